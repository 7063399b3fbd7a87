"""Count-median vs count-min at scale (issue 18, part 4): Pyramid reports a 0.5-point advantage
of count-median under noise; on MovieLens 100K it is a tie (BENCHMARKS.md, accuracy (d)).

`python -m bench.accuracy.sketch_scale [--scale 100] [--draws 2] [--shares 0.01,0.1]`: one
"more users" simulated stream (``bench.accuracy.simulator``) at ×scale; per hot share and noise
draw, both estimators read the **same** noisy tables (``CoreArm.run`` with both kinds: one
noise draw, laplace ε = 1 per window, sketch 16384 × 3, 7 tables and the prior) at the regime
benchmark's cuts; figures: log-loss of each (mean over cuts), the paired difference
(min − median) ÷ median with its standard error over draws × cuts, and the movie table's
estimate error (mean, RMS) against the exact counts."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench import movielens
from bench.accuracy import sim_stream, simulator
from bench.accuracy.plan import Privacy, Sketching, make_plan
from bench.accuracy.regime import CUTS, SEED, TRAIN_CAP, TRAINING
from bench.report import Clock, Table, write_section


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy.sketch_scale", description=__doc__)
    p.add_argument("--scale", type=int, default=100)
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--shares", default="0.01,0.1")
    p.add_argument("--cuts", default=",".join(map(str, CUTS)), help="some of the regime's cuts")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",")]
    cut_shares = tuple(float(c) for c in args.cuts.split(","))
    if not cut_shares or any(c not in CUTS for c in cut_shares):
        p.error(f"--cuts must be some of {CUTS}")
    if not 1 <= args.scale <= 1000 or not 1 <= args.draws <= 10:
        p.error("--scale must be in [1, 1000] and --draws in [1, 10]")
    if any(s not in (0.01, 0.02, 0.05, 0.1) for s in shares):
        p.error("--shares must be some of 0.01, 0.02, 0.05, 0.1")
    say, t0 = Clock(), time.perf_counter()
    cal = simulator.fit(movielens.load())
    cuts = make_plan(len(cal.users) * args.scale, cut_shares)
    arm = sim_stream.StreamArm(
        cal, args.scale, SEED + args.scale, cuts, shares, Sketching(), TRAINING,
        grow="users", kinds=("median", "min"), train_cap=TRAIN_CAP, say=say,
    )  # fmt: skip
    say(f"simulated ×{args.scale}: {cuts.n:,} events")
    rows = []
    for share in shares:
        med: list[float] = []
        mn: list[float] = []
        diffs: list[float] = []
        err: dict[str, list[tuple[float, float]]] = {"median": [], "min": []}
        for d in range(args.draws):
            evals = arm.run(cuts, share, Privacy("laplace", 1.0), draw=d)
            by = {(e.method, e.cut): e for e in evals}
            for cut in cuts.cuts:
                a, b = by[("core-median", cut)], by[("core-min", cut)]
                med.append(a.log_loss)
                mn.append(b.log_loss)
                diffs.append((b.log_loss - a.log_loss) / a.log_loss)
                err["median"].append((a.est_bias, a.est_rmse))
                err["min"].append((b.est_bias, b.est_rmse))
            say(f"{share:.0%} draw {d}: median {statistics.fmean(med):.4f}, "
                f"min {statistics.fmean(mn):.4f}")  # fmt: skip
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
        lower = sum(x > 0 for x in diffs)
        rows.append(
            [
                f"{share:.0%}",
                f"{statistics.fmean(med):.4f}",
                f"{statistics.fmean(mn):.4f}",
                f"{100 * statistics.fmean(diffs):+.2f} % ± {100 * se:.2f}",
                f"{lower} of {len(diffs)}",
                " / ".join(f"{statistics.fmean(e[0] for e in err[k]):+.0f}" for k in err),
                " / ".join(f"{statistics.fmean(e[1] for e in err[k]):.0f}" for k in err),
            ]
        )
    minutes = (time.perf_counter() - t0) / 60
    setup = Table(
        ["setup", ""],
        [
            ["stream", f"simulator ×{args.scale} more users ({100_000 * args.scale:,} events)"],
            ["tables", "laplace ε = 1 per window, sketch 16384 × 3, 7 tables and the prior"],
            [
                "pairing",
                "both estimators read the same noisy tables (one draw), cuts "
                + "/".join(f"{100 * c:.0f}" for c in cut_shares)
                + " %",
            ],
            [
                "stream in chunks",
                "bench/accuracy/sim_stream.py (the whole-frame simulator's "
                f"events and tables); a hot window above {TRAIN_CAP:,} rows trains on every s-th",
            ],
            ["runtime", f"{minutes:.1f} min"],
        ],
    )
    table = Table(
        ["hot window", "count-median log-loss", "count-min log-loss",
         "(min − median) ÷ median, mean ± s.e.", "median lower in",
         "movie-count error, mean: median / min", "RMS: median / min"],
        rows,
        f"Count-median vs count-min, {args.draws} draws × {len(cut_shares)} cuts",
    )  # fmt: skip
    write_section(
        f"Count-median vs count-min at ×{args.scale} (simulator)",
        [setup, table],
        command="python -m bench.accuracy.sketch_scale " + " ".join(argv),
    )


if __name__ == "__main__":
    main()

"""Accuracy of count featurization on MovieLens 100K (issue 3): ``selectivity bench accuracy``.

What is compared, on the same test rows (label ``rating >= 4``; features user, movie, genres,
age, gender, occupation, zip3; ratings in time order):

(a) **baseline**: LightGBM with native categorical features on *every* raw rating before the
    cut. Also reported: the same model on the raw hot window only, and the label prior.
(b) **count features, no noise**, through the service (HTTP, in-process app over an embedded
    Redis and SQLite in a temp dir, ``bench.harness``): one stream per configuration,
    ``hot_windows = 1`` (the train set is the open window), windows of ``share`` of the data
    (1, 2, 5, 10 %), ratings replayed in time order with a forced roll between windows,
    ``retention_windows`` large enough that the count period is *everything before the hot
    window* (Pyramid also keeps all history in its counts). At each cut the model trains on
    ``GET /trainset`` (Arrow) and is tested on the next rows featurized with ``POST /featurize``
    before they are ingested (same epoch, same count period as the train set).
(c) the same under DP: ``laplace`` with ε per window, and ``gaussian`` with the matching ρ =
    ε²/2 (an ε-DP mechanism is ε²/2-zCDP, Bun & Steinke 2016 Prop. 1.4; so a gaussian row
    has the same zCDP bound as the laplace row of its ε, but a weaker pure-DP one).
(d) **count-median vs count-min** under the same noise, in-process on the service's pure core
    (``service.core``: its counting, noise, sketch estimators and featurization), *not* via
    HTTP: the same per-window tables built both ways (signed increments and the median
    estimator; unsigned +1 increments and the min estimator), the same noise draws added to
    both, the same featurization, training and test rows.

Cuts: the stream is cut at 50, 60, 70, 80 and 90 % of the ratings; every window share divides
them, so at a cut the hot window is the ``share`` of the data just before it, and the test rows
are the next 1 % of the ratings (the next window for the 1 % share, its first rows for the
others): every configuration and the baseline are scored on exactly the same 5 × 1,000 rows.
Figures are means over the cuts of the per-cut log-loss and AUC; ratios are to the baseline's
mean log-loss.

Every model is LightGBM with the same parameters (``bench.lgbm``); the number of rounds is
chosen by early stopping on the last 20 % (in time) of the model's training rows, then the model
is refit on all of them with that many rounds; predictions are averaged over three seeds.

Noise draws: the ε = 1 HTTP configurations are replayed 3 times (fresh streams, so fresh
noise); (d) takes 3 draws per configuration; a per-table ablation (noise on one table at a time,
10 % share, ε = 1) shows which tables carry the DP cost.

Operating point: ``--features`` (which features get a count table, so ``max_tables``),
``--depth`` and ``--width`` change the sketch (Δ1 = T·depth); ``--shares``, ``--epsilons``,
``--mechanisms`` and ``--gaussian-delta`` restrict or change what is run (e.g. ``--depth 1
--features user_id,movie_id,genres,zip3 --epsilons 1 --mechanisms none,laplace --skip-core``).
Such a run prints its report; it writes its section into BENCHMARKS.md (replacing the last
run's) only with ``--append``. The report is tables and plots only, under the command that
made them.

Runtime: about 10 minutes on 2 cores (``--quick``: under 2). The work is split into jobs (one
per share for HTTP, one per share for (d), the ablation, the raw baselines) run by two worker
processes. Per-cut results go to ``bench/plots/accuracy.csv``; ``--from-csv`` re-makes the
report from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from bench import movielens, report
from bench.accuracy import runner
from bench.accuracy.plan import FULL, MECHANISMS, QUICK, SHARES_FULL, Setup, Sketching, make_plan
from bench.accuracy.report import Output, sections, title


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parser() -> argparse.ArgumentParser:
    default = Sketching()
    p = argparse.ArgumentParser(
        prog="selectivity bench accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sweep (shares 2 and 10 %%, ε = 1, cuts 70 and 90 %%); "
        "prints, writes its BENCHMARKS.md section only with --append",
    )
    p.add_argument("--append", action="store_true", help="write a --quick run's section too")
    p.add_argument(
        "--drift",
        action="store_true",
        help="run the evaluation across drift instead (bench.accuracy.drift; --drift --help)",
    )
    p.add_argument("--no-append", action="store_true", help="print only")
    p.add_argument("--skip-core", action="store_true", help="leave out (d) and the ablation")
    p.add_argument("--skip-http", action="store_true", help="leave out (b) and (c)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument(
        "--from-csv", type=Path, help="re-make the report from a saved run's per-cut results"
    )
    point = p.add_argument_group(
        "operating point and restrictions",
        "Any of these but --out makes a non-default run: it prints its report and\n"
        "writes its BENCHMARKS.md section only with --append. With --from-csv, pass the same\n"
        "options as the run.",
    )
    point.add_argument(
        "--features",
        type=_csv_list,
        default=None,
        metavar="F1,F2,...",
        help="features that get a count table (default all: "
        f"{','.join(movielens.FEATURES)}); max_tables = their number + 1 (the prior "
        "table), so fewer features mean a smaller Δ1 = T·depth. The raw baselines always use "
        "every feature",
    )
    point.add_argument(
        "--depth",
        type=int,
        default=default.depth,
        help=f"sketch depth (default {default.depth}); depth 1 is a plain hashed count table",
    )
    point.add_argument(
        "--width",
        type=int,
        default=default.width,
        help=f"sketch width, a power of two (default {default.width})",
    )
    point.add_argument(
        "--table-weights",
        type=_csv_list,
        default=None,
        metavar="F=W,...",
        help="the budget split: each listed table's weight (privacy.table_weights; 'prior' "
        "for the prior table), every other table 1; table s gets ε·w_s/Σw",
    )
    point.add_argument(
        "--shares",
        type=_csv_list,
        default=None,
        metavar="PCT,...",
        help="hot-window shares in %% of the ratings, from 1, 2, 5, 10 (default all; --quick: "
        "2, 10)",
    )
    point.add_argument(
        "--epsilons",
        type=_csv_list,
        default=None,
        metavar="E,...",
        help="ε per window (default 0.1, 0.5, 1, 5; --quick: 1); the ε = 1 HTTP rows are "
        "replayed several times (fresh noise)",
    )
    point.add_argument(
        "--mechanisms",
        type=_csv_list,
        default=None,
        metavar="M,...",
        help="from none, laplace, gaussian (default all three; keep none as the reference)",
    )
    point.add_argument(
        "--gaussian-delta",
        type=float,
        default=None,
        metavar="DELTA",
        help="gaussian rows at the largest ρ that is (ε, DELTA)-DP, i.e. the laplace row's ε "
        "with a δ (default: ρ = ε²/2, the laplace row's zCDP bound)",
    )
    point.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="path prefix of the per-cut CSV and the plots (PREFIX.csv, PREFIX_logloss.png, "
        "...; default bench/plots/accuracy[_quick])",
    )
    return p


def sketching_of(args: argparse.Namespace, p: argparse.ArgumentParser) -> Sketching:
    features = tuple(movielens.FEATURES)
    if args.features is not None:
        unknown = sorted(set(args.features) - set(movielens.FEATURES))
        if unknown or not args.features:
            p.error(f"--features: unknown {unknown}; choose from {movielens.FEATURES}")
        # the canonical order, so that the columns come in the same order as in a default run
        features = tuple(f for f in movielens.FEATURES if f in args.features)
    if args.width < 2 or args.width & (args.width - 1):
        p.error(f"--width must be a power of two, got {args.width}")
    if args.depth < 1:
        p.error(f"--depth must be at least 1, got {args.depth}")
    weights: dict[str, float] = {}
    for item in args.table_weights or []:
        feature, _, value = item.partition("=")
        try:
            weights[feature] = float(value)
        except ValueError:
            p.error(f"--table-weights: {item!r} is not FEATURE=WEIGHT")
        if feature != "prior" and feature not in features:
            p.error(f"--table-weights: {feature!r} has no table; choose from {features}")
    return Sketching(features, args.width, args.depth, tuple(sorted(weights.items())))


def customise(setup: Setup, args: argparse.Namespace, p: argparse.ArgumentParser) -> Setup:
    """Apply the operating-point and restriction options."""
    changes: dict[str, Any] = {"sketching": sketching_of(args, p)}
    if args.shares is not None:
        try:
            shares = tuple(sorted({float(x) / 100 for x in args.shares}))
        except ValueError:
            p.error(f"--shares: not numbers: {args.shares}")
        bad = [s for s in shares if not any(math.isclose(s, f) for f in SHARES_FULL)]
        if bad or not shares:
            p.error(f"--shares: choose from {[round(s * 100) for s in SHARES_FULL]}")
        changes["shares"] = shares
        changes["core_shares"] = tuple(s for s in setup.core_shares if s in shares)
        if setup.ablation_share not in shares:
            changes["ablation_share"] = None
    if args.epsilons is not None:
        try:
            eps = tuple(sorted({float(x) for x in args.epsilons}))
        except ValueError:
            p.error(f"--epsilons: not numbers: {args.epsilons}")
        if not eps or min(eps) <= 0:
            p.error("--epsilons must be positive")
        changes["epsilons"] = eps
        changes["core_epsilons"] = tuple(e for e in setup.core_epsilons if e in eps)
        if 1.0 not in eps:
            changes["ablation_share"] = None
    if args.mechanisms is not None:
        mechs = tuple(m for m in MECHANISMS if m in args.mechanisms)
        unknown = sorted(set(args.mechanisms) - set(MECHANISMS))
        if unknown or not mechs:
            p.error(f"--mechanisms: unknown {unknown}; choose from none, laplace, gaussian")
        changes["mechanisms"] = mechs
    if args.gaussian_delta is not None:
        if not 0 < args.gaussian_delta < 1:
            p.error("--gaussian-delta must be in (0, 1)")
        changes["gaussian_delta"] = args.gaussian_delta
    return dataclasses.replace(setup, **changes)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--drift" in argv:  # the split-by-split evaluation across drift: bench.accuracy.drift
        from bench.accuracy import drift

        return drift.main([a for a in argv if a != "--drift"])
    p = parser()
    args = p.parse_args(argv)
    if not movielens.available():
        raise SystemExit(f"MovieLens 100K not found under {movielens.DATA}")
    base = QUICK if args.quick else FULL
    setup = customise(base, args, p)
    custom = setup != base
    out = Output(args.out, setup.quick)
    csv = out.path("", "csv")
    df = movielens.load()
    if args.from_csv:
        frame = pd.read_csv(args.from_csv)
    else:
        plan = make_plan(len(df), setup.cut_shares)
        todo = runner.jobs(setup, http=not args.skip_http, core=not args.skip_core)
        print(
            f"MovieLens 100K: {len(df)} ratings, cuts {list(plan.cuts)}, {plan.test_rows} test "
            f"rows per cut; {len(todo)} jobs on {args.workers} worker processes",
            flush=True,
        )
        frame, elapsed = runner.run(setup, todo, workers=args.workers)
        print(f"done in {elapsed:.0f}s; per-cut results in {report.rel(csv)}", flush=True)
        frame.to_csv(csv, index=False)
    parts = sections(frame, df, setup, out)
    command = " ".join(["selectivity bench accuracy", *argv])
    if not args.no_append and (args.append or not (setup.quick or custom)):
        report.write_section(title(setup), parts, command=command)
    else:
        print(report.section(title(setup), parts, command=command))

"""The planning rule's constants and its check (issue 18, part 3; ``service.core.dp.plan``).

`python -m bench.accuracy.plan_fit --include REGIME.json ... [--check-scale 30] [--draws 2]`:

1. **Fit**: from the raw figures of ``bench.accuracy.regime`` runs (their ``--json``), per
   stream and hot share the per-table SNR the rule computes (regime geometry: 7 feature tables
   and the prior, uniform split, laplace ε = 1, depth 3, 2 labels, a window = the hot share of
   the stream, m = cut/window − 1 windows counted, averaged over the cuts), then least squares
   of log(DP cost − 1) on log S (S = geometric mean of min(SNR, SNR_CAP)) and of the no-noise
   ratio on log10(hot rows), on the "more users" streams at ``--fit-scales`` (×1, ×10) only;
   every stream's measured and predicted figures, the others held out.
2. **Check** at ``--check-scale`` (a size not fitted on): a "more users" simulated stream; the
   planner gets its observations per 1 % window, the keys' counts and max_exposure 1/70 (about
   the run's mean count period); for each target (log-loss ≤ 1.03 × baseline; DP cost ≤ 1.02)
   the proposed ε, split and sketch run through ``service.core`` (the regime benchmark's
   cuts, ``draws`` noise draws) against no noise and the LightGBM baseline."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import lgbm, movielens
from bench.accuracy import simulator
from bench.accuracy.plan import Privacy, Sketching, make_plan
from bench.accuracy.regime import BASELINE_CAP, CUTS, SEED, TRAINING, ratios
from bench.report import BENCHMARKS, Clock, Table, write_section
from service.core.dp import plan as rule

ML_KEYS = {
    "user_id": 943,
    "movie_id": 1682,
    "genres": 216,
    "age": 7,
    "gender": 2,
    "occupation": 21,
    "zip3": 382,
}
TABLES = len(ML_KEYS) + 1
DEPTH = 3


def regime_s(scale: int, share: float, grow: str) -> float:
    """S of a regime run (module docstring, 1.)."""
    w = share * 100_000 * scale
    snrs = []
    for feature, k in ML_KEYS.items():
        keys = k * scale if feature == "user_id" and grow == "users" else k
        per_cut = []
        for cut in CUTS:
            m = round(cut / share) - 1
            per_cut.append(math.sqrt(m) * w * (1.0 / TABLES) / (keys * 2 * DEPTH * math.sqrt(2)))
        snrs.append(statistics.fmean(per_cut))
    return math.exp(statistics.fmean(math.log(min(s, rule.SNR_CAP)) for s in snrs))


def fit(runs: list[dict[str, Any]], fit_scales: set[int]) -> tuple[dict[str, float], list[list]]:
    points = []
    for r in runs:
        if r["label"] == "real":
            continue
        scale = r["n"] // 100_000
        grow = str(r.get("grow", "events")) if scale > 1 else "users"
        q = ratios(r)
        for share in r["shares"]:
            points.append(
                {
                    "scale": scale,
                    "grow": grow,
                    "share": share,
                    "s": regime_s(scale, share, grow),
                    "rows": share * r["n"],
                    "dp": q[f"{share}|dp"],
                    "nn": q[f"{share}|no noise"],
                    "eps": q[f"{share}|laplace ε=1"],
                    "fitted": grow == "users" and scale in fit_scales,
                }
            )
    used = [p for p in points if p["fitted"]]
    slope, icept = np.polyfit(
        [math.log(p["s"]) for p in used], [math.log(max(p["dp"] - 1, 1e-4)) for p in used], 1
    )
    b, a = np.polyfit([math.log10(p["rows"]) for p in used], [p["nn"] for p in used], 1)
    consts = {"KAPPA": math.exp(icept), "POWER": -slope, "NN_A": a, "NN_B": -b}
    rows = []
    for p in points:
        dp = 1 + consts["KAPPA"] * p["s"] ** (-consts["POWER"])
        nn = consts["NN_A"] - consts["NN_B"] * math.log10(p["rows"])
        rows.append(
            [
                f"×{p['scale']} more {p['grow']}",
                f"{p['share']:.0%}",
                "fitted" if p["fitted"] else "held out",
                f"{p['s']:.2f}",
                f"{p['dp']:.3f}",
                f"{dp:.3f}",
                f"{p['eps']:.3f}",
                f"{nn * dp:.3f}",
            ]
        )
    return consts, rows


def check(scale: int, draws: int, say: Clock) -> list[list]:
    """Module docstring, 2."""
    cal = simulator.fit(movielens.load())
    df = simulator.simulate(cal, scale, SEED + scale, grow="users")
    n = len(df)
    say(f"simulated ×{scale}: {n:,} events")
    cards = {f: int(df[f].nunique()) for f in ML_KEYS if f != "age"} | {"age": 7}
    cuts = make_plan(n, CUTS)
    raw, y = movielens.raw_frame(df), movielens.labels01(df)
    base = []
    for cut in cuts.cuts:
        lo = max(0, cut - BASELINE_CAP)
        p, _ = lgbm.fit_predict(raw.iloc[lo:cut], y[lo:cut], raw.iloc[cuts.test(cut)], TRAINING)
        base.append(lgbm.log_loss(y[cuts.test(cut)], p))
        say(f"baseline at {cut}: {base[-1]:.4f}")
    del raw
    out = []
    for name, value in (("target_loss", 1.03), ("target_dp_cost", 1.02)):
        proposal = rule.make_plan(
            rule.PlanRequest.model_validate(
                {"observations_per_window": n // 100, "cardinalities": cards,
                 "max_exposure": 1 / 70, "hot_windows": 1, name: value}
            )
        )  # fmt: skip
        assert proposal.window_multiplier in (1, 2, 5, 10), proposal.why
        share = 0.01 * proposal.window_multiplier
        weights = (*proposal.table_weights.items(), ("prior", proposal.prior_weight))
        arm = simulator.ColumnArm(
            df, Sketching(width=proposal.width, depth=proposal.depth, weights=weights), TRAINING
        )

        def losses(
            privacy: Privacy, d: int, arm: simulator.ColumnArm = arm, share: float = share
        ) -> list[float]:
            return [e.log_loss for e in arm.run(cuts, share, privacy, draw=d, kinds=("median",))]

        clean = losses(Privacy("none"), 0)
        noisy = [losses(Privacy("laplace", proposal.epsilon), d) for d in range(draws)]
        per_draw = [statistics.fmean(x / b for x, b in zip(r, base, strict=True)) for r in noisy]
        dp = [statistics.fmean(x / c for x, c in zip(r, clean, strict=True)) for r in noisy]
        sd = statistics.stdev(per_draw) if draws > 1 else 0.0
        say(f"{name} {value}: ε {proposal.epsilon}, ÷ baseline {statistics.fmean(per_draw):.4f}")
        out.append(
            [
                f"{name.removeprefix('target_').replace('_', ' ')} ≤ {value}",
                f"{proposal.epsilon:g}",
                f"{proposal.width} × {proposal.depth}",
                f"{proposal.window_multiplier} % of the stream",
                f"{proposal.predicted_dp_cost:.3f}",
                f"{statistics.fmean(dp):.3f}",
                f"{proposal.predicted_loss:.3f}",
                f"{statistics.fmean(per_draw):.3f} ± {sd:.3f}",
            ]
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy.plan_fit", description=__doc__)
    p.add_argument("--include", type=Path, action="append", required=True)
    p.add_argument("--fit-scales", default="1,10")
    p.add_argument("--check-scale", type=int, default=0, help="0: no check run")
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--out", type=Path, default=BENCHMARKS, help="the Markdown file to write into")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if not 0 <= args.check_scale <= 100 or not 1 <= args.draws <= 10:
        p.error("--check-scale must be in [0, 100] and --draws in [1, 10]")
    say, t0 = Clock(), time.perf_counter()
    runs = [r for path in args.include for r in json.loads(path.read_text())]
    consts, rows = fit(runs, {int(s) for s in args.fit_scales.split(",")})
    say("fitted: " + ", ".join(f"{k} = {v:.4f}" for k, v in consts.items()))
    in_rule = {k: getattr(rule, k) for k in consts}
    say("service.core.dp.plan: " + ", ".join(f"{k} = {v}" for k, v in in_rule.items()))
    tables = [
        Table(
            ["constant", "fitted", "in service.core.dp.plan"],
            [[k, f"{v:.4f}", f"{in_rule[k]}"] for k, v in consts.items()],
            "Constants",
        ),
        Table(
            [
                "stream",
                "hot",
                "",
                "S",
                "DP cost measured",
                "predicted",
                "ε=1 ÷ baseline measured",
                "predicted",
            ],
            rows,
            "The rule on the regime runs (laplace ε = 1, sketch 16384 × 3, uniform split)",
        ),  # fmt: skip
    ]
    if args.check_scale:
        checked = check(args.check_scale, args.draws, say)
        tables.append(
            Table(
                [
                    "target",
                    "proposed ε",
                    "sketch",
                    "hot window",
                    "DP cost predicted",
                    "measured",
                    "÷ baseline predicted",
                    "measured (± s.d. over draws)",
                ],
                checked,
                f"Check at ×{args.check_scale} more users (not fitted on), {args.draws} draws",
            )  # fmt: skip
        )
    shown = [a for a in argv if not a.startswith("--out") and a != str(args.out)]
    command = "python -m bench.accuracy.plan_fit " + " ".join(shown)
    minutes = (time.perf_counter() - t0) / 60
    say(f"{minutes:.1f} min")
    title = "Planning a stream's budget: the rule's fit and check"
    write_section(title, tables, command=command, path=args.out)


if __name__ == "__main__":
    main()

"""The regime, measured (issue 18, part 2): count features at ε = 1, without noise, and the
full-data baseline on the MovieLens-calibrated simulator (``bench.accuracy.simulator``) at ×1,
×10, ×100 … the observations per window, with the same windows (shares of the stream), the same
ε per window and the same sketch.

`python -m bench.accuracy.regime [--scales 1,10,100] [--draws 2] [--grow users|events]`: per
scale one simulated stream (grown by more users, the default, or more events per user:
``simulator.simulate``'s stream, generated and counted in chunks by ``sim_stream`` so that
×1000, 100M events, fits in memory); the real MovieLens at ×1 on the same figures (the
simulator's check). Per stream, at cuts 50, 70 and 90 % (``--cuts``: some of them, for the
largest streams) with the next 1 % as test rows: (a) the
baseline, LightGBM on every raw event before the cut (above ``BASELINE_CAP`` rows: the last
``BASELINE_CAP``, said in the table), and the Bayes log-loss of the simulator's true
probabilities; (b) count features on ``service.core`` (``core_arm``'s core arm: the
service's tables, hashing, noise and featurization, count-median, no HTTP) with hot windows
of 1 % and 10 % (a window above ``TRAIN_CAP`` rows trains on every s-th row), no noise and
laplace ε = 1 (``draws`` noise draws). Figures: log-loss ÷
baseline (mean over cuts and draws), and DP
÷ no noise; Pyramid's claims are ≤ 1.03 at ≤ 1 % exposure and ≤ 1.02."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import lgbm, movielens
from bench.accuracy import sim_stream, simulator
from bench.accuracy.core_arm import CoreArm
from bench.accuracy.plan import Plan, Privacy, Sketching, make_plan
from bench.report import Clock, Plot, Table, plot_path, pyplot, write_section

CUTS = (0.5, 0.7, 0.9)
SHARES = (0.01, 0.10)
BASELINE_CAP = 1_000_000
# Hot windows above this many rows train on every s-th row (sim_stream): only the 10 % window
# at ×1000 (10M rows, 1M trained on); up to ×100 every window trains on all of its rows.
TRAIN_CAP = 1_000_000
SEED = 18
TRAINING = lgbm.Training(seeds=(7,))  # one seed: the figures are means over cuts and draws


def measure(
    df: Any, label: str, draws: int, say: Clock, *, bayes: bool, shares: tuple[float, ...] = SHARES
) -> dict[str, Any]:
    """The figures of one stream held as a frame (the real MovieLens; see the module
    docstring)."""
    plan = make_plan(len(df), CUTS)
    raw = movielens.raw_frame(df)
    y = movielens.labels01(df)

    def baseline(lo: int, cut: int, t: slice) -> tuple[Any, np.ndarray, Any, np.ndarray]:
        return raw.iloc[lo:cut], y[lo:cut], raw.iloc[t], y[t]

    def bayes_of(t: slice) -> float:
        return simulator.bayes_log_loss(df, t)

    return _figures(
        plan, baseline, bayes_of if bayes else None,
        lambda: simulator.ColumnArm(df, Sketching(), TRAINING), label, draws, say, shares,
    )  # fmt: skip


def measure_stream(
    cal: simulator.Calibration,
    scale: int,
    grow: str,
    label: str,
    draws: int,
    say: Clock,
    *,
    shares: tuple[float, ...] = SHARES,
    cuts: tuple[float, ...] = CUTS,
) -> dict[str, Any]:
    """The figures of one simulated stream, generated and counted chunk by chunk
    (``sim_stream``: the same stream and tables as ``simulator.simulate`` and ``ColumnArm``,
    within memory at ×1000)."""
    plan = make_plan(len(cal.users) * scale, cuts)
    arm = sim_stream.StreamArm(
        cal, scale, SEED + scale, plan, shares, Sketching(), TRAINING,
        grow=grow, baseline_cap=BASELINE_CAP, train_cap=TRAIN_CAP, say=say,
    )  # fmt: skip

    def baseline(lo: int, cut: int, t: slice) -> tuple[Any, np.ndarray, Any, np.ndarray]:
        return (*arm.raw(slice(lo, cut)), *arm.raw(t))

    res = _figures(plan, baseline, arm.bayes_log_loss, lambda: arm, label, draws, say, shares)
    res["cuts"] = list(cuts)
    res["train_rows"] = {
        str(s): len(arm.train_events(slice(0, plan.window(s)))) for s in shares
    }  # fmt: skip
    return res


def _figures(
    plan: Plan,
    baseline: Callable[[int, int, slice], tuple[Any, np.ndarray, Any, np.ndarray]],
    bayes_of: Callable[[slice], float] | None,
    make_arm: Callable[[], CoreArm],
    label: str,
    draws: int,
    say: Clock,
    shares: tuple[float, ...],
) -> dict[str, Any]:
    base: list[float] = []
    bayes_ll: list[float] = []
    for cut in plan.cuts:
        t = plan.test(cut)
        x_train, y_train, x_test, y_test = baseline(max(0, cut - BASELINE_CAP), cut, t)
        p, _ = lgbm.fit_predict(x_train, y_train, x_test, TRAINING)
        base.append(lgbm.log_loss(y_test, p))
        if bayes_of is not None:
            bayes_ll.append(bayes_of(t))
        say(f"{label}: baseline at cut {cut}: {base[-1]:.4f}")
        del x_train, x_test
    arm = make_arm()
    out: dict[str, Any] = {
        "label": label,
        "n": plan.n,
        "baseline": base,
        "baseline_rows": min(BASELINE_CAP, plan.cuts[0]),
        "bayes": bayes_ll,
        "shares": list(shares),
        "count": {},
    }
    for share in shares:
        for privacy in (Privacy("none"), Privacy("laplace", 1.0)):
            runs = 1 if privacy.mechanism == "none" else draws
            losses = []
            for d in range(runs):
                evals = arm.run(plan, share, privacy, draw=d, kinds=("median",))
                losses.append([e.log_loss for e in evals])
            out["count"][f"{share}|{privacy.label}"] = losses
            mean = statistics.fmean(statistics.fmean(r) for r in losses)
            say(f"{label}: {share:.0%} {privacy.label}: log-loss {mean:.4f}")
    return out


def ratios(res: dict[str, Any]) -> dict[str, float]:
    """Log-loss ÷ baseline (per cut, then the mean over cuts and draws), and DP ÷ no noise."""
    base = res["baseline"]
    out: dict[str, float] = {}
    for share in res["shares"]:
        for key in ("no noise", "laplace ε=1"):
            runs = res["count"][f"{share}|{key}"]
            per_draw = [statistics.fmean(x / b for x, b in zip(r, base, strict=True)) for r in runs]
            out[f"{share}|{key}"] = statistics.fmean(per_draw)
            out[f"{share}|{key}|sd"] = statistics.stdev(per_draw) if len(per_draw) > 1 else 0.0
        out[f"{share}|dp"] = out[f"{share}|laplace ε=1"] / out[f"{share}|no noise"]
    if res["bayes"]:
        out["bayes"] = statistics.fmean(b / x for b, x in zip(res["bayes"], base, strict=True))
    return out


def _grow(res: dict[str, Any]) -> str:
    return str(res.get("grow", "events"))  # the first runs grew events (before the option)


def _plot(results: list[dict[str, Any]], name: str = "regime") -> Path:
    """A row per way of growing the stream (×1 is the same stream for both)."""
    plt = pyplot()
    sims = [r for r in results if r["label"] != "real"]
    modes = sorted({_grow(r) for r in sims if r["n"] > 100_000}) or ["users"]
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 4 * len(modes)), squeeze=False)
    for (left, right), mode in zip(axes, modes, strict=True):
        rows = sorted(
            (r for r in sims if r["n"] == 100_000 or _grow(r) == mode), key=lambda r: r["n"]
        )
        scales = [r["n"] / 100_000 for r in rows]
        for share, style in zip(rows[0]["shares"], ("-", "--", "-.", ":"), strict=False):
            for key, color in (("no noise", "C0"), ("laplace ε=1", "C1")):
                values = [ratios(r)[f"{share}|{key}"] for r in rows]
                left.plot(scales, values, "o" + style, color=color, label=f"{key}, {share:.0%} hot")
            right.plot(
                scales, [ratios(r)[f"{share}|dp"] for r in rows], "s" + style, color="C2",
                label=f"ε=1 ÷ no noise, {share:.0%} hot",
            )  # fmt: skip
        for r in results:
            if r["label"] == "real":
                q = ratios(r)
                for share in r["shares"]:
                    for key, color in (("no noise", "C0"), ("laplace ε=1", "C1")):
                        left.plot([1], [q[f"{share}|{key}"]], "x", color=color, ms=9)
                    right.plot([1], [q[f"{share}|dp"]], "x", color="C2", ms=9)
                left.plot([], [], "x", color="grey", label="real MovieLens ×1")
        left.plot(scales, [ratios(r).get("bayes", np.nan) for r in rows], ":", color="grey",
                  label="Bayes (true p) ÷ baseline")  # fmt: skip
        left.axhline(1.03, color="C3", lw=0.8, ls=":", label="Pyramid: ≤ 1.03")
        right.axhline(1.02, color="C3", lw=0.8, ls=":", label="Pyramid: ≤ 1.02")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xlabel(f"stream size (× MovieLens 100K per window; more {mode})")
            ax.legend(fontsize=7)
        left.set_ylabel("test log-loss ÷ full-data baseline")
        right.set_ylabel("log-loss at ε = 1 ÷ without noise")
    fig.suptitle("Count features by stream size (MovieLens-calibrated simulator)")
    fig.tight_layout()
    png = plot_path(name)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _cuts(results: list[dict[str, Any]]) -> str:
    """The cuts, and the streams that used others (``--cuts``)."""
    text = ", ".join(f"{c:.0%}" for c in CUTS)
    other = {
        ", ".join(f"{c:.0%}" for c in r["cuts"]): r["label"]
        for r in results
        if tuple(r.get("cuts", CUTS)) != CUTS
    }
    return text + "".join(f" ({label.replace('x', '×')}: {c})" for c, label in other.items())


def _subsampled(res: dict[str, Any]) -> str:
    """The hot windows that trained on a subsample of their rows (``TRAIN_CAP``), said."""
    notes = [
        f"{float(s):.0%} hot: {rows:,} of {round(float(s) * res['n']):,} rows trained on"
        for s, rows in res.get("train_rows", {}).items()
        if rows < round(float(s) * res["n"])
    ]
    return f" ({'; '.join(notes)})" if notes else ""


def report(
    results: list[dict[str, Any]], command: str, minutes: float, plot: str = "regime"
) -> None:
    shares = results[0]["shares"]
    rows = []
    for r in results:
        q = ratios(r)
        rows.append(
            [
                "real MovieLens ×1"
                if r["label"] == "real"
                else f"simulated ×{r['n'] // 100_000}"
                + (f", more {_grow(r)}" if r["n"] > 100_000 else "")
                + _subsampled(r),
                f"{r['n']:,}",
                f"{statistics.fmean(r['baseline']):.4f}"
                + ("" if r["baseline_rows"] >= min(r["n"] * c for c in r.get("cuts", CUTS)) else
                   f" (last {r['baseline_rows']:,} rows)"),
                f"{q['bayes']:.3f}" if "bayes" in q else "",
                *(
                    f"{q[f'{s}|{k}']:.3f}"
                    + (f" ± {q[f'{s}|{k}|sd']:.3f}" if k != "no noise" else "")
                    for s in shares
                    for k in ("no noise", "laplace ε=1")
                ),
                *(f"{q[f'{s}|dp']:.3f}" for s in shares),
            ]
        )  # fmt: skip
    header = [
        "stream",
        "events",
        "baseline log-loss",
        "Bayes ÷ baseline",
        *(f"{k}, {s:.0%} hot ÷ baseline" for s in shares for k in ("no noise", "ε=1")),
        *(f"ε=1 ÷ no noise, {s:.0%}" for s in shares),
    ]
    setup = Table(
        ["setup", ""],
        [
            ["simulator", "bench/accuracy/simulator.py (calibration in its docstring)"],
            ["cuts", f"{_cuts(results)} of the stream; test: the next 1 %"],
            ["baseline", f"LightGBM, raw categorical, events before the cut (≤ {BASELINE_CAP:,})"],
            ["count features", "service.core tables (core arm), sketch 16384 × 3, 7 tables and "
             "the prior, count period = everything before the hot window, count-median; "
             f"a hot window above {TRAIN_CAP:,} rows trains on every s-th of them"],
            ["simulated streams", "generated and counted in chunks (bench/accuracy/sim_stream.py:"
             " the same events and tables as the whole-frame simulator)"],
            ["noise", "laplace ε = 1 per window (± : s.d. over noise draws)"],
            ["training", "LightGBM as bench/lgbm.py, one seed"],
            ["runtime", f"{minutes:.1f} min"],
        ],
    )  # fmt: skip
    grown = sorted({_grow(r) for r in results if r["n"] > 100_000}) or ["users"]
    largest = max(r["n"] for r in results) // 100_000
    write_section(
        "Regime: count features by stream size "
        f"(simulator, more {' and '.join(grown)}, up to ×{largest})",
        [setup, Table(header, rows, "Log-loss ratios"), Plot("regime", _plot(results, plot))],
        command=command,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy.regime", description=__doc__)
    p.add_argument("--scales", default="1,10,100", help="comma-separated ×k of the stream")
    p.add_argument("--draws", type=int, default=2, help="noise draws at ε = 1")
    p.add_argument("--shares", default="0.01,0.1", help="hot-window shares of the stream")
    p.add_argument("--cuts", default=",".join(map(str, CUTS)), help="cuts of the simulated streams")
    p.add_argument(
        "--grow", choices=simulator.GROWTHS, default="users", help="simulator.simulate's grow"
    )
    p.add_argument("--no-real", action="store_true", help="skip the real MovieLens check")
    p.add_argument("--json", type=Path, help="also write the raw figures here")
    p.add_argument("--plot", default="regime", help="the plot's name under bench/plots")
    p.add_argument(
        "--include",
        type=Path,
        action="append",
        default=[],
        help="the --json of an earlier run (same settings) to report with this one's",
    )
    args = p.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    shares = tuple(float(s) for s in args.shares.split(","))
    cuts = tuple(float(c) for c in args.cuts.split(","))
    if not cuts or any(c not in CUTS for c in cuts):
        p.error(f"--cuts must be some of {CUTS}")
    if not shares or any(s not in (0.01, 0.02, 0.05, 0.1) for s in shares):
        p.error("--shares must be some of 0.01, 0.02, 0.05, 0.1")
    if any(not 1 <= s <= 1000 for s in scales) or not 1 <= args.draws <= 20:
        p.error("scales must be in [1, 1000] and --draws in [1, 20]")
    say = Clock()
    t0 = time.perf_counter()
    real = movielens.load()
    cal = simulator.fit(real)
    say(f"calibrated: C = {cal.c}, holdout log-loss {cal.holdout_log_loss:.4f}")
    included: list[dict[str, Any]] = []
    for path in args.include:
        included += [r for r in json.loads(path.read_text()) if r["shares"] == list(shares)]
    results: list[dict[str, Any]] = []
    if not args.no_real:
        results.append(measure(real, "real", args.draws, say, bayes=False, shares=shares))
    for k in scales:
        say(f"simulating ×{k} ({args.grow}): {len(cal.users) * k:,} events")
        results.append(
            measure_stream(cal, k, args.grow, f"x{k}", args.draws, say, shares=shares, cuts=cuts)
        )
        results[-1]["grow"] = args.grow
        if args.json:  # after every stream: a long run's finished streams are kept
            args.json.write_text(json.dumps(results))
    if args.json:
        args.json.write_text(json.dumps(results))
    results = included + results
    command = (
        f"python -m bench.accuracy.regime --scales {args.scales} --draws {args.draws} "
        f"--shares {args.shares} --grow {args.grow}"
    )
    command += " --no-real" if args.no_real else ""
    command += f" --cuts {args.cuts}" if cuts != CUTS else ""
    command += "".join(f" --include {path}" for path in args.include)
    command += f" --plot {args.plot}" if args.plot != "regime" else ""
    report(results, command, (time.perf_counter() - t0) / 60, args.plot)


if __name__ == "__main__":
    main()

"""The regime benchmark's baseline at the largest scales, trained on other 1M-row samples
(issue 18 at ×1000): the regime's baseline trains on the last ``BASELINE_CAP`` (1M) events
before the cut, which at ×1000 is the last 1 % of the stream, the rows of the 1 % hot window
itself, not the "full-data" baseline Pyramid's claim is against (LightGBM on 70–90M raw events
does not fit the machine's time). This prints that baseline beside two samples of the same size
over longer spans: every s-th event of the last 10 % (the span the capped baseline had at ×100)
and every s-th event of the whole stream before the cut, with the label prior and the Bayes
log-loss of the simulator's true probabilities on the same test rows.

`python -m bench.accuracy.regime_baselines [--scale 1000] [--cuts 0.7,0.9] [--grow users]
[--spans last,tenth,all]` (``last``: the regime's baseline again)"""

from __future__ import annotations

import argparse

import numpy as np

from bench import lgbm, movielens
from bench.accuracy import sim_stream, simulator
from bench.accuracy.plan import Privacy, Sketching, make_plan
from bench.accuracy.regime import BASELINE_CAP, CUTS, SEED, TRAINING
from bench.report import Clock
from service.core.features.runtime import StreamRuntime


def sample(
    cal: simulator.Calibration, scale: int, grow: str, lo: int, hi: int, rows: int
) -> sim_stream.Events:
    """Every s-th event of ``lo .. hi − 1`` (s = ⌈(hi − lo) ÷ rows⌉, the last one included)."""
    step = -(-(hi - lo) // rows)
    parts = []
    for a in range(lo, hi, sim_stream.CHUNK):
        b = min(hi, a + sim_stream.CHUNK)
        ev = sim_stream.events(cal, scale, SEED + scale, a, b, grow=grow)
        first = (hi - 1 - a) % step  # positions ≡ hi − 1 (mod step)
        parts.append(ev.take(np.arange(first, b - a, step)))
    return sim_stream.Events.concat(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.accuracy.regime_baselines", description=__doc__
    )
    p.add_argument("--scale", type=int, default=1000)
    p.add_argument("--cuts", default="0.7,0.9")
    p.add_argument("--grow", choices=simulator.GROWTHS, default="users")
    p.add_argument("--spans", default="last,tenth,all")
    args = p.parse_args(argv)
    cuts = tuple(float(c) for c in args.cuts.split(","))
    if any(c not in CUTS for c in cuts) or not 1 <= args.scale <= 1000:
        p.error(f"--cuts must be some of {CUTS}, --scale in [1, 1000]")
    say = Clock()
    cal = simulator.fit(movielens.load())
    plan = make_plan(len(cal.users) * args.scale, cuts)
    cfg = Sketching().stream_config(Privacy("none"))
    rt = StreamRuntime(1, "core", cfg, b"bench-accuracy-core", ())
    keys = sim_stream.Keys(cal, args.scale, args.grow, rt)
    wanted = args.spans.split(",")
    print("| cut | training rows | span | log-loss | prior | Bayes |")
    print("|---|---|---|---|---|---|")
    for cut in plan.cuts:
        test = sim_stream.events(cal, args.scale, SEED + args.scale, cut, cut + plan.test_rows)
        y_test = test.label.astype(np.float64)
        x_test = keys.raw_frame(test)
        bayes = lgbm.log_loss(y_test, test.p_true)
        spans = {
            "last": ("the last events (the regime's)", max(0, cut - BASELINE_CAP)),
            "tenth": ("the last 10 %, every s-th", max(0, cut - plan.n // 10)),
            "all": ("everything before the cut, every s-th", 0),
        }
        for name, lo in (spans[s] for s in wanted):
            ev = sample(cal, args.scale, args.grow, lo, cut, BASELINE_CAP)
            y = ev.label.astype(np.float64)
            prob, _ = lgbm.fit_predict(keys.raw_frame(ev), y, x_test, TRAINING)
            loss = lgbm.log_loss(y_test, prob)
            prior = lgbm.log_loss(y_test, np.full(len(y_test), y.mean()))
            print(
                f"| {cut / plan.n:.0%} | {len(y):,} | {name} ({cut - lo:,} events) | {loss:.4f} "
                f"| {prior:.4f} | {bayes:.4f} |",
                flush=True,
            )
            say(f"cut {cut}: {name}: {loss:.4f}")


if __name__ == "__main__":
    main()

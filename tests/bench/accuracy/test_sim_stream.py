"""The chunked simulator stream (``bench.accuracy.sim_stream``, issue 18 at ×1000) against the
whole-frame path it replaces (``simulator.simulate`` + ``ColumnArm``): the same events, the same
tables after every count period, the same features, exact counts and baseline frames, and the
same no-noise log-losses, at small scales and with chunks that do not line up with anything."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from bench import lgbm, movielens
from bench.accuracy import regime, regime_baselines, sim_stream, simulator
from bench.accuracy.plan import Privacy, Sketching, make_plan

pytestmark = [
    pytest.mark.skipif(
        not movielens.available(), reason=f"MovieLens 100K not found under {movielens.DATA}"
    ),
    pytest.mark.slow,  # fits the calibration (about 10 s) and a few small LightGBM models
]


@functools.cache
def calibrated() -> simulator.Calibration:
    return simulator.fit(movielens.load())


@pytest.mark.parametrize("grow", simulator.GROWTHS)
def test_events_in_any_chunks_are_the_simulated_stream(grow: str) -> None:
    cal = calibrated()
    k, seed = 3, 21
    sim = simulator.simulate(cal, k, seed, grow=grow)
    n = len(sim)
    bounds = [0, 1, 999, 77_777, 150_001, n]
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    ev = sim_stream.Events.concat(
        [sim_stream.events(cal, k, seed, a, b, grow=grow) for a, b in pairs]
    )
    assert np.array_equal(ev.p_true, sim["p_true"].to_numpy())
    assert np.array_equal(ev.label, (sim["label"] == "1").to_numpy())
    rt = simulator.ColumnArm(sim.iloc[:100], Sketching(), lgbm.DEFAULT).runtime(Privacy("none"))
    keys = sim_stream.Keys(cal, k, grow, rt)
    for f in movielens.CATEGORICAL:
        values = np.array([b.decode() for b in keys.encoded[f].keys], dtype=object)
        assert values[keys.codes(f, ev)].tolist() == sim[f].tolist(), f
    with pytest.raises(ValueError, match="outside the stream"):
        sim_stream.events(cal, k, seed, 0, n + 1)


def test_chunked_tables_features_and_baseline_frames_are_the_frame_paths() -> None:
    cal = calibrated()
    k, seed, shares = 3, 22, (0.01, 0.1)
    sim = simulator.simulate(cal, k, seed)
    plan = make_plan(len(sim), regime.CUTS)
    column = simulator.ColumnArm(sim, Sketching(), lgbm.DEFAULT)
    arm = sim_stream.StreamArm(
        cal, k, seed, plan, shares, Sketching(), lgbm.DEFAULT,
        kinds=("median", "min"), baseline_cap=40_000, train_cap=10_000, chunk=70_001,
    )  # fmt: skip
    counted = {cut - plan.window(s) for s in shares for cut in plan.cuts}
    assert {u for u, _ in arm._increments} == counted
    for (upto, kind), (tables, prior) in arm._increments.items():
        want, want_prior = column.increments(upto, kind)
        assert all(np.array_equal(a, b) for a, b in zip(tables, want, strict=True)), (upto, kind)
        assert np.array_equal(prior, want_prior)
    rt = column.runtime(Privacy("none"))
    thresholds = [3.0] * len(rt.tables)
    for cut in plan.cuts:
        upto, test = cut - plan.window(0.01), plan.test(cut)
        for kind in ("median", "min"):
            a, est_a = column.featurize(rt, column.increments(upto, kind), thresholds, test, kind)
            rows = arm.rows(test)
            b, est_b = arm.featurize(rt, arm.increments(upto, kind), thresholds, rows, kind)
            assert np.array_equal(a, b) and np.array_equal(est_a, est_b)
        assert np.array_equal(
            column.exact_movie_counts(upto, test), arm.exact_movie_counts(upto, arm.rows(test))
        )
        assert arm.bayes_log_loss(test) == simulator.bayes_log_loss(sim, test)
        # the baseline's frames: values and category codes as movielens.raw_frame's
        raw = movielens.raw_frame(sim)
        for sl in (slice(cut - 40_000, cut), test):
            got, y = arm.raw(sl)
            pd.testing.assert_frame_equal(got, raw.iloc[sl].reset_index(drop=True))
            assert np.array_equal(y, movielens.labels01(sim)[sl])
    # a 10 % window (30,000 rows) above the cap trains on every 3rd row, the 1 % on all
    hot = slice(plan.cuts[0] - plan.window(0.1), plan.cuts[0])
    rows = arm.train_rows(hot)
    assert len(arm.y[rows]) == 10_000
    assert np.array_equal(arm.y[rows], movielens.labels01(sim)[hot][::3])
    small = slice(plan.cuts[0] - plan.window(0.01), plan.cuts[0])
    assert np.array_equal(arm.y[arm.train_rows(small)], movielens.labels01(sim)[small])
    with pytest.raises(KeyError, match="not kept"):
        arm.rows(slice(10, 20))


def test_chunked_no_noise_log_losses_are_the_frame_paths() -> None:
    cal = calibrated()
    seed = 23
    sim = simulator.simulate(cal, 1, seed)
    plan = make_plan(len(sim), regime.CUTS)
    column = simulator.ColumnArm(sim, Sketching(), regime.TRAINING)
    arm = sim_stream.StreamArm(
        cal, 1, seed, plan, (0.02,), Sketching(), regime.TRAINING, chunk=33_333
    )  # fmt: skip
    a = column.run(plan, 0.02, Privacy("none"), kinds=("median",))
    b = arm.run(plan, 0.02, Privacy("none"), kinds=("median",))
    assert [e.log_loss for e in a] == [e.log_loss for e in b]
    assert [e.est_rmse for e in a] == [e.est_rmse for e in b]


def test_baseline_samples_are_every_sth_event_ending_at_the_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cal = calibrated()
    monkeypatch.setattr(sim_stream, "CHUNK", 10_000)  # the sample crosses chunks
    got = regime_baselines.sample(cal, 2, "users", 1_000, 50_001, 7_000)
    full = sim_stream.events(cal, 2, regime.SEED + 2, 1_000, 50_001)
    every = np.arange(50_000 - 1_000, -1, -8)[::-1]  # ⌈49,001 ÷ 7,000⌉ = 8, the last included
    assert np.array_equal(got.p_true, full.p_true[every])
    assert np.array_equal(got.label, full.label[every]) and len(every) <= 7_000

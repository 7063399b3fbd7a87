"""The drift evaluation: its base-rate arithmetic, the noise it draws (the service's, at the
budget's scales, the prior table's included), its counts (the service's counting, exact without
noise), a split end to end on a small synthetic stream, and ``--quick`` on MovieLens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import lgbm, movielens
from bench.accuracy import drift, drift_arm, drift_report
from bench.accuracy.drift_arm import DriftArm
from bench.accuracy.drift_streams import DriftStream
from bench.report import Clock
from service.core.dp.budget import noise_for
from service.core.tables.sketch import estimate


def synthetic(windows: int = 6, rows: int = 1500, seed: int = 1) -> DriftStream:
    """Two categorical features; the label depends on both, its base rate jumps in the last
    two windows."""
    rng = np.random.default_rng(seed)
    n = windows * rows
    a = rng.integers(0, 20, n)
    b = rng.integers(0, 4, n)
    shift = np.where(np.arange(n) >= (windows - 2) * rows, 1.0, 0.0)
    z = (a - 10) / 6 + (b == 2) - 0.3 + shift
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.float64)
    return DriftStream(
        "synthetic",
        "synthetic",
        ({"name": "a", "kind": "categorical"}, {"name": "b", "kind": "categorical"}),
        {"a": np.array([f"a{v}" for v in a], dtype=object), "b": b.astype(str).astype(object)},
        y,
        tuple(range(0, n + 1, rows)),
        tuple(f"w{i}" for i in range(windows)),
        ("time",) * windows,
        (windows - 2, windows - 1),
    )


def test_recency_rate_weights_the_newest_windows_and_clamps_noise() -> None:
    counts = np.array([[50, 50], [10, 90]])
    assert drift.recency_rate(counts, math.inf) == pytest.approx(140 / 200)
    assert drift.recency_rate(counts, 1e-9) == pytest.approx(0.9)
    assert drift.recency_rate(counts, 1.0) == pytest.approx((0.5 * 50 + 90) / (0.5 * 100 + 100))
    # a noisy negative count counts as 0, as the service's prior does
    assert drift.recency_rate(np.array([[-7, 30], [10, 10]]), math.inf) == pytest.approx(40 / 50)


def test_shift_and_oracle() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 4000)
    y = (rng.random(4000) < np.clip(p + 0.1, 0, 1)).astype(np.float64)
    assert drift.shifted(np.array([0.3]), 0.6, 0.3)[0] == pytest.approx(0.6)
    # the oracle never does worse than the model, and a constant becomes the test rate
    assert drift.recalibrated(y, p) <= lgbm.log_loss(y, p)
    assert drift.recalibrated(y, np.full(len(y), 0.2)) == pytest.approx(
        lgbm.log_loss(y, np.full(len(y), y.mean())), abs=1e-9
    )


def test_noise_is_the_services_at_the_budgets_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table's and the prior table's noise per window: the service's sampler, laplace at
    ε = 1, scale Δ1/ε = T·depth (T = features + the prior table), from service.core.dp.budget."""
    arm = DriftArm(synthetic())
    calls: list[tuple[str, float, int]] = []
    real = drift_arm.sample_noise

    def spy(*, mechanism: str, scale: float, size: int) -> np.ndarray:
        calls.append((mechanism, scale, size))
        return real(mechanism=mechanism, scale=scale, size=size)  # type: ignore[arg-type]

    monkeypatch.setattr(drift_arm, "sample_noise", spy)
    draw = arm.draw([1, 2], n_windows=3)
    rt = arm.runtime(1)
    noise = noise_for(rt.config)
    assert noise.scale == pytest.approx(3 * drift_arm.DEPTH / drift_arm.EPSILON)
    tables = [c for c in calls if c[2] == rt.spec.cells]
    priors = [c for c in calls if c[2] == 2]
    assert len(tables) == 2 * 2 and len(priors) == 3  # 2 windows × 2 tables; 3 prior tables
    assert {c[0] for c in calls} == {"laplace"}
    assert {c[1] for c in tables} == {noise.scale_for(1.0)}
    assert {c[1] for c in priors} == {noise.scale_for(rt.prior_weight)}
    # the released prior tables are the windows' label counts plus that noise
    released = arm.noisy_prior(draw, range(3))
    assert (released - arm.window_counts[:3] == draw.prior).all()
    assert (draw.prior != 0).any()


def test_counts_are_exact_without_noise() -> None:
    s = synthetic()
    arm = DriftArm(s)
    rt = arm.runtime(1)
    cells = arm.exact(2)
    upto = s.bounds[2]
    frame = pd.DataFrame({"a": s.values["a"][:upto], "y": s.y[:upto].astype(int)})
    want = frame.groupby(["a", "y"]).size().unstack(fill_value=0)
    enc = arm.encoded["a"]
    buckets, signs = arm.hashes[0]
    got = estimate(cells[0], buckets, signs, rt.spec)
    for code, key in enumerate(enc.keys):
        assert got[code].tolist() == want.loc[key.decode()].tolist()


@pytest.mark.slow  # the benchmark end to end on a synthetic stream (over a second of CPU)
def test_a_split_end_to_end(tmp_path: Path) -> None:
    s = synthetic()
    arm = DriftArm(s)
    setup = drift.Setup(streams=("synthetic",), hots=(1, 2), draws=2)
    records = drift.evaluate(arm, 5, setup, Clock())
    frame = pd.DataFrame(records)
    assert set(frame.model) == {"prior", "raw", "raw-hot", "counts"}
    counts = frame[frame.model == "counts"]
    assert set(counts.draw) == {0, 1} and set(counts.hot) == {1, 2}
    variants = set(counts.variant)
    assert {"columns", "reweight H=2", "passthrough", "prior columns", "shift H=∞"} <= variants
    if drift_arm.shrinkage_module() is not None:
        assert {"empirical Bayes", "empirical Bayes + passthrough"} <= variants
    assert set(frame[frame.model == "raw-hot"].hot) == {1, 2}
    assert counts.target.dropna().between(0, 1).all()
    # the raw model trains on every row before the test window: it beats the prior here
    prior, raw = frame[frame.model == "prior"].iloc[0], frame[frame.model == "raw"].iloc[0]
    assert raw.ll < prior.ll
    fig = drift_report.figures(frame.assign(stream="synthetic"))
    assert np.isfinite(fig[["share", "share_oracle", "auc_lift"]].to_numpy()).all()
    # an intercept shift changes neither the ranking nor the oracle's log-loss
    cols = counts[(counts.hot == 1) & (counts.draw == 0)].set_index("variant")
    assert cols.loc["shift H=1", "auc"] == pytest.approx(cols.loc["columns", "auc"])
    assert cols.loc["shift H=1", "ll_oracle"] == pytest.approx(
        cols.loc["columns", "ll_oracle"], abs=1e-6
    )


@pytest.mark.slow  # an end-to-end run on MovieLens (about 12 s of CPU)
@pytest.mark.skipif(not movielens.available(), reason="MovieLens 100K not found")
def test_quick_run_writes_its_tables_plot_and_csvs(tmp_path: Path) -> None:
    drift.main(["--quick", "--workers", "1", "--out-dir", str(tmp_path)])
    frame = pd.read_csv(tmp_path / "accuracy_drift_quick.csv")
    splits = pd.read_csv(tmp_path / "accuracy_drift_splits_quick.csv")
    assert (tmp_path / "accuracy_drift_quick.png").stat().st_size > 0
    assert set(frame.stream) == {"movielens"} and set(frame.split) == {9}
    assert {"share", "share_oracle", "auc_lift"} <= set(splits.columns)


def test_an_operating_point_sets_tables_sketch_and_weights_through_the_service() -> None:
    """Fewer tables and depth 1: the service's budget gives Laplace b = T·depth/ε per cell (T =
    tables + the prior table), weights scale each table's by (W/T)/w; the raw hot values stay
    every feature's."""
    s = synthetic()
    point = drift_arm.Point(label="a only, depth 1", depth=1, features=("a",))
    arm = DriftArm(s, point=point)
    rt = arm.runtime(1)
    assert [t.features for t in rt.tables] == [("a",)]
    assert rt.spec.depth == 1 and rt.config.max_tables == 2
    noise = noise_for(rt.config)
    assert noise.scale == pytest.approx(2 * 1 / drift_arm.EPSILON)
    assert len(arm.exact(2)) == 1
    train, test = s.rows(3, 4), s.window(4)
    tr, te = arm.passthrough(train, test)
    assert list(tr.columns) == ["a_value", "b_value"] and len(te) == 1500
    weighted = DriftArm(
        s,
        point=drift_arm.Point(label="w", depth=1, weights=(("b", 0.25),), prior_weight=0.25),
    )
    wrt = weighted.runtime(1)
    wn = noise_for(wrt.config)
    a, b = wrt.tables
    assert wn.scale_for(wrt.weight_of(a)) == pytest.approx(3 * (1.5 / 3) / 1.0)
    assert wn.scale_for(wrt.weight_of(b)) == pytest.approx(3 * (1.5 / 3) / 0.25)
    with pytest.raises(ValueError, match="not features"):
        DriftArm(s, point=drift_arm.Point(features=("nope",)))


@pytest.mark.slow  # several operating points end to end on MovieLens (about 3 s of CPU)
def test_operating_points_end_to_end_and_their_table() -> None:
    s = synthetic()
    points = (
        drift_arm.DEFAULT_POINT,
        drift_arm.Point(label="a only, depth 1", depth=1, features=("a",)),
    )
    arms = [DriftArm(s, point=p) for p in points]
    setup = drift.Setup(streams=("synthetic",), hots=(1, 3), draws=2, points=points)
    frame = pd.DataFrame(drift.evaluate_points(arms, 5, setup, Clock()))
    counts = frame[frame.model == "counts"]
    assert set(counts.point) == {p.label for p in points}
    assert set(counts.variant) == {"columns", "passthrough"} and set(counts.hot) == {1, 3}
    assert len(counts) == 2 * 2 * 2 * 2  # points × draws × h × variants
    assert (frame.model == "raw").sum() == 1 and (frame.model == "raw-hot").sum() == 2


@pytest.mark.skipif(not movielens.available(), reason="MovieLens 100K not found")
def test_cli_operating_point_options() -> None:
    p = drift.parser()
    args = p.parse_args(
        [
            "--streams",
            "movielens",
            "--depth",
            "1",
            "--features",
            "user_id,movie_id",
            "--weights",
            "user_id=2,prior=0.1",
            "--hot",
            "1,3",
        ]
    )
    point = drift.point_of(args, p)
    assert point.depth == 1 and point.features == ("user_id", "movie_id")
    assert point.weights == (("user_id", 2.0),) and point.prior_weight == pytest.approx(0.1)
    assert args.hot == (1, 3)
    with pytest.raises(SystemExit):
        p.parse_args(["--weights", "user_id=x"])
    with pytest.raises(SystemExit):
        p.parse_args(["--hot", "0"])
    bad = p.parse_args(["--streams", "movielens", "--features", "user_id,nope"])
    with pytest.raises(SystemExit):  # the service's validation names the feature
        drift.point_of(bad, p)

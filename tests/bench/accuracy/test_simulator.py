"""The MovieLens-calibrated simulator (issue 18, part 2): its stream keeps MovieLens's users,
arrival order and per-key label rates, scales by repeating each real rating's user, and its
column-encoded core arm featurizes exactly as the core arm does."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from bench import lgbm, movielens
from bench.accuracy import pair_effects, regime, simulator
from bench.accuracy.core_arm import CoreArm
from bench.accuracy.plan import Privacy, Sketching

pytestmark = [
    pytest.mark.skipif(
        not movielens.available(), reason=f"MovieLens 100K not found under {movielens.DATA}"
    ),
    pytest.mark.slow,  # fits a logistic regression on 100,000 ratings (about 10 s)
]


def assert_rates_close(sim: pd.DataFrame, df: pd.DataFrame) -> None:
    """The ×1 check: overall and per-user label rates close to the real ones (shrunk, hence
    the tolerance)."""
    assert abs((sim["label"] == "1").mean() - (df["label"] == "1").mean()) < 0.01
    real_rate = (df["label"] == "1").groupby(df["user_id"]).mean()
    sim_rate = sim["p_true"].groupby(sim["user_id"]).mean()
    heavy = df["user_id"].value_counts()
    heavy = heavy[heavy >= 100].index
    assert np.corrcoef(real_rate[heavy], sim_rate[heavy])[0, 1] > 0.9


@functools.cache
def calibrated() -> tuple[pd.DataFrame, simulator.Calibration]:
    df = movielens.load()
    return df, simulator.fit(df)


def test_calibration_reproduces_the_per_key_label_rates() -> None:
    df, cal = calibrated()
    assert cal.c in simulator.C_GRID
    # better than the label prior on the held-out 20 %: the effects carry signal
    y = movielens.labels01(df)
    split = int(0.8 * len(df))
    prior = lgbm.log_loss(y[split:], np.full(len(df) - split, y[:split].mean()))
    assert cal.holdout_log_loss < prior - 0.03
    sim = simulator.simulate(cal, 1, seed=3)
    assert sim["user_id"].tolist() == df["user_id"].tolist()  # real pairs, real order at ×1
    assert sim["movie_id"].tolist() == df["movie_id"].tolist()
    assert sim["genres"].tolist() == df["genres"].tolist()
    assert sim["zip3"].tolist() == df["zip3"].tolist()
    assert_rates_close(sim, df)


def test_pair_effects_keep_the_check_and_plant_only_what_the_data_supports() -> None:
    """MovieLens's genre × age and genre × gender interactions are real (τ̂ > 0.05 log-odds)
    but small; with them the simulator still passes the ×1 check above and, off, nothing
    changes."""
    df, cal = calibrated()
    pairs = pair_effects.estimate(df, cal)
    assert [f"{p.movie_column}+{p.user_column}" for p in pairs] == [
        "genres+age",
        "genres+gender",
        "genres+occupation",
    ]
    taus = {f"{p.movie_column}+{p.user_column}": p.tau for p in pairs}
    assert 0.05 < taus["genres+age"] < 0.5 and 0.05 < taus["genres+gender"] < 0.5
    with_pairs = pair_effects.add(cal, pairs)
    y = movielens.labels01(df)
    fitted = lgbm.log_loss(y, with_pairs.probability(cal.users, cal.movies))
    assert fitted < lgbm.log_loss(y, cal.probability(cal.users, cal.movies))  # closer to the data
    sim = simulator.simulate(with_pairs, 1, seed=3)
    assert_rates_close(sim, df)
    # the planted genre × gender effect shows in the simulated labels' genre rates by gender
    real_gap = (df["label"] == "1").groupby([df["genres"], df["gender"]]).mean().unstack()
    sim_gap = sim["p_true"].groupby([sim["genres"], sim["gender"]]).mean().unstack()
    big = df["genres"].value_counts()
    big = big[big >= 2000].index
    gap = (real_gap["F"] - real_gap["M"])[big], (sim_gap["F"] - sim_gap["M"])[big]
    base = simulator.simulate(cal, 1, seed=3)
    base_gap = base["p_true"].groupby([base["genres"], base["gender"]]).mean().unstack()
    plain = (base_gap["F"] - base_gap["M"])[big]
    assert np.abs(gap[0] - gap[1]).mean() < np.abs(gap[0] - plain).mean()
    assert simulator.simulate(pair_effects.add(cal, pairs, gain=0.0), 1, seed=3).equals(base)


def test_growing_users_copies_each_user_with_its_attributes_and_effect() -> None:
    df, cal = calibrated()
    k = 4
    sim = simulator.simulate(cal, k, seed=2)  # grow="users", the default
    assert len(sim) == k * len(df)
    ids = sim["user_id"].to_numpy().reshape(-1, k)
    assert ids[:, 0].tolist() == df["user_id"].tolist()
    for j in range(1, k):
        assert ids[:, j].tolist() == [f"{u}~{j}" for u in df["user_id"]]
    for column in ("age", "gender", "occupation", "zip3"):
        assert (sim[column].to_numpy().reshape(-1, k) == df[column].to_numpy()[:, None]).all()
    assert sim["user_id"].nunique() == k * df["user_id"].nunique()
    # the same movie gives a copy the real user's probability
    same = sim["movie_id"].to_numpy().reshape(-1, k) == df["movie_id"].to_numpy()[:, None]
    p = sim["p_true"].to_numpy().reshape(-1, k)
    assert np.allclose(p[same], np.broadcast_to(p[:, :1], p.shape)[same])
    with pytest.raises(ValueError, match="grow must be one of"):
        simulator.simulate(cal, 2, seed=1, grow="keys")


def test_scaling_keeps_users_and_arrival_and_draws_block_movies() -> None:
    df, cal = calibrated()
    k = 3
    sim = simulator.simulate(cal, k, seed=4, grow="events")
    assert len(sim) == k * len(df)
    # every real rating's user k times in a row, the first event the real movie
    assert sim["user_id"].to_numpy()[::k].tolist() == df["user_id"].tolist()
    assert (sim["user_id"].to_numpy().reshape(-1, k) == df["user_id"].to_numpy()[:, None]).all()
    assert sim["movie_id"].to_numpy()[::k].tolist() == df["movie_id"].tolist()
    # the other movies come from the same block of real ratings
    block = simulator.BLOCK
    extra = sim["movie_id"].to_numpy().reshape(-1, k)[:, 1:]
    for b in (0, 37, len(df) // block - 1):
        allowed = set(df["movie_id"].iloc[b * block : (b + 1) * block])
        assert set(extra[b * block : (b + 1) * block].reshape(-1)) <= allowed
    # seeded: the same seed, the same stream; another seed, other labels
    again = simulator.simulate(cal, k, seed=4, grow="events")
    assert again["label"].tolist() == sim["label"].tolist()
    other = simulator.simulate(cal, k, seed=5, grow="events")
    assert other["label"].tolist() != sim["label"].tolist()
    with pytest.raises(ValueError, match="scale must be >= 1"):
        simulator.simulate(cal, 0, seed=1)


def test_column_arm_matches_the_core_arm() -> None:
    df, cal = calibrated()
    sim = simulator.simulate(cal, 1, seed=6).iloc[:20_000]
    core = CoreArm(sim, Sketching(), lgbm.DEFAULT)
    column = simulator.ColumnArm(sim, Sketching(), lgbm.DEFAULT)
    for name, enc in core.encoded.items():
        assert column.encoded[name].keys == enc.keys
        assert (column.encoded[name].codes == enc.codes).all()
    rt = core.runtime(Privacy("none"))
    test = slice(10_000, 11_000)
    thresholds = [0.0] * len(rt.tables)
    a, _ = core.featurize(rt, core.increments(10_000, "median"), thresholds, test, "median")
    b, _ = column.featurize(rt, column.increments(10_000, "median"), thresholds, test, "median")
    assert np.array_equal(a, b)
    assert simulator.bayes_log_loss(sim, test) < lgbm.log_loss(
        movielens.labels01(sim.iloc[test]), np.full(1000, 0.55)
    )


def test_regime_ratios() -> None:
    res = {
        "label": "x1",
        "n": 100_000,
        "baseline": [0.6, 0.5],
        "bayes": [0.57, 0.45],
        "shares": list(regime.SHARES),
        "count": {
            f"{s}|{k}": ([[0.63, 0.52]] if k == "no noise" else [[0.66, 0.55], [0.6, 0.55]])
            for s in regime.SHARES
            for k in ("no noise", "laplace ε=1")
        },
    }
    q = regime.ratios(res)
    share = regime.SHARES[0]
    assert q[f"{share}|no noise"] == pytest.approx((0.63 / 0.6 + 0.52 / 0.5) / 2)
    draws = [(0.66 / 0.6 + 0.55 / 0.5) / 2, (0.6 / 0.6 + 0.55 / 0.5) / 2]
    assert q[f"{share}|laplace ε=1"] == pytest.approx(sum(draws) / 2)
    assert q[f"{share}|dp"] == pytest.approx(q[f"{share}|laplace ε=1"] / q[f"{share}|no noise"])
    assert q["bayes"] == pytest.approx((0.57 / 0.6 + 0.45 / 0.5) / 2)

"""The pair-effect estimator (``bench.accuracy.pair_effects``): on synthetic labels it recovers a
planted interaction's standard deviation and the interaction itself, removes main effects, and
shrinks to ~0 when there is no interaction; the simulator's label model is unchanged without
pair effects; the selection benchmark names the planted groups and reports them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.accuracy import pair_effects, selection_sim, simulator


def synthetic(tau: float, seed: int) -> tuple[np.ndarray, ...]:
    """300,000 observations in 40 × 6 cells with log-odds offset + row and column main effects
    (which the estimator must not count as interaction) + an interaction of sd ``tau``."""
    rng = np.random.default_rng(seed)
    n, n_rows, n_cols = 300_000, 40, 6
    rows = rng.integers(0, n_rows, n)
    cols = rng.integers(0, n_cols, n)
    offset = rng.normal(0.2, 0.8, n)
    main = rng.normal(0, 0.3, n_rows)[rows] + rng.normal(0, 0.3, n_cols)[cols]
    delta = rng.normal(0, tau, (n_rows, n_cols)) if tau > 0 else np.zeros((n_rows, n_cols))
    p = 1 / (1 + np.exp(-(offset + main + delta[rows, cols])))
    y = (rng.random(n) < p).astype(np.float64)
    return rows, cols, y, offset, delta


@pytest.mark.slow  # statistical: two simulations of 300,000 observations (a second of CPU)
def test_recovers_a_planted_interaction() -> None:
    # fixed seeds: deterministic; the tolerance is ~4 standard errors of τ̂ (240 cells)
    for seed in (1, 2):
        rows, cols, y, offset, delta = synthetic(0.25, seed)
        effect, tau2 = pair_effects.interaction(rows, cols, y, offset)
        # the planted sd net of what main effects absorb (its two-way centred version)
        centred = delta - delta.mean(axis=0) - delta.mean(axis=1)[:, None] + delta.mean()
        assert np.sqrt(tau2) == pytest.approx(centred.std(), rel=0.2)
        assert np.corrcoef(effect.reshape(-1), centred.reshape(-1))[0, 1] > 0.85
        # shrunk: never larger in spread than the raw estimate it comes from
        assert effect.std() < np.sqrt(tau2)


@pytest.mark.slow  # statistical: two simulations of 300,000 observations (a second of CPU)
def test_no_interaction_shrinks_to_about_zero() -> None:
    for seed in (3, 4):
        rows, cols, y, offset, _ = synthetic(0.0, seed)
        effect, tau2 = pair_effects.interaction(rows, cols, y, offset)
        assert np.sqrt(tau2) < 0.05  # main effects of sd 0.3 are not taken for interaction
        assert np.abs(effect).max() < 0.03


def test_two_way_residual_removes_main_effects_exactly() -> None:
    rng = np.random.default_rng(5)
    rows = np.repeat(np.arange(5), 4)
    cols = np.tile(np.arange(4), 5)
    w = rng.uniform(1, 10, 20)
    r = rng.normal(size=5)[rows] + rng.normal(size=4)[cols]
    assert np.abs(pair_effects.two_way_residual(r, w, rows, cols)).max() < 1e-9


def tiny_calibration() -> simulator.Calibration:
    """3 users × 4 movies, enough for the label model's arithmetic."""
    return simulator.Calibration(
        users=np.array([0, 1, 2, 0, 1, 2, 0, 1]),
        movies=np.array([0, 1, 2, 3, 0, 1, 2, 3]),
        user_table=pd.DataFrame(
            {
                "user_id": ["1", "2", "3"],
                "age": [20, 40, 60],
                "gender": ["F", "M", "F"],
                "occupation": ["a", "b", "a"],
                "zip3": ["100", "200", "300"],
            }
        ),
        movie_table=pd.DataFrame(
            {"movie_id": ["10", "11", "12", "13"], "genres": ["Drama", "Comedy", "Drama", "War"]}
        ),
        intercept=0.2,
        user_effect=np.array([0.1, -0.3, 0.5]),
        movie_effect=np.array([-0.2, 0.4, 0.0, 0.7]),
        c=1.0,
        holdout_log_loss=0.6,
    )


def test_without_pair_effects_the_label_model_is_unchanged() -> None:
    cal = tiny_calibration()
    assert cal.pairs == ()
    u, m = cal.users, cal.movies
    before = 1.0 / (1.0 + np.exp(-(cal.intercept + cal.user_effect[u] + cal.movie_effect[m])))
    assert np.array_equal(cal.probability(u, m), before)  # bit for bit: the streams are equal
    pair = simulator.PairEffect(
        "genres",
        "gender",
        pair_effects.levels(cal.movie_table, "genres"),
        pair_effects.levels(cal.user_table, "gender"),
        np.array([[0.5, -0.5], [0.0, 0.2], [0.1, 0.0]]),
        0.3,
    )
    off = pair_effects.add(cal, (pair,), gain=0.0)
    a = simulator.simulate(cal, 2, seed=9)
    b = simulator.simulate(off, 2, seed=9)
    assert a.equals(b)
    on = pair_effects.add(cal, (pair,), gain=2.0)
    z = cal.log_odds(u, m) + 2.0 * pair.effect[pair.movie_level[m], pair.user_level[u]]
    assert np.allclose(on.log_odds(u, m), z)
    assert on.pairs[0].tau == pytest.approx(0.6)
    with pytest.raises(ValueError, match="gain must be >= 0"):
        pair_effects.add(cal, (pair,), gain=-1.0)


def test_age_levels_are_the_buckets_its_table_counts() -> None:
    table = pd.DataFrame({"age": [17, 18, 30, 56, 70]})
    assert pair_effects.levels(table, "age").tolist() == [0, 1, 2, 5, 5]


def test_selection_bench_names_and_reports_the_planted_groups(tmp_path: Path) -> None:
    cal = tiny_calibration()
    pairs = tuple(
        simulator.PairEffect(
            "genres",
            col,
            pair_effects.levels(cal.movie_table, "genres"),
            pair_effects.levels(cal.user_table, col),
            np.full((3, levels), 0.1 if tau else 0.0),
            tau,
        )
        for col, levels, tau in (("gender", 2, 0.2), ("age", 6, 0.0))
    )
    cal = pair_effects.add(cal, pairs)
    assert selection_sim.planted(cal) == (("gender", "genres"),)  # τ̂ = 0 is not planted
    res = {
        "scale": 1,
        "arms": ["aic", "aic-t1e-3"],
        "fixed": [["gender", "genres"]],
        "bound": 0.99,
        "picks": {"aic": [["gender", "genres"]], "aic-t1e-3": []},
        "losses": {k: [0.6, 0.5] for k in ("without", "aic", "aic-t1e-3", "fixed")},
        "pairs": pair_effects.summary(cal),
        "gain": 1.0,
    }
    out = tmp_path / "report.md"
    selection_sim.append_report([res, res, res | {"scale": 10}], 1.0, "1,10", out)
    text = out.read_text()
    assert "with MovieLens's pair effects" in text
    assert "--pair-effects --pair-gain 1.0" in text
    assert "fixed gender+genres ÷ without" in text
    assert "genres+gender: τ̂ = 0.200" in text
    assert "0.9900" in text  # the bound
    assert "| ×1 | 2 |" in text and "| ×10 | 1 |" in text  # replays numbered per scale

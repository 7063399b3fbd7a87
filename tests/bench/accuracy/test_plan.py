"""The accuracy benchmark's configurations: the stream both arms count with, its noise as the
service derives it, and the labels the per-cut CSV is keyed by."""

from __future__ import annotations

import math

import pytest

from bench.accuracy.plan import FULL, QUICK, Privacy, Sketching, make_plan, privacies


def test_labels_are_stable() -> None:
    # the per-cut CSVs (bench/plots/accuracy.csv, --from-csv) are keyed by these
    assert [p.label for p in privacies([1.0])] == [
        "no noise",
        "laplace ε=1",
        "gaussian ρ=0.5 (ε=1)",
    ]
    assert Privacy("gaussian", 1.0, delta=1e-9).label.startswith("gaussian ρ=0.01")


def test_noise_is_the_services() -> None:
    sk = Sketching()
    assert sk.max_tables == 8
    assert sk.noise(Privacy("laplace", 1.0)).scale == pytest.approx(24.0)  # Δ1/ε = T·depth/ε
    sigma = sk.noise(Privacy("gaussian", 1.0)).scale
    assert sigma == pytest.approx(math.sqrt(24) / math.sqrt(2 * 0.5))
    assert sk.noise(Privacy("none")).scale == 0.0
    small = Sketching(features=("movie_id", "genres"), depth=1)
    assert small.noise(Privacy("laplace", 1.0)).scale == pytest.approx(3.0)


def test_stream_body_and_weights() -> None:
    sk = Sketching(weights=(("movie_id", 4.0), ("prior", 0.5)))
    body = sk.stream_body("s", Privacy("laplace", 1.0), retention=10)
    assert body["privacy"] == {
        "mechanism": "laplace",
        "epsilon": 1.0,
        "table_weights": {"movie_id": 4.0},
        "prior_weight": 0.5,
    }
    assert body["max_tables"] == 8 and body["retention_windows"] == 10
    noise = sk.noise(Privacy("laplace", 1.0))
    assert noise.scale_for(4.0) < noise.scale_for(1.0) < noise.scale_for(0.5)
    assert not sk.default and Sketching().default


def test_plan() -> None:
    plan = make_plan(100_000, FULL.cut_shares)
    assert plan.cuts == (50_000, 60_000, 70_000, 80_000, 90_000) and plan.test_rows == 1000
    assert plan.window(0.02) == 2000 and plan.cut_windows(0.1) == {
        5: 50_000,
        6: 60_000,
        7: 70_000,
        8: 80_000,
        9: 90_000,
    }
    with pytest.raises(SystemExit):
        make_plan(100_000, (0.55,)).window(0.1)
    assert QUICK.quick and [p.label for p in QUICK.core_configs()] == ["no noise", "laplace ε=1"]

"""The work of the (β, k, ε, δ) computations is bounded, and δ is cached: the calculator once
took 20 s of CPU for one request, and the ledger recomputed each queue's δ at every read."""

from __future__ import annotations

import pytest

from service.core.annotation import sampled_kanon as kanon


def test_the_worst_corner_of_the_input_box_is_far_below_the_search_bound() -> None:
    """The longest search is where γ is nearest β: the smallest β, ε at its boundary, the
    largest k (about 18,500 n); every δ of the box stays under ``MAX_SEARCH_N``."""
    worst = 0
    for beta in (kanon.BETA_MIN, 0.002, 0.01, 0.5, kanon.BETA_MAX):
        for k in (1, 1000, kanon.K_MAX):
            for eps in (kanon.min_epsilon(beta=beta), kanon.covered_epsilon(beta=beta) * 1.01):
                worst = max(worst, kanon.delta(k=k, beta=beta, epsilon=eps).work)
    assert 10_000 < worst < kanon.MAX_SEARCH_N / 2


def test_a_solve_past_its_budget_is_refused_naming_the_fields() -> None:
    # the request that took 20 s: every point of the β grid sits near β = 0.001
    with pytest.raises(kanon.WorkLimit, match=r"^beta, delta: solving for beta at k=1000000") as e:
        kanon.largest_beta(k=1_000_000, epsilon=0.0011, target_delta=1e-300)
    assert str(kanon.SOLVE_BUDGET_N) in str(e.value)
    # the same question at a larger ε is cheap and answered
    r = kanon.largest_beta(k=1_000_000, epsilon=1.0, target_delta=1e-300)
    assert r.log_delta <= -690


def test_the_budget_counts_cached_deltas_too() -> None:
    """A refusal does not depend on what was computed before."""
    args = {"k": 1_000_000, "epsilon": 0.0011, "target_delta": 1e-300}
    for _ in range(2):
        with pytest.raises(kanon.WorkLimit):
            kanon.largest_beta(**args)  # type: ignore[arg-type]


def test_delta_is_cached_by_its_exact_parameters() -> None:
    args = {"k": 77_777, "beta": 0.0013, "epsilon": 0.0014}
    first = kanon.delta(**args)  # type: ignore[arg-type]
    hits = kanon.delta.cache_info().hits
    assert kanon.delta(**args) is first  # type: ignore[arg-type]
    assert kanon.delta.cache_info().hits == hits + 1
    assert kanon.delta(k=77_777, beta=0.0013, epsilon=0.0015) is not first

"""The public outcome ⊥ ("add no table") of a selection round and the bases a candidate is
scored against (service.core.dp.selection, "Picking nothing"; docs/ARCHITECTURE.md,
"Count-table selection").

The distribution tests draw from the CSPRNG the service uses (not a seeded PRNG), so they are
not deterministic: each chi-square test has a fixed level α = 1e-6, its false-failure rate when
the mechanism is right, and a power check against a wrong distribution that it must reject.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from service.core.dp.selection import (
    Candidate,
    candidate_groups,
    empirical_mi,
    group_codes,
    score_candidates,
    score_sensitivity,
    select,
    select_round,
)

ALPHA = 1e-6  # false-failure rate of each chi-square test below
TRIALS = 30_000


def cand(group: str, gain: float) -> Candidate:
    """A candidate for the pair ``group`` = "ab" extending ("a",) by "b"."""
    return Candidate(base=(group[0],), feature=group[1], group=tuple(sorted(group)), gain=gain)


def softmax(x: NDArray[np.float64]) -> NDArray[np.float64]:
    w = np.exp(x - x.max())
    return w / w.sum()


def zeros(size: int) -> NDArray[np.float64]:
    return np.zeros(size)


# --------------------------------------------------------------------------------------------
# ⊥ in the mechanism
# --------------------------------------------------------------------------------------------


def test_nothing_is_picked_when_every_score_is_below_the_threshold() -> None:
    """β = 2Δ/ε = 0.002; ⊥ at τ = 0.1 against scores ≤ 0: P(pick) <= 3·e^{-50} per round."""
    candidates = [cand("ab", -1.0), cand("ac", -0.5), cand("ad", 0.0)]
    for k in (1, 3):
        outcomes = {
            tuple(c.group for c in select(candidates=candidates, k=k, epsilon=10.0,
                                          sensitivity=0.01, threshold=0.1))
            for _ in range(300)
        }  # fmt: skip
        assert outcomes == {()}
    # without ⊥ the same round always picks (the behaviour before)
    assert len(select(candidates=candidates, k=1, epsilon=10.0, sensitivity=0.01)) == 1


def test_a_dominating_candidate_is_still_picked_and_the_round_stops_at_nothing() -> None:
    """Scores 0.5 and 0.4 against τ = 0 and others at −1, β = 0.002 (k = 1) or 0.006 (k = 3):
    every other outcome has probability below e^{-60}."""
    candidates = [cand("ab", -1.0), cand("ac", 0.5), cand("ad", -1.0), cand("ae", 0.4)]
    one = {
        tuple(c.group for c in select(candidates=candidates, k=1, epsilon=10.0, sensitivity=0.01,
                                      threshold=0.0))
        for _ in range(300)
    }  # fmt: skip
    assert one == {(("a", "c"),)}
    three = {
        tuple(c.group for c in select(candidates=candidates, k=3, epsilon=10.0, sensitivity=0.01,
                                      threshold=0.0))
        for _ in range(300)
    }  # fmt: skip
    assert three == {(("a", "c"), ("a", "e"))}  # then ⊥: the two below 0 are never picked


def test_nothing_draws_its_own_noise_last() -> None:
    """⊥ is the last of ``m + 1`` Gumbel values (m = 2 candidates) and scores τ + β·log m
    (β = 2·2·0.01/1 = 0.04: τ + 0.0277): with no noise it ranks by that score."""
    candidates = [cand("ab", 0.1), cand("ac", 0.3)]
    sizes: list[int] = []

    def spy(size: int) -> NDArray[np.float64]:
        sizes.append(size)
        return np.zeros(size)

    args = {"candidates": candidates, "k": 2, "epsilon": 1.0, "sensitivity": 0.01, "gumbel": spy}
    assert select(**args, threshold=0.5) == []  # type: ignore[arg-type]
    assert select(**args, threshold=0.28) == []  # 0.3077 > 0.3  # type: ignore[arg-type]
    assert [c.group for c in select(**args, threshold=0.2)] == [("a", "c")]  # type: ignore[arg-type]
    assert [c.group for c in select(**args, threshold=0.08)] == [("a", "c")]  # 0.1077 > 0.1  # type: ignore[arg-type]
    assert [c.group for c in select(**args, threshold=0.05)] == [("a", "c"), ("a", "b")]  # type: ignore[arg-type]
    assert sizes == [3] * 5
    with pytest.raises(ValueError, match="threshold must be finite"):
        select(**args, threshold=math.inf)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="threshold must be a real number or None"):
        select(**args, threshold="0")  # type: ignore[arg-type]


SCORES = np.array([0.0, 0.1, 0.2, 0.3])
SENSITIVITY = 0.05
TAU = 0.15


def _candidates() -> list:
    return [cand(f"a{f}", float(g)) for f, g in zip("bcde", SCORES, strict=True)]


def _draws(candidates: list, *, k: int, epsilon: float) -> Counter:
    """How often each outcome (the picked groups in order; () for ⊥ first) comes up over
    TRIALS rounds of CSPRNG draws."""
    return Counter(
        tuple(
            c.group
            for c in select(
                candidates=candidates,
                k=k,
                epsilon=epsilon,
                sensitivity=SENSITIVITY,
                threshold=TAU,
            )
        )
        for _ in range(TRIALS)
    )


def test_one_pick_with_nothing_follows_the_exponential_mechanism() -> None:
    """P(i) ∝ exp(ε u_i / 2Δ) and P(⊥) ∝ m·exp(ε τ / 2Δ) (m = 4 stop outcomes at τ), over
    CSPRNG draws: β = 0.1, so the weights are e^0 … e^3 and 4·e^1.5 for ⊥."""
    epsilon = 1.0
    candidates = _candidates()
    counts = _draws(candidates, k=1, epsilon=epsilon)
    outcomes = [(c.group,) for c in candidates] + [()]
    observed = np.array([counts[o] for o in outcomes])
    assert observed.sum() == TRIALS
    beta = 2 * SENSITIVITY / epsilon
    em = softmax(np.append(SCORES, TAU + beta * math.log(len(SCORES))) / beta)
    assert stats.chisquare(observed, TRIALS * em).pvalue > ALPHA
    # power: ⊥ as one outcome of score τ (without its m copies) is rejected
    wrong = softmax(np.append(SCORES, TAU) / beta)
    assert stats.chisquare(observed, TRIALS * wrong).pvalue < ALPHA


# statistical: 60,000 selections (over a second of CPU); the distribution with ⊥ stays in the
# fast set (the one-pick and two-pick tests here), and so do the margin's bounds
@pytest.mark.slow
def test_the_margin_makes_a_pick_among_useless_candidates_rare() -> None:
    """Every candidate scores exactly τ (none is useful): without a margin a round picks half
    the time; with margin c, ⊥ scores τ + β·(c + log m) and a round picks with probability
    1/(1 + e^c) (4.7 % at c = 3), over CSPRNG draws."""
    candidates = [cand(f"a{f}", TAU) for f in "bcdefghijk"]
    for margin, want in ((0.0, 0.5), (3.0, 1 / (1 + math.e**3))):
        picked = sum(
            bool(
                select(
                    candidates=candidates,
                    k=1,
                    epsilon=1.0,
                    sensitivity=SENSITIVITY,
                    threshold=TAU,
                    margin=margin,
                )
            )
            for _ in range(TRIALS)
        )
        assert stats.binomtest(picked, TRIALS, want).pvalue > ALPHA, (margin, picked)
        # power: the other margin's rate is rejected
        other = 0.5 if margin else 1 / (1 + math.e**3)
        assert stats.binomtest(picked, TRIALS, other).pvalue < ALPHA, (margin, picked)


def test_the_margin_is_checked() -> None:
    args = {"candidates": _candidates(), "k": 1, "epsilon": 1.0, "sensitivity": SENSITIVITY}
    for bad in (-0.1, 33.0, math.nan):
        with pytest.raises(ValueError, match="margin must be in"):
            select(**args, threshold=TAU, margin=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="margin must be a real number"):
        select(**args, threshold=TAU, margin=True)  # type: ignore[arg-type]


def test_two_picks_with_nothing_follow_peeling_stopped_at_nothing() -> None:
    """k = 2 at ε = 2: peeling over candidates ∪ {⊥} with ε/2 each (β = 0.1; ⊥ of score
    τ + β·log m), stopped at ⊥: P(()) = p⊥, P((i,)) = p_i·p⊥/(1 − p_i),
    P((i, j)) = p_i·p_j/(1 − p_i)."""
    epsilon = 2.0
    candidates = _candidates()
    counts = _draws(candidates, k=2, epsilon=epsilon)

    def expected(beta: float) -> dict[tuple, float]:
        p = softmax(np.append(SCORES, TAU + beta * math.log(len(SCORES))) / beta)
        bottom = p[-1]
        out: dict[tuple, float] = {(): bottom}
        for i, ci in enumerate(candidates):
            out[(ci.group,)] = p[i] * bottom / (1 - p[i])
            for j, cj in enumerate(candidates):
                if j != i:
                    out[(ci.group, cj.group)] = p[i] * p[j] / (1 - p[i])
        return out

    want = expected(2 * 2 * SENSITIVITY / epsilon)
    assert math.isclose(sum(want.values()), 1.0)
    assert set(counts) <= set(want)
    outcomes = sorted(want)
    observed = np.array([counts[o] for o in outcomes])
    assert stats.chisquare(observed, TRIALS * np.array([want[o] for o in outcomes])).pvalue > ALPHA
    # power: the full ε per pick (β = 2Δ/ε = 0.05) is rejected
    full = expected(2 * SENSITIVITY / epsilon)
    assert stats.chisquare(observed, TRIALS * np.array([full[o] for o in outcomes])).pvalue < ALPHA


def test_round_passes_the_threshold_on_the_padded_scale() -> None:
    """select_round compares τ with the padded scores n/(n+N)·score: a strong interaction on
    n = N records (factor 1/2) is picked against τ below its padded score and not above."""
    rng = np.random.default_rng(4)
    n = 2000
    columns = {f: rng.integers(0, 2, n) for f in "abc"}
    labels = columns["a"] ^ columns["b"]  # exact XOR: Î(ab) = log 2, Î(a) = Î(b) ≈ 0
    args = {
        "columns": columns,
        "labels": labels,
        "n_labels": 2,
        "tables": [("a",), ("b",), ("c",)],
        "max_tables": 6,
        "groups_per_round": 1,
        "epsilon": 50.0,
        "min_records": n,
        "score": "aic",
        "gumbel": zeros,
    }
    gain = score_candidates(columns=columns, labels=labels, n_labels=2, tables=args["tables"],
                            score="aic")  # type: ignore[arg-type]  # fmt: skip
    best = max(c.gain for c in gain)
    assert best > 0.6
    picked = select_round(**args, threshold=0.45 * best)  # type: ignore[arg-type]
    assert [c.group for c in picked] == [("a", "b")]
    assert select_round(**args, threshold=0.55 * best) == []  # type: ignore[arg-type]
    assert score_sensitivity(score="aic", n=n, n_labels=2) < 0.01  # noise off anyway (zeros)


# --------------------------------------------------------------------------------------------
# bases: every existing table the group refines
# --------------------------------------------------------------------------------------------


def test_a_group_an_existing_table_determines_gains_nothing() -> None:
    """``u`` (64 values) determines ``a`` and ``b``; with tables a, b, u and (a, b), the triple
    (a, b, u) holds nothing ``u``'s table does not: against ``u`` it gains 0 and adds no
    cell, so it scores 0 by "mi" and at most 0 by "aic" (the minimum over bases). Its
    one-feature-less base (a, b) alone would give it the plug-in bias of u's 64 cells (> 0.03
    nats by "mi"): the score a base of fewer features prevents."""
    rng = np.random.default_rng(8)
    n = 500
    u = rng.integers(0, 64, n)
    columns = {"a": u % 2, "b": (u // 2) % 2, "u": u}
    labels = (columns["a"] ^ columns["b"]) ^ (rng.random(n) < 0.2)
    tables = [("a",), ("b",), ("u",), ("a", "b")]
    for score in ("mi", "aic"):
        found = {
            c.group: c
            for c in score_candidates(
                columns=columns, labels=labels, n_labels=2, tables=tables, score=score
            )
        }
        triple = found[("a", "b", "u")]
        assert triple.gain == 0.0 if score == "mi" else triple.gain <= 0.0
        assert triple.base == ("a", "b")  # the data-independent base recorded as `extends`

    def mi(*names: str) -> float:
        return empirical_mi(group_codes([columns[x] for x in names]), labels, n_labels=2)

    assert mi("a", "b", "u") - mi("a", "b") > 0.03  # what the old one-feature base gave


def test_candidate_groups_need_no_data() -> None:
    tables = [("a",), ("b",), ("c",), ("b", "a")]
    groups = candidate_groups(tables=tables, features=["a", "b", "c", "d"])
    rng = np.random.default_rng(1)
    columns = {f: rng.integers(0, 3, 50) for f in "abcd"}
    scored = score_candidates(
        columns=columns, labels=rng.integers(0, 2, 50), n_labels=2, tables=tables
    )
    assert groups == [c.group for c in scored]
    assert ("a", "b", "c") in groups and ("a", "b") not in groups
    assert candidate_groups(tables=[("a", "b")], features=["a", "b"]) == []
    with pytest.raises(ValueError, match="without a column"):
        candidate_groups(tables=[("a", "z")], features=["a", "b"])


# --------------------------------------------------------------------------------------------
# groups a table already determines (the stream's "of" declarations)
# --------------------------------------------------------------------------------------------


def test_groups_a_table_determines_are_not_candidates() -> None:
    """With age 'of' user and genre 'of' movie (zip3 'of' zip 'of' user: transitively), a
    group inside what one table's key determines is not offered; interactions across two
    keys are."""
    tables = [("age",), ("genre",), ("movie",), ("user",), ("zip",), ("zip3",)]
    features = ["age", "genre", "movie", "user", "zip", "zip3"]
    every = candidate_groups(tables=tables, features=features)
    attributes = {"age": "user", "genre": "movie", "zip": "user", "zip3": "zip"}
    kept = candidate_groups(tables=tables, features=features, attributes=attributes)
    determined = {
        ("age", "user"),
        ("genre", "movie"),
        ("user", "zip"),
        ("user", "zip3"),
        ("zip", "zip3"),
    }
    # age+zip: both attributes of the user, so the user table holds them
    determined |= {("age", "zip"), ("age", "zip3")}
    assert set(every) - set(kept) == determined
    assert ("age", "genre") in kept and ("movie", "user") in kept and ("genre", "zip3") in kept
    # the scores are computed for the same groups only
    rng = np.random.default_rng(3)
    columns = {f: rng.integers(0, 4, 200) for f in features}
    scored = score_candidates(
        columns=columns,
        labels=rng.integers(0, 2, 200),
        n_labels=2,
        tables=tables,
        score="aic",
        attributes=attributes,
    )
    assert [c.group for c in scored] == kept


def test_of_declarations_are_checked() -> None:
    from pydantic import ValidationError

    from service.core.streamconfig import StreamCreate

    def body(**of: str) -> dict:
        return {
            "name": "s",
            "features": [{"name": f, **({"of": of[f]} if f in of else {})} for f in "abc"],
            "labels": ["0", "1"],
        }

    assert StreamCreate.model_validate(body(a="b", b="c")).features[0].of == "b"
    with pytest.raises(ValidationError, match="'a' is 'of' 'x', not a feature"):
        StreamCreate.model_validate(body(a="x"))
    with pytest.raises(ValidationError, match="cycle: a -> b"):
        StreamCreate.model_validate(body(a="b", b="a"))
    with pytest.raises(ValidationError, match="cycle"):
        StreamCreate.model_validate(body(a="a"))

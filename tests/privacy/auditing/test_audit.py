"""The empirical audit of the service's releases (``service.privacy.auditing``), bounded for
the suite: every mechanism, as the service runs it with CSPRNG noise, on the neighbouring pair
the search finds, has an audited lower bound on ε at most the ε it claims, and every planted bug
is caught (its bound above its claim).

Rates. Each audit holds at confidence 1 − 1e-6: a mechanism that keeps its claim FAILs with
probability at most 1e-6, so this file's 12 honest audits fail a correct service with
probability at most 1.2e-5 per run. A planted bug PASSes (a missed bug) only when its bound
falls below its claim: over 30 runs at these sizes and
confidence the margin (bound − claim) was at least 0.40 for every planted bug, its mean 0.48
(noise halved, s.d. 0.026), 0.48 (depth forgotten, s.d. 0.029), 3.4 (queue, s.d. 0.026) and
1.2 (calibration, s.d. 0.12): a miss needs a bound more than 10 s.d. below its mean."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.dp.noise import SeededRandomBits
from service.core.dp.selection import select, select_round
from service.core.reidentification import attacks as pu
from service.privacy.auditing import mechanisms as m
from service.privacy.auditing import suite

CONFIDENCE = 1 - 1e-6


def _releases(case: m.Case) -> int:
    """Releases per input: selection rounds cost a ``select`` call each (about 30 µs), the
    others are drawn in bulk."""
    return 20_000 if "selection" in case.mechanism else 200_000


@pytest.fixture(scope="module")
def service_cases() -> list[m.Case]:
    return suite.service_cases()


@pytest.fixture(scope="module")
def planted_cases() -> list[m.Case]:
    return suite.planted_cases()


@pytest.mark.slow  # builds every audited case (seconds), as the two audits below
def test_every_mechanism_is_covered(service_cases: list[m.Case]) -> None:
    names = " | ".join(c.mechanism for c in service_cases)
    for what in (
        "count tables per observation, laplace",
        "count tables per observation, gaussian",
        "count tables per user, laplace",
        "count tables per user, gaussian",
        "selection round",
        "annotation queue",
        "re-identification",
        "ledger composition",
    ):
        assert what in names
    relations = {c.relation for c in service_cases}
    assert {
        "add or remove one observation",
        "replace one observation",
        "add or remove one user",
    } <= relations


@pytest.mark.slow  # 200,000 releases per input of every mechanism
def test_every_mechanism_keeps_its_claim(service_cases: list[m.Case]) -> None:
    results = [suite.audit(c, releases=_releases(c), confidence=CONFIDENCE) for c in service_cases]
    failed = [r.row() for r in results if not r.passed]
    assert not failed, failed
    # the pair's exact ε (where computed) is within the claim too: the search found no pair
    # beyond what the ledger states
    for c in service_cases:
        if c.pair_epsilon is not None:
            assert c.pair_epsilon <= c.claimed_epsilon + 1e-9, c.mechanism
    # and the audit has power on the honest mechanisms too: where the pair reaches the
    # claim, the bound is near it
    tight = [
        r
        for r in results
        if r.case.pair_epsilon is not None and r.case.pair_epsilon >= 0.99 * r.case.claimed_epsilon
    ]
    assert tight and all(r.tightness > 0.5 for r in tight), [r.row() for r in tight]


@pytest.mark.slow  # 200,000 releases per input of every planted bug
def test_every_planted_bug_fails(planted_cases: list[m.Case]) -> None:
    assert len(planted_cases) == 4
    for case in planted_cases:
        r = suite.audit(case, releases=_releases(case), confidence=CONFIDENCE)
        assert not r.passed, r.row()
        assert r.bound.epsilon > case.claimed_epsilon


def test_the_count_tables_pair_is_the_worst_of_the_relation() -> None:
    """User key, c = 1 under max(c, 2): the worst add/remove pair is a swap (a counted
    observation removed, the user's next one counted instead) at exactly the claim; the old
    calibration to c gives it twice the stream's ε, which the ledger states."""
    keyed = suite._keyed_stream("laplace", 1, "max_c_2", 2.0)
    old = suite._keyed_stream("laplace", 1, "c", 2.0)
    assert m.count_tables(keyed, "add_remove").pair_epsilon == pytest.approx(2.0)
    case = m.count_tables(old, "add_remove")
    assert case.pair_epsilon == pytest.approx(4.0) == case.claimed_epsilon


def test_the_batched_class_release_is_sum_release_draw() -> None:
    """The audit draws the re-identification release in bulk; one draw of it is exactly
    ``SumRelease.draw`` given the same random bytes."""
    mech = pu.calibrate(pu.Domain.box(0.0, 1.0), dimensions=3, epsilon=1.0)
    units = mech.units(np.array([[0.1, 0.5, 0.9], [1.0, 1.0, 0.0]]))
    for seed in range(5):
        sums, counts = m.sum_release_batch(mech, units, 1, bits=SeededRandomBits(seed))
        s, c = mech.draw(units, bits=SeededRandomBits(seed))
        assert np.array_equal(sums[0], s) and counts[0] == c


@pytest.mark.parametrize("bottom", [True, False])
def test_the_audited_round_is_select_round(bottom: bool) -> None:
    """The audit calls ``select`` on the padded scores it computes; ``select_round`` on the
    same records, with the same Gumbel noise, picks the same."""
    stream = suite._selection_stream(1.0, score="aic" if bottom else "mi", bottom=bottom)
    p = stream.cfg.privacy
    rng = np.random.default_rng(0)
    for data in [(0, 3, 5), (1, 1, 2, 14), (7,), ()]:
        cols, labels = stream.selection_columns(data)
        cands = stream.selection_scores(data)
        for _ in range(20):
            g = rng.gumbel(size=len(cands) + 1)
            kw = {"threshold": p.selection_threshold, "margin": p.selection_margin}
            ours = select(
                candidates=cands,
                k=1,
                epsilon=p.epsilon_selection,
                sensitivity=stream.selection_sensitivity(),
                gumbel=lambda n, g=g: g[:n],
                **kw,
            )
            theirs = select_round(
                columns=cols,
                labels=labels,
                n_labels=2,
                tables=[t.features for t in stream.rt.tables],
                max_tables=stream.cfg.max_tables,
                groups_per_round=1,
                epsilon=p.epsilon_selection,
                min_records=p.min_records,
                gumbel=lambda n, g=g: g[:n],
                score=p.selection_score,
                **kw,
            )
            assert [c.group for c in ours] == [c.group for c in theirs]


@pytest.mark.parametrize("bottom", [True, False])
def test_the_selection_statistic_is_the_round_distribution(bottom: bool) -> None:
    """The audit's exact outcome probabilities of a round match the frequencies of
    ``select`` (20,000 CSPRNG rounds; each frequency within 5 s.d. of its probability:
    false-failure rate < 1e-5 over the outcomes)."""
    stream = suite._selection_stream(1.0, score="aic" if bottom else "mi", bottom=bottom)
    data = (1, 1, 2, 14)
    cands = stream.selection_scores(data)
    probs = np.exp(stream.selection_log_probs(np.array([c.gain for c in cands])))
    n = 20_000
    freq = np.bincount(m._round_outcomes(stream, data, n), minlength=len(cands) + 1) / n
    sd = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(freq - probs) <= 5 * sd + 1e-12), (freq, probs)

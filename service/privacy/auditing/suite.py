"""The audit's cases (the service's mechanisms and the planted bugs) and a run over them."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.privacy.auditing import mechanisms as m
from service.privacy.auditing.stats import Bound, lower_bound
from service.privacy.auditing.streams import SmallStream, small_stream

BINARY = ("0", "1")
CONFIDENCE = 0.95
"""The confidence of the benchmark's table; the tests use ``1 − 1e-6`` per audit."""


@functools.cache
def _tables_stream(mechanism: str) -> SmallStream:
    budget = {"epsilon": 1.0} if mechanism == "laplace" else {"rho": 0.5}
    return small_stream(
        {
            "max_tables": 3,
            "sketch": {"width": 8, "depth": 2},
            "privacy": {"mechanism": mechanism, **budget},
        },
        {"a": ("x", "y"), "b": ("p", "q")},
        BINARY,
    )


@functools.cache
def _keyed_stream(mechanism: str, c: int, calibration: str, budget: float) -> SmallStream:
    key = "epsilon" if mechanism == "laplace" else "rho"
    return small_stream(
        {
            "max_tables": 4,
            "sketch": {"width": 8, "depth": 1},
            "privacy": {
                "mechanism": mechanism,
                key: budget,
                "user_key": "user",
                "max_contributions_per_window": c,
                "table_calibration": calibration,
            },
        },
        {"user": ("u1", "u2"), "a": ("x", "y"), "b": ("p", "q")},
        BINARY,
    )


@functools.cache
def _selection_stream(
    epsilon_selection: float, selection_rounds: int = 1, score: str = "aic", bottom: bool = True
) -> SmallStream:
    """Three binary features, two labels, a free slot; ``bottom``: the default ⊥ (threshold
    0, margin 3), else none (every round picks)."""
    privacy: dict[str, Any] = {
        "epsilon_selection": epsilon_selection,
        "selection_rounds": selection_rounds,
        "selection_score": score,
    }
    if not bottom:
        privacy |= {"selection_threshold": None, "selection_margin": 0.0}
    return small_stream(
        {
            "max_tables": 5,
            "sketch": {"width": 8, "depth": 1},
            "privacy": {"mechanism": "laplace", "epsilon": 1.0, "min_records": 1, **privacy},
            "hot_windows": selection_rounds,
        },
        {"a": ("x", "y"), "b": ("p", "q"), "c": ("s", "t")},
        BINARY,
    )


def service_cases() -> list[m.Case]:
    """Every mechanism of the service, on the neighbour relations its ledger states."""
    lap, gau = _tables_stream("laplace"), _tables_stream("gaussian")
    keyed = _keyed_stream("laplace", 1, "max_c_2", 2.0)
    keyed_old = _keyed_stream("laplace", 1, "c", 2.0)
    per_user = _keyed_stream("laplace", 2, "max_c_2", 1.0)
    per_user_g = _keyed_stream("gaussian", 2, "max_c_2", 0.5)
    return [
        m.count_tables(lap, "add_remove"),
        m.count_tables(lap, "replace"),
        m.count_tables(gau, "add_remove"),
        m.count_tables(keyed, "add_remove"),
        m.count_tables(keyed_old, "add_remove"),
        m.count_tables(per_user, "user"),
        m.count_tables(per_user_g, "user"),
        m.selection_round(_selection_stream(1.0)),
        m.selection_round(_selection_stream(1.0, score="mi", bottom=False)),
        m.queue_period(beta=0.1, k=10),
        m.reidentification_mean(),
        m.composition(_selection_stream(0.5, 2)),
    ]


def planted_cases() -> list[m.Case]:
    """The planted bugs: each must FAIL (its audited bound above the ε it claims)."""
    lap = _tables_stream("laplace")
    keyed_old = _keyed_stream("laplace", 1, "c", 2.0)
    return [
        m.count_tables(
            lap,
            "add_remove",
            scale_factor=0.5,
            planted="noise scale halved",
            label=" [noise halved]",
        ),
        m.count_tables(
            lap,
            "add_remove",
            scale_factor=m.depth_forgotten(lap),
            planted="sensitivity forgets depth",
            label=" [Δ1 without depth]",
        ),
        m.queue_period(beta=0.1, k=10, at_kth_arrival=True),
        m.count_tables(
            keyed_old,
            "add_remove",
            claim=keyed_old.cfg.privacy.epsilon,
            planted="user-keyed stream calibrated to add/remove only",
            label=" [claims ε for add/remove]",
        ),
    ]


@dataclass(frozen=True)
class Result:
    case: m.Case
    bound: Bound
    releases: int  # per input
    seconds: float

    @property
    def passed(self) -> bool:
        return self.bound.epsilon <= self.case.claimed_epsilon

    @property
    def tightness(self) -> float:
        return self.bound.epsilon / self.case.claimed_epsilon

    def row(self) -> dict[str, Any]:
        c, b = self.case, self.bound
        return {
            "mechanism": c.mechanism,
            "neighbours": c.relation,
            "planted": c.planted or "",
            "claimed_epsilon": c.claimed_epsilon,
            "delta": c.delta,
            "claim_source": c.claim_source,
            "pair_epsilon": c.pair_epsilon,
            "audited_epsilon": b.epsilon,
            "confidence": b.confidence,
            "tightness": self.tightness,
            "verdict": "PASS" if self.passed else "FAIL",
            "releases": self.releases,
            "seconds": self.seconds,
        }


def audit(case: m.Case, *, releases: int, confidence: float) -> Result:
    """Draw ``releases`` releases on each input of ``case`` and bound ε from below."""
    t0 = time.perf_counter()
    s0, s1 = case.sample(releases)
    bound = lower_bound(s0, s1, delta=case.delta, confidence=confidence)
    return Result(case, bound, releases, time.perf_counter() - t0)


def run(
    cases: list[m.Case],
    *,
    releases: int,
    confidence: float = CONFIDENCE,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    out = []
    for case in cases:
        r = audit(case, releases=releases, confidence=confidence)
        if progress is not None:
            progress(r)
        out.append(r)
    return out

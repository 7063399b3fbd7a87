"""What a queue's release promises: its (ε, δ) in figures and in words, and its parts of a linked
stream's privacy ledger (docs/PRIVACY.md, promise 5; docs/ARCHITECTURE.md, "Annotation
queues")."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.annotation import sampled_kanon as kanon
from service.core.dp.accounting import Part
from service.queues import repository
from service.queues.schemas import PrivacyOut
from service.queues.service import QUEUE_SOURCE, QueueRuntime, _deltas, _runtime, runtime

CURVE_EPSILONS = (0.5, 1.0, 2.0, 3.0, 5.0)


ACCEPTED_NOTE = "δ above the operator's ceiling, accepted explicitly (accept_delta_above_ceiling)"


def guarantee_in_words(rt: QueueRuntime, delta: float, ceiling: float) -> str:
    """What the queue's (ε, δ) means and whom it protects (docs/PRIVACY.md, promise 5)."""
    words = (
        f"(ε, δ) = ({rt.epsilon:.3g}, {delta:.2g}). For any one submitted candidate, what this "
        f"queue releases (which examples, their uncertainty, and when) is at most "
        f"{math.exp(rt.epsilon):.3g} times more or less likely with that candidate than "
        f"without it, except with probability at most {delta:.2g}. This holds against anyone "
        "who sees the releases (annotators, the label export, these statistics), even one "
        f"who knows or submitted every other candidate: each candidate is kept with "
        f"probability β = {rt.beta:g}, and an example is released only once k = {rt.k} kept "
        f"candidates of it arrived within one release period ({rt.release_seconds} s). It "
        "does not hold against someone who reads the service's Redis and database while a "
        "period is open: that period's counts tell which guessed candidates were kept."
    )
    if delta <= ceiling:
        return words
    how = (
        "was accepted explicitly when the queue was created (accept_delta_above_ceiling)"
        if rt.accept_delta_above_ceiling
        else "was not checked when the queue was created"
    )
    return (
        f"Warning: δ = {delta:.2g} is above the operator's ceiling of {ceiling:g} and {how}: "
        f"with probability up to {delta:.2g} the releases can reveal that a candidate was "
        "submitted. " + words
    )


def privacy_of(rt: QueueRuntime, *, delta_ceiling: float) -> PrivacyOut:
    d = kanon.delta(k=rt.k, beta=rt.beta, epsilon=rt.epsilon)
    lo = kanon.covered_epsilon(beta=rt.beta)
    curve = [
        {"epsilon": e, "delta": kanon.delta(k=rt.k, beta=rt.beta, epsilon=e).delta}
        for e in sorted({lo, *(e for e in CURVE_EPSILONS if e >= lo)})
    ]
    return PrivacyOut(
        queue=rt.name,
        beta=rt.beta,
        k=rt.k,
        epsilon=rt.epsilon,
        delta=d.delta,
        log_delta=d.log_delta,
        min_epsilon=lo,
        curve=curve,
        delta_ceiling=delta_ceiling,
        above_ceiling=d.delta > delta_ceiling,
        accept_delta_above_ceiling=rt.accept_delta_above_ceiling,
        release_seconds=rt.release_seconds,
        guarantee=guarantee_in_words(rt, d.delta, delta_ceiling),
        source=QUEUE_SOURCE + (f"; {ACCEPTED_NOTE}" if rt.accept_delta_above_ceiling else ""),
    )


async def privacy(*, ctx: AppContext, name: str) -> PrivacyOut:
    rt = await runtime(ctx=ctx, name=name)
    # up to seven δ (the curve), cached by kanon.delta
    return await asyncio.to_thread(privacy_of, rt, delta_ceiling=ctx.settings.queue_delta_ceiling)


async def ledger_parts(*, session: AsyncSession, stream_id: int) -> list[Part]:
    """The (ε, δ) of every record queue linked to a stream, as parts of its privacy ledger:
    a candidate submitted to such a queue is a record of the stream's kind, and its release
    (or not) is (ε, δ)-DP with respect to it."""
    parts = []
    rts = [_runtime(q) for q in await repository.of_stream(session, stream_id)]
    for rt, d in zip(rts, await _deltas(rts), strict=True):
        parts.append(
            Part(
                name=f"annotation_queue:{rt.name}",
                epsilon=rt.epsilon,
                delta=d.delta,
                rho=None,
                parameters={
                    "queue": rt.name,
                    "beta": rt.beta,
                    "k": rt.k,
                    "release_seconds": rt.release_seconds,
                    "accept_delta_above_ceiling": rt.accept_delta_above_ceiling,
                },
                source=QUEUE_SOURCE
                + (f"; {ACCEPTED_NOTE}" if rt.accept_delta_above_ceiling else ""),
            )
        )
    return parts


async def model_score_releases(*, session: AsyncSession, stream_id: int) -> list[dict[str, Any]]:
    """The stream's privacy ledger entry of each ``model``-scored record queue linked to it: a
    non-DP release. What is kept, and for how long: a released task's uncertainty is the
    middle of the bucket ⌊10u⌋ of the reference model's score u (one of ten values, never the
    score itself); it lives in Redis (the pool's ranking, the ``scores`` a lease shows) while
    the epoch of the model that gave it lasts, and the first release run after the roll that
    ends that epoch (when the model and the hot rows it was trained on are deleted) turns it
    into the fallback 0.5 (``forget_model_scores``); SQL and the label export never hold it.
    What annotators saw, and the pool histogram curators and annotators read, stays with
    them."""
    out = []
    for q in await repository.of_stream(session, stream_id):
        rt = _runtime(q)
        if rt.uncertainty != "model":
            continue
        out.append(
            {
                "kind": f"annotation queue {rt.name} model uncertainty",
                "dp": False,
                "guarantee": "non-DP: an exact function of the reference model, bucketed",
                "epsilon": None,
                "delta": None,
                "neighbour": None,
                "unit": None,
                "per_user": None,
                "reveals": "each released record's reference-model uncertainty as the middle "
                "of its bucket ⌊10u⌋ (one of ten values), a function of the hot rows the model "
                "was trained on; the pool's histogram of these buckets",
                "to": ["annotator", "curator", "admin"],
                "readers": "annotators (the uncertainty of the tasks they lease; the pool "
                "histogram in the queue's stats), curators and admins (the histogram)",
                "created": f"at the end of each release period ({rt.release_seconds} s), for "
                "the tasks it releases, while the stream has a reference model",
                "lifetime": "the epoch of the model that scored it: the first release run "
                "after the roll that ends that epoch sets it to the fallback 0.5; never "
                "stored in SQL nor in label exports",
                "items": None,
            }
        )
    return out

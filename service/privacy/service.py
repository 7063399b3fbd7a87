"""The privacy ledger of a stream (docs/ARCHITECTURE.md, "Privacy ledger"): every number
recomputable from the stored configuration, by ``service.core.accounting``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.audits import service as audits
from service.context import AppContext
from service.core import kanon
from service.core.accounting import (
    SOURCES,
    Guarantee,
    Part,
    compose,
    selection_part,
    selection_rounds,
    table_part,
)
from service.core.budget import budget_split, noise_for
from service.errors import ValidationError
from service.privacy.schemas import KAnonIn, KAnonOut
from service.queues import service as queues
from service.streams import service as streams
from service.streams.schemas import StreamCreate

KANON_SOURCE = queues.SOURCE + "; δ searched over n in log space with a Chernoff stop"


def with_queues(g: Guarantee, queue_parts: Sequence[Part]) -> Guarantee:
    """The stream's guarantee composed with its record queues' (ε, δ) parts by basic
    composition (the queue parts are (ε, δ)-DP, not zCDP, so they join after any zCDP
    composition of the table parts)."""
    if not queue_parts:
        return g
    return Guarantee(
        g.unit,
        [*g.parts, *queue_parts],
        g.epsilon + sum(p.epsilon for p in queue_parts),
        g.delta + sum(p.delta for p in queue_parts),
        None,
        f"{g.composition}; then, with the annotation queues, {SOURCES['basic']}",
    )


def ledger(cfg: StreamCreate, queue_parts: Sequence[Part] = ()) -> dict[str, Any]:
    p = cfg.privacy
    noise = noise_for(cfg)
    params = {
        "mechanism": p.mechanism,
        "epsilon": p.epsilon,
        "rho": p.rho,
        "max_tables": cfg.max_tables,
        "depth": cfg.sketch.depth,
        "l1_sensitivity": noise.l1_sensitivity,
        "l2_sensitivity": noise.l2_sensitivity,
        "noise_scale": noise.scale,
        "table_weights": dict(p.table_weights),
        "prior_weight": p.prior_weight,
        "budget_split": budget_split(cfg),
    }
    h, r = cfg.hot_windows, cfg.retention_windows
    assert cfg.max_tables is not None and p.selection_rounds is not None
    schedule = {
        "max_tables": cfg.max_tables,
        "features": len(cfg.features),
        "hot_windows": h,
        "max_rounds": p.selection_rounds,
    }
    slots, rounds = selection_rounds(**schedule, per_user=False)
    user_rounds = selection_rounds(**schedule, per_user=True)[1]
    if p.epsilon_selection <= 0:
        rounds = user_rounds = 0
    selection_params: dict[str, float | int | str | None] = {
        "min_records": p.min_records,
        "free_slots": slots,
        "max_rounds": p.selection_rounds,
        "groups_per_round": p.groups_per_round,
        "score": p.selection_score,
        "threshold": p.selection_threshold,
        "margin": p.selection_margin,
    }
    per_obs = [
        table_part(
            mechanism=p.mechanism,
            epsilon=p.epsilon,
            rho=p.rho,
            delta=p.delta,
            windows=1,
            parameters=params,
        )
    ]
    if rounds:
        per_obs.append(
            selection_part(
                epsilon_selection=p.epsilon_selection, rounds=rounds, parameters=selection_params
            )
        )
    out: dict[str, Any] = {
        "observation": asdict(
            with_queues(compose(per_obs, delta=p.delta, unit="observation"), queue_parts)
        ),
        "user": None,
        "annotation_queue": [asdict(q) for q in queue_parts] or None,
        "notes": [
            "Windows hold disjoint observations: one observation is in one window's tables.",
            (
                "Within a window the budget is split across the tables by weight "
                "(parameters.budget_split: each table's share, ε or ρ and noise scale); the "
                "shares add up to the window's budget (basic composition across tables; "
                "Bun & Steinke 2016, Lemma 2.3, for ρ)."
            ),
            (
                f"Selection reads the hot period that just ended; an observation is in it for "
                f"{h} rounds, and a stream runs at most {p.selection_rounds} rounds (the "
                f"public schedule: the rolls to epochs 2 … {p.selection_rounds + 1}, while "
                f"one of its {slots} free table slots is left), each charged whether it picks "
                "tables or nothing, so min(H, rounds) rounds are charged. Rounds are "
                f"calibrated to min_records = {p.min_records}, never to the hot period's size, "
                "and none is skipped for few rows."
            ),
            (
                f"{len(queue_parts)} annotation queue(s) of this stream's records: each "
                "release is (ε, δ)-DP for one submitted record (Li, Qardaji & Su, Thm 5); "
                "composed with the tables by basic composition, per observation only."
                if queue_parts
                else "No annotation queue is linked to this stream."
            ),
        ],
    }
    if p.user_key:
        c = p.max_contributions_per_window
        per_user = [
            table_part(
                mechanism=p.mechanism,
                epsilon=p.epsilon,
                rho=p.rho,
                delta=p.delta,
                windows=r + h,
                parameters={**params, "max_contributions_per_window": c},
            )
        ]
        if user_rounds:
            per_user.append(
                selection_part(
                    epsilon_selection=p.epsilon_selection,
                    rounds=user_rounds,
                    group=c * h,
                    parameters=selection_params,
                )
            )
        out["user"] = asdict(compose(per_user, delta=p.delta, unit="user"))
        out["notes"].append(
            f"Per user: at most {c} observations of a user are counted per window "
            f"(user key {p.user_key!r}); the {r} retention and {h} hot windows compose. "
            f"Selection reads only counted observations, at most {c}·{h} of a user per round; "
            f"a user may be in each of the stream's at most {user_rounds} rounds, whose "
            "outcomes are kept: the guarantee covers the stream's whole life."
        )
    return out


async def get(*, session: AsyncSession, name: str, ctx: AppContext | None = None) -> dict[str, Any]:
    """The ledger; with ``ctx`` also ``reidentification``, the stream's latest finished
    re-identification audit (``service.audits.service.latest``: null when none lives)."""
    stream = await streams.get(session=session, name=name)
    parts = await queues.ledger_parts(session=session, stream_id=stream.id)
    out = {"stream": name, **ledger(StreamCreate.model_validate(stream.config), parts)}
    if ctx is not None:
        out["reidentification"] = await audits.latest(ctx=ctx, stream=name, stream_id=stream.id)
    return out


async def sampling_k_anonymity(body: KAnonIn) -> KAnonOut:
    """The calculator, off the event loop (an inverse search takes up to about a second)."""
    return await asyncio.to_thread(calculate, body)


def calculate(body: KAnonIn) -> KAnonOut:
    """δ from (β, k, ε), or the smallest k / largest β that reaches a target δ
    (docs/ARCHITECTURE.md, "Annotation queues")."""
    try:
        if body.beta is not None and body.k is not None:
            r, solved = kanon.delta(k=body.k, beta=body.beta, epsilon=body.epsilon), "delta"
        elif body.k is None:
            assert body.beta is not None and body.delta is not None
            r = kanon.smallest_k(beta=body.beta, epsilon=body.epsilon, target_delta=body.delta)
            solved = "k"
        else:
            assert body.delta is not None
            r = kanon.largest_beta(k=body.k, epsilon=body.epsilon, target_delta=body.delta)
            solved = "beta"
    except ValueError as exc:  # unreachable targets; the message names the inputs
        raise ValidationError(str(exc)) from exc
    return KAnonOut(
        beta=r.beta,
        k=r.k,
        epsilon=r.epsilon,
        delta=r.delta,
        log_delta=r.log_delta,
        solved_for=solved,  # type: ignore[arg-type]
        target_delta=body.delta,
        gamma=r.gamma,
        n_m=r.n_m,
        n_max=r.n_max,
        source=KANON_SOURCE,
    )

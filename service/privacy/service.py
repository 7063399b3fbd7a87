"""The privacy ledger of a stream (docs/ARCHITECTURE.md, "Privacy ledger"): every number
recomputable from the stored configuration, by ``service.core.dp.accounting``."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.annotation import sampled_kanon as kanon
from service.core.dp.accounting import (
    ADD_REMOVE_USER,
    BOTH,
    CONTINUAL,
    ONE_TIME,
    SOURCES,
    Guarantee,
    Part,
    compose,
    selection_part,
    selection_rounds,
    table_part,
)
from service.core.dp.budget import (
    budget_split,
    calibration_multiple,
    noise_for,
    observations_changed,
    window_multiplier,
)
from service.errors import ValidationError
from service.privacy import releases
from service.privacy.schemas import KAnonIn, KAnonOut
from service.queues import privacy as queues
from service.queues.service import SOURCE as QUEUE_CALCULATOR_SOURCE
from service.streams import service as streams
from service.streams.schemas import StreamCreate

KANON_SOURCE = QUEUE_CALCULATOR_SOURCE + "; δ searched over n in log space with a Chernoff stop"


def with_queues(g: Guarantee, queue_parts: Sequence[Part]) -> Guarantee:
    """The stream's guarantee composed with its record queues' (ε, δ) parts by basic
    composition (the queue parts are (ε, δ)-DP, not zCDP, so they join after any zCDP
    composition of the table parts)."""
    if not queue_parts:
        return g
    assert g.epsilon is not None
    return replace(
        g,
        parts=[*g.parts, *queue_parts],
        epsilon=g.epsilon + sum(p.epsilon for p in queue_parts),
        delta=g.delta + sum(p.delta for p in queue_parts),
        rho=None,
        composition=f"{g.composition}; then, with the annotation queues, {SOURCES['basic']}",
    )


QUEUE_NEIGHBOUR = "add or remove one submitted candidate"
QUEUE_OBSERVER = (
    "whoever sees what a queue releases (annotators, label exports, stats, release times), "
    "even one who submitted every other candidate; not the one-time attacker during the open "
    "period (docs/PRIVACY.md, promise 5)"
)
NO_USER_BOUND = (
    "annotation queue {queue}: each release protects one submitted candidate; a user may "
    "submit any number of candidates, so group privacy gives no per-user bound"
)


def _queue_part(q: Part) -> Part:
    return replace(q, observer=QUEUE_OBSERVER, neighbour=QUEUE_NEIGHBOUR, level="event")


def ledger(cfg: StreamCreate, queue_parts: Sequence[Part] = ()) -> dict[str, Any]:
    p = cfg.privacy
    noise = noise_for(cfg)
    queue_parts = [_queue_part(q) for q in queue_parts]
    k = calibration_multiple(cfg)
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
        "table_calibration": p.table_calibration if p.user_key else None,
        "calibration_multiple": k,
        "observations_changed": observations_changed(cfg, level="observation"),
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
    swap = 2 if p.user_key else 1  # records of a round one observation changes
    per_obs = [
        table_part(
            mechanism=p.mechanism,
            epsilon=p.epsilon,
            rho=p.rho,
            delta=p.delta,
            windows=1,
            parameters=params,
            multiplier=window_multiplier(cfg, level="observation"),
        )
    ]
    if rounds:
        per_obs.append(
            selection_part(
                epsilon_selection=p.epsilon_selection,
                rounds=rounds,
                group=swap,
                parameters=selection_params,
            )
        )
    observation = with_queues(compose(per_obs, delta=p.delta, unit="observation"), queue_parts)
    observation.covers = (
        "one observation in the count tables and the selection rounds"
        + (", and one submitted candidate in each linked annotation queue" if queue_parts else "")
        + ", against both observers: windows hold disjoint observations, so the figure is "
        "the same for a one-time reader of the stores and for a continual observer of every "
        "output (a window's noise is drawn once; featurize and the train set re-reveal the "
        "same noisy tables: post-processing)"
    )
    out: dict[str, Any] = {
        "observation": asdict(observation),
        "user": None,
        "user_continual": None,
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
            (
                "Replacing one observation by another (the substitution neighbour) is a "
                "removal and an addition: twice the per-observation figure (group privacy 2)."
            ),
        ],
    }
    if p.user_key:
        c = p.max_contributions_per_window
        out["notes"].append(
            f"Neighbour per observation: removing one observation of a user can let the "
            f"user's next one be counted in its place (at most {c} of a user are counted per "
            f"window), so one observation changes up to 2 counted observations: a window's "
            f"tables, calibrated to k = {k} ({p.table_calibration!r}), are (2/{k})·ε-DP for "
            f"it, and each selection round, calibrated to one record, is charged 2·ε_sel "
            "(group privacy 2)."
        )
        user_params = {**params, "max_contributions_per_window": c}
        user_mult = window_multiplier(cfg, level="user")
        per_user = [
            table_part(
                mechanism=p.mechanism,
                epsilon=p.epsilon,
                rho=p.rho,
                delta=p.delta,
                windows=r + h,
                parameters=user_params,
                multiplier=user_mult,
                observer=ONE_TIME,
                neighbour=ADD_REMOVE_USER,
                level="user",
            )
        ]
        selection_user: list[Part] = []
        if user_rounds:
            selection_user.append(
                selection_part(
                    epsilon_selection=p.epsilon_selection,
                    rounds=user_rounds,
                    group=c * h,
                    parameters=selection_params,
                    observer=BOTH,
                    neighbour=ADD_REMOVE_USER,
                    level="user",
                )
            )
        user = compose(per_user + selection_user, delta=p.delta, unit="user")
        user.observer, user.neighbour, user.level = ONE_TIME, ADD_REMOVE_USER, "user"
        covers = (
            f"every observation of one user (user key {p.user_key!r}) in the count tables of "
            f"the {r + h} windows whose tables exist at once and in the stream's at most "
            f"{user_rounds} selection rounds, against a one-time reader of the stores at any "
            "time"
        )
        no_bound = [NO_USER_BOUND.format(queue=q.name.split(":", 1)[-1]) for q in queue_parts]
        if queue_parts:
            covers += (
                "; not the candidates a user submits to the linked annotation queues (no "
                "per-user bound exists for them)"
            )
            user = replace(user, epsilon=None)
        user.covers, user.unbounded = covers, no_bound
        out["user"] = asdict(user)
        # a continual observer sees every window's tables in turn: no lifetime bound
        continual = compose(
            [
                table_part(
                    mechanism=p.mechanism,
                    epsilon=p.epsilon,
                    rho=p.rho,
                    delta=p.delta,
                    windows=1,
                    parameters=user_params,
                    multiplier=user_mult,
                    observer=CONTINUAL,
                    neighbour=ADD_REMOVE_USER,
                    level="user",
                )
            ],
            delta=p.delta,
            unit="user per window active",
        )
        per_window = continual.epsilon
        sel_eps = sum(s.epsilon for s in selection_user)
        out["user_continual"] = {
            **asdict(
                replace(
                    continual,
                    parts=continual.parts + selection_user,
                    epsilon=None,
                    observer=CONTINUAL,
                    covers=(
                        "every observation of one user over the stream's life, against a "
                        "continual observer of featurize, the train set and the selected "
                        "tables"
                    ),
                    unbounded=[
                        "the count tables of every window the user is active in compose: "
                        "n windows give n·ε_window, which grows while the stream runs "
                        "(no per-user lifetime bound exists)",
                        *no_bound,
                    ],
                )
            ),
            "epsilon_per_active_window": per_window,
            "epsilon_selection_total": sel_eps,
            "formula": (
                f"ε_user(n) = n·{per_window:.6g} + {sel_eps:.6g} for a user active in n "
                "windows (count tables per window + every selection round; basic composition)"
                if p.mechanism != "gaussian"
                else f"ρ_user(n) = n·{continual.parts[0].rho:.6g} (zCDP) for the count tables "
                f"of n windows, plus the selection rounds' {sel_eps:.6g} (basic composition)"
            ),
        }
        out["notes"].append(
            f"Per user: at most {c} observations of a user are counted per window "
            f"(user key {p.user_key!r}); against a one-time reader the {r} retention and {h} "
            f"hot windows compose (their tables are all that exist at once). Selection reads "
            f"only counted observations, at most {c}·{h} of a user per round; a user may be in "
            f"each of the stream's at most {user_rounds} rounds, whose outcomes are kept. "
            "Against a continual observer of featurize and the train set the tables of every "
            "window the user is active in compose (user_continual): no lifetime bound."
        )
    return out


async def get(
    *,
    session: AsyncSession,
    name: str,
    ctx: AppContext | None = None,
    viewer: releases.Viewer | None = None,
) -> dict[str, Any]:
    """The ledger; with ``ctx`` and the ``viewer`` also ``releases``, every release kind of
    the stream, DP or not (``service.privacy.releases``), and ``reidentification``, the
    stream's latest finished re-identification audit as the viewer may see it (null when none
    lives)."""
    stream = await streams.get(session=session, name=name)
    parts = await queues.ledger_parts(session=session, stream_id=stream.id)
    out = {"stream": name, **ledger(StreamCreate.model_validate(stream.config), parts)}
    if ctx is not None and viewer is not None:
        rt = await streams.runtime(ctx=ctx, name=name)
        inp = releases.LedgerInput(ctx=ctx, session=session, rt=rt, ledger=out, viewer=viewer)
        out["releases"] = await releases.collect(inp)
        out["reidentification"] = await releases.reidentification(inp)
    return out


CALCULATOR_CACHE = 1024
_answers: OrderedDict[tuple[float | None, int | None, float, float | None], KAnonOut | str] = (
    OrderedDict()
)
"""The calculator's answers (or the 422's detail) by their exact inputs, most recent last;
read and written on the event loop only."""


async def sampling_k_anonymity(body: KAnonIn, *, slot: AbstractAsyncContextManager) -> KAnonOut:
    """The calculator: an answer given before (or its 422) at once; otherwise computed in a
    worker thread while holding ``slot`` (the calculator's bounded concurrency). A solve's
    work is bounded by ``kanon.SOLVE_BUDGET_N`` (under a second), a δ's by
    ``kanon.MAX_SEARCH_N``."""
    key = (body.beta, body.k, body.epsilon, body.delta)
    answer = _answers.get(key)
    if answer is None:
        async with slot:
            answer = _answers.get(key)  # the request this one waited for may have made it
            if answer is None:
                answer = _answers[key] = await asyncio.to_thread(_answer, body)
                if len(_answers) > CALCULATOR_CACHE:
                    _answers.popitem(last=False)
    _answers.move_to_end(key)
    if isinstance(answer, str):
        raise ValidationError(answer)
    return answer


def _answer(body: KAnonIn) -> KAnonOut | str:
    try:
        return calculate(body)
    except ValidationError as exc:
        return exc.detail


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

"""The privacy ledger of a stream (DESIGN §6): every number recomputable from the stored
configuration, by ``service.core.accounting``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.accounting import compose, selection_part, table_part
from service.streams import service as streams
from service.streams.runtime import noise_for
from service.streams.schemas import StreamCreate


def ledger(cfg: StreamCreate) -> dict[str, Any]:
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
    }
    h, r = cfg.hot_windows, cfg.retention_windows
    rounds = h if p.epsilon_selection > 0 else 0
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
        per_obs.append(selection_part(epsilon_selection=p.epsilon_selection, rounds=rounds))
    out: dict[str, Any] = {
        "observation": asdict(compose(per_obs, delta=p.delta, unit="observation")),
        "user": None,
        "annotation_queue": None,
        "notes": [
            "Windows hold disjoint observations: one observation is in one window's tables.",
            f"Selection reads the hot period; an observation is in it for {h} rolls.",
            "No annotation queue is linked to this stream.",
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
        if rounds:
            per_user.append(
                selection_part(epsilon_selection=p.epsilon_selection, rounds=r + h, group=c * h)
            )
        out["user"] = asdict(compose(per_user, delta=p.delta, unit="user"))
        out["notes"].append(
            f"Per user: at most {c} observations of a user are counted per window "
            f"(user key {p.user_key!r}); the {r} retention and {h} hot windows compose."
        )
    return out


async def get(*, session: AsyncSession, name: str) -> dict[str, Any]:
    stream = await streams.get(session=session, name=name)
    return {"stream": name, **ledger(StreamCreate.model_validate(stream.config))}

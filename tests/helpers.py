"""Small builders shared by the tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.context import AppContext
from service.streams import service as streams
from service.windows.service import store_of


def stream_body(name: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "features": [
            {"name": "user", "kind": "categorical"},
            {"name": "item", "kind": "categorical"},
            {
                "name": "age",
                "kind": "numeric",
                "buckets": [18, 25, 35, 45, 56],
                "passthrough": True,
            },
        ],
        "labels": ["0", "1"],
        "window_seconds": 3600,
        "hot_windows": 1,
        "retention_windows": 3,
        "privacy": {"mechanism": "none"},
        "sketch": {"width": 1024, "depth": 3},
    }
    body.update(over)
    return body


def obs(user: str, item: str, age: float, label: str, id_: str | None = None) -> dict[str, Any]:
    o: dict[str, Any] = {"features": {"user": user, "item": item, "age": age}, "label": label}
    if id_:
        o["id"] = id_
    return o


async def window_cells(ctx: AppContext, name: str, epoch: int) -> dict[str, bytes | None]:
    """Raw bytes of every table of a window (to show counts unchanged / changed), once every
    accepted observation is counted (as the counting job or a roll would)."""
    from service.ingest import service as ingest

    rt = await streams.runtime(ctx=ctx, name=name)
    await ingest.count_window(ctx=ctx, rt=rt, window=epoch)
    out: dict[str, bytes | None] = {}
    for t in rt.tables:
        out[t.name] = await ctx.redis.get(ctx.keys.table(name, epoch, t.id))
    out["_prior"] = await ctx.redis.get(ctx.keys.prior(name, epoch))
    out["_hot"] = str(await store_of(ctx).hot_length(name, epoch)).encode()
    return out


def prior_of(cells: bytes | None) -> np.ndarray:
    assert cells is not None
    return np.frombuffer(cells, ">i4").astype(np.int64)

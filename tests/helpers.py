"""Small builders shared by the tests."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from service.context import AppContext
from service.core.features import counting as counting_math
from service.core.features.columns import table_name
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate
from service.counting import service as counting
from service.db.models import Base
from service.ingest import service as ingest_service
from service.ingest.schemas import IngestIn
from service.streams import service as streams
from tests.conftest import Api, unique


def producer_scope(api: Api, role: str = "producer") -> str:
    """The Idempotency-Key scope of the key ``api`` holds for ``role`` (its actor: the key's id,
    ``sk_<id>_<secret>``, when none was named)."""
    return ingest_service.key_scope(actor=api.keys[role].split("_")[1])


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


def runtime() -> StreamRuntime:
    """The runtime of a stream of ``stream_body`` as its creation makes it (one table per
    feature), without Redis or SQL: for the pure code of ``service.core``."""
    cfg = StreamCreate.model_validate(stream_body("s"))
    tables = tuple(
        TableRef(i, table_name([f.name]), (f.name,), 1) for i, f in enumerate(cfg.features, 1)
    )
    return StreamRuntime(id=1, name=cfg.name, config=cfg, hash_seed=bytes(range(32)), tables=tables)


async def new_stream(api: Api, prefix: str = "s", **over: Any) -> str:
    """A new stream of ``stream_body`` (``over`` replaces its fields) named ``prefix-<random>``:
    its name."""
    name = unique(prefix)
    r = await api.post("/v1/streams", json=stream_body(name, **over))
    assert r.status_code == 201, r.text
    return name


async def ingest(api: Api, name: str, rows: list[dict[str, Any]]) -> int:
    """Posts one batch as the producer: the window it landed in."""
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202, r.text
    return int(r.json()["window"])


async def featurize(api: Api, name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": rows})
    assert r.status_code == 200, r.text
    return dict(r.json())


def column(out: dict[str, Any], name: str) -> list[float]:
    """One column of a ``/featurize`` answer."""
    j = out["columns"].index(name)
    return [row[j] for row in out["rows"]]


def obs(user: str, item: str, age: float, label: str, id_: str | None = None) -> dict[str, Any]:
    o: dict[str, Any] = {"features": {"user": user, "item": item, "age": age}, "label": label}
    if id_:
        o["id"] = id_
    return o


async def window_cells(ctx: AppContext, name: str, epoch: int) -> dict[str, bytes | None]:
    """Raw bytes of every table of a window (to show counts unchanged / changed), once every
    accepted observation is counted (as the counting job or a roll would)."""

    rt = await streams.runtime(ctx=ctx, name=name)
    await counting.count_window(ctx=ctx, rt=rt, window=epoch)
    out: dict[str, bytes | None] = {}
    for t in rt.tables:
        out[t.name] = await ctx.redis.get(ctx.keys.table(name, epoch, t.id))
    out["_prior"] = await ctx.redis.get(ctx.keys.prior(name, epoch))
    out["_hot"] = str(await ctx.stores.windows.hot_length(name, epoch)).encode()
    return out


def prior_of(cells: bytes | None) -> np.ndarray:
    assert cells is not None
    return np.frombuffer(cells, ">i4").astype(np.int64)


def batch_ops(rt: StreamRuntime, body: IngestIn) -> tuple[list[int], list[bytes], list[bytes]]:
    """The increments the counting job computes for a batch: from its rows as the hot stream
    stores them (JSON), not from the request's values. The ids of the tables of window 1,
    their packed ops (the prior's last) and the rows."""
    rows = ingest_service.batch_rows(body)
    tables = counting_math.tables_of(rt, 1)
    parsed, _ = counting_math.parse_rows(rt, b",".join(rows), after=b"", last=b"")
    ops = counting_math.count_increments(rt, tables, parsed.encoded, parsed.labels).packed()
    return [t.id for t in tables], ops, rows


def spy_urandom(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the size of every ``os.urandom`` call (the production randomness) is
    appended to the list returned."""
    requested: list[int] = []
    real = os.urandom

    def spy(n: int) -> bytes:
        requested.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", spy)
    return requested


def forbid_prngs(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, every PRNG of numpy and of ``random`` raises: production randomness may
    come from ``os.urandom`` only."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a PRNG was used")

    np_names = [
        "default_rng", "Generator", "RandomState", "seed", "random", "random_sample", "rand",
        "randn", "randint", "integers", "bytes", "choice", "shuffle", "permutation", "laplace",
        "normal", "geometric", "gumbel", "uniform", "PCG64", "PCG64DXSM", "MT19937", "Philox",
        "SFC64", "SeedSequence", "BitGenerator", "get_state", "set_state",
    ]  # fmt: skip
    for name in np_names:
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, forbidden)
    for name in ["Random", "SystemRandom", "random", "getrandbits", "randbytes", "randint",
                 "seed", "choice", "uniform", "gauss"]:  # fmt: skip
        monkeypatch.setattr(random, name, forbidden)


async def redis_dump(ctx: AppContext) -> bytes:
    """Every key and value of this run in Redis (its prefix, and the job queue's keys). The
    commands go in pipelines, a few round trips in all: the session's earlier tests leave
    thousands of keys, one round trip each was most of a dump's time."""
    keys = [k async for k in ctx.redis.scan_iter(match=f"*{ctx.keys.prefix}*", count=1000)]
    out: list[bytes] = []
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        pipe = ctx.redis.pipeline(transaction=False)
        for k in chunk:
            pipe.type(k)
        kinds = [kind.decode() for kind in await pipe.execute()]
        pipe = ctx.redis.pipeline(transaction=False)
        for k, kind in zip(chunk, kinds, strict=True):
            if kind == "string":
                pipe.get(k)
            elif kind == "hash":
                pipe.hgetall(k)
            elif kind == "stream":
                pipe.xrange(k)
            elif kind == "set":
                pipe.smembers(k)
            elif kind == "zset":
                pipe.zrange(k, 0, -1)
            elif kind == "list":
                pipe.lrange(k, 0, -1)
        values = iter(await pipe.execute())
        for k, kind in zip(chunk, kinds, strict=True):
            out.append(k)
            if kind == "string":
                out.append(next(values) or b"")
            elif kind == "hash":
                out += [b for kv in next(values).items() for b in kv]
            elif kind == "stream":
                for eid, fields in next(values):
                    out += [eid, *[b for kv in fields.items() for b in kv]]
            elif kind in ("set", "zset", "list"):
                out += list(next(values))
    return b"\n".join(out)


async def sql_dump(ctx: AppContext) -> bytes:
    """Every live row of every table, as text and raw bytes."""
    parts: list[bytes] = []
    async with ctx.sessionmaker() as s:
        for table in Base.metadata.sorted_tables:
            for row in (await s.execute(text(f'SELECT * FROM "{table.name}"'))).all():
                parts += [v if isinstance(v, bytes) else repr(v).encode() for v in row]
    return b"\n".join(parts)


async def aof_rewritten(ctx: AppContext) -> None:
    """Wait for an AOF rewrite under way (or scheduled) to finish."""
    for _ in range(200):
        info = await ctx.redis.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("AOF rewrite did not finish")


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait for them to end, cancelling again while one runs: on Python
    3.11 a cancellation that arrives as redis-py's ``asyncio.wait_for`` around a command's send
    completes is lost, and a task polling Redis polls on (``resources.close`` does the same)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    await asyncio.gather(*tasks, return_exceptions=True)

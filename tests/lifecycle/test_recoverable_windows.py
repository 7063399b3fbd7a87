"""What Redis holds of a user-keyed stream's count tables never lets more than R + H windows be
recovered, the windows the per-user ledger charges (docs/ARCHITECTURE.md, "Life cycle",
"Privacy ledger").

At every step of every roll (the roll's ``step`` hook) and after the follow-ups, the test
enumerates the stream's keys: a window's tables (and a counting run's staged tables) give
that window; an aggregate, or an aggregate's staging key, gives the sum of the windows it
holds. A window is recoverable when its indicator is a linear combination of those (sketches
are linear: table(e−H−R) = agg(e−1) − agg(e) + table(e−H)). Windows that can take counts are
those up to the epoch pointer (the counting job may count the open window at any time); a
prepared window holds noise only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import orjson
import pytest
import redis

from service.core.tables.aggregate import Aggregate
from service.features import pointer
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import REDIS_URL, Api, Backend, Jobs
from tests.helpers import column, featurize, ingest, new_stream, obs


@contextmanager
def sync_redis(backend: Backend) -> Iterator[redis.Redis]:
    if backend.embedded is not None:
        r = redis.Redis(unix_socket_path=backend.embedded.socket)
    else:
        r = redis.Redis.from_url(REDIS_URL)  # type: ignore[arg-type]
    try:
        yield r
    finally:
        r.close()


def recoverable(r: redis.Redis, prefix: str, name: str) -> tuple[set[int], int]:
    """(windows recoverable from the stream's tables and aggregates, the epoch pointer)."""
    epoch = int(r.get(f"{prefix}:{{{name}}}:epoch") or 0)
    rows: list[set[int]] = []
    for raw in r.scan_iter(match=f"{prefix}:{{{name}*", count=1000):
        key = raw.decode()
        tag, _, rest = key[len(prefix) + 2 :].partition("}:")
        if ":" in tag:  # a window's key: {name:w}
            w = int(tag.rsplit(":", 1)[1])
            if rest.startswith(("t:", "prior", "stage:")):
                rows.append({w})
        elif rest.startswith("agg:") and r.type(raw) == b"hash":
            meta = r.hget(raw, "meta")
            if meta is not None:
                rows.append(set(orjson.loads(meta)["windows"]))
    data = {w for row in rows for w in row if w <= epoch}
    universe = sorted({w for row in rows for w in row})
    if not universe:
        return set(), epoch
    col = {w: i for i, w in enumerate(universe)}
    m = np.zeros((len(rows), len(universe)))
    for i, row in enumerate(rows):
        for w in row:
            m[i, col[w]] = 1
    rank = np.linalg.matrix_rank(m)
    out = set()
    for w in data:
        e = np.zeros((1, len(universe)))
        e[0, col[w]] = 1
        if np.linalg.matrix_rank(np.vstack([m, e])) == rank:
            out.add(w)
    return out, epoch


@pytest.mark.parametrize(("hot", "follow_ups"), [(2, True), (2, False), (1, True)])
async def test_no_more_windows_are_recoverable_than_the_ledger_charges(
    api: Api, jobs: Jobs, backend: Backend, hot: int, follow_ups: bool
) -> None:
    retention = 2
    name = await new_stream(
        api,
        "rec",
        hot_windows=hot,
        retention_windows=retention,
        privacy={"mechanism": "laplace", "epsilon": 1, "user_key": "user"},
    )
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    charged = led["user"]["parts"][0]["parameters"]["windows_composed"]
    assert charged == retention + hot
    prefix = api.ctx.keys.prefix
    seen: list[tuple[str, int, set[int]]] = []
    with sync_redis(backend) as r:

        def check(at: str) -> None:
            windows, epoch = recoverable(r, prefix, name)
            seen.append((at, epoch, windows))
            assert len(windows) <= charged, (at, epoch, sorted(windows))

        for k in range(7):
            await ingest(api, name, [obs(f"u{k}", "i", 30, "1")])
            check("ingested")
            await lifecycle_roll.roll(ctx=api.ctx, name=name, step=check)
            check("rolled")
            if follow_ups or k < 2:
                await jobs()
                check("followed up")
    # the stream did reach a state holding the R + H windows (the check is not vacuous)
    assert max(len(w) for _, _, w in seen) == charged


async def test_a_process_behind_the_roll_fails_over_to_the_served_epoch(api: Api) -> None:
    """featurize caches the ``served`` pointer for 20 ms: a process that still takes the
    previous epoch as served, without its featurizer in memory, finds its aggregate deleted by
    the roll, reads the pointer again and answers from the current epoch (never a 500)."""
    name = await new_stream(api, "fo", hot_windows=2, retention_windows=2)
    ctx = api.ctx
    await ingest(api, name, [obs("alice", "x", 20, "1")])
    for _ in range(3):
        await lifecycle_roll.roll(ctx=ctx, name=name)
    assert await ctx.stores.windows.served(name) == 4
    assert await ctx.stores.windows.read_agg(name, 3) is None  # gone with the roll
    ctx.caches.featurizers.pop(name, None)
    ctx.caches.featurizers_ahead.pop(name, None)
    pointer.moved(ctx, name, 3)  # as a process whose cached pointer is behind
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    assert out["epoch"] == 4 and column(out, "user:count:1")[0] == 1.0


async def test_an_aggregate_of_an_earlier_epoch_never_lands(api: Api) -> None:
    """A writer of an aggregate (a late follow-up) whose epoch the stream no longer serves
    drops it: it may hold a window whose tables expiry deleted."""
    name = await new_stream(api, "late", hot_windows=2, retention_windows=2)
    ctx = api.ctx
    store = ctx.stores.windows
    for _ in range(3):
        await lifecycle_roll.roll(ctx=ctx, name=name)
    stale = Aggregate(2, -1, 0, [0], [], np.zeros(2, np.int64))
    assert await store.write_agg(name, stale) is False
    assert await store.read_agg(name, 2) is None
    assert await ctx.redis.smembers(store.agg_stages(name)) == set()
    current = await store.read_agg(name, 4)
    assert current is not None and await store.write_agg(name, current) is True

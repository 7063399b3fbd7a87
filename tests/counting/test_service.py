"""The counting job (``service.counting``): accepted rows reach the window's tables when they
are counted, exactly once whatever races or crashes, through the Lua script's BITFIELD calls
or whole-table writes; user-level privacy: at most c observations of one user are counted
per window."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.core.features import counting as counting_math
from service.core.features.columns import row_keys, table_keys
from service.core.features.runtime import StreamRuntime
from service.core.tables.sketch import aggregate_increments, hash_keys
from service.counting import service as counting
from service.ingest.schemas import IngestIn
from service.lifecycle import roll as lifecycle_roll
from service.stores.counting import STAGE_TTL_SECONDS, CountingStore
from service.streams import service as streams
from tests.conftest import Api, unique
from tests.helpers import (
    batch_ops,
    ingest,
    new_stream,
    obs,
    prior_of,
    stream_body,
    window_cells,
)


async def test_at_most_c_observations_per_user_and_window_are_counted(api: Api) -> None:
    name = unique("usr")
    body = stream_body(
        name, privacy={"mechanism": "none", "user_key": "user", "max_contributions_per_window": 2}
    )
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201
    assert r.json()["l1_sensitivity"] == 2 * 4 * 3  # c · T · depth, T = 3 features + prior

    await ingest(api, name, [obs("u1", "x", 20, "1")] * 5 + [obs("u2", "x", 20, "0")])
    await ingest(api, name, [obs("u1", "y", 20, "0")] * 2 + [obs("u2", "y", 20, "0")])
    cells = await window_cells(api.ctx, name, 1)
    assert cells["_hot"] == b"9"  # every observation reaches the hot store
    np.testing.assert_array_equal(prior_of(cells["_prior"]), [2, 2])  # u1: 2 (both "1"), u2: 2
    # the counters hold keyed hashes, never the raw user ids
    counters = await api.ctx.redis.hgetall(api.ctx.keys.users(name, 1))
    assert sorted(int(v) for v in counters.values()) == [2, 7]
    assert all(b"u1" not in k and b"u2" not in k for k in counters)

    await api.post(f"/v1/streams/{name}/roll")
    await ingest(api, name, [obs("u1", "z", 20, "0")] * 3)
    np.testing.assert_array_equal(
        prior_of((await window_cells(api.ctx, name, 2))["_prior"]), [2, 0]
    )  # a new window: u1 counts again, up to 2
    out = (
        await api.post(
            f"/v1/streams/{name}/featurize",
            role="model",
            json={"rows": [{"user": "u1"}, {"user": "u2"}]},
        )
    ).json()
    cols = out["columns"]
    assert out["rows"][0][cols.index("user:count:1")] == 2.0
    assert out["rows"][0][cols.index("user:count:0")] == 0.0  # u1's "0"s came past the bound
    assert out["rows"][1][cols.index("user:total")] == 2.0
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [{"features": {"item": "x"}, "label": "1"}]},
    )
    assert r.status_code == 422 and "user key" in r.json()["detail"]
    assert await api.ctx.stores.windows.hot_length(name, 2) == 3


async def test_lua_applies_exactly_the_batch_increments(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script turns the packed ops into BITFIELD calls (over 1000 ops per table here, so in
    several calls): the window's cells are the reference increments (no noise: zeros + ops)."""
    name = await new_stream(api, "cnt")
    monkeypatch.setattr(counting, "SCRIPT_OPS_MAX", 10**9)  # every op through the script
    observations = [obs(f"user{i}", f"item{i % 97}", 20 + i % 50, str(i % 2)) for i in range(900)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": observations}
    )
    assert r.status_code == 202, r.text
    rt = await streams.runtime(ctx=api.ctx, name=name)
    body = IngestIn.model_validate({"observations": observations})
    feats = [o.features for o in body.observations]
    labels = np.array([rt.label_index[o.label] for o in body.observations])
    values = row_keys(feats, rt.features)
    cells = await window_cells(api.ctx, name, 1)
    n_ops = 0
    for t in rt.tables:
        b, s = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        idx, deltas = aggregate_increments(labels, b, s, rt.spec)
        want = np.zeros(rt.spec.cells, np.int64)
        want[idx] = deltas
        n_ops = max(n_ops, idx.size)
        assert np.array_equal(prior_of(cells[t.name]), want), t.name
    assert n_ops > 1000  # the user table needed more than one BITFIELD call
    assert prior_of(cells["_prior"]).tolist() == [450, 450]


def _assert_counted_exactly(rt: StreamRuntime, cells: dict, observations: list[dict]) -> None:
    """Every table's cells are exactly the increments of ``observations`` (no noise)."""
    _, ops, _ = batch_ops(rt, IngestIn.model_validate({"observations": observations}))
    for t, packed in zip(rt.tables, ops, strict=False):
        idx, deltas = counting_math.unpack_ops(packed)
        want = np.zeros(rt.spec.cells, np.int64)
        want[idx] = deltas
        assert np.array_equal(prior_of(cells[t.name]), want), t.name


@pytest.mark.parametrize(
    ("dense_ratio", "ops_max"),
    [(0, 10**9), (10**9, 10**9), (0, 40)],
    ids=["bitfield", "whole-tables", "capped-script"],
)
async def test_accepted_rows_are_counted_once_by_racing_and_crashing_counters(
    api: Api, monkeypatch: pytest.MonkeyPatch, dense_ratio: int, ops_max: int
) -> None:
    """Counting runs from a checkpoint by compare-and-set: two counters racing over the same
    window, and a counter that dies after some chunks, still count every row exactly once,
    whether tables are incremented op by op, read, added to and staged whole, or a mix (the
    script's ops capped); a failed compare-and-set leaves no staging key, and the dead
    counter's expire."""
    name = await new_stream(api, "cnt")
    monkeypatch.setattr(counting, "DENSE_RATIO", dense_ratio)
    monkeypatch.setattr(counting, "SCRIPT_OPS_MAX", ops_max)
    monkeypatch.setattr(counting, "COUNT_CHUNK", 37)  # many chunks, many CAS rounds
    batches = [
        [
            obs(f"user{i % 13}", f"item{(i * 7) % 29}", 20 + i % 50, str(i % 2))
            for i in range(k, k + 60)
        ]
        for k in range(0, 600, 60)
    ]
    for batch in batches[:5]:
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202, r.text
    rt = await streams.runtime(ctx=api.ctx, name=name)

    calls = 0
    real = CountingStore.count

    async def dies_on_the_third(self, **kw):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionError("killed")
        return await real(self, **kw)

    monkeypatch.setattr(CountingStore, "count", dies_on_the_third)
    with pytest.raises(ConnectionError):
        await counting.count_window(ctx=api.ctx, rt=rt, window=1)
    monkeypatch.setattr(CountingStore, "count", real)
    assert 0 < await api.ctx.redis.xlen(api.ctx.keys.hot(name, 1)) == 300
    checkpoint = await api.ctx.stores.counting.counted(name, 1)
    before = len(await api.ctx.redis.xrange(api.ctx.keys.hot(name, 1), "-", checkpoint))
    assert 0 < before < 300  # two runs counted, then the counter died
    for batch in batches[5:]:  # more rows arrive while two counters race
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202
    done = await asyncio.gather(
        *(counting.count_window(ctx=api.ctx, rt=rt, window=1) for _ in range(2))
    )
    assert sum(done) + before == 600  # each row counted by exactly one run
    cells = await window_cells(api.ctx, name, 1)
    every = [o for batch in batches for o in batch]
    assert prior_of(cells["_prior"]).tolist() == [300, 300]
    _assert_counted_exactly(rt, cells, every)
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) == 0
    left = [k async for k in api.ctx.redis.scan_iter(match=f"*{{{name}:1}}:stage:*")]
    staged = dense_ratio > 0 or ops_max < 10**9
    assert len({k.rsplit(b":", 2)[1] for k in left}) == (1 if staged else 0)  # the dead run's
    for k in left:
        assert 0 < await api.ctx.redis.ttl(k) <= STAGE_TTL_SECONDS


async def test_a_staging_key_lost_before_the_compare_and_set_recounts_the_run(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staging key that is gone when count.lua runs (expired: a counter stalled past its
    TTL) fails the whole run before any write, and the counter counts the run again: nothing
    is half-applied, lost or counted twice."""
    name = await new_stream(api, "cnt")
    monkeypatch.setattr(counting, "DENSE_RATIO", 10**9)  # every table staged
    batch = [obs(f"user{i % 7}", f"item{i % 11}", 30, str(i % 2)) for i in range(50)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
    )
    assert r.status_code == 202, r.text
    rt = await streams.runtime(ctx=api.ctx, name=name)
    real = CountingStore.stage
    lost = 0

    async def loses_the_first(self, **kw):  # type: ignore[no-untyped-def]
        nonlocal lost
        await real(self, **kw)
        if not lost:
            lost += 1
            first = next(iter(kw["tables"]))
            await api.ctx.redis.delete(api.ctx.keys.stage(name, 1, kw["token"], first))

    monkeypatch.setattr(CountingStore, "stage", loses_the_first)
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) == 50
    assert lost == 1
    cells = await window_cells(api.ctx, name, 1)
    assert prior_of(cells["_prior"]).tolist() == [25, 25]
    _assert_counted_exactly(rt, cells, batch)
    assert not [k async for k in api.ctx.redis.scan_iter(match=f"*{{{name}:1}}:stage:*")]


async def test_tables_wait_for_the_counter_and_a_roll_counts_the_rest(api: Api) -> None:
    """Accepting a batch only appends its rows; the tables change when they are counted, and a
    roll counts what is left before the window joins the count period."""
    name = await new_stream(api, "cnt")
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u1", "i1", 20, "1")] * 3},
    )
    assert r.status_code == 202
    raw = await api.ctx.redis.get(api.ctx.keys.prior(name, 1))
    assert prior_of(raw).tolist() == [0, 0]  # accepted, not counted yet
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    raw = await api.ctx.redis.get(api.ctx.keys.prior(name, 1))
    assert prior_of(raw).tolist() == [0, 3]


@pytest.mark.slow  # the real worker, counting every stream of the session
async def test_the_counting_cron_enqueues_one_job_per_stream_and_the_worker_counts_them(
    api: Api,
) -> None:
    """The cron enqueues a ``count_stream`` job per stream, keyed by the stream, so streams
    are counted in parallel (the worker's slots, several workers) and one stream never by two
    jobs at once: while a stream's job is queued, the next tick enqueues none for it. The
    real worker then counts every stream."""
    from saq.job import Status

    from service.jobs import queue_name
    from workers import jobs as worker_jobs
    from workers.runner import run_in_process

    names = [await new_stream(api, "cnt") for _ in range(2)]
    for name in names:
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            json={"observations": [obs("u1", "i1", 20, "1"), obs("u2", "i2", 30, "0")]},
        )
        assert r.status_code == 202, r.text
    first = await worker_jobs.ingest_count({"app": api.ctx})
    assert first["enqueued"] >= 2  # (other tests' streams share the database)
    queue = api.ctx.jobs.queue
    for name in names:
        job = await queue.job(f"{queue_name(api.ctx.keys)}:count:{name}")
        assert job is not None and job.status == Status.QUEUED
        assert (job.function, job.kwargs) == ("count_stream", {"stream": name})
    assert (await worker_jobs.ingest_count({"app": api.ctx}))["enqueued"] == 0
    worker = asyncio.create_task(run_in_process(api.ctx))
    try:
        for _ in range(300):
            last = [await api.ctx.stores.windows.hot_last_id(n, 1) for n in names]
            done = [await api.ctx.stores.counting.counted(n, 1) for n in names]
            if done == last:
                break
            assert not worker.done(), worker
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the worker did not count both streams within 30 s")
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)

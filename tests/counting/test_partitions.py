"""Windows split into parts (``StreamCreate.partitions``): each part has its own hash tag, hot
rows, checkpoint and exact tables; the window's noise is drawn once (part 0), so a window's
tables summed over its parts are what one part would hold; a user's rows all go to one part,
so the per-user bound is exact per window; a keyed batch is accepted exactly once across
parts, whatever crashes between them; every reader of a window reads every part."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sqlalchemy import select

from service.coldstore import service as coldstore
from service.counting import service as counting
from service.db.models import ColdSegment, Stream, Window
from service.jobs import queue_name
from service.stores.ingest import IngestStore
from service.streams import service as streams
from tests.conftest import Api, Backend, Jobs
from tests.counting.tables import expected_tables
from tests.helpers import new_stream, obs, stream_body

PARTS = 3


def _rows(n: int, users: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        obs(
            f"u{rng.integers(users)}",
            f"i{rng.integers(7)}",
            float(rng.integers(15, 70)),
            str(rng.integers(2)),
            id_=f"r{seed}-{i}",
        )
        for i in range(n)
    ]


async def _post(api: Api, name: str, rows: list[dict[str, Any]], key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": rows},
        headers=headers,
    )


async def _window(api: Api, name: str, w: int) -> np.ndarray:
    rt = await streams.runtime(ctx=api.ctx, name=name)
    flat = await api.ctx.stores.windows.read_window(
        name, w, [t.id for t in rt.tables], cells=rt.spec.cells, parts=rt.parts
    )
    assert flat is not None
    return flat


def _user_stream(**over: Any) -> dict[str, Any]:
    privacy = {"mechanism": "none", "user_key": "user", "max_contributions_per_window": 2}
    return {"partitions": PARTS, "privacy": privacy, "hot_windows": 2, **over}


async def test_parts_count_exactly_what_one_part_would_with_the_user_bound_per_window(
    api: Api,
) -> None:
    name = await new_stream(api, "prt", **_user_stream())
    rows = _rows(300, users=40)
    for i in range(0, len(rows), 50):
        assert (await _post(api, name, rows[i : i + 50])).status_code == 202
    ctx = api.ctx
    rt = await streams.runtime(ctx=ctx, name=name)
    lengths = [await ctx.redis.xlen(ctx.keys.hot(name, 1, p)) for p in range(PARTS)]
    assert sum(lengths) == 300 and all(n > 0 for n in lengths)  # spread over every part
    # each part counted by its own call, as the per-part jobs do
    for p in range(PARTS):
        assert await counting.count_stream(ctx, name, p) == lengths[p]
    np.testing.assert_array_equal(
        await _window(api, name, 1), await expected_tables(api, name, rows, 2)
    )
    # every user's counter in exactly one part (so the bound of 2 holds per window)
    seen: dict[bytes, int] = {}
    for p in range(PARTS):
        for user, n in (await ctx.redis.hgetall(ctx.keys.users(name, 1, p))).items():
            assert user not in seen
            seen[user] = int(n)
    assert len(seen) == len({r["features"]["user"] for r in rows})
    assert rt.parts == PARTS


async def test_a_window_of_several_parts_draws_its_noise_once(api: Api) -> None:
    """Part 0 holds the window's noise; every other part starts at zero. Noise drawn per part
    would add P draws to the window's sum: P times the variance the ledger charges for."""
    name = await new_stream(
        api, "prn", partitions=PARTS, privacy={"mechanism": "laplace", "epsilon": 1.0}
    )
    ctx = api.ctx
    rt = await streams.runtime(ctx=ctx, name=name)
    for w in (1, 2):  # the open window and the one prepared ahead
        for p in range(PARTS):
            raw = [await ctx.redis.get(ctx.keys.table(name, w, t.id, p)) for t in rt.tables]
            raw.append(await ctx.redis.get(ctx.keys.prior(name, w, p)))
            assert all(b is not None for b in raw)
            nonzero = sum(int(np.any(np.frombuffer(b, ">i4"))) for b in raw if b)
            if p == 0:
                assert nonzero == len(raw)
            else:
                assert nonzero == 0
        assert await ctx.stores.windows.state(name, w) == ("open" if w == 1 else "prepared")
        for p in range(PARTS):
            state = await ctx.redis.hget(ctx.keys.meta(name, w, p), "state")
            assert state == (b"open" if w == 1 else b"prepared")


async def test_a_keyed_batch_is_accepted_once_across_parts_whatever_fails_between_them(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = await new_stream(api, "prk", **_user_stream())
    rows = _rows(60, users=30, seed=1)
    real = IngestStore.accept
    calls = {"n": 0}

    async def crash_at_part_2(self: IngestStore, **kw: Any) -> Any:
        if kw.get("part") == 2 and calls["n"] == 0:
            calls["n"] += 1
            raise ConnectionError("lost between parts")
        return await real(self, **kw)

    monkeypatch.setattr(IngestStore, "accept", crash_at_part_2)
    with pytest.raises(ConnectionError):
        await _post(api, name, rows, key="k-1")
    monkeypatch.setattr(IngestStore, "accept", real)
    ctx = api.ctx
    partial = sum([await ctx.redis.xlen(ctx.keys.hot(name, 1, p)) for p in range(PARTS)])
    assert 0 < partial < 60  # parts 0 and 1 were accepted
    r = await _post(api, name, rows, key="k-1")  # the retry completes the batch
    assert r.status_code == 202 and r.json() == {"accepted": 60, "window": 1}
    assert "Idempotent-Replayed" not in r.headers  # the first attempt was never answered
    again = await _post(api, name, rows, key="k-1")
    assert again.status_code == 202 and again.json() == r.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    other = await _post(api, name, _rows(5, users=5, seed=2), key="k-1")
    assert other.status_code == 422  # refused at part 0, before any of its rows
    assert await ctx.stores.windows.hot_length(name, 1, parts=PARTS) == 60
    await counting.count_window(ctx=ctx, rt=await streams.runtime(ctx=ctx, name=name), window=1)
    np.testing.assert_array_equal(
        await _window(api, name, 1), await expected_tables(api, name, rows, 2)
    )


async def test_a_roll_mid_batch_sends_the_rest_to_the_next_window_and_a_retry_follows(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll between two parts of a keyed batch: the parts left go to the next window, and a
    retry answers with the same window (the last a part went to), accepting nothing again."""
    name = await new_stream(api, "prr", **_user_stream())
    rows = _rows(40, users=30, seed=3)
    real = IngestStore.accept
    rolled = {"done": False}

    async def roll_before_part_1(self: IngestStore, **kw: Any) -> Any:
        if kw.get("part") == 1 and not rolled["done"]:
            rolled["done"] = True
            assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
        return await real(self, **kw)

    monkeypatch.setattr(IngestStore, "accept", roll_before_part_1)
    r = await _post(api, name, rows, key="k-roll")
    monkeypatch.setattr(IngestStore, "accept", real)
    assert r.status_code == 202 and r.json() == {"accepted": 40, "window": 2}
    store = api.ctx.stores.windows
    in_1 = await store.hot_length(name, 1, parts=PARTS)
    in_2 = await store.hot_length(name, 2, parts=PARTS)
    assert in_1 + in_2 == 40 and in_1 > 0 and in_2 > 0
    again = await _post(api, name, rows, key="k-roll")
    assert again.json() == r.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert (
        await store.hot_length(name, 1, parts=PARTS) + await store.hot_length(name, 2, parts=PARTS)
        == 40
    )


async def test_every_reader_of_a_window_reads_every_part(api: Api, jobs: Jobs) -> None:
    """The roll counts every part, featurize serves the sum, the train set holds every row,
    the seal seals every part (and verifies the window against all of them), expiry deletes
    every part's hot rows."""
    name = await new_stream(api, "prw", **_user_stream(hot_windows=1))
    rows = _rows(90, users=25, seed=4)
    assert (await _post(api, name, rows)).status_code == 202  # unkeyed: split as well
    ctx = api.ctx
    counted_rows = await expected_tables(api, name, rows, 2)
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    np.testing.assert_array_equal(await _window(api, name, 1), counted_rows)
    r = await api.post(
        f"/v1/streams/{name}/featurize", role="model", json={"rows": [{"user": "u3"}]}
    )
    assert r.status_code == 200, r.text
    n_u3 = min(2, sum(1 for o in rows if o["features"]["user"] == "u3"))
    cols = r.json()["columns"]
    assert r.json()["rows"][0][cols.index("user:total")] == n_u3
    # the train set: window 2 is the hot period now; rows there, part 0 counted (read by
    # column), the other parts not yet (read as JSON)
    more = _rows(45, users=25, seed=5)
    assert (await _post(api, name, more)).status_code == 202
    rt = await streams.runtime(ctx=ctx, name=name)
    assert await counting.count_window(ctx=ctx, rt=rt, window=2, part=0) > 0
    r = await api.get(f"/v1/streams/{name}/trainset", role="model")
    assert r.status_code == 200, r.text
    table = pa.ipc.open_stream(r.content).read_all()
    assert sorted(table.column("id").to_pylist()) == sorted(o["id"] for o in more)
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    # the seal: every part of the closed windows, verified against every part
    await jobs()  # the roll's follow-ups (expiry waits for the rounds that read a window)
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=20)
    assert stats.entries == 135 and stats.problems == 0 and stats.windows_sealed == 2
    async with ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        segs = list(await s.scalars(select(ColdSegment).where(ColdSegment.stream_id == sid)))
        wins = {w.epoch: w for w in await s.scalars(select(Window).where(Window.stream_id == sid))}
    assert {g.part for g in segs} == set(range(PARTS))
    assert wins[1].cold_sealed_at is not None and wins[2].cold_sealed_at is not None
    # window 1 left the hot period at the roll to 2: sealed now, so expired
    for p in range(PARTS):
        assert not await ctx.redis.exists(ctx.keys.hot(name, 1, p))


async def test_no_exact_part_outlives_the_raw_rows_of_its_window(api: Api, jobs: Jobs) -> None:
    """Parts p ≥ 1 hold exact counts, without noise: a one-time reader of Redis would read
    them as they are. While the window's raw rows are in Redis that tells nothing more; once
    expiry deletes them, the window is folded first: part 0 holds the sum (noise and every
    count, the same tables every reader read before), no other part has a table left, and a
    stream whose raw rows went before folding existed is folded by the next expiry."""
    name = await new_stream(
        api,
        "prf",
        partitions=PARTS,
        hot_windows=1,
        retention_windows=5,
        privacy={"mechanism": "laplace", "epsilon": 1.0},
    )
    ctx = api.ctx
    rt = await streams.runtime(ctx=ctx, name=name)
    ids = [t.id for t in rt.tables]
    for seed in (7, 8):
        assert (await _post(api, name, _rows(60, users=20, seed=seed))).status_code == 202
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    await jobs()
    before = {w: await _window(api, name, w) for w in (1, 2)}

    def part_keys(w: int) -> list[str]:
        return [
            key
            for p in range(1, PARTS)
            for key in [ctx.keys.table(name, w, t, p) for t in ids] + [ctx.keys.prior(name, w, p)]
        ]

    assert all([await ctx.redis.exists(k) for k in part_keys(1)])  # raw rows still there
    assert (await coldstore.seal_stream(ctx=ctx, name=name)).windows_sealed == 2
    for w in (1, 2):  # sealed and out of the hot period: raw rows gone, parts folded
        assert not await ctx.redis.exists(ctx.keys.hot(name, w, 0))
        assert await ctx.stores.windows.folded(name, w)
        assert not any([await ctx.redis.exists(k) for k in part_keys(w)])
        np.testing.assert_array_equal(await _window(api, name, w), before[w])
    # featurize and a roll's aggregate read the folded windows as before
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": [{}]})
    assert r.status_code == 200, r.text
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    np.testing.assert_array_equal(await _window(api, name, 2), before[2])

    # a window whose raw rows were deleted before folding existed: folded by the next expiry
    store = ctx.stores.windows
    w = 3
    assert (await _post(api, name, _rows(40, users=20, seed=9))).status_code == 202
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    await jobs()
    await counting.count_window(ctx=ctx, rt=rt, window=w)
    expected = await _window(api, name, w)
    await store.delete_hot(name, w, parts=PARTS)  # as the expiry of a version before it did
    async with ctx.sessionmaker() as s, s.begin():
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        row = await s.scalar(select(Window).where(Window.stream_id == sid, Window.epoch == w))
        assert row is not None
        row.hot_deleted_at = row.closed_at
    assert not await store.folded(name, w) and all(
        [await ctx.redis.exists(k) for k in part_keys(w)]
    )
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # its expiry
    assert await store.folded(name, w)
    assert not any([await ctx.redis.exists(k) for k in part_keys(w)])
    np.testing.assert_array_equal(await _window(api, name, w), expected)


async def test_a_crashed_runs_staged_tables_go_with_the_raw_rows(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counting run stages a part's new cells (exact counts in a part p ≥ 1) and dies before
    its compare-and-set: its staging keys are recorded in the part's meta, and the expiry that
    deletes the window's raw rows deletes them too, rather than leaving them to their TTL."""
    name = await new_stream(api, "prs", partitions=PARTS, hot_windows=1)
    ctx = api.ctx
    assert (await _post(api, name, _rows(60, users=20, seed=11))).status_code == 202
    rt = await streams.runtime(ctx=ctx, name=name)
    ids = [t.id for t in rt.tables]
    store = ctx.stores.counting
    await store.stage(  # the crashed run: staged, never counted
        stream=name, window=1, token="crashed", tables={t: b"\0" * 16 for t in ids}, part=2
    )
    staged = [ctx.keys.stage(name, 1, "crashed", t, 2) for t in ids]
    assert all([await ctx.redis.exists(k) for k in staged])
    # a run that succeeds (its tables staged: every one written whole) leaves no record
    monkeypatch.setattr(counting, "DENSE_RATIO", 10**9)
    done_parts: list[int] = []
    done = store.done

    async def recorded(**kw: Any) -> None:
        done_parts.append(kw["part"])
        await done(**kw)

    monkeypatch.setattr(store, "done", recorded)
    await counting.count_window(ctx=ctx, rt=rt, window=1)
    assert len(set(done_parts)) == PARTS  # every part's run staged its tables
    fields = await ctx.redis.hkeys(ctx.keys.meta(name, 1, 2))
    assert [f for f in fields if f.startswith(b"stage:")] == [b"stage:crashed"]
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    await jobs()
    assert (await coldstore.seal_stream(ctx=ctx, name=name)).windows_sealed == 1
    assert not await ctx.redis.exists(ctx.keys.hot(name, 1, 2))  # the raw rows went
    assert not any([await ctx.redis.exists(k) for k in staged])  # and the staged tables
    assert not [f for f in await ctx.redis.hkeys(ctx.keys.meta(name, 1, 2)) if b"stage" in f]


@pytest.mark.parametrize("at", ["after part 0", "before part 1", "inside part 0"])
async def test_a_read_that_a_fold_overtakes_counts_every_part_once(
    api: Api, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """A fold between a reader's read of part 0 and of the others would, read naively, add
    the other parts twice (part 0 read folded, then the parts not yet deleted) or leave them
    out (part 0 read unfolded, the parts deleted). The fold runs at either point of the read
    here, and the read still returns every count once."""
    name = await new_stream(
        api, "pro", partitions=PARTS, hot_windows=1, privacy={"mechanism": "none"}
    )
    ctx = api.ctx
    assert (await _post(api, name, _rows(80, users=30, seed=3))).status_code == 202
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    rt = await streams.runtime(ctx=ctx, name=name)
    ids = [t.id for t in rt.tables]
    store = ctx.stores.windows
    whole = await _window(api, name, 1)
    part_1 = await ctx.redis.get(ctx.keys.prior(name, 1, 1))
    assert part_1 is not None and np.frombuffer(part_1, ">i4").sum() > 0  # a part to fold
    read_part = store._read_part
    folded_once: list[bool] = []

    async def overtaken(s: str, w: int, p: int, table_ids: Any, cells: int) -> Any:
        if at == "before part 1" and p == 1 and not folded_once:
            folded_once.append(await store.fold(name, 1, ids, parts=PARTS))
        if at == "inside part 0" and p == 0 and not folded_once:
            # the sum moved into place between two of part 0's MGETs, the other parts not
            # deleted yet: the first table read unfolded, the rest folded
            unfolded = await read_part(s, w, p, table_ids, cells)
            folded_once.append(await store.sum_into_part_0(name, 1, ids, parts=PARTS))
            mixed = await read_part(s, w, p, table_ids, cells)
            mixed[:cells] = unfolded[:cells]
            return mixed
        out = await read_part(s, w, p, table_ids, cells)
        if at == "after part 0" and p == 0 and not folded_once:
            folded_once.append(await store.fold(name, 1, ids, parts=PARTS))
        return out

    monkeypatch.setattr(store, "_read_part", overtaken)
    flat = await store.read_window(name, 1, ids, cells=rt.spec.cells, parts=PARTS)
    assert folded_once == [True]
    assert flat is not None
    np.testing.assert_array_equal(flat, whole)
    monkeypatch.undo()
    if at == "inside part 0":  # a crash between the fold's steps: the parts are still there
        assert await ctx.redis.exists(ctx.keys.prior(name, 1, 1))
        np.testing.assert_array_equal(await _window(api, name, 1), whole)
        assert await store.fold(name, 1, ids, parts=PARTS)  # the next expiry's
        assert not await ctx.redis.exists(ctx.keys.prior(name, 1, 1))
    np.testing.assert_array_equal(await _window(api, name, 1), whole)


async def test_the_cron_enqueues_one_counting_job_per_part(api: Api) -> None:
    name = await new_stream(api, "prj", partitions=PARTS)
    await counting.enqueue_all(api.ctx)
    queue = api.ctx.jobs.queue
    q = queue_name(api.ctx.keys)
    for p in range(PARTS):
        job = await queue.job(f"{q}:{counting.count_job_key(name, p)}")
        assert job is not None
        assert job.kwargs == ({"stream": name, "part": p} if p else {"stream": name})


async def test_partitions_are_bounded(api: Api) -> None:
    for bad, needle in ((0, "partitions"), (65, "partitions")):
        r = await api.post("/v1/streams", json=stream_body("prb-x", partitions=bad))
        assert r.status_code == 422 and needle in r.text
    big = stream_body("prb-y", partitions=64, sketch={"width": 1 << 20, "depth": 4})
    r = await api.post("/v1/streams", json=big)
    assert r.status_code == 422 and "partitions" in r.text


# --- kill -9 of a counting process mid-run ------------------------------------------------

CHILD = r"""
import asyncio, os, signal, sys
from service import resources
from service.config import Settings
from service.counting import service as counting
from service.stores.counting import CountingStore

async def main(name, part, kill_at, after):
    after = int(after)
    s = Settings.model_validate_json(os.environ["SEL_TEST_SETTINGS"])
    ctx = await resources.build(s, embedded=None)
    counting.COUNT_CHUNK = 1  # a run a listed batch
    real = CountingStore.count
    runs = {"n": 0}

    async def count(self, **kw):
        runs["n"] += 1
        if runs["n"] == after and kill_at == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = await real(self, **kw)
        if runs["n"] == after and kill_at == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    CountingStore.count = count
    n = await counting.count_stream(ctx, name, int(part))
    print("counted", n, "in", runs["n"], "runs", file=sys.stderr)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow  # a child process per kill
@pytest.mark.parametrize("kill_at", ["before", "after"])
async def test_a_counter_killed_mid_part_loses_and_duplicates_nothing(
    api: Api, backend: Backend, kill_at: str
) -> None:
    """A process counting one part is killed (SIGKILL) before or after the compare-and-set of
    its third run; another part's counter runs meanwhile; the next count of that part picks up
    from its checkpoint, and the window's tables hold every row exactly once."""
    name = await new_stream(api, "prk9", **_user_stream())
    rows = _rows(400, users=60, seed=6)
    for i in range(0, len(rows), 50):  # 8 batches: 8 runs of each part
        assert (await _post(api, name, rows[i : i + 50])).status_code == 202
    settings = backend.settings
    if backend.embedded is not None:  # the child reaches the same embedded server
        settings = settings.model_copy(update={"redis_url": f"unix://{backend.embedded.socket}"})
    env = {**os.environ, "SEL_TEST_SETTINGS": settings.model_dump_json()}
    ctx = api.ctx
    killed = subprocess.Popen(
        [sys.executable, "-c", CHILD, name, "1", kill_at, "3"],
        env=env,
        stderr=subprocess.PIPE,
    )
    assert await counting.count_stream(ctx, name, 0) > 0  # part 0 alongside, in this process
    _, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, err.decode()[-2000:]
    checkpoint = await ctx.stores.counting.counted(name, 1, 1)
    last = await ctx.stores.windows.hot_last_id(name, 1, 1)
    assert checkpoint and checkpoint != last  # it died mid-part
    for p in range(PARTS):
        await counting.count_stream(ctx, name, p)
    np.testing.assert_array_equal(
        await _window(api, name, 1), await expected_tables(api, name, rows, 2)
    )


async def test_the_counting_job_lets_a_part_gather_rows_for_a_while(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job leaves the open window's part while few rows wait and the oldest is young
    (a run's whole-table writes cost Redis per cell, not per row); it counts once the oldest
    has waited LINGER_SECONDS, and a roll counts everything at once."""
    name = await new_stream(api, "prl", **_user_stream())
    ctx = api.ctx
    rows = _rows(9, users=9, seed=7)
    assert (await _post(api, name, rows)).status_code == 202
    assert sum([await counting.count_stream(ctx, name, p) for p in range(PARTS)]) == 0
    monkeypatch.setattr(counting, "LINGER_SECONDS", 0.0)
    assert sum([await counting.count_stream(ctx, name, p) for p in range(PARTS)]) == 9
    monkeypatch.undo()
    more = _rows(6, users=9, seed=8)
    assert (await _post(api, name, more)).status_code == 202
    monkeypatch.setattr(counting, "LINGER_ROWS_PER_CELLS", 1 / 10**9)  # any row is enough
    assert sum([await counting.count_stream(ctx, name, p) for p in range(PARTS)]) == 6

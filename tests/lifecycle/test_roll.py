"""The roll (``service.lifecycle.roll``): a window's counts enter and leave the count period on
time, the count-period aggregate is kept incrementally, expiry deletes only what is sealed,
and a roll killed at any step is completed by the next run without double effects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from service.db.models import Window
from service.lifecycle import expire as lifecycle_expire
from service.lifecycle import roll as lifecycle_roll
from service.streams import repository
from service.streams import service as streams
from tests.conftest import Api, Jobs
from tests.helpers import column, featurize, ingest, new_stream, obs, window_cells


async def test_featurize_sees_exactly_the_count_period(api: Api) -> None:
    """hot_windows=2, retention=2: a window's counts appear once it leaves the hot period and
    vanish once it passes retention."""
    name = await new_stream(api, "win", hot_windows=2, retention_windows=2)
    probe = [{"user": "alice", "item": "x", "age": 20}]
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 3)  # window 1
    seen = []
    for _ in range(5):
        out = await featurize(api, name, probe)
        seen.append((out["epoch"], column(out, "user:count:1")[0]))
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    out = await featurize(api, name, probe)
    seen.append((out["epoch"], column(out, "user:count:1")[0]))
    # epoch e: count period = [e-3, e-2]; window 1 counted at epochs 3 and 4
    assert seen == [(1, 0.0), (2, 0.0), (3, 3.0), (4, 3.0), (5, 0.0), (6, 0.0)]


async def test_back_to_back_rolls_each_advance_one_window(api: Api) -> None:
    name = await new_stream(api, "win")
    epochs = [(await api.post(f"/v1/streams/{name}/roll")).json()["epoch"] for _ in range(3)]
    assert epochs == [2, 3, 4]
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    body = r.json()
    assert body["epoch"] == 4 and body["served_epoch"] == 4
    assert [w["epoch"] for w in body["windows"]] == [4, 3, 2, 1]
    assert body["windows"][0]["period"] == "open"


async def test_incremental_aggregate_equals_fresh_sum_and_old_tables_expire(api: Api) -> None:
    name = await new_stream(
        api, "win", retention_windows=2, privacy={"mechanism": "laplace", "epsilon": 1}
    )
    ctx = api.ctx
    for k in range(6):
        await ingest(api, name, [obs(f"u{k}", "i", 30, str(k % 2))] * (k + 1))
        await lifecycle_roll.roll(ctx=ctx, name=name)
    rt = await streams.runtime(ctx=ctx, name=name)
    store = ctx.stores.windows
    epoch = await store.epoch(name)
    assert epoch == 7
    incremental = await store.read_agg(name, epoch)
    assert incremental is not None and incremental.windows == [5, 6]
    fresh_tables = {t.id: np.zeros(rt.spec.cells, np.int64) for t in rt.tables}
    fresh_prior = np.zeros(2, np.int64)
    for w in (5, 6):
        data = await store.read_tables(rt.name, w, [t.id for t in rt.tables], cells=rt.spec.cells)
        assert data is not None
        for tid, cells in data[0].items():
            fresh_tables[tid] += cells
        fresh_prior += data[1]
    for tid, cells in fresh_tables.items():
        np.testing.assert_array_equal(incremental.tables[tid], cells)
    np.testing.assert_array_equal(incremental.prior, fresh_prior)
    # windows past retention lost their tables; hot data stays until sealed (cold-store issue)
    for w in range(1, 5):
        cells = await window_cells(ctx, name, w)
        assert all(v is None for k, v in cells.items() if not k.startswith("_hot"))
        assert cells["_hot"] != b"0"
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    states = {w["epoch"]: w["state"] for w in r.json()["windows"]}
    assert states[1] == "expired" and states[5] == "counted" and states[7] == "open"


async def test_with_two_hot_windows_the_roll_serves_an_aggregate_built_ahead(
    api: Api, jobs: Jobs
) -> None:
    """hot_windows = 2: the follow-up of the roll to E builds the aggregate of E + 1, so the
    roll to E + 1 moves ``served`` before it counts the window it closed; that aggregate is
    the plain sum of its count period's tables (rows accepted after it was built, into the
    open window, are not in it), and featurize answers from it."""
    name = await new_stream(
        api,
        "win",
        hot_windows=2,
        retention_windows=2,
        privacy={"mechanism": "laplace", "epsilon": 1},
    )
    ctx = api.ctx
    store = ctx.stores.windows
    rt = await streams.runtime(ctx=ctx, name=name)
    ids = [t.id for t in rt.tables]
    for k in range(6):
        await ingest(api, name, [obs("alice", "x", 20, str(k % 2))] * (k + 1))
        epoch = await store.epoch(name)
        assert epoch is not None
        if k >= 1:  # built by the previous roll's follow-up, before these rows came
            assert await store.agg_span(name, epoch + 1) == rt.count_period(epoch + 1)
        marks: list[str] = []
        await lifecycle_roll.roll(ctx=ctx, name=name, step=marks.append)
        # featurize moves first, then ingest; the first roll has nothing built ahead (the
        # stream was just created) and builds the aggregate itself before it serves it
        assert marks.index("served") < marks.index("pointed") < marks.index("counted")
        assert await store.served(name) == epoch + 1
        await jobs()
    served = await store.served(name)
    assert served == 7
    agg = await store.read_agg(name, served)
    assert agg is not None and agg.windows == [4, 5]
    fresh = np.zeros_like(agg.cells)
    for w in agg.windows:
        flat = await store.read_window(name, w, ids, cells=rt.spec.cells)
        assert flat is not None
        fresh += flat
    np.testing.assert_array_equal(agg.cells, fresh)
    # built ahead for epoch 8: windows 5 and 6, not the open window 7
    ahead = await store.read_agg(name, 8)
    assert ahead is not None and ahead.windows == [5, 6]


async def test_a_roll_serving_ahead_leaves_the_closed_windows_tail_to_its_follow_up(
    api: Api, jobs: Jobs
) -> None:
    """hot_windows = 2: a roll that serves an aggregate built ahead does not wait to count the
    window it closes; the roll's follow-up counts it to its end before it builds the next
    aggregate (which holds every row of it), and when no follow-up runs, the roll at which the
    window enters the count period counts it: either way every row is counted once."""
    for follow_up in (True, False):
        name = await new_stream(api, "win", hot_windows=2)
        ctx = api.ctx
        store, counts = ctx.stores.windows, ctx.stores.counting
        await ingest(api, name, [obs("alice", "x", 20, "1")] * 2)
        await lifecycle_roll.roll(ctx=ctx, name=name)  # to 2
        await jobs()  # builds the aggregate of epoch 3 (window 1)
        assert await ingest(api, name, [obs("alice", "x", 20, "1")] * 3) == 2
        marks: list[str] = []
        await lifecycle_roll.roll(ctx=ctx, name=name, step=marks.append)  # to 3, served ahead
        assert "served" in marks
        assert await counts.counted(name, 2) != await store.hot_last_id(name, 2)
        if follow_up:
            await jobs()
            assert await counts.counted(name, 2) == await store.hot_last_id(name, 2)
            ahead = await store.read_agg(name, 4)
            assert ahead is not None and ahead.windows == [1, 2]
        # (without the follow-up nothing is built ahead, so the roll to 4 counts window 2)
        await lifecycle_roll.roll(ctx=ctx, name=name)  # to 4: count period windows 1 and 2
        out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
        assert out["epoch"] == 4 and column(out, "user:count:1")[0] == 5.0, follow_up


async def test_with_one_hot_window_nothing_is_built_ahead(api: Api, jobs: Jobs) -> None:
    """hot_windows = 1: the window entering the count period is the one the roll closes, so
    the roll builds the aggregate itself after counting it."""
    name = await new_stream(api, "win", hot_windows=1)
    ctx = api.ctx
    for _ in range(3):
        await ingest(api, name, [obs("alice", "x", 20, "1")])
        marks: list[str] = []
        await lifecycle_roll.roll(ctx=ctx, name=name, step=marks.append)
        assert "served" not in marks
        await jobs()
    epoch = await ctx.stores.windows.epoch(name)
    assert epoch == 4
    assert await ctx.stores.windows.agg_span(name, epoch + 1) is None
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    assert out["epoch"] == 4 and column(out, "user:count:1")[0] == 3.0


async def test_expire_deletes_hot_data_only_of_sealed_windows(api: Api, jobs: Jobs) -> None:
    name = await new_stream(api, "win")
    ctx = api.ctx
    await ingest(api, name, [obs("u", "i", 30, "1")])
    await lifecycle_roll.roll(ctx=ctx, name=name)
    await ingest(api, name, [obs("u", "i", 30, "1")])
    await lifecycle_roll.roll(ctx=ctx, name=name)  # epoch 3, hot period [3, 3]
    rt = await streams.runtime(ctx=ctx, name=name)
    await lifecycle_expire.expire(ctx=ctx, rt=rt, epoch=3)
    assert await ctx.stores.windows.hot_length(name, 1) == 1  # not sealed: kept
    await jobs()  # the selection rounds that read windows 1 and 2 (they keep them till then)
    assert await ctx.stores.windows.hot_length(name, 1) == 1  # still not sealed: kept
    # the seal checkpoint (set by the cold-store seal job) lets expire delete it
    async with ctx.sessionmaker() as session, session.begin():
        w: Window | None = await repository.get_window(session, rt.id, 1)
        assert w is not None
        w.cold_sealed_at = datetime.now(UTC)
    result = await lifecycle_expire.expire(ctx=ctx, rt=rt, epoch=3)
    assert result["hot_windows_deleted"] == 1
    assert await ctx.stores.windows.hot_length(name, 1) == 0
    assert await ctx.stores.windows.hot_length(name, 2) == 1  # window 2 not sealed


class Crash(Exception):
    pass


STEPS = [
    "checkpoint",
    "opened",
    "pointed",
    "closed",
    "counted",
    "aggregated",
    "committed",
    "expired",
]


@pytest.mark.parametrize("crash_at", STEPS)
async def test_a_roll_killed_midway_is_completed_by_the_next_run(api: Api, crash_at: str) -> None:
    name = await new_stream(api, "win")
    ctx = api.ctx
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 2)

    def step(at: str) -> None:
        if at == crash_at:
            raise Crash(at)

    with pytest.raises(Crash):
        await lifecycle_roll.roll(ctx=ctx, name=name, step=step)
    # a batch arriving between the crash and the recovery is not lost
    late = await ingest(api, name, [obs("alice", "x", 20, "1")])
    # the scheduler's next run completes the interrupted roll (to epoch 2) although no roll
    # is due, and does not roll twice
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True) == 2
    assert await ctx.stores.windows.epoch(name) == 2
    assert await ctx.stores.windows.served(name) == 2
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    counted = column(out, "user:count:1")[0]
    # window 1 holds 2 (+1 if the late batch landed before the close), never more
    assert counted == 2.0 + (1.0 if late == 1 else 0.0)
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    assert r.json()["epoch"] == 2
    assert {w["epoch"]: w["state"] for w in r.json()["windows"]} == {1: "counted", 2: "open"}
    # and the following roll is an ordinary one
    assert await lifecycle_roll.roll(ctx=ctx, name=name) == 3


async def test_a_roll_killed_after_serving_ahead_is_completed(api: Api, jobs: Jobs) -> None:
    """hot_windows = 2, killed right after ``served`` moved to the aggregate built ahead:
    the next run counts the closed window, commits, and serves the same epoch."""
    name = await new_stream(api, "win", hot_windows=2)
    ctx = api.ctx
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 2)  # window 1
    assert await lifecycle_roll.roll(ctx=ctx, name=name) == 2
    await jobs()  # builds the aggregate of epoch 3 (count period: window 1)
    await ingest(api, name, [obs("alice", "x", 20, "1")])  # window 2

    def step(at: str) -> None:
        if at == "served":
            raise Crash(at)

    with pytest.raises(Crash):
        await lifecycle_roll.roll(ctx=ctx, name=name, step=step)
    assert await ctx.stores.windows.served(name) == 3
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    assert out["epoch"] == 3 and column(out, "user:count:1")[0] == 2.0
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True) == 3
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    assert {w["epoch"]: w["state"] for w in r.json()["windows"]} == {
        1: "counted",
        2: "hot",
        3: "open",
    }
    assert (await ctx.stores.windows.state(name, 2)) == "closed"
    assert await lifecycle_roll.roll(ctx=ctx, name=name) == 4
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    assert out["epoch"] == 4 and column(out, "user:count:1")[0] == 3.0


async def test_scheduled_roll_happens_when_due(api: Api) -> None:
    name = await new_stream(api, "win", window_seconds=60)
    ctx = api.ctx
    now = datetime.now(UTC)
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True, now=now) == 1
    later = now + timedelta(seconds=61)
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True, now=later) == 2
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True, now=later) == 2

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from service.streams import service as streams
from service.windows import service as windows
from service.windows.schedule import roll_due
from service.windows.service import store_of
from tests.conftest import Api, unique
from tests.helpers import obs, stream_body, window_cells


async def _stream(api: Api, **over: object) -> str:
    name = unique("win")
    r = await api.post("/v1/streams", json=stream_body(name, **over))
    assert r.status_code == 201, r.text
    return name


async def _ingest(api: Api, name: str, rows: list[dict]) -> int:
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202, r.text
    return r.json()["window"]


async def _featurize(api: Api, name: str, rows: list[dict]) -> dict:
    r = await api.post(f"/v1/streams/{name}/featurize", role="model", json={"rows": rows})
    assert r.status_code == 200, r.text
    return r.json()


def _col(out: dict, column: str) -> list[float]:
    j = out["columns"].index(column)
    return [row[j] for row in out["rows"]]


@pytest.mark.parametrize(
    ("age_seconds", "window_seconds", "due"),
    [(0, 60, False), (59.9, 60, False), (60, 60, True), (3600, 60, True), (86399, 86400, False)],
)
def test_roll_due(age_seconds: float, window_seconds: int, due: bool) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    started = now - timedelta(seconds=age_seconds)
    assert roll_due(epoch_started_at=started, window_seconds=window_seconds, now=now) is due


async def test_featurize_sees_exactly_the_count_period(api: Api) -> None:
    """hot_windows=2, retention=2: a window's counts appear once it leaves the hot period and
    vanish once it passes retention."""
    name = await _stream(api, hot_windows=2, retention_windows=2)
    probe = [{"user": "alice", "item": "x", "age": 20}]
    await _ingest(api, name, [obs("alice", "x", 20, "1")] * 3)  # window 1
    seen = []
    for _ in range(5):
        out = await _featurize(api, name, probe)
        seen.append((out["epoch"], _col(out, "user:count:1")[0]))
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    out = await _featurize(api, name, probe)
    seen.append((out["epoch"], _col(out, "user:count:1")[0]))
    # epoch e: count period = [e-3, e-2]; window 1 counted at epochs 3 and 4
    assert seen == [(1, 0.0), (2, 0.0), (3, 3.0), (4, 3.0), (5, 0.0), (6, 0.0)]


async def test_back_to_back_rolls_each_advance_one_window(api: Api) -> None:
    name = await _stream(api)
    epochs = [(await api.post(f"/v1/streams/{name}/roll")).json()["epoch"] for _ in range(3)]
    assert epochs == [2, 3, 4]
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    body = r.json()
    assert body["epoch"] == 4 and body["served_epoch"] == 4
    assert [w["epoch"] for w in body["windows"]] == [4, 3, 2, 1]
    assert body["windows"][0]["period"] == "open"


async def test_incremental_aggregate_equals_fresh_sum_and_old_tables_expire(api: Api) -> None:
    name = await _stream(api, retention_windows=2, privacy={"mechanism": "laplace", "epsilon": 1})
    ctx = api.ctx
    for k in range(6):
        await _ingest(api, name, [obs(f"u{k}", "i", 30, str(k % 2))] * (k + 1))
        await windows.roll(ctx=ctx, name=name)
    rt = await streams.runtime(ctx=ctx, name=name)
    store = store_of(ctx)
    epoch = await store.epoch(name)
    assert epoch == 7
    incremental = await store.read_agg(name, epoch)
    assert incremental is not None and incremental.windows == [5, 6]
    fresh_tables = {t.id: np.zeros(rt.spec.cells, np.int64) for t in rt.tables}
    fresh_prior = np.zeros(2, np.int64)
    for w in (5, 6):
        data = await store.read_tables(rt, w, [t.id for t in rt.tables])
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


async def test_expire_deletes_hot_data_only_of_sealed_windows(api: Api) -> None:
    name = await _stream(api)
    ctx = api.ctx
    await _ingest(api, name, [obs("u", "i", 30, "1")])
    await windows.roll(ctx=ctx, name=name)
    await _ingest(api, name, [obs("u", "i", 30, "1")])
    await windows.roll(ctx=ctx, name=name)  # epoch 3, hot period [3, 3]
    rt = await streams.runtime(ctx=ctx, name=name)
    await windows.expire(ctx=ctx, rt=rt, epoch=3)
    assert await store_of(ctx).hot_length(name, 1) == 1  # not sealed: kept
    # the seal checkpoint (set by the cold-store seal job) lets expire delete it
    from service.db.models import Window
    from service.streams import repository

    async with ctx.sessionmaker() as session, session.begin():
        w: Window | None = await repository.get_window(session, rt.id, 1)
        assert w is not None
        w.cold_sealed_at = datetime.now(UTC)
    result = await windows.expire(ctx=ctx, rt=rt, epoch=3)
    assert result["hot_windows_deleted"] == 1
    assert await store_of(ctx).hot_length(name, 1) == 0
    assert await store_of(ctx).hot_length(name, 2) == 1  # window 2 not sealed


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
    name = await _stream(api)
    ctx = api.ctx
    await _ingest(api, name, [obs("alice", "x", 20, "1")] * 2)

    def step(at: str) -> None:
        if at == crash_at:
            raise Crash(at)

    with pytest.raises(Crash):
        await windows.roll(ctx=ctx, name=name, step=step)
    # a batch arriving between the crash and the recovery is not lost
    late = await _ingest(api, name, [obs("alice", "x", 20, "1")])
    # the scheduler's next run completes the interrupted roll (to epoch 2) although no roll
    # is due, and does not roll twice
    assert await windows.roll(ctx=ctx, name=name, only_if_due=True) == 2
    assert await store_of(ctx).epoch(name) == 2
    assert await store_of(ctx).served(name) == 2
    out = await _featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    counted = _col(out, "user:count:1")[0]
    # window 1 holds 2 (+1 if the late batch landed before the close), never more
    assert counted == 2.0 + (1.0 if late == 1 else 0.0)
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    assert r.json()["epoch"] == 2
    assert {w["epoch"]: w["state"] for w in r.json()["windows"]} == {1: "counted", 2: "open"}
    # and the following roll is an ordinary one
    assert await windows.roll(ctx=ctx, name=name) == 3


async def test_scheduled_roll_happens_when_due(api: Api) -> None:
    name = await _stream(api, window_seconds=60)
    ctx = api.ctx
    now = datetime.now(UTC)
    assert await windows.roll(ctx=ctx, name=name, only_if_due=True, now=now) == 1
    later = now + timedelta(seconds=61)
    assert await windows.roll(ctx=ctx, name=name, only_if_due=True, now=later) == 2
    assert await windows.roll(ctx=ctx, name=name, only_if_due=True, now=later) == 2


async def test_worker_tick_rolls_due_streams_and_prepares_the_next_window(api: Api) -> None:
    from workers.jobs import windows_tick

    name = await _stream(api, window_seconds=1)
    ctx = api.ctx
    import asyncio

    await asyncio.sleep(1.05)
    result = await windows_tick({"app": ctx})
    assert result["rolled"] >= 1
    assert await store_of(ctx).epoch(name) == 2
    assert await store_of(ctx).state(name, 3) == "prepared"

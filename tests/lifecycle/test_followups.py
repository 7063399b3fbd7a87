"""A roll's follow-ups are durable: written in the roll's commit, enqueued as keyed jobs,
re-enqueued by the scheduler tick until done, and idempotent per (stream, epoch)."""

from __future__ import annotations

from sqlalchemy import select

from service.coldstore import service as coldstore
from service.db.models import FollowUp, Stream
from service.lifecycle import followups, scheduler
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Jobs, unique
from tests.helpers import obs, stream_body


async def _rows(api: Api, name: str) -> dict[tuple[int, str], FollowUp]:
    async with api.ctx.sessionmaker() as session:
        got = await session.execute(
            select(FollowUp)
            .join(Stream, Stream.id == FollowUp.stream_id)
            .where(Stream.name == name)
        )
        return {(f.epoch, f.kind): f for f in got.scalars().all()}


async def _queued_keys(api: Api) -> set[str]:
    queue = api.ctx.jobs.queue
    ids = await api.ctx.redis.zrange(queue.namespace("incomplete"), 0, -1)
    return {queue.job_key_from_id(i.decode()) for i in ids}


async def test_a_roll_records_and_enqueues_its_follow_ups(api: Api, jobs: Jobs) -> None:
    name = unique("fu")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    rows = await _rows(api, name)
    assert sorted(k for e, k in rows if e == 2) == sorted(followups.KINDS)
    assert all(f.done_at is None for f in rows.values())
    queued = await _queued_keys(api)
    for kind in followups.KINDS:
        assert any(k.endswith(followups.job_key(kind, name, 2)) for k in queued), queued

    assert await jobs() == len(followups.KINDS)
    rows = await _rows(api, name)
    assert all(f.done_at is not None and f.attempts == 1 for f in rows.values())
    assert await jobs() == 0  # nothing left
    # a rerun of a done follow-up returns its record and does nothing again
    again = await followups.run(api.ctx, kind="windows_prepare_next", name=name, epoch=2)
    assert again == rows[(2, "windows_prepare_next")].result
    assert (await _rows(api, name))[(2, "windows_prepare_next")].attempts == 1


async def test_the_tick_re_enqueues_follow_ups_a_crash_left_unqueued(api: Api) -> None:
    name = unique("fu")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    # as if the process died between the commit and the enqueue: the queue lost them
    queue = api.ctx.jobs.queue
    mine = [k for k in await _queued_keys(api) if f":{name}:" in k]
    assert len(mine) == len(followups.KINDS)
    for key in mine:
        job_id = queue.job_id(key)
        await api.ctx.redis.zrem(queue.namespace("incomplete"), job_id)
        await api.ctx.redis.lrem(queue.namespace("queued"), 0, job_id)
        await api.ctx.redis.delete(job_id)
    assert not [k for k in await _queued_keys(api) if f":{name}:" in k]
    await scheduler.tick(api.ctx)
    assert len([k for k in await _queued_keys(api) if f":{name}:" in k]) == len(followups.KINDS)
    # and enqueuing again while they are queued is a no-op
    stream_id = next(iter((await _rows(api, name)).values())).stream_id
    assert await followups.enqueue(api.ctx, name=name, stream_id=stream_id, epoch=2) == 0


async def test_the_prepare_follow_up_of_an_epoch_left_behind_does_nothing(
    api: Api, jobs: Jobs
) -> None:
    name = unique("fu")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 30, "1")]},
    )
    assert r.status_code == 202
    for epoch in (2, 3):
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == epoch
    await jobs()
    rows = await _rows(api, name)
    assert rows[(2, "windows_prepare_next")].result == {
        "prepared": False,
        "reason": "the stream moved on",
    }
    assert await api.ctx.stores.windows.state(name, 4) == "prepared"


async def test_a_window_a_pending_selection_round_reads_waits_for_it(api: Api, jobs: Jobs) -> None:
    """Hot data that left the hot period and is sealed is deleted at once, unless the
    selection round of the roll that closed it has not read it yet: then it goes as soon as
    that round is done (the round's follow-up expires it)."""
    name = unique("fu")
    body = stream_body(name, privacy={"mechanism": "none", "epsilon_selection": 1.0})
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rows = [obs(f"u{i}", f"i{i % 3}", 30, str(i % 2)) for i in range(20)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # window 1 leaves (H = 1)
    await coldstore.seal_all(ctx=api.ctx)  # sealed, then expire: kept for the round of 2
    store = api.ctx.stores.windows
    assert await store.hot_length(name, 1) == 20
    await jobs()
    assert (await _rows(api, name))[(2, "selection_round")].done_at is not None
    assert await store.hot_length(name, 1) == 0

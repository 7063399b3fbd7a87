"""A stream never has more tables than ``max_tables``, whatever the interleaving of selection
rounds and rolls (issue 11: two rounds of back-to-back rolls once made 6 tables of 5, and the
windows after them had more sensitivity than their noise was calibrated for).

The rounds here pick at random (a tiny ``epsilon_selection``, and no "add no table" outcome:
every round picks), so rounds that were not serialised would add different groups and overflow
the one free slot."""

from __future__ import annotations

import asyncio
from datetime import datetime

import numpy as np
from sqlalchemy import select, update

from service.db.models import CountTable, FollowUp, StreamEvent
from service.lifecycle import roll as lifecycle_roll
from service.selection import repository
from service.selection import service as selection
from service.streams import service as streams
from tests.conftest import Api, Jobs, unique

FEATURES = ["a", "b", "c", "d"]
MAX_TABLES = 6  # 4 features + the prior + one free slot


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    x = rng.integers(0, 2, (n, len(FEATURES)))
    y = x[:, 0] ^ x[:, 1]
    return [
        {"features": {f: f"{f}{v}" for f, v in zip(FEATURES, row, strict=True)}, "label": str(t)}
        for row, t in zip(x.tolist(), y.tolist(), strict=True)
    ]


async def _stream(api: Api) -> str:
    name = unique("race")
    body = {
        "name": name,
        "features": [{"name": f} for f in FEATURES],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "retention_windows": 10,
        "sketch": {"width": 256, "depth": 2},
        "max_tables": MAX_TABLES,
        "privacy": {
            "mechanism": "none",
            "epsilon_selection": 1e-6,
            "groups_per_round": 3,
            "selection_threshold": None,
        },
    }
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    return name


async def _window(api: Api, name: str, rng: np.random.Generator) -> None:
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": _rows(rng, 300)}
    )
    assert r.status_code == 202, r.text


async def _tables(api: Api, name: str) -> list[dict]:
    r = await api.get(f"/v1/streams/{name}/tables", role="model")
    assert r.status_code == 200
    return list(r.json()["tables"])


async def test_concurrent_rounds_of_one_epoch_fill_only_the_free_slot(api: Api) -> None:
    name = await _stream(api)
    rng = np.random.default_rng(3)
    await _window(api, name, rng)
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    results = await asyncio.gather(
        *[selection.select_tables(ctx=api.ctx, name=name, epoch=2) for _ in range(6)]
    )
    added = [t for r in results for t in r["selected"]]  # type: ignore[union-attr]
    assert len(added) == 1, results
    tables = await _tables(api, name)
    assert len(tables) + 1 == MAX_TABLES  # + the prior table
    # a rerun of a committed round does nothing
    again = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)
    assert again["selected"] == []


async def test_rounds_racing_back_to_back_rolls_never_exceed_max_tables(
    api: Api, jobs: Jobs
) -> None:
    name = await _stream(api)
    rng = np.random.default_rng(4)
    for epoch in (2, 3):
        await _window(api, name, rng)
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == epoch
    await _window(api, name, rng)
    # rounds of an epoch already left behind (2), of the current one (3), and a roll, at once
    await asyncio.gather(
        selection.select_tables(ctx=api.ctx, name=name, epoch=2),
        selection.select_tables(ctx=api.ctx, name=name, epoch=3),
        lifecycle_roll.roll(ctx=api.ctx, name=name),
        selection.select_tables(ctx=api.ctx, name=name, epoch=3),
        selection.select_tables(ctx=api.ctx, name=name, epoch=2),
        lifecycle_roll.roll(ctx=api.ctx, name=name),
        selection.select_tables(ctx=api.ctx, name=name, epoch=4),
    )
    await jobs()  # every roll's follow-ups, the selection rounds among them
    tables = await _tables(api, name)
    selected = [t for t in tables if t["reason"] == "selected"]
    assert len(tables) + 1 <= MAX_TABLES
    assert len(selected) <= 1
    # a round's tables start at least two windows after the epoch it read
    for t in selected:
        assert t["first_epoch"] >= t["selected_epoch"] + 2


async def test_a_round_left_behind_by_rolls_still_commits_after_the_prepared_windows(
    api: Api,
) -> None:
    """Whether a round commits must not depend on how long it took (its read-and-score time
    grows with the hot period): a round that finishes after the next rolls commits its picks,
    counted from two windows after the stream's epoch then (the windows before may be prepared
    with a fixed table set)."""
    name = await _stream(api)
    rng = np.random.default_rng(5)
    await _window(api, name, rng)
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 3
    result = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)
    assert len(result["selected"]) == 1 and result["first_epoch"] == 5, result  # type: ignore[arg-type]
    (table,) = [t for t in await _tables(api, name) if t["reason"] == "selected"]
    assert (table["selected_epoch"], table["first_epoch"]) == (2, 5)


async def test_a_round_records_the_time_of_its_roll_never_of_its_commit(
    api: Api, jobs: Jobs
) -> None:
    """The event and the table of a round carry the roll's time (public), and so does its
    follow-up's ``done_at``: a commit time would tell how long the round read and scored."""
    name = await _stream(api)
    await _window(api, name, np.random.default_rng(7))
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    rolled_at = datetime(2001, 2, 3, 4, 5, 6)
    async with api.ctx.sessionmaker() as session, session.begin():
        stream = await streams.get(session=session, name=name)
        await session.execute(
            update(FollowUp)
            .where(FollowUp.stream_id == stream.id, FollowUp.epoch == 2)
            .values(created_at=rolled_at)
        )
    await jobs()
    async with api.ctx.sessionmaker() as session:
        events = (
            (
                await session.execute(
                    select(StreamEvent).where(
                        StreamEvent.stream_id == stream.id,
                        StreamEvent.kind.in_((repository.PICKED, repository.NOTHING)),
                    )
                )
            )
            .scalars()
            .all()
        )
        tables = (
            (
                await session.execute(
                    select(CountTable).where(
                        CountTable.stream_id == stream.id, CountTable.reason == "selected"
                    )
                )
            )
            .scalars()
            .all()
        )
        follow_up = (
            await session.execute(
                select(FollowUp).where(
                    FollowUp.stream_id == stream.id,
                    FollowUp.epoch == 2,
                    FollowUp.kind == "selection_round",
                )
            )
        ).scalar_one()
    assert [e.created_at.replace(tzinfo=None) for e in events] == [rolled_at]
    assert [t.created_at.replace(tzinfo=None) for t in tables] == [rolled_at]
    assert follow_up.done_at is not None
    assert follow_up.done_at.replace(tzinfo=None) == rolled_at


async def test_rounds_commit_in_epoch_order(api: Api) -> None:
    """The round of epoch 3 scores only once the round of epoch 2 has committed: otherwise the
    table set it scores against (its candidates) would depend on which round read and scored
    faster."""
    name = unique("order")
    body = {
        "name": name,
        "features": [{"name": f} for f in FEATURES],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "sketch": {"width": 256, "depth": 2},
        "max_tables": MAX_TABLES + 1,  # two free slots
        "privacy": {
            "mechanism": "none",
            "epsilon_selection": 1e-6,
            "selection_threshold": None,
            "selection_rounds": 2,
        },
    }
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(8)
    for epoch in (2, 3):
        await _window(api, name, rng)
        assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == epoch
    later = asyncio.create_task(selection.select_tables(ctx=api.ctx, name=name, epoch=3))
    await asyncio.sleep(1.0)
    assert not later.done()  # it waits for the round of epoch 2
    first = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)
    second = await asyncio.wait_for(later, 60)
    assert len(first["selected"]) == 1 and len(second["selected"]) == 1, (first, second)  # type: ignore[arg-type]
    tables = await _tables(api, name)
    selected = {t["selected_epoch"]: t for t in tables if t["reason"] == "selected"}
    assert sorted(selected) == [2, 3]
    assert selected[2]["name"] != selected[3]["name"]


async def test_concurrent_rounds_that_pick_nothing_record_one_outcome(api: Api) -> None:
    """⊥ commits no table, so the rounds are serialised by its event: six rounds of one epoch
    that all pick ⊥ (a threshold no score reaches) record one ``nothing_selected``, and a rerun
    finds it (a second draw could otherwise pick a table: two outcomes of one round)."""
    name = unique("racenone")
    body = {
        "name": name,
        "features": [{"name": f} for f in FEATURES],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "sketch": {"width": 256, "depth": 2},
        "max_tables": MAX_TABLES,
        "privacy": {"mechanism": "none", "epsilon_selection": 1.0, "selection_threshold": 64},
    }
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    await _window(api, name, np.random.default_rng(6))
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    results = await asyncio.gather(
        *[selection.select_tables(ctx=api.ctx, name=name, epoch=2) for _ in range(6)]
    )
    reasons = sorted(str(r["reason"]) for r in results)
    assert reasons.count("nothing picked") == 1 and reasons.count("done") == 5, results
    async with api.ctx.sessionmaker() as session:
        stream = await streams.get(session=session, name=name)
        assert await repository.round_epochs(session, stream.id) == {2}
    again = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)
    assert again == {"selected": [], "reason": "done"}

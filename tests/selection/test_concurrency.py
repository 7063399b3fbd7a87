"""A stream never has more tables than ``max_tables``, whatever the interleaving of selection
rounds and rolls (issue 11: two rounds of back-to-back rolls once made 6 tables of 5, and the
windows after them had more sensitivity than their noise was calibrated for).

The rounds here pick at random (a tiny ``epsilon_selection``, and no "add no table" outcome:
every round picks), so rounds that were not serialised would add different groups and overflow
the one free slot."""

from __future__ import annotations

import asyncio

import numpy as np

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
    # a round commits only at the epoch it read: its tables start two windows later
    for t in selected:
        assert t["first_epoch"] == t["selected_epoch"] + 2


async def test_a_round_of_an_epoch_left_behind_commits_nothing(api: Api) -> None:
    name = await _stream(api)
    rng = np.random.default_rng(5)
    await _window(api, name, rng)
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 3
    result = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)
    assert result["selected"] == [] and "stale" in str(result["reason"])
    assert [t for t in await _tables(api, name) if t["reason"] == "selected"] == []


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

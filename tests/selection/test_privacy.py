"""Selection is DP as the ledger charges it (issue 12, items 6–8; docs/ARCHITECTURE.md,
"Count-table selection" and "Privacy ledger"): a round reads only the observations the counter
counts, runs whatever the hot period's size, and a stream releases at most the rounds of its
public schedule (``privacy.selection_rounds``), whether they pick tables or nothing (⊥)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select

from service.db.models import StreamEvent
from service.selection import service as selection
from service.streams import service as streams
from tests.conftest import Api, Jobs, unique
from tests.helpers import ingest, obs, prior_of, stream_body, window_cells


def _heavy_window(tag: str) -> list[dict[str, Any]]:
    """One window's rows in arrival order: user u0 sends 20 (its first two labelled 1, the
    rest 0) around one row each of u1 … u5 (labelled 0)."""
    heavy = [obs("u0", f"{tag}{i}", 30, "1" if i < 2 else "0") for i in range(20)]
    light = [obs(f"u{j}", f"{tag}l{j}", 40, "0") for j in range(1, 6)]
    return [heavy[0], light[0], heavy[1], light[1], *heavy[2:], *light[2:]]


async def test_a_round_reads_only_the_first_c_rows_of_a_user_per_window(api: Api) -> None:
    """Item 7: with a user key and c = 2, a user who sends 20 rows per window is 2 of each
    window's rows in the round's input (the first two, in arrival order), exactly the rows the
    counter counted: the per-user factor c·H of the ledger holds."""
    name = unique("selub")
    body = stream_body(
        name,
        hot_windows=2,
        privacy={
            "mechanism": "none",
            "epsilon_selection": 1.0,
            "user_key": "user",
            "max_contributions_per_window": 2,
        },
    )
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    for epoch, tag in ((2, "a"), (3, "b")):
        await ingest(api, name, _heavy_window(tag))
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
    rt = await streams.runtime(ctx=api.ctx, name=name)
    columns, labels = await selection._hot_matrix(api.ctx, rt, 3)  # windows 1 and 2
    assert labels.size == 2 * (2 + 5)  # per window: u0's first 2, one each of u1 … u5
    assert int(labels.sum()) == 2 * 2  # u0's rows kept are its first two (labelled 1)
    assert int((columns["user"] == 0).sum()) == 4  # code 0 is u0 (sorted canonical values)
    assert all(col.size == labels.size for col in columns.values())
    # the round's input is what the counter counted (mechanism none: exact prior tables)
    priors = [prior_of((await window_cells(api.ctx, name, w))["_prior"]) for w in (1, 2)]
    assert (priors[0] + priors[1]).tolist() == np.bincount(labels, minlength=2).tolist()


async def test_a_round_runs_whatever_the_hot_period_size(api: Api) -> None:
    """Item 6: no round is skipped (nor calibrated) on the hot period's exact count: an empty
    hot period and one of a single row, far below min_records, still release picks (no ⊥
    here, so that a pick is certain)."""
    name = unique("selsz")
    privacy = {"mechanism": "none", "epsilon_selection": 5.0, "selection_threshold": None}
    body = stream_body(name, privacy=privacy)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    empty = await selection.select_tables(ctx=api.ctx, name=name, epoch=2)  # window 1: no rows
    assert len(empty["selected"]) == 1, empty  # type: ignore[arg-type]
    await ingest(api, name, [obs("u1", "i1", 20, "1")])
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    single = await selection.select_tables(ctx=api.ctx, name=name, epoch=3)
    assert len(single["selected"]) == 1, single  # type: ignore[arg-type]
    stream = (await api.get(f"/v1/streams/{name}")).json()
    assert stream["privacy"]["min_records"] == 100_000  # both hot periods far below it


def _xor_rows(rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    x = rng.integers(0, 2, (n, 3))
    return [
        {
            "features": {"a": f"a{r[0]}", "b": f"b{r[1]}", "c": f"c{r[2]}", "user": f"u{i}"},
            "label": str(r[0] ^ r[1]),
        }
        for i, r in enumerate(x.tolist())
    ]


def _rounds_body(name: str, **privacy: Any) -> dict[str, Any]:
    return {
        "name": name,
        "features": [{"name": f} for f in ("a", "b", "c", "user")],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "retention_windows": 10,
        "sketch": {"width": 256, "depth": 2},
        "max_tables": 7,  # 4 features + the prior + 2 free slots
        "privacy": {
            "mechanism": "none",
            "epsilon_selection": 50.0,
            "user_key": "user",
            "max_contributions_per_window": 5,
            "min_records": 300,
            **privacy,
        },
    }


async def _released_rounds(api: Api, name: str) -> dict[int, str]:
    """Epoch -> outcome of every round the stream released: its events (``tables_selected``
    or ``nothing_selected``), cross-checked with the tables."""
    async with api.ctx.sessionmaker() as session:
        stream = await streams.get(session=session, name=name)
        rows = (
            await session.execute(
                select(StreamEvent).where(
                    StreamEvent.stream_id == stream.id,
                    StreamEvent.kind.in_(("tables_selected", "nothing_selected")),
                )
            )
        ).scalars()
        out = {int(e.data["epoch"]): e.kind for e in rows}
    tables = (await api.get(f"/v1/streams/{name}/tables", role="model")).json()["tables"]
    picked = {t["selected_epoch"] for t in tables if t["reason"] == "selected"}
    assert picked == {e for e, kind in out.items() if kind == "tables_selected"}
    return out


async def _ledger_rounds(api: Api, name: str) -> tuple[int, int]:
    """(rounds charged per observation, per user) by the stream's ledger."""
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    per_obs, per_user = led["observation"]["parts"][1], led["user"]["parts"][1]
    assert per_obs["name"] == per_user["name"] == "table_selection"
    return per_obs["parameters"]["rounds"], per_user["parameters"]["rounds"]


async def test_a_stream_releases_no_more_rounds_than_the_ledger_charges(
    api: Api, jobs: Jobs
) -> None:
    """Item 8, with ⊥: rounds run at the rolls to epochs 2 … Q + 1 (Q defaults to the S = 2
    free slots), each releases an outcome (tables or ⊥), and then no round runs: the rounds
    released are the Q the ledger charges per user."""
    name = unique("selrounds")
    assert (await api.post("/v1/streams", json=_rounds_body(name))).status_code == 201
    rng = np.random.default_rng(21)
    for epoch in range(2, 7):
        await ingest(api, name, _xor_rows(rng, 300))
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
        await jobs()
    released = await _released_rounds(api, name)
    assert sorted(released) == [2, 3]  # the schedule, whatever was picked
    assert released[2] == "tables_selected"  # a XOR b dominates every other group and ⊥
    per_obs, per_user = await _ledger_rounds(api, name)
    assert (per_obs, per_user) == (1, 2)  # min(H = 1, Q = 2); Q = S by default
    late = await selection.select_tables(ctx=api.ctx, name=name, epoch=6)
    assert late["selected"] == [] and late["reason"] in (
        "past the schedule",
        "no budget or no free slot",
    )


async def test_rounds_that_pick_nothing_are_charged_and_stop_on_schedule(
    api: Api, jobs: Jobs
) -> None:
    """⊥ uses no slot, so the slots no longer bound the rounds: with a threshold no score can
    reach (64 nats per record; scores are at most log 2) every round picks ⊥, the rounds
    stop after Q = 3 > S = 2 all the same, and the ledger charges every one of them. Fails if
    the ledger still charged the slots (2 < 3), if rounds ran past the schedule (7 rolls), or
    if a ⊥ round were not recorded."""
    name = unique("selnone")
    body = _rounds_body(name, selection_threshold=64, selection_rounds=3)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(22)
    for epoch in range(2, 9):
        await ingest(api, name, _xor_rows(rng, 300))
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
        await jobs()
    released = await _released_rounds(api, name)
    assert released == {2: "nothing_selected", 3: "nothing_selected", 4: "nothing_selected"}
    tables = (await api.get(f"/v1/streams/{name}/tables", role="model")).json()["tables"]
    assert not [t for t in tables if t["reason"] == "selected"]  # both slots still free
    per_obs, per_user = await _ledger_rounds(api, name)
    assert per_user >= len(released) and per_obs >= 1  # H = 1 round reads an observation
    assert (per_obs, per_user) == (1, 3)
    # a round is released once: a retry of a recorded ⊥ round draws nothing again
    again = await selection.select_tables(ctx=api.ctx, name=name, epoch=4)
    assert again == {"selected": [], "reason": "done"}
    assert await selection.select_tables(ctx=api.ctx, name=name, epoch=8) == {
        "selected": [],
        "reason": "past the schedule",
    }

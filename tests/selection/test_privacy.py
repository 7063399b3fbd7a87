"""Selection is DP as the ledger charges it (issue 12, items 6–8; docs/ARCHITECTURE.md,
"Count-table selection" and "Privacy ledger"): a round reads only the observations the counter
counts, runs whatever the hot period's size, and a stream releases at most as many rounds as
it has free table slots."""

from __future__ import annotations

from typing import Any

import numpy as np

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
    hot period and one of a single row, far below min_records, still release picks."""
    name = unique("selsz")
    body = stream_body(name, privacy={"mechanism": "none", "epsilon_selection": 5.0})
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


async def test_a_stream_releases_no_more_rounds_than_the_ledger_charges(
    api: Api, jobs: Jobs
) -> None:
    """Item 8: rounds run at every roll until the free slots are used, each releasing round
    commits a table, and then no round runs: the rounds recorded (distinct selected_epoch)
    are the S = max_tables − features − 1 the ledger charges per user, not R + H."""
    name = unique("selrounds")
    body = {
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
        },
    }
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(21)
    for epoch in range(2, 7):
        await ingest(api, name, _xor_rows(rng, 300))
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
        await jobs()
    tables = (await api.get(f"/v1/streams/{name}/tables", role="model")).json()["tables"]
    rounds = sorted({t["selected_epoch"] for t in tables if t["reason"] == "selected"})
    assert rounds == [2, 3]  # one pick per round, until the two free slots are used
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    charged = led["user"]["parts"][1]["parameters"]["rounds"]
    assert charged == len(rounds) == 2
    # and once the slots are used, a round releases nothing
    late = await selection.select_tables(ctx=api.ctx, name=name, epoch=6)
    assert late == {"selected": [], "reason": "no budget or no free slot"}

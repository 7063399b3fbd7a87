"""Selection end to end: a pairwise interaction is picked at a roll, counted from the window
after next, and featurized once that window is in the count period."""

from __future__ import annotations

import numpy as np

from tests.conftest import Api, Jobs, unique
from tests.helpers import ingest


def _xor_rows(rng: np.random.Generator, n: int) -> list[dict]:
    a = rng.integers(0, 2, n)
    b = rng.integers(0, 2, n)
    c = rng.integers(0, 5, n)
    y = (a ^ b) ^ (rng.random(n) < 0.05)
    return [
        {"features": {"a": f"a{x}", "b": f"b{z}", "c": f"c{w}"}, "label": str(int(lab))}
        for x, z, w, lab in zip(a, b, c, y, strict=True)
    ]


async def test_selected_group_is_counted_then_featurized(api: Api, jobs: Jobs) -> None:
    name = unique("sel")
    body = {
        "name": name,
        "features": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "retention_windows": 10,
        "sketch": {"width": 1024, "depth": 3},
        "max_tables": 5,
        "privacy": {"mechanism": "none", "epsilon_selection": 50.0},
    }
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(11)

    await ingest(api, name, _xor_rows(rng, 1500))  # window 1
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()  # the follow-ups the rolls left to the worker
    r = await api.get(f"/v1/streams/{name}/tables", role="model")
    picked = [t for t in r.json()["tables"] if t["reason"] == "selected"]
    # the round at the roll to 2 read window 1: the interaction a×b carries all the signal
    assert [(t["name"], t["selected_epoch"], t["first_epoch"]) for t in picked] == [("a+b", 2, 4)]
    assert picked[0]["score"] is None and picked[0]["selection_epsilon"] == 50.0
    assert r.json()["max_tables"] == 5
    events = (await api.get(f"/v1/streams/{name}/events?follow_seconds=0", role="model")).text
    assert "event: tables_selected" in events

    fz = await api.post(
        f"/v1/streams/{name}/featurize", role="model", json={"rows": [{"a": "a1", "b": "b0"}]}
    )
    assert not any(c.startswith("a+b:") for c in fz.json()["columns"])
    for epoch in (3, 4, 5):
        # windows 2, 3, 4 (window 4 is the first to count a+b)
        await ingest(api, name, _xor_rows(rng, 1500))
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
        await jobs()
    r = await api.get(f"/v1/streams/{name}/tables", role="model")
    assert len(r.json()["tables"]) == 4  # the cap: 3 features + a+b + the prior = 5
    fz = (
        await api.post(
            f"/v1/streams/{name}/featurize",
            role="model",
            json={"rows": [{"a": "a1", "b": "b0"}, {"a": "a1", "b": "b1"}]},
        )
    ).json()
    cols = fz["columns"]
    assert "a+b:p:1" in cols
    p = [row[cols.index("a+b:p:1")] for row in fz["rows"]]
    assert p[0] > 0.85 and p[1] < 0.15  # XOR: (1, 0) → 1, (1, 1) → 0
    single = [row[cols.index("a:p:1")] for row in fz["rows"]]
    assert abs(single[0] - 0.5) < 0.1  # one feature alone carries nothing
    # the counts of a+b come from window 4 only (the table did not exist before)
    total = sum(row[cols.index("a+b:total")] for row in fz["rows"])
    assert 600 < total < 900  # about half of window 4's 1500 rows have a = a1

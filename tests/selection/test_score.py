"""The stream's ``privacy.selection_score`` reaches the round (issue 18): by default ("aic") a
round picks the real interaction, with "mi" the near-unique pair of two id-like features; an
unknown score is a 422 naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import Api, Jobs, unique
from tests.helpers import ingest


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    a = rng.integers(0, 2, n)
    b = rng.integers(0, 2, n)
    u = rng.integers(0, 40, n)  # u × v: 1,600 cells for 1,500 rows, nearly one row per cell
    v = rng.integers(0, 40, n)
    y = (a ^ b) ^ (rng.random(n) < 0.3)
    return [
        {"features": {"a": f"a{p}", "b": f"b{q}", "u": f"u{s}", "v": f"v{t}"}, "label": str(lab)}
        for p, q, s, t, lab in zip(a, b, u, v, y.astype(int), strict=True)
    ]


def _body(name: str, score: str | None) -> dict:
    privacy: dict = {"mechanism": "none", "epsilon_selection": 50.0}
    if score is not None:
        privacy["selection_score"] = score
    return {
        "name": name,
        "features": [{"name": f} for f in ("a", "b", "u", "v")],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "retention_windows": 10,
        "sketch": {"width": 1024, "depth": 3},
        "max_tables": 6,  # 4 features + the prior + one free slot
        "privacy": privacy,
    }


@pytest.mark.parametrize(("score", "expected"), [(None, "a+b"), ("aic", "a+b"), ("mi", "u+v")])
async def test_the_configured_score_decides_the_pick(
    api: Api, jobs: Jobs, score: str | None, expected: str
) -> None:
    name = unique("score")
    assert (await api.post("/v1/streams", json=_body(name, score))).status_code == 201
    await ingest(api, name, _rows(np.random.default_rng(5), 1500))
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()
    r = await api.get(f"/v1/streams/{name}/tables", role="model")
    picked = [t["name"] for t in r.json()["tables"] if t["reason"] == "selected"]
    assert picked == [expected]


async def test_an_unknown_score_is_refused(api: Api) -> None:
    r = await api.post("/v1/streams", json=_body(unique("score"), "entropy"))
    assert r.status_code == 422 and "selection_score" in r.text, r.text

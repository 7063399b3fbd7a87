"""User-level privacy: at most c observations of one user are counted per window."""

from __future__ import annotations

import numpy as np

from service.windows.service import store_of
from tests.conftest import Api, unique
from tests.helpers import obs, prior_of, stream_body, window_cells


async def test_at_most_c_observations_per_user_and_window_are_counted(api: Api) -> None:
    name = unique("usr")
    body = stream_body(
        name, privacy={"mechanism": "none", "user_key": "user", "max_contributions_per_window": 2}
    )
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201
    assert r.json()["l1_sensitivity"] == 2 * 8 * 3  # c · T · depth

    async def send(rows: list[dict]) -> None:
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
        )
        assert r.status_code == 202, r.text

    await send([obs("u1", "x", 20, "1")] * 5 + [obs("u2", "x", 20, "0")])
    await send([obs("u1", "y", 20, "0")] * 2 + [obs("u2", "y", 20, "0")])
    cells = await window_cells(api.ctx, name, 1)
    assert cells["_hot"] == b"9"  # every observation reaches the hot store
    np.testing.assert_array_equal(prior_of(cells["_prior"]), [2, 2])  # u1: 2 (both "1"), u2: 2
    # the counters hold keyed hashes, never the raw user ids
    counters = await api.ctx.redis.hgetall(api.ctx.keys.users(name, 1))
    assert sorted(int(v) for v in counters.values()) == [2, 7]
    assert all(b"u1" not in k and b"u2" not in k for k in counters)

    await api.post(f"/v1/streams/{name}/roll")
    await send([obs("u1", "z", 20, "0")] * 3)
    np.testing.assert_array_equal(
        prior_of((await window_cells(api.ctx, name, 2))["_prior"]), [2, 0]
    )  # a new window: u1 counts again, up to 2
    out = (
        await api.post(
            f"/v1/streams/{name}/featurize",
            role="model",
            json={"rows": [{"user": "u1"}, {"user": "u2"}]},
        )
    ).json()
    cols = out["columns"]
    assert out["rows"][0][cols.index("user:count:1")] == 2.0
    assert out["rows"][0][cols.index("user:count:0")] == 0.0  # u1's "0"s came past the bound
    assert out["rows"][1][cols.index("user:total")] == 2.0
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [{"features": {"item": "x"}, "label": "1"}]},
    )
    assert r.status_code == 422 and "user key" in r.json()["detail"]
    assert await store_of(api.ctx).hot_length(name, 2) == 3

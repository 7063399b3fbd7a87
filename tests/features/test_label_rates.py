"""GET /v1/streams/{s}/label-rates: the label rate's history of the count period, per window
and pooled; never the open window or the hot period (an open window's noisy table is a running
count, and two reads of it would give the rows between them exactly)."""

from __future__ import annotations

import pytest

from service.streams import service as streams
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs


async def _stream(api: Api) -> str:
    name = await new_stream(api, "rates", retention_windows=5)  # mechanism none: exact counts
    await ingest(api, name, [obs("u", "i", 20, "1")] * 6 + [obs("u", "i", 20, "0")] * 4)
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await ingest(api, name, [obs("u", "i", 20, "1")] * 2 + [obs("u", "i", 20, "0")] * 8)
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    await ingest(api, name, [obs("u", "i", 20, "1")] * 50)  # the hot, open window: not read
    return name


async def test_windows_of_the_count_period_and_their_pooled_rates(api: Api) -> None:
    name = await _stream(api)
    r = await api.get(f"/v1/streams/{name}/label-rates?half_life=1", role="model")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["epoch"] == 3 and out["noise_sd"] == 0.0
    assert [w["window"] for w in out["windows"]] == [1, 2]
    assert [w["counts"] for w in out["windows"]] == [{"0": 4, "1": 6}, {"0": 8, "1": 2}]
    assert out["windows"][0]["rates"] == pytest.approx({"0": 5 / 12, "1": 7 / 12})
    # pooled: 12 and 8, add-one smoothed; recent: window 2 weight 1, window 1 weight 1/2
    assert out["pooled"] == pytest.approx({"0": 13 / 22, "1": 9 / 22})
    assert out["recent"] == pytest.approx({"0": 11 / 17, "1": 6 / 17})


async def test_limits_and_roles(api: Api) -> None:
    name = await _stream(api)
    for bad in ("0", "-1", "1001", "x"):
        r = await api.get(f"/v1/streams/{name}/label-rates?half_life={bad}", role="model")
        assert r.status_code == 422 and "half_life" in r.text, (bad, r.text)
    r = await api.get(f"/v1/streams/{name}/label-rates", role="producer")
    assert r.status_code == 403
    assert (await api.get("/v1/streams/nope-00/label-rates", role="model")).status_code == 404


async def test_noise_sd_is_the_prior_tables(api: Api) -> None:
    name = await new_stream(api, "rates", privacy={"mechanism": "laplace", "epsilon": 1.0})
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    out = (await api.get(f"/v1/streams/{name}/label-rates", role="model")).json()
    rt = await streams.runtime(ctx=api.ctx, name=name)
    assert out["noise_sd"] == pytest.approx(rt.noise.variance_for(rt.prior_weight) ** 0.5)
    assert out["noise_sd"] > 0 and [w["window"] for w in out["windows"]] == [1]

"""Hard edges of the HTTP API (issue 13 items 1, 2, 4, 5, 7, 11): every integer parameter
in range or 422, tiny floats 422 not 500, chunked bodies over the limit 413, the key checked
before the body is read, unknown streams 404, and bodies without a JSON Content-Type 415."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import Api, unique
from tests.helpers import stream_body

TOO_BIG = 2**63  # one past SQLite's (and PostgreSQL's bigint) largest integer


@pytest.mark.parametrize(
    "url",
    [
        "/v1/queues/{queue}/labels?after={n}",
        "/v1/admin/audit?after={n}",
        "/v1/streams/{stream}/events?after={n}",
        "/v1/streams/{stream}/windows?limit={n}",
    ],
)
async def test_integers_beyond_64_bits_are_422_naming_the_parameter(api: Api, url: str) -> None:
    name = unique("s")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    queue = unique("q")
    r = await api.post(
        "/v1/queues", json={"name": queue, "beta": 0.1, "k": 20, "labels": ["a", "b"]}
    )
    assert r.status_code == 201, r.text
    r = await api.get(url.format(queue=queue, stream=name, n=TOO_BIG))
    assert r.status_code == 422, r.text
    body = r.json()
    param = url.split("?")[1].split("=")[0]
    assert body["error"] == "ValidationError" and param in body["detail"], body


TINY = [5e-324, 1e-300, 1e-200]


@pytest.mark.parametrize("value", TINY)
@pytest.mark.parametrize(
    "privacy",
    [
        {"mechanism": "laplace", "epsilon": "V"},
        {"mechanism": "gaussian", "rho": "V"},
        {"mechanism": "gaussian", "rho": 0.5, "delta": "V"},
        {"mechanism": "laplace", "epsilon_selection": "V"},
        {"mechanism": "laplace", "table_weights": {"user": "V"}},
        {"mechanism": "laplace", "prior_weight": "V"},
    ],
)
async def test_tiny_privacy_floats_are_a_4xx_not_a_500(
    api: Api, privacy: dict[str, Any], value: float
) -> None:
    filled = {k: (value if v == "V" else v) for k, v in privacy.items()}
    if "table_weights" in filled:
        filled["table_weights"] = {"user": value}
    body = stream_body(unique("tiny"), privacy=filled)
    r = await api.post("/v1/streams", json=body)
    assert r.status_code in (201, 422), r.text
    if r.status_code == 422:
        assert r.json()["error"] == "ValidationError"


@pytest.mark.parametrize("value", TINY)
@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/privacy/sampling-k-anonymity", {"beta": 0.1, "k": 10, "epsilon": "V"}),
        ("/v1/privacy/sampling-k-anonymity", {"beta": 0.1, "epsilon": 1.0, "delta": "V"}),
        ("/v1/privacy/sampling-k-anonymity", {"beta": "V", "k": 10, "epsilon": 1.0}),
        ("/v1/queues", {"beta": 0.1, "k": 10, "epsilon": "V", "labels": ["a", "b"]}),
        ("/v1/streams", {"featurize": {"alpha": "V", "backoff_sigmas": "V"}}),
    ],
)
async def test_tiny_floats_elsewhere_are_a_4xx_not_a_500(
    api: Api, url: str, body: dict[str, Any], value: float
) -> None:
    def fill(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        return value if x == "V" else x

    sent = fill(body)
    if url == "/v1/queues":
        sent["name"] = unique("q")
    if url == "/v1/streams":
        sent = stream_body(unique("tiny"), **sent)
    r = await api.post(url, json=sent)
    assert r.status_code < 500, r.text


async def test_a_chunked_body_over_the_limit_is_413(api: Api) -> None:
    limit = api.ctx.settings.max_body_bytes
    name = unique("s")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"observations": ['
        piece = b'{"user": "u", "label": "0"},' * 1000
        sent = 0
        while sent <= limit:
            yield piece
            sent += len(piece)
        yield b'{"user": "u", "label": "0"}]}'

    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "PayloadTooLarge" and str(limit) in r.json()["detail"]


async def test_the_key_is_checked_before_the_body_is_read(api: Api) -> None:
    name = unique("s")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    read = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal read
        for _ in range(100):
            read += 1
            yield b"x" * 1000

    r = await api.client.post(
        f"/v1/streams/{name}/observations",
        content=body(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 401, r.text
    assert read <= 1  # the transport may pull one chunk; the app read none of the rest
    # no key and a malformed body: 401, not 422
    r = await api.client.post(
        "/v1/streams", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
    # a wrong key: 401 as well
    r = await api.client.post(
        "/v1/streams",
        content=b"{not json",
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk_x_y"},
    )
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "featurize", {"rows": [{"user": "u"}]}),
        ("GET", "trainset", None),
        ("POST", "predict", {"rows": [{"user": "u"}]}),
    ],
)
async def test_serving_an_unknown_stream_is_404_not_503(
    api: Api, method: str, path: str, body: dict | None
) -> None:
    url = f"/v1/streams/{unique('nosuch')}/{path}"
    if method == "POST":
        r = await api.post(url, role="model", json=body)
    else:
        r = await api.get(url, role="model")
    assert r.status_code == 404, r.text
    assert r.json()["error"] == "NotFound" and "not found" in r.json()["detail"]


async def test_a_body_without_json_content_type_is_415_naming_the_header(api: Api) -> None:
    body = b'{"name": "x", "features": [{"name": "a"}], "labels": ["0", "1"]}'
    r = await api.post("/v1/streams", content=body)  # httpx sends no Content-Type for bytes
    assert r.status_code == 415, r.text
    assert r.json()["error"] == "UnsupportedMediaType"
    assert "Content-Type" in r.json()["detail"] and "application/json" in r.json()["detail"]
    r = await api.post("/v1/streams", content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["detail"]
    r = await api.post(
        "/v1/streams",
        content=body.replace(b'"x"', f'"{unique("ct")}"'.encode()),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 201, r.text

"""Headers read as numbers are ASCII digits or a 4xx naming the header, never a 500:
``"²".isdigit()`` is true and ``int("²")`` fails."""

from __future__ import annotations

import pytest
from starlette.types import Message, Receive, Scope, Send

from service.api import limits
from service.api.deps import INT64_MAX
from service.config import Settings
from tests.conftest import Api
from tests.helpers import new_stream


@pytest.mark.parametrize(
    "value",
    [b"\xb2", "١٢".encode(), b"12a", b"-1", b"+1", b"1_0", b" 1e3", str(INT64_MAX + 1).encode()],
)
async def test_a_last_event_id_that_is_not_ascii_digits_is_422(api: Api, value: bytes) -> None:
    name = await new_stream(api, "lei")
    r = await api.client.get(
        f"/v1/streams/{name}/events?follow_seconds=0",
        headers={**api.auth("model"), "Last-Event-ID": value},
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("Last-Event-ID:") and str(INT64_MAX) in r.text


@pytest.mark.parametrize("value", [b"", b"0", b"7", str(INT64_MAX).encode()])
async def test_ascii_digits_are_an_event_id(api: Api, value: bytes) -> None:
    name = await new_stream(api, "lei")
    r = await api.client.get(
        f"/v1/streams/{name}/events?follow_seconds=0",
        headers={**api.auth("model"), "Last-Event-ID": value},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", [b"\xb2", b"1\xb2", "１２".encode(), b"12 "])
async def test_the_body_limit_never_reads_a_content_length_that_is_not_ascii_digits(
    value: bytes,
) -> None:
    """The server refuses such a header before the app (h11, httptools); the middleware
    itself must not turn one into a 500 either."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: Message) -> None:
        sent.append(msg)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/admin/keys",
        "headers": [(b"content-length", value)],
    }
    await limits.BodyLimit(app, Settings())(scope, receive, send)
    assert sent[0]["status"] == 204

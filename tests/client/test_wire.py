"""The client's wire details that need no server: the SSE parser, error bodies, the rows it
sends, the batch keys."""

from __future__ import annotations

import httpx
import pandas as pd
import pytest
from selectivity_client import NotFound, RetrainRequired, SelectivityError, ValidationError
from selectivity_client._core import SSEParser, batch_key, batches, observations, records
from selectivity_client.errors import from_response


def test_sse_parser_follows_the_event_stream_format() -> None:
    p = SSEParser()
    lines = [": keep-alive", "", "id: 7", "event: roll", 'data: {"epoch":', "data: 2}", ""]
    events = [e for line in lines if (e := p.feed(line)) is not None]
    assert len(events) == 1
    assert (events[0].id, events[0].event, events[0].data) == (7, "roll", {"epoch": 2})


def test_errors_are_typed_by_kind_then_status() -> None:
    def resp(status: int, body: object) -> httpx.Response:
        return httpx.Response(status, json=body)

    e = from_response(resp(409, {"error": "RetrainRequired", "detail": "retrain"}))
    assert (
        type(e) is RetrainRequired
        and e.status == 409
        and str(e) == "RetrainRequired (409): retrain"
    )
    assert type(from_response(resp(404, {"error": "Whatever", "detail": "x"}))) is NotFound
    v = from_response(resp(422, {"detail": [{"loc": ["body", "rows"], "msg": "too short"}]}))
    assert type(v) is ValidationError and v.detail == "rows: too short"
    assert type(from_response(httpx.Response(418, text="teapot"))) is SelectivityError


def test_rows_and_dataframes_become_observations() -> None:
    df = pd.DataFrame({"user": ["a", None], "age": [3.0, float("nan")], "label": [1, 0]})
    assert records(df) == [
        {"user": "a", "age": 3.0, "label": 1},
        {"user": None, "age": None, "label": 0},
    ]
    obs = observations(df)
    assert obs[0] == {"features": {"user": "a", "age": 3.0}, "label": "1"}
    ready = {"features": {"u": 1}, "label": "0", "id": "x"}
    assert observations([ready]) == [ready]
    with pytest.raises(ValueError, match="label"):
        observations([{"user": "a"}])


def test_batches_have_stable_keys() -> None:
    assert list(batches(5, 2)) == [(0, 2), (2, 4), (4, 5)]
    assert batch_key("k", 2, 4) == "k:2-4"

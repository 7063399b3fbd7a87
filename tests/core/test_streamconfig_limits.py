"""A stream's tables must fit in Redis: one table is one string of 4-byte cells (at most
512 MiB), a window's tables at most 1 GiB. A config past either is refused, naming the fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.core.streamconfig import MAX_TABLE_CELLS, MAX_WINDOW_CELLS, StreamCreate
from tests.conftest import Api, unique
from tests.helpers import stream_body


def _config(**over: object) -> StreamCreate:
    return StreamCreate.model_validate(stream_body("limits", **over))


def test_a_table_larger_than_a_redis_string_is_refused() -> None:
    labels = [str(i) for i in range(64)]
    with pytest.raises(ValidationError, match="cells in a table"):
        _config(labels=labels, sketch={"width": 1 << 24, "depth": 16})
    ok = _config(labels=labels[:2], sketch={"width": 1 << 24, "depth": 2}, max_tables=4)
    assert ok.sketch.width * ok.sketch.depth * 2 <= MAX_TABLE_CELLS


def test_a_window_larger_than_a_gibibyte_is_refused() -> None:
    sketch = {"width": 1 << 22, "depth": 8}  # 2^26 cells a table with 2 labels
    assert _config(sketch=sketch, max_tables=4).max_tables == 4  # 2^28: the limit itself
    with pytest.raises(ValidationError, match="cells in a window") as info:
        _config(sketch=sketch, max_tables=5)
    assert str(MAX_WINDOW_CELLS) in str(info.value) and "max_tables" in str(info.value)


async def test_the_api_answers_422_naming_the_fields(api: Api) -> None:
    body = stream_body(unique("limits"), sketch={"width": 1 << 24, "depth": 16})
    body["labels"] = [str(i) for i in range(64)]
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422 and "sketch.width" in r.text, r.text

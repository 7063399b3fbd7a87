from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from service.coldstore import service as coldstore
from service.context import AppContext
from service.db.models import ColdSegment, Stream
from tests.conftest import Api, unique
from tests.helpers import obs, stream_body


@dataclass
class Key:
    id: int
    shares: list[str]


@pytest.fixture
async def cold_key(ctx: AppContext) -> AsyncIterator[Key]:
    """A fresh cold-store key whose shares the test holds (the previous one is retired)."""
    row, shares = await coldstore.init_key(
        sessionmaker=ctx.sessionmaker, shares=3, threshold=2, actor="test", rotate=True
    )
    yield Key(row.id, shares)


async def sealed_stream(api: Api, rows_per_window: list[list[dict]], **over: object) -> str:
    """A stream whose windows 1..n hold the given rows, rolled so that they are all closed."""
    name = unique("cold")
    r = await api.post("/v1/streams", json=stream_body(name, **over))
    assert r.status_code == 201, r.text
    for rows in rows_per_window:
        if rows:
            r = await api.post(
                f"/v1/streams/{name}/observations", "producer", json={"observations": rows}
            )
            assert r.status_code == 202, r.text
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    return name


def rows(n: int, tag: str, label: str = "1") -> list[dict]:
    return [
        obs(f"{tag}-u{i % 7}", f"{tag}-i{i}", 20 + i % 40, label, id_=f"{tag}-{i}")
        for i in range(n)
    ]


async def segments(ctx: AppContext, name: str) -> list[ColdSegment]:
    """The stream's cold segments, in window order."""
    async with ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        return list(
            await s.scalars(
                select(ColdSegment)
                .where(ColdSegment.stream_id == sid)
                .order_by(ColdSegment.epoch, ColdSegment.id)
            )
        )

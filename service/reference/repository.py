from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import ReferenceModel


async def get(session: AsyncSession, stream_id: int, epoch: int) -> ReferenceModel | None:
    stmt = select(ReferenceModel).where(
        ReferenceModel.stream_id == stream_id, ReferenceModel.epoch == epoch
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def delete_before(session: AsyncSession, stream_id: int, epoch: int) -> int:
    """Delete the stream's reference models of epochs before ``epoch``: how many."""
    stmt = delete(ReferenceModel).where(
        ReferenceModel.stream_id == stream_id, ReferenceModel.epoch < epoch
    )
    return int((await session.execute(stmt)).rowcount or 0)  # type: ignore[attr-defined]


async def add(session: AsyncSession, row: ReferenceModel) -> None:
    session.add(row)
    await session.flush()


async def all_of(
    session: AsyncSession, stream_id: int, *, since: int, limit: int
) -> Sequence[ReferenceModel]:
    """The stream's reference models of epochs ``since`` and later (those of earlier epochs
    are deleted by ``expire``; one may linger between a roll's commit and its expiry)."""
    stmt = (
        select(ReferenceModel)
        .where(ReferenceModel.stream_id == stream_id, ReferenceModel.epoch >= since)
        .order_by(ReferenceModel.epoch.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(stmt)).scalars().all()))

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import ReferenceModel


async def get(session: AsyncSession, stream_id: int, epoch: int) -> ReferenceModel | None:
    stmt = select(ReferenceModel).where(
        ReferenceModel.stream_id == stream_id, ReferenceModel.epoch == epoch
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def latest_trained(
    session: AsyncSession, stream_id: int, up_to: int
) -> ReferenceModel | None:
    stmt = (
        select(ReferenceModel)
        .where(
            ReferenceModel.stream_id == stream_id,
            ReferenceModel.epoch <= up_to,
            ReferenceModel.model.is_not(None),
        )
        .order_by(ReferenceModel.epoch.desc())
        .limit(1)
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def add(session: AsyncSession, row: ReferenceModel) -> None:
    session.add(row)
    await session.flush()


async def all_of(session: AsyncSession, stream_id: int, *, limit: int) -> Sequence[ReferenceModel]:
    stmt = (
        select(ReferenceModel)
        .where(ReferenceModel.stream_id == stream_id)
        .order_by(ReferenceModel.epoch.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(stmt)).scalars().all()))

"""All SQL of streams, windows and count tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import CountTable, Stream, Window

READY = "ready"
CREATING = "creating"  # its first windows are being prepared: invisible to every other lookup


async def get_by_name(
    session: AsyncSession, name: str, *, for_update: bool = False, creating: bool = False
) -> Stream | None:
    """The ready stream ``name`` (``creating``: in whatever state, for its creation)."""
    stmt = select(Stream).where(Stream.name == name)
    if not creating:
        stmt = stmt.where(Stream.state == READY)
    if for_update:
        stmt = stmt.with_for_update()
    return (await session.execute(stmt)).scalar_one_or_none()


async def list_streams(session: AsyncSession) -> Sequence[Stream]:
    """Every ready stream."""
    stmt = select(Stream).where(Stream.state == READY).order_by(Stream.id)
    return (await session.execute(stmt)).scalars().all()


async def list_creating(session: AsyncSession) -> Sequence[Stream]:
    stmt = select(Stream).where(Stream.state == CREATING).order_by(Stream.id)
    return (await session.execute(stmt)).scalars().all()


async def mark_ready(session: AsyncSession, stream_id: int, at: datetime) -> bool:
    """A creating stream becomes ready; its first window opens ``at``. False when it is not
    (no longer) creating."""
    done = await session.execute(
        update(Stream)
        .where(Stream.id == stream_id, Stream.state == CREATING)
        .values(state=READY, epoch_started_at=at)
    )
    if not done.rowcount:  # type: ignore[attr-defined]
        return False
    await session.execute(
        update(Window).where(Window.stream_id == stream_id, Window.epoch == 1).values(opened_at=at)
    )
    return True


async def delete_creating(session: AsyncSession, stream_id: int) -> None:
    """Delete a stream that never became ready (its tables and windows go with it)."""
    await session.execute(delete(Stream).where(Stream.id == stream_id, Stream.state == CREATING))


async def create(session: AsyncSession, stream: Stream, tables: list[CountTable]) -> Stream:
    session.add(stream)
    await session.flush()
    for t in tables:
        t.stream_id = stream.id
        session.add(t)
    await session.flush()
    return stream


async def tables_of(session: AsyncSession, stream_id: int) -> Sequence[CountTable]:
    stmt = select(CountTable).where(CountTable.stream_id == stream_id).order_by(CountTable.id)
    return (await session.execute(stmt)).scalars().all()


async def windows_of(session: AsyncSession, stream_id: int, *, limit: int) -> Sequence[Window]:
    stmt = (
        select(Window)
        .where(Window.stream_id == stream_id)
        .order_by(Window.epoch.desc())
        .limit(limit)
    )
    return (await session.execute(stmt)).scalars().all()


async def get_window(session: AsyncSession, stream_id: int, epoch: int) -> Window | None:
    stmt = select(Window).where(Window.stream_id == stream_id, Window.epoch == epoch)
    return (await session.execute(stmt)).scalar_one_or_none()


async def ensure_window(
    session: AsyncSession, stream_id: int, epoch: int, state: str, at: datetime
) -> Window:
    w = await get_window(session, stream_id, epoch)
    if w is None:
        w = Window(stream_id=stream_id, epoch=epoch, state=state, opened_at=at)
        session.add(w)
        await session.flush()
    return w


async def windows_to_expire_hot(
    session: AsyncSession, stream_id: int, before: int
) -> Sequence[Window]:
    """Windows before epoch ``before`` whose raw data is sealed but not yet deleted."""
    stmt = select(Window).where(
        Window.stream_id == stream_id,
        Window.epoch < before,
        Window.cold_sealed_at.is_not(None),
        Window.hot_deleted_at.is_(None),
    )
    return (await session.execute(stmt)).scalars().all()


async def windows_hot_deleted(session: AsyncSession, stream_id: int) -> Sequence[Window]:
    """Windows whose raw data is deleted from the hot store and whose tables are not."""
    stmt = select(Window).where(
        Window.stream_id == stream_id,
        Window.hot_deleted_at.is_not(None),
        Window.expired_at.is_(None),
    )
    return (await session.execute(stmt)).scalars().all()


async def windows_past_retention(
    session: AsyncSession, stream_id: int, before: int
) -> Sequence[Window]:
    stmt = select(Window).where(
        Window.stream_id == stream_id, Window.epoch < before, Window.expired_at.is_(None)
    )
    return (await session.execute(stmt)).scalars().all()


async def set_roll_target(session: AsyncSession, stream_id: int, target: int | None) -> None:
    await session.execute(update(Stream).where(Stream.id == stream_id).values(roll_target=target))

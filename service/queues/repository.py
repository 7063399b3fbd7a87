"""All SQL of annotation queues and their released tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import AnnotationQueue, AnnotationTask


async def get_by_name(session: AsyncSession, name: str) -> AnnotationQueue | None:
    stmt = select(AnnotationQueue).where(AnnotationQueue.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


async def create(session: AsyncSession, queue: AnnotationQueue) -> AnnotationQueue:
    session.add(queue)
    await session.flush()
    return queue


async def list_queues(session: AsyncSession) -> Sequence[AnnotationQueue]:
    return (
        (await session.execute(select(AnnotationQueue).order_by(AnnotationQueue.id)))
        .scalars()
        .all()
    )


async def of_stream(session: AsyncSession, stream_id: int) -> Sequence[AnnotationQueue]:
    stmt = select(AnnotationQueue).where(AnnotationQueue.stream_id == stream_id)
    return (await session.execute(stmt.order_by(AnnotationQueue.id))).scalars().all()


async def insert_tasks(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Insert released tasks (``AnnotationTask`` columns), passing over any whose id or key
    the queue holds already: a rerun of a release, or two at once, inserts each key once and
    never fails on a unique constraint."""
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    await session.execute(dialect.insert(AnnotationTask).on_conflict_do_nothing(), list(rows))


async def task_ids(session: AsyncSession, queue_id: int, keys: Sequence[str]) -> dict[str, str]:
    """The task id of each of ``keys`` (key digests) the queue holds."""
    out: dict[str, str] = {}
    for i in range(0, len(keys), 500):
        stmt = select(AnnotationTask.key_hash, AnnotationTask.id).where(
            AnnotationTask.queue_id == queue_id, AnnotationTask.key_hash.in_(keys[i : i + 500])
        )
        out.update({k: t for k, t in (await session.execute(stmt)).all()})
    return out


async def get_task(session: AsyncSession, queue_id: int, task_id: str) -> AnnotationTask | None:
    stmt = select(AnnotationTask).where(
        AnnotationTask.id == task_id, AnnotationTask.queue_id == queue_id
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def labelled(
    session: AsyncSession, queue_id: int, *, after: int, limit: int
) -> Sequence[AnnotationTask]:
    stmt = (
        select(AnnotationTask)
        .where(
            AnnotationTask.queue_id == queue_id,
            AnnotationTask.label.is_not(None),
            AnnotationTask.seq > after,
        )
        .order_by(AnnotationTask.seq)
        .limit(limit)
    )
    return (await session.execute(stmt)).scalars().all()


async def label_counts(session: AsyncSession, queue_id: int) -> dict[str, int]:
    stmt = (
        select(AnnotationTask.label, func.count())
        .where(AnnotationTask.queue_id == queue_id, AnnotationTask.label.is_not(None))
        .group_by(AnnotationTask.label)
    )
    return {str(label): int(n) for label, n in (await session.execute(stmt)).all()}

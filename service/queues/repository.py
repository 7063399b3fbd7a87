"""All SQL of annotation queues and their released tasks."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
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


async def add_tasks(session: AsyncSession, tasks: Sequence[AnnotationTask]) -> None:
    session.add_all(tasks)
    await session.flush()


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

"""All SQL of models, stream events and webhook deliveries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import Model, StreamEvent, WebhookDelivery


async def get(session: AsyncSession, stream_id: int, model_id: str) -> Model | None:
    m = await session.get(Model, model_id)
    return m if m is not None and m.stream_id == stream_id else None


async def get_by_name(session: AsyncSession, stream_id: int, name: str) -> Model | None:
    stmt = select(Model).where(Model.stream_id == stream_id, Model.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


async def create(session: AsyncSession, model: Model) -> Model:
    session.add(model)
    await session.flush()
    return model


async def mark_stale(session: AsyncSession, stream_id: int, epoch: int, at: datetime) -> list[str]:
    """Models trained before ``epoch`` (or never) that are not yet stale become stale now."""
    behind = or_(Model.trained_epoch.is_(None), Model.trained_epoch < epoch)
    stmt = select(Model.id).where(Model.stream_id == stream_id, behind, Model.stale_since.is_(None))
    ids = list((await session.execute(stmt)).scalars().all())
    if ids:
        await session.execute(update(Model).where(Model.id.in_(ids)).values(stale_since=at))
    return ids


async def behind(session: AsyncSession, stream_id: int, epoch: int) -> Sequence[Model]:
    stmt = select(Model).where(
        Model.stream_id == stream_id,
        or_(Model.trained_epoch.is_(None), Model.trained_epoch < epoch),
    )
    return (await session.execute(stmt)).scalars().all()


async def add_event(session: AsyncSession, event: StreamEvent) -> StreamEvent:
    session.add(event)
    await session.flush()
    return event


async def events_after(
    session: AsyncSession, stream_id: int, after: int, *, limit: int
) -> Sequence[StreamEvent]:
    after = min(after, 2**31 - 1)  # the id is a 32-bit INTEGER: PostgreSQL refuses more
    stmt = (
        select(StreamEvent)
        .where(StreamEvent.stream_id == stream_id, StreamEvent.id > after)
        .order_by(StreamEvent.id)
        .limit(limit)
    )
    return (await session.execute(stmt)).scalars().all()


async def add_delivery(session: AsyncSession, delivery: WebhookDelivery) -> None:
    session.add(delivery)
    await session.flush()


async def deliveries(session: AsyncSession, model_id: str) -> Sequence[WebhookDelivery]:
    stmt = (
        select(WebhookDelivery)
        .where(WebhookDelivery.model_id == model_id)
        .order_by(WebhookDelivery.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def roll_events(
    session: AsyncSession, stream_id: int, epoch: int, kind: str
) -> list[StreamEvent]:
    """The events of ``kind`` that the roll to ``epoch`` wrote."""
    stmt = (
        select(StreamEvent)
        .where(StreamEvent.stream_id == stream_id, StreamEvent.kind == kind)
        .order_by(StreamEvent.id.desc())
        .limit(100)
    )
    return [
        e for e in (await session.execute(stmt)).scalars().all() if e.data.get("epoch") == epoch
    ]


async def delivered(session: AsyncSession, event_id: int) -> set[str]:
    """Models that acknowledged event ``event_id`` (a 2xx answer to one attempt)."""
    stmt = select(WebhookDelivery.model_id).where(
        WebhookDelivery.event_id == event_id,
        WebhookDelivery.status_code >= 200,
        WebhookDelivery.status_code < 300,
    )
    return set((await session.execute(stmt)).scalars().all())

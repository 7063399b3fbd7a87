"""All SQL of count-table selection: which rounds a stream has recorded."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import FollowUp, StreamEvent, Window

PICKED = "tables_selected"  # a round that picked tables (they are count_table rows too)
NOTHING = "nothing_selected"  # a round whose first pick was ⊥: no table row records it


async def round_epochs(session: AsyncSession, stream_id: int) -> set[int]:
    """The epochs of the rolls whose selection round has committed its outcome (tables or
    nothing): a round is released once, so a retry after a crash must find it here."""
    stmt = select(StreamEvent.data).where(
        StreamEvent.stream_id == stream_id, StreamEvent.kind.in_((PICKED, NOTHING))
    )
    return {int(data["epoch"]) for data in (await session.execute(stmt)).scalars().all()}


async def round_pending(
    session: AsyncSession, stream_id: int, epoch: int, *, max_attempts: int
) -> bool:
    """Whether the round of the roll to ``epoch`` may still commit: not recorded, and its
    follow-up not done and not given up (fewer than ``max_attempts`` tries)."""
    if epoch in await round_epochs(session, stream_id):
        return False
    row = (
        await session.execute(
            select(FollowUp.done_at, FollowUp.attempts).where(
                FollowUp.stream_id == stream_id,
                FollowUp.epoch == epoch,
                FollowUp.kind == "selection_round",
            )
        )
    ).first()
    return row is not None and row.done_at is None and row.attempts < max_attempts


async def roll_time(session: AsyncSession, stream_id: int, epoch: int) -> datetime | None:
    """The time of the roll to ``epoch``, a public fact of the stream's schedule: when the roll
    recorded its follow-ups (the same commit as the new epoch), else when window ``epoch``'s
    row was written."""
    at = (
        await session.execute(
            select(FollowUp.created_at).where(
                FollowUp.stream_id == stream_id,
                FollowUp.epoch == epoch,
                FollowUp.kind == "selection_round",
            )
        )
    ).scalar_one_or_none()
    if at is not None:
        return at
    return (
        await session.execute(
            select(Window.opened_at).where(Window.stream_id == stream_id, Window.epoch == epoch)
        )
    ).scalar_one_or_none()

"""All SQL of count-table selection: which rounds a stream has recorded."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import StreamEvent

PICKED = "tables_selected"  # a round that picked tables (they are count_table rows too)
NOTHING = "nothing_selected"  # a round whose first pick was ⊥: no table row records it


async def round_epochs(session: AsyncSession, stream_id: int) -> set[int]:
    """The epochs of the rolls whose selection round has committed its outcome (tables or
    nothing): a round is released once, so a retry after a crash must find it here."""
    stmt = select(StreamEvent.data).where(
        StreamEvent.stream_id == stream_id, StreamEvent.kind.in_((PICKED, NOTHING))
    )
    return {int(data["epoch"]) for data in (await session.execute(stmt)).scalars().all()}

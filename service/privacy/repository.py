"""SQL the privacy ledger reads: who created a job, from the audit log (``service.audit``),
which records every creation with the creating key as its actor."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import AuditEntry


async def creator(session: AsyncSession, *, action: str, target: str) -> str | None:
    """The key id that the audit log names as the actor of ``action`` on ``target`` (its
    first such entry), or None."""
    return await session.scalar(
        select(AuditEntry.actor)
        .where(AuditEntry.action == action, AuditEntry.target == target)
        .order_by(AuditEntry.seq)
        .limit(1)
    )

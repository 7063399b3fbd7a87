from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import ApiKey


async def get(session: AsyncSession, key_id: str) -> ApiKey | None:
    return await session.get(ApiKey, key_id)


async def create(session: AsyncSession, key: ApiKey) -> ApiKey:
    session.add(key)
    await session.flush()
    return key


async def any_admin(session: AsyncSession) -> bool:
    stmt = select(ApiKey.id).where(ApiKey.role == "admin", ApiKey.revoked_at.is_(None)).limit(1)
    return (await session.execute(stmt)).first() is not None

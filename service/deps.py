"""Dependencies: the app context, the request-owned session, the caller's key and role."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.admin.service import Principal, authenticate
from service.context import AppContext
from service.errors import Forbidden


def get_ctx(request: Request) -> AppContext:
    return request.app.state.ctx


CtxDep = Annotated[AppContext, Depends(get_ctx)]


async def get_session(ctx: CtxDep) -> AsyncIterator[AsyncSession]:
    """The request owns the transaction: commit on success, roll back on error."""
    async with ctx.sessionmaker() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


SessionDep = Annotated[AsyncSession, Depends(get_session)]


async def current_key(
    ctx: CtxDep, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    return await authenticate(ctx=ctx, authorization=authorization)


CurrentKey = Annotated[Principal, Depends(current_key)]


def require(*roles: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting the given roles (and admin, which may do everything)."""
    allowed = set(roles) | {"admin"}

    async def dep(principal: CurrentKey) -> Principal:
        if principal.role not in allowed:
            raise Forbidden(
                f"this endpoint needs a key with role {sorted(allowed)}; "
                f"yours is {principal.role!r}"
            )
        return principal

    return dep


AnyKey = Annotated[
    Principal, Depends(require("producer", "model", "curator", "annotator", "analyst"))
]
AdminKey = Annotated[Principal, Depends(require())]
ProducerKey = Annotated[Principal, Depends(require("producer"))]
ModelKey = Annotated[Principal, Depends(require("model"))]

"""Dependencies: the app context, the request-owned session, the caller's key and role.

Every route is a ``JsonRoute``: before the body is read, it refuses a request without a valid
API key (401) when the route needs one, and a body that is not ``application/json`` (415), so
that nobody without a key makes the service parse a body, and a client that forgot the header
is told so instead of a 422 about missing fields."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from service.admin.service import Principal, authenticate
from service.api import limits, ratelimit
from service.context import AppContext
from service.errors import Forbidden, UnsupportedMediaType

INT64_MAX = 2**63 - 1  # the largest integer SQLite and PostgreSQL (bigint) store: sequence bounds


class _OrjsonRequest(Request):
    async def body(self) -> bytes:
        read: limits.Read | None = self.scope.get(limits.READ)
        return read.raw if read is not None else await super().body()

    async def json(self) -> Any:
        """The body parsed by orjson (about twice as fast as ``json`` on a large ingest batch;
        stricter: no NaN or Infinity literals, integers within 64 bits). Its
        ``JSONDecodeError`` is ``json.JSONDecodeError``'s subclass, so a bad body is still a
        422 naming the position. A heavy body was parsed and validated in a thread already
        (``limits.admit``): its model, which FastAPI's validation returns as it is."""
        read: limits.Read | None = self.scope.get(limits.READ)
        if read is not None:
            return read.value
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """Every route of the API: the key checked before the body is read, JSON bodies only,
    parsed by orjson."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needs_key = _needs_key(self.dependant)
        takes_body = self.body_field is not None
        # per-key rate limit and creation cap (service.api.ratelimit), after the key, before
        # the body
        limit = ratelimit.class_of(self.methods, self.path) if needs_key else None
        cap = ratelimit.cap_of(self.methods, self.path) if needs_key else None
        if limit is not None:
            self.responses = {**self.responses, 429: ratelimit.RESPONSE_429}

        async def handle(request: Request) -> Response:
            ctx = request.app.state.ctx
            if needs_key:
                principal = await authenticate(
                    ctx=ctx, authorization=request.headers.get("authorization")
                )
                request.state.principal = principal
                if limit is not None:
                    await ratelimit.take(ctx, principal, limit)
            if takes_body:
                _check_json(request.headers.get("content-type"))
                await limits.admit(request, self.body_field)  # heavy: a slot, then a thread
            req = _OrjsonRequest(request.scope, request.receive)
            if cap is None:
                return await handler(req)
            return await ratelimit.within_cap(ctx, principal, cap, lambda: handler(req))

        return handle


def _needs_key(dependant: Dependant) -> bool:
    return any(d.call is current_key or _needs_key(d) for d in dependant.dependencies)


# Media types a 415 names when a client sent one of them; any other value of the header is
# not repeated (a header is the client's text: it is neither echoed nor logged).
KNOWN_MEDIA = frozenset(
    {
        "text/plain",
        "text/csv",
        "text/html",
        "application/xml",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    }
)


def _check_json(content_type: str | None) -> None:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        sent = (
            " (the header is missing)"
            if not media
            else f", not {media!r}"
            if media in KNOWN_MEDIA
            else ", not the media type sent"
        )
        raise UnsupportedMediaType(
            "Content-Type: the body must be sent with 'Content-Type: application/json'" + sent
        )


async def get_ctx(request: Request) -> AppContext:
    """Async, so FastAPI calls it on the event loop: a plain function would cost every request
    a hand-off to the thread pool (a seventh of a one-row featurize, issue 17's profile)."""
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


BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="an API key, `Authorization: Bearer sk_<id>_<secret>`",
)


async def current_key(
    request: Request,
    ctx: CtxDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
) -> Principal:
    """The caller, authenticated by ``JsonRoute`` before the body was read (or here, for a
    route of another class)."""
    principal = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    return await authenticate(ctx=ctx, authorization=request.headers.get("authorization"))


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

    dep.roles = frozenset(allowed)  # type: ignore[attr-defined]  # read by service.cli.apidoc
    return dep


AnyKey = Annotated[
    Principal, Depends(require("producer", "model", "curator", "annotator", "analyst"))
]
AdminKey = Annotated[Principal, Depends(require())]
ProducerKey = Annotated[Principal, Depends(require("producer"))]
ModelKey = Annotated[Principal, Depends(require("model"))]

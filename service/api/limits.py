"""What a request body may cost the event loop (docs/ARCHITECTURE.md, "HTTP API"; docs/USING.md,
"API").

- **Size, per endpoint, before it is read** (``BodyLimit``, an ASGI middleware in front of
  everything): the endpoints that take batches (``LARGE_BODY_ROUTES``) accept up to
  ``SELECTIVITY_MAX_BODY_BYTES``, every other one up to ``SELECTIVITY_MAX_SMALL_BODY_BYTES``;
  a larger Content-Length is a 413 before any byte is read, and a chunked body (or one longer
  than its Content-Length said) a 413 as soon as it passes the limit.
- **Heavy bodies, off the loop and a few at a time** (``admit``, called by every route after
  the key and the media type are checked): a body over ``SELECTIVITY_HEAVY_BODY_BYTES``, or
  of unknown length, waits for one of ``SELECTIVITY_HEAVY_REQUESTS`` slots (429 with
  Retry-After when none frees within ``SELECTIVITY_HEAVY_WAIT_SECONDS``), is then parsed and
  validated in a worker thread, and keeps its slot until its response is sent, so that the
  route's own work proportional to the body (normalisation, hashing, encoding: each route
  runs it in a thread too) is bounded by the same slots. A smaller body is parsed on the
  loop: at most ``HEAVY_BODY_BYTES`` of JSON, a few milliseconds."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
import pydantic
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.config import Settings
from service.errors import TooManyRequests

LARGE_BODY_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {
        ("POST", "/v1/streams/{stream}/observations"),
        ("POST", "/v1/streams/{stream}/featurize"),
        ("POST", "/v1/streams/{stream}/predict"),
        ("POST", "/v1/queues/{queue}/candidates"),
        ("POST", "/v1/anonymizations"),
        ("POST", "/v1/anonymizations/weights"),
        ("POST", "/v1/audits/reidentification"),
    }
)
"""The endpoints whose bodies are batches of rows or candidates: up to
``SELECTIVITY_MAX_BODY_BYTES``. Every other endpoint takes at most
``SELECTIVITY_MAX_SMALL_BODY_BYTES`` (``tests/api/test_heavy_requests.py`` checks the list
against the routes)."""

_LARGE = [
    (method, re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)) + "$"))
    for method, path in sorted(LARGE_BODY_ROUTES)
]
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,19}")
READ = "selectivity.body"
"""The scope key of a body ``admit`` read and validated: a ``Read``."""
RETRY_AFTER_SECONDS = 2


def body_limit(settings: Settings, method: str, path: str) -> int:
    """The most bytes a body of ``method path`` may have."""
    small = min(settings.max_small_body_bytes, settings.max_body_bytes)
    for m, pattern in _LARGE:
        if m == method and pattern.match(path):
            return settings.max_body_bytes
    return small


def _error(status: int, kind: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": kind, "detail": detail}, status_code=status)


class BodyLimit:
    """Refuse a body over its endpoint's limit (``body_limit``) with 413, whether or not
    Content-Length is sent: a Content-Length over it before anything is read, a body that
    grows past it as soon as it does."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(self.settings, scope["method"], scope["path"])
        for name, value in scope.get("headers", []):
            # h11 and httptools refuse a Content-Length that is not ASCII digits; any other
            # value is left to the server (never read here as a number)
            if (
                name == b"content-length"
                and _CONTENT_LENGTH.fullmatch(value)
                and int(value) > limit
            ):
                await _error(
                    413,
                    "PayloadTooLarge",
                    f"body of {int(value)} bytes exceeds this endpoint's limit of {limit}",
                )(scope, receive, send)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge as exc:  # raised where no route's error handling saw it
            await _error(413, "PayloadTooLarge", exc.detail)(scope, receive, send)


class _TooLarge(StarletteHTTPException):
    """A body (chunked, or longer than its Content-Length said) past the limit. An HTTP
    exception, so that FastAPI's body reader re-raises it as it is (any other exception there
    becomes 400 "There was an error parsing the body") and the handler answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body exceeds this endpoint's limit of {limit} bytes")


class Gate:
    """At most ``slots`` requests of a kind at once; a request waits at most ``wait_seconds``
    for a slot, then gets 429 with Retry-After (``busy`` says which limit)."""

    def __init__(self, *, slots: int, wait_seconds: float, busy: str) -> None:
        self.slots = slots
        self.wait_seconds = wait_seconds
        self.busy = busy
        self._sem = asyncio.Semaphore(slots)

    async def _acquire(self) -> None:
        try:
            await asyncio.wait_for(self._sem.acquire(), self.wait_seconds)
        except TimeoutError:
            raise TooManyRequests(
                f"{self.busy}: all {self.slots} slots stayed busy for {self.wait_seconds:g} s; "
                "retry",
                retry_after=RETRY_AFTER_SECONDS,
            ) from None

    async def enter(self, stack: AsyncExitStack) -> None:
        """Take a slot, given back when ``stack`` closes."""
        await self._acquire()
        stack.callback(self._sem.release)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._sem.release()


@dataclass(frozen=True)
class Read:
    raw: bytes
    value: Any


GATES = {
    "heavy": (
        "heavy_requests",
        "large request bodies (over SELECTIVITY_HEAVY_BODY_BYTES, or chunked) are parsed "
        "SELECTIVITY_HEAVY_REQUESTS at a time",
    ),
    "calculator": (
        "calculator_concurrency",
        "the (beta, k, epsilon, delta) calculator computes SELECTIVITY_CALCULATOR_CONCURRENCY "
        "answers at a time (answers it has given are served at once)",
    ),
}
"""Gate name → (the setting of its slots, what a 429 says)."""


def gate(request: Request, name: str) -> Gate:
    """The app's gate ``name`` (``GATES``), made at its first use (on the app's loop)."""
    state = request.app.state
    gates: dict[str, Gate] | None = getattr(state, "gates", None)
    if gates is None:
        gates = state.gates = {}
    if name not in gates:
        settings: Settings = state.ctx.settings
        slots, busy = GATES[name]
        gates[name] = Gate(
            slots=getattr(settings, slots), wait_seconds=settings.heavy_wait_seconds, busy=busy
        )
    return gates[name]


def is_heavy(request: Request, settings: Settings) -> bool:
    """A body over ``heavy_body_bytes``, or of unknown length (chunked)."""
    value = request.headers.get("content-length")
    if value is None or not _CONTENT_LENGTH.fullmatch(value.encode("latin-1")):
        return True
    return int(value) > settings.heavy_body_bytes


async def admit(request: Request, body_field: Any) -> None:
    """For a heavy body: a slot (held until the response is sent), then the body read and
    validated by ``body_field`` in a worker thread, left in the scope under ``READ`` for the
    route (``service.api.deps``' request class hands it to FastAPI, whose own validation of a
    validated model returns it as it is). A light body is left to FastAPI."""
    settings: Settings = request.app.state.ctx.settings
    if body_field is None or not is_heavy(request, settings):
        return
    await gate(request, "heavy").enter(request.scope["fastapi_inner_astack"])
    raw = await request.body()  # capped by BodyLimit
    if not raw:
        return  # FastAPI's own 422: the body is missing
    value = await anyio.to_thread.run_sync(validate, body_field, raw)
    request.scope[READ] = Read(raw, value)


def validate(body_field: Any, raw: bytes) -> Any:
    """The body validated as FastAPI would, with FastAPI's errors, from its JSON text by
    pydantic (``validate_json``), which lets the event loop's thread run every few tens of
    milliseconds; validating the parsed objects (``validate_python``) holds the interpreter
    for all of it (0.56 s for 15 MB of small integers, against 0.08 s). orjson reads it
    first, for the service's strict JSON: no NaN or Infinity literals, integers within 64
    bits, errors naming the position."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", e.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": e.msg},
                }
            ]
        ) from None
    try:
        # FastAPI's own adapter of the route's body (``ModelField.validate`` takes objects)
        return body_field._type_adapter.validate_json(raw)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in errors]
        ) from None

"""The FastAPI application: routers, one error handler, limits, health and metrics."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import resources
from service.admin.service import bootstrap_admin
from service.api import admin as admin_router
from service.api import anonymizations as anonymizations_router
from service.api import audit as audit_router
from service.api import audits as audits_router
from service.api import coldstore as coldstore_router
from service.api import features as features_router
from service.api import ingest as ingest_router
from service.api import limits, openapi
from service.api import metrics as operator_metrics
from service.api import models as models_router
from service.api import plan as plan_router
from service.api import privacy as privacy_router
from service.api import queues as queues_router
from service.api import reference as reference_router
from service.api import selection as selection_router
from service.api import streams as streams_router
from service.api import web as web_router
from service.api import windows as windows_router
from service.coldstore.service import init_embedded_key, warn_without_key
from service.config import Settings
from service.context import AppContext, start_process_pool, stop_process_pool
from service.core import logsafe
from service.db import session as db_session
from service.errors import ServiceError
from service.features import service as features
from workers import runner

log = logging.getLogger("selectivity")

REQUESTS = Counter("selectivity_requests_total", "HTTP requests", ["route", "status"])
LATENCY = Histogram("selectivity_request_seconds", "HTTP request latency", ["route"])


def _error(
    status: int, kind: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": kind, "detail": detail}, status_code=status, headers=headers)


def _loc(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


class Metrics:
    """Request latency and count per route for ``/metrics`` (a plain ASGI middleware: no task
    or stream per request, unlike ``BaseHTTPMiddleware``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            LATENCY.labels(path).observe(time.perf_counter() - start)
            REQUESTS.labels(path, str(status)).inc()


def _stop_started_pool(start: asyncio.Future[ProcessPoolExecutor]) -> None:
    if not start.cancelled() and start.exception() is None:
        stop_process_pool(start.result())


def create_app(settings: Settings | None = None, *, ctx: AppContext | None = None) -> FastAPI:
    """The app. With ``ctx`` given (tests), the caller owns the resources; otherwise the
    lifespan builds them (and, in embedded mode, the embedded Redis and the worker)."""
    settings = settings or (ctx.settings if ctx else Settings())
    # no row value in any log record of the process (docs/PRIVACY.md, promise 1)
    logsafe.install("uvicorn", "uvicorn.error", "saq", "selectivity")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if ctx is not None:
            app.state.ctx = ctx
            yield
            return
        # the process pool starts first, in a thread (its forkserver imports the noise's
        # modules), while Redis and the database are set up; it is ready before the server
        # listens, so the first stream creation does not pay for it
        pool = None
        if settings.run_worker_in_process:
            pool = asyncio.ensure_future(start_process_pool())
            await asyncio.sleep(0)  # let it hand its start to its thread now
        embedded = None
        try:
            embedded = None if settings.redis_url else resources.EmbeddedRedis(settings)
            own = await resources.build(settings, embedded=embedded)
            app.state.ctx = own
            path = await bootstrap_admin(sessionmaker=own.sessionmaker, settings=settings)
            if path:
                log.warning("created the bootstrap admin key in %s (mode 0600)", path)
            if embedded is not None:
                await init_embedded_key(own)
            else:
                await warn_without_key(own)
            if pool is not None:
                own.executor = await pool
        except BaseException:  # a failed start leaves no process behind
            if pool is not None:
                pool.add_done_callback(_stop_started_pool)
            if embedded is not None:
                embedded.close()
            raise
        worker = None
        if own.executor is not None:
            worker = asyncio.create_task(runner.run_in_process(own))
        # the featurizers of epochs no longer served go within seconds (cancelled by
        # resources.close)
        own.caches.background["featurizers"] = asyncio.create_task(features.sweep_forever(own))
        if settings.metrics_token is not None:  # cancelled by resources.close
            own.caches.background["metrics"] = asyncio.create_task(
                operator_metrics.refresh_forever(own)
            )
        try:
            yield
        finally:
            if worker is not None:
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)
            await resources.close(own)
            if embedded is not None:
                embedded.close()

    app = FastAPI(
        title="Selectivity",
        version="0.1.0",
        lifespan=lifespan,
        description="Data selectivity after Pyramid: hot window, DP count tables.",
        docs_url=None,  # /docs is service.api.web's: Swagger UI from local assets, no CDN
        redoc_url=None,
    )

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status_code, type(exc).__name__, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        msgs = []
        for e in exc.errors()[:10]:
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            msgs.append(f"{_loc(tuple(e.get('loc', ())))}: {msg}")
        return _error(422, "ValidationError", "; ".join(msgs))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge"}.get(
            exc.status_code, "HTTPError"
        )
        return _error(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(OperationalError)
    async def _database(_: Request, exc: OperationalError) -> JSONResponse:
        """The database stayed locked past the wait (SQLite's busy timeout): 503 with
        Retry-After; any other operational error goes on to ``_unexpected`` (500)."""
        if not db_session.is_busy(exc):
            raise exc
        log.warning("database busy: %s", logsafe.type_name(exc))
        retry = db_session.RETRY_AFTER_SECONDS
        return _error(
            503,
            "DatabaseBusy",
            "the database is busy: another writer held its lock past the wait of "
            f"{settings.sqlite_busy_timeout_seconds:g} s; retry in {retry} s",
            {"Retry-After": str(retry)},
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        """A generic body, never the exception's text (it may hold a row, a SQL parameter);
        the log gets the exception's type and a request id the body names. The server logs
        the traceback after this (Starlette re-raises), through ``logsafe``: types and
        frames only."""
        rid = secrets.token_hex(6)
        log.error("internal error %s, request %s", logsafe.type_name(exc), rid)
        return _error(500, "InternalError", f"internal error (request {rid}); see the server log")

    for r in (
        streams_router.router,
        ingest_router.router,
        features_router.router,
        windows_router.router,
        models_router.router,
        reference_router.router,
        privacy_router.router,
        privacy_router.calculator_router,
        plan_router.router,
        queues_router.router,
        web_router.router,
        selection_router.router,
        admin_router.router,
        admin_router.me_router,
        audit_router.router,
        coldstore_router.router,
        anonymizations_router.router,
        audits_router.router,
    ):
        app.include_router(r)
    openapi.install(app)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> JSONResponse:
        c: AppContext = request.app.state.ctx
        try:
            await c.redis.ping()
            async with c.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            return _error(503, "Unavailable", f"not ready: {type(exc).__name__}")
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        """For operators (the metrics token); the gauges as the background refresh left them."""
        c: AppContext = request.app.state.ctx
        operator_metrics.authorize(c.settings, request.headers.get("authorization"))
        return PlainTextResponse(operator_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(Metrics)
    app.add_middleware(limits.BodyLimit, settings=settings)  # per endpoint: api.limits
    if ctx is not None:
        app.state.ctx = ctx
    return app

"""What an operator alerts on, for ``/metrics`` (the alert rules and dashboard in ``deploy/`` use
only these and the request metrics).

``/metrics`` is for operators only: it answers a bearer token set by
``SELECTIVITY_METRICS_TOKEN`` (Prometheus's ``authorization`` scrape option,
``deploy/prometheus/prometheus.yml``), 401 to anyone else, and 404 when no token is set. A
scrape only writes out the gauges as they are (milliseconds, whatever the number of streams
and queues); ``refresh_forever`` recomputes them in the background of each API process every
``SELECTIVITY_METRICS_REFRESH_SECONDS``, one refresh at a time, the privacy ledgers' maths in a
worker thread. Each refresh reads everything first and only then replaces the gauges, in one
step with no await in it, so a scrape never sees half of a refresh; a stream or queue that is
gone leaves no stale series. Counters and histograms that belong to the work itself live
beside it: the roll's duration (``service.lifecycle.roll.ROLL_SECONDS``) and job failures
(``workers.runner`` counts them in the worker process, which serves them on its own
``/metrics`` only if it is in the API process, as in embedded mode).

No value is a count of raw observations: labels are stream and queue names, states and parts
of the ledger; values are window counts, ages, epochs, ε and δ, break-glass requests, and the
annotation queue counters the queue's own stats already show its curators and annotators. How
many rows wait to be counted or sealed is not exported (an exact function of what was
ingested); the counting lag is the age of the oldest uncounted row, in whole seconds."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge, generate_latest
from sqlalchemy import func, select

from service.config import Settings
from service.context import AppContext
from service.core.streamconfig import StreamCreate
from service.db.models import AnnotationQueue, Stream, UnlockRequest, Window
from service.errors import NotFound, Unauthorized
from service.privacy.service import ledger
from service.queues.privacy import ledger_parts as queue_ledger_parts

log = logging.getLogger("selectivity")

COUNTING_LAG_SECONDS = Gauge(
    "selectivity_counting_lag_seconds",
    "age of the oldest accepted row not yet counted, in whole seconds (0: all counted)",
    ["stream"],
)
SEAL_BACKLOG_WINDOWS = Gauge(
    "selectivity_seal_backlog_windows",
    "closed windows whose raw data is not yet sealed into the cold store",
    ["stream"],
)
HOT_PAST_DEADLINE_WINDOWS = Gauge(
    "selectivity_hot_past_deadline_windows",
    "windows that left the hot period whose raw data is still in Redis (promise 1)",
    ["stream"],
)
HOT_PAST_DEADLINE_SECONDS = Gauge(
    "selectivity_hot_past_deadline_seconds",
    "how long the oldest such window is past its deletion deadline (0: none)",
    ["stream"],
)
STREAM_EPOCH = Gauge("selectivity_stream_epoch", "the stream's open window", ["stream"])
PRIVACY_EPSILON = Gauge(
    "selectivity_privacy_epsilon",
    "ε of the stream's privacy ledger per observation (tables, selection, queues composed)",
    ["stream"],
)
PRIVACY_DELTA = Gauge(
    "selectivity_privacy_delta", "δ of the stream's privacy ledger per observation", ["stream"]
)
UNLOCK_REQUESTS = Gauge(
    "selectivity_unlock_requests", "break-glass unlock requests by status", ["status"]
)
UNLOCK_GRANTS_OPEN = Gauge(
    "selectivity_unlock_grants_open",
    "granted unlock requests whose key is in this API process's memory now",
)
QUEUE_TASKS = Gauge(
    "selectivity_queue_tasks", "annotation queue tasks by state", ["queue", "state"]
)
REFRESH_ERRORS = Gauge(
    "selectivity_metrics_refresh_errors",
    "parts of the last refresh of these gauges that failed (see the log): their gauges are missing",
)
REFRESH_SECONDS = Gauge(
    "selectivity_metrics_refresh_seconds", "time the last refresh of these gauges took"
)
AGE_SECONDS = Gauge(
    "selectivity_metrics_age_seconds",
    "time since these gauges were last refreshed (+Inf: not yet, in this process)",
)

PER_STREAM = (
    COUNTING_LAG_SECONDS,
    SEAL_BACKLOG_WINDOWS,
    HOT_PAST_DEADLINE_WINDOWS,
    HOT_PAST_DEADLINE_SECONDS,
    STREAM_EPOCH,
    PRIVACY_EPSILON,
    PRIVACY_DELTA,
)
QUEUE_STATES = ("in_pool", "leased", "released", "labelled", "skipped")
UNLOCK_STATUSES = ("pending", "granted", "expired", "closed")

_refreshed_at: float | None = None  # time.monotonic() at the end of the last refresh


def _age() -> float:
    return float("inf") if _refreshed_at is None else time.monotonic() - _refreshed_at


AGE_SECONDS.set_function(_age)


def authorize(settings: Settings, authorization: str | None) -> None:
    """Admit the metrics token (compared in constant time); 404 when none is set."""
    token = settings.metrics_token
    if token is None:
        raise NotFound("/metrics is off: set SELECTIVITY_METRICS_TOKEN to serve it")
    sent = (authorization or "").removeprefix("Bearer ").strip()
    if (
        not authorization
        or not authorization.startswith("Bearer ")
        or not hmac.compare_digest(sent.encode(), token.get_secret_value().encode())
    ):
        raise MetricsUnauthorized("/metrics needs 'Authorization: Bearer <metrics token>'")


class MetricsUnauthorized(Unauthorized):
    headers = {"WWW-Authenticate": 'Bearer realm="metrics"'}


def exposition() -> bytes:
    """The gauges as they are, in Prometheus's text format: no query, no computation."""
    return generate_latest()


@dataclass
class _Values:
    streams: dict[str, dict[Gauge, float]] = field(default_factory=dict)
    unlock: dict[str, int] = field(default_factory=dict)
    grants_open: int = 0
    queues: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: int = 0


def _id_seconds(entry_id: bytes) -> float:
    """A Redis stream entry id's time (its milliseconds part), in seconds."""
    return int(entry_id.split(b"-", 1)[0]) / 1000


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


async def _stream(
    ctx: AppContext, s: Any, windows: list[Window], now: datetime
) -> dict[Gauge, float]:
    """One stream's gauges. ``windows``: its windows whose raw data is not deleted."""
    cfg = StreamCreate.model_validate(s.config)
    name = s.name
    hot_lo = s.epoch - cfg.hot_windows + 1
    lag_seconds = 0.0
    backlog_windows = past = 0
    past_seconds = 0.0
    for w in windows:
        if w.epoch >= hot_lo:
            for p in range(cfg.partitions):
                counted = await ctx.stores.counting.counted(name, w.epoch, p)
                start = b"(" + counted if counted else b"-"
                first = await ctx.stores.windows.hot_range(name, w.epoch, start, b"+", 1, p)
                if first:
                    lag_seconds = max(lag_seconds, now.timestamp() - _id_seconds(first[0][0]))
        if w.state != "open" and w.cold_sealed_at is None:
            backlog_windows += 1
        if w.epoch < hot_lo:
            # it left the hot period at the roll to w + H: about (H − 1) windows after it closed
            closed = _aware(w.closed_at or w.opened_at)
            deadline = closed.timestamp() + (cfg.hot_windows - 1) * cfg.window_seconds
            past += 1
            past_seconds = max(past_seconds, now.timestamp() - deadline)
    return {
        COUNTING_LAG_SECONDS: float(int(max(0.0, lag_seconds))),
        SEAL_BACKLOG_WINDOWS: backlog_windows,
        HOT_PAST_DEADLINE_WINDOWS: past,
        HOT_PAST_DEADLINE_SECONDS: max(0.0, past_seconds),
        STREAM_EPOCH: s.epoch,
    }


async def _read(ctx: AppContext) -> _Values:
    """Everything the gauges show, read from SQL and Redis (the ledgers' maths in a thread)."""
    out = _Values()
    now = datetime.now(UTC)
    async with ctx.sessionmaker() as session:
        streams = (await session.execute(select(Stream))).scalars().all()
        holding = (
            (await session.execute(select(Window).where(Window.hot_deleted_at.is_(None))))
            .scalars()
            .all()
        )
        unlock = (
            await session.execute(
                select(UnlockRequest.status, func.count()).group_by(UnlockRequest.status)
            )
        ).all()
        queues = (await session.execute(select(AnnotationQueue.name))).scalars().all()
        ledgers = {}
        for s in streams:
            try:
                parts = await queue_ledger_parts(session=session, stream_id=s.id)
                cfg = StreamCreate.model_validate(s.config)
                ledgers[s.name] = await asyncio.to_thread(ledger, cfg, parts)
            except Exception as exc:  # one bad stream must not hide the others
                out.errors += 1
                log.warning("metrics: ledger of a stream failed: %s", type(exc).__name__)
    by_stream: dict[int, list[Window]] = {}
    for w in holding:
        by_stream.setdefault(w.stream_id, []).append(w)
    for s in streams:
        try:
            values = await _stream(ctx, s, by_stream.get(s.id, []), now)
        except Exception as exc:
            out.errors += 1
            log.warning("metrics: a stream's gauges failed: %s", type(exc).__name__)
            values = {}
        if s.name in ledgers:
            values[PRIVACY_EPSILON] = ledgers[s.name]["observation"]["epsilon"]
            values[PRIVACY_DELTA] = ledgers[s.name]["observation"]["delta"]
        out.streams[s.name] = values
    out.unlock = {status: 0 for status in UNLOCK_STATUSES} | {st: n for st, n in unlock}
    out.grants_open = len(ctx.vault.grants)
    for q in queues:
        try:
            st = await ctx.stores.queues.stats(queue=q)
        except Exception as exc:
            out.errors += 1
            log.warning("metrics: a queue's gauges failed: %s", type(exc).__name__)
            continue
        out.queues[q] = {state: int(st[state]) for state in QUEUE_STATES}
    return out


def _publish(values: _Values, seconds: float) -> None:
    """Replace every gauge's series by ``values`` (no await: a scrape sees all or nothing)."""
    global _refreshed_at
    for family in (*PER_STREAM, UNLOCK_REQUESTS, QUEUE_TASKS):
        family.clear()
    for name, gauges in values.streams.items():
        for gauge, v in gauges.items():
            gauge.labels(name).set(v)
    for status, n in values.unlock.items():
        UNLOCK_REQUESTS.labels(status).set(n)
    UNLOCK_GRANTS_OPEN.set(values.grants_open)
    for q, states in values.queues.items():
        for state, n in states.items():
            QUEUE_TASKS.labels(q, state).set(n)
    REFRESH_ERRORS.set(values.errors)
    REFRESH_SECONDS.set(seconds)
    _refreshed_at = time.monotonic()


async def refresh(ctx: AppContext) -> None:
    """Recompute every gauge from the current state."""
    started = time.perf_counter()
    values = await _read(ctx)
    _publish(values, time.perf_counter() - started)


async def refresh_forever(ctx: AppContext) -> None:
    """``refresh`` now and then every ``metrics_refresh_seconds`` after the last one ended
    (never two at once); started by the API's lifespan when a metrics token is set."""
    while True:
        try:
            await refresh(ctx)
        except Exception as exc:  # the next refresh may succeed; the age gauge shows it
            log.warning("metrics: the operator gauges failed: %s", type(exc).__name__)
        await asyncio.sleep(ctx.settings.metrics_refresh_seconds)

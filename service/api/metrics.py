"""What an operator alerts on, computed when ``/metrics`` is scraped (issue 16 part 3; the
alert rules and dashboard in ``deploy/`` use only these and the request metrics).

Gauges are read from SQL and Redis at each scrape (a few queries per stream; scrape every 15 s
or more), so they are true whichever process did the work. Each family is cleared first, so a
stream or queue that is gone leaves no stale series. Counters and histograms that belong to the
work itself live beside it: the roll's duration (``service.lifecycle.roll.ROLL_SECONDS``) and
job failures (``workers.runner`` counts them in the worker process, which serves them on its
own ``/metrics`` only if it is in the API process, as in embedded mode).

No metric carries raw data: labels are stream and queue names, states and parts of the ledger;
values are counts, ages and ε."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge
from sqlalchemy import func, select

from service.context import AppContext
from service.core.streamconfig import StreamCreate
from service.db.models import AnnotationQueue, Stream, UnlockRequest, Window
from service.privacy.service import ledger
from service.queues.service import ledger_parts as queue_ledger_parts

log = logging.getLogger("selectivity")

LAG_ROWS_CAP = 100_000  # the uncounted rows are counted up to this many (XRANGE ... COUNT)

COUNTING_LAG_ROWS = Gauge(
    "selectivity_counting_lag_rows",
    f"rows accepted but not yet counted into the tables (capped at {LAG_ROWS_CAP})",
    ["stream"],
)
COUNTING_LAG_SECONDS = Gauge(
    "selectivity_counting_lag_seconds",
    "age of the oldest accepted row not yet counted (0: all counted)",
    ["stream"],
)
SEAL_BACKLOG_WINDOWS = Gauge(
    "selectivity_seal_backlog_windows",
    "closed windows whose raw data is not yet sealed into the cold store",
    ["stream"],
)
SEAL_BACKLOG_ROWS = Gauge(
    "selectivity_seal_backlog_rows", "hot rows of closed windows not yet sealed", ["stream"]
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
SCRAPE_ERRORS = Gauge(
    "selectivity_metrics_scrape_errors",
    "parts of the last scrape that failed (see the log): their gauges are missing",
)
SCRAPE_SECONDS = Gauge("selectivity_metrics_scrape_seconds", "time the last scrape took")

PER_STREAM = (
    COUNTING_LAG_ROWS,
    COUNTING_LAG_SECONDS,
    SEAL_BACKLOG_WINDOWS,
    SEAL_BACKLOG_ROWS,
    HOT_PAST_DEADLINE_WINDOWS,
    HOT_PAST_DEADLINE_SECONDS,
    STREAM_EPOCH,
    PRIVACY_EPSILON,
    PRIVACY_DELTA,
)


def _id_seconds(entry_id: bytes) -> float:
    """A Redis stream entry id's time (its milliseconds part), in seconds."""
    return int(entry_id.split(b"-", 1)[0]) / 1000


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


async def _stream(ctx: AppContext, s: Any, windows: list[Window], now: datetime) -> None:
    """One stream's gauges. ``windows``: its windows whose raw data is not deleted."""
    cfg = StreamCreate.model_validate(s.config)
    name = s.name
    hot_lo = s.epoch - cfg.hot_windows + 1
    lag_rows = 0
    lag_seconds = 0.0
    backlog_windows = backlog_rows = 0
    past = 0
    past_seconds = 0.0
    for w in windows:
        if w.epoch >= hot_lo:
            counted = await ctx.stores.counting.counted(name, w.epoch)
            start = b"(" + counted if counted else b"-"
            pending = await ctx.stores.windows.hot_range(name, w.epoch, start, b"+", LAG_ROWS_CAP)
            if pending:
                lag_rows += len(pending)
                lag_seconds = max(lag_seconds, now.timestamp() - _id_seconds(pending[0][0]))
        if w.state != "open" and w.cold_sealed_at is None:
            backlog_windows += 1
            backlog_rows += await ctx.stores.windows.hot_length(name, w.epoch)
        if w.epoch < hot_lo:
            # it left the hot period at the roll to w + H: about (H − 1) windows after it closed
            closed = _aware(w.closed_at or w.opened_at)
            deadline = closed.timestamp() + (cfg.hot_windows - 1) * cfg.window_seconds
            past += 1
            past_seconds = max(past_seconds, now.timestamp() - deadline)
    COUNTING_LAG_ROWS.labels(name).set(lag_rows)
    COUNTING_LAG_SECONDS.labels(name).set(max(0.0, lag_seconds))
    SEAL_BACKLOG_WINDOWS.labels(name).set(backlog_windows)
    SEAL_BACKLOG_ROWS.labels(name).set(backlog_rows)
    HOT_PAST_DEADLINE_WINDOWS.labels(name).set(past)
    HOT_PAST_DEADLINE_SECONDS.labels(name).set(max(0.0, past_seconds))
    STREAM_EPOCH.labels(name).set(s.epoch)


async def collect(ctx: AppContext) -> None:
    """Set every gauge from the current state (called by the ``/metrics`` route)."""
    started = time.perf_counter()
    errors = 0
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
                ledgers[s.name] = ledger(StreamCreate.model_validate(s.config), parts)
            except Exception as exc:  # one bad stream must not hide the others
                errors += 1
                log.warning("metrics: ledger of a stream failed: %s", type(exc).__name__)
    for family in (*PER_STREAM, UNLOCK_REQUESTS, QUEUE_TASKS):
        family.clear()
    by_stream: dict[int, list[Window]] = {}
    for w in holding:
        by_stream.setdefault(w.stream_id, []).append(w)
    for s in streams:
        try:
            await _stream(ctx, s, by_stream.get(s.id, []), now)
        except Exception as exc:
            errors += 1
            log.warning("metrics: a stream's gauges failed: %s", type(exc).__name__)
        if s.name in ledgers:
            PRIVACY_EPSILON.labels(s.name).set(ledgers[s.name]["observation"]["epsilon"])
            PRIVACY_DELTA.labels(s.name).set(ledgers[s.name]["observation"]["delta"])
    for status in ("pending", "granted", "expired", "closed"):
        UNLOCK_REQUESTS.labels(status).set(0)
    for status, n in unlock:
        UNLOCK_REQUESTS.labels(status).set(n)
    UNLOCK_GRANTS_OPEN.set(len(ctx.vault.grants))
    for q in queues:
        try:
            st = await ctx.stores.queues.stats(queue=q)
        except Exception as exc:
            errors += 1
            log.warning("metrics: a queue's gauges failed: %s", type(exc).__name__)
            continue
        for state in ("in_pool", "leased", "released", "labelled", "skipped"):
            QUEUE_TASKS.labels(q, state).set(st[state])
    SCRAPE_ERRORS.set(errors)
    SCRAPE_SECONDS.set(time.perf_counter() - started)

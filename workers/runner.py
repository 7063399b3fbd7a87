"""The worker: SAQ on the service's Redis, with all jobs and cron schedules declared here.
``selectivity worker`` runs it alone (production); embedded mode runs it inside the API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from saq import CronJob, Queue, Worker
from saq.queue.redis import RedisQueue

from service.context import AppContext, make_process_pool
from workers.jobs import (
    FUNCTIONS,
    coldstore_seal,
    ingest_count,
    unlock_expire_grants,
    windows_tick,
)

log = logging.getLogger("selectivity.worker")


def cron_every(seconds: float) -> str:
    """A six-field (seconds) cron expression firing every ``seconds`` (rounded, 1..59)."""
    s = min(59, max(1, math.ceil(seconds)))
    return f"* * * * * */{s}"


def make_worker(app: AppContext) -> Worker:
    queue: Queue = RedisQueue(app.redis, name=f"{app.keys.prefix}:jobs")

    async def startup(ctx: dict[str, Any]) -> None:
        ctx["app"] = app

    return Worker(
        queue,
        functions=FUNCTIONS,  # type: ignore[arg-type]
        concurrency=4,
        startup=startup,
        cron_jobs=[
            CronJob(
                windows_tick,
                cron=cron_every(app.settings.scheduler_seconds),
                unique=True,
                timeout=600,
            ),
            CronJob(
                ingest_count,
                cron=cron_every(app.settings.count_seconds),
                unique=True,
                timeout=600,
            ),
            CronJob(
                coldstore_seal,
                cron=cron_every(app.settings.scheduler_seconds),
                unique=True,
                timeout=3600,
            ),
            CronJob(unlock_expire_grants, cron=cron_every(10), unique=True, timeout=60),
        ],
    )


async def run_in_process(app: AppContext, *, handle_signals: bool = False) -> None:
    """Run the worker until cancelled. Inside the API process, uvicorn owns SIGINT/SIGTERM
    (SAQ would otherwise take them over and the server would never shut down)."""
    worker = make_worker(app)
    if not handle_signals:
        worker.SIGNALS = []
    try:
        await worker.start()
    finally:
        await worker.stop()


async def run_standalone(app: AppContext) -> None:
    app.executor = make_process_pool()
    log.info("worker started")
    with contextlib.suppress(asyncio.CancelledError):
        await run_in_process(app, handle_signals=True)

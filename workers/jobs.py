"""Job bodies: plain async functions, thin, each calling one service (docs/ARCHITECTURE.md,
"Jobs"). ``ctx["app"]`` is the process's ``AppContext``. Every job is safe to run twice and
to crash at any line: the services they call are idempotent and checkpointed, and a roll's
follow-ups are keyed per (stream, epoch) and recorded in SQL (``service.lifecycle.followups``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prometheus_client import Counter

from service.anonymize import service as anonymize
from service.audits import service as audits
from service.coldstore import service as coldstore
from service.coldstore import unlock
from service.counting import service as counting
from service.lifecycle import followups, scheduler
from service.queues import service as queues

JOB_FAILURES = Counter(
    "selectivity_job_failures", "worker jobs that raised, by job (then retried or re-run)", ["job"]
)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def counted(fn: F) -> F:
    """The job, with its failures counted in ``selectivity_job_failures_total{job}`` (the
    operator's "job failing" alert, deploy/prometheus/alerts.yml)."""

    @functools.wraps(fn)
    async def run(ctx: dict[str, Any], **kwargs: Any) -> Any:
        try:
            return await fn(ctx, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception:
            JOB_FAILURES.labels(fn.__name__).inc()
            raise

    return run  # type: ignore[return-value]


@counted
async def windows_tick(ctx: dict[str, Any]) -> dict[str, int]:
    """Roll every stream that is due, prepare next windows, re-enqueue unfinished follow-ups."""
    return await scheduler.tick(ctx["app"])


@counted
async def ingest_count(ctx: dict[str, Any]) -> dict[str, int]:
    """Enqueue one counting job per stream (``count_stream``), skipping streams whose job is
    queued or running: streams are counted in parallel, across the worker's slots and across
    workers."""
    return await counting.enqueue_all(ctx["app"])


@counted
async def count_stream(ctx: dict[str, Any], *, stream: str, part: int = 0) -> int:
    """Count one part of a stream's hot windows: the entries accepted since the last run, into
    their window's tables."""
    return await counting.count_stream(ctx["app"], stream, part)


@counted
async def coldstore_seal(ctx: dict[str, Any]) -> dict[str, int]:
    """Seal hot-stream entries into the cold store; expire what is sealed and left the hot
    period."""
    return await coldstore.seal_all(ctx=ctx["app"])


@counted
async def unlock_expire_grants(ctx: dict[str, Any]) -> int:
    return await unlock.expire_grants(ctx=ctx["app"])


@counted
async def queues_release(ctx: dict[str, Any]) -> dict[str, int]:
    """Release the annotation queues' release periods that have ended."""
    return await queues.release_due(ctx["app"])


# The follow-ups of a roll, one job each, keyed <kind>:<stream>:<epoch>.
@counted
async def windows_prepare_next(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="windows_prepare_next", name=stream, epoch=epoch)


@counted
async def selection_round(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="selection_round", name=stream, epoch=epoch)


@counted
async def reference_refresh(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="reference_refresh", name=stream, epoch=epoch)


@counted
async def models_notify(ctx: dict[str, Any], *, stream: str, epoch: int) -> dict:
    return await followups.run(ctx["app"], kind="models_notify", name=stream, epoch=epoch)


@counted
async def anonymize_run(ctx: dict[str, Any], *, id: str) -> dict:  # noqa: A002
    """Compute a k-anonymised release (deterministic: a rerun after a crash starts over)."""
    return await anonymize.run(ctx=ctx["app"], a=id)


@counted
async def reidentification_run(ctx: dict[str, Any], *, id: str) -> dict:  # noqa: A002
    """Run a re-identification audit (a rerun after a crash resumes from its checkpoints)."""
    return await audits.run(ctx=ctx["app"], a=id)


FUNCTIONS = [
    windows_tick,
    ingest_count,
    count_stream,
    coldstore_seal,
    unlock_expire_grants,
    queues_release,
    windows_prepare_next,
    selection_round,
    reference_refresh,
    models_notify,
    anonymize_run,
    reidentification_run,
]
assert {f.__name__ for f in FUNCTIONS} >= set(followups.KINDS)

"""Per-key rate limits and creation quotas (docs/USING.md, "Quotas and rate limits").

Every operation of the API is in ``CLASSES`` (it costs more than a lookup: it is limited, per
API key, by its class's token bucket, ``SELECTIVITY_RATE_LIMITS`` over
``service.config.RATE_LIMITS``) or in ``LOOKUPS`` (reads of a few keys or rows: not limited);
``tests/api/test_ratelimit.py`` fails on an operation in neither. ``JsonRoute``
(``service.api.deps``) takes the token right after the key is checked, before the body is
read, so a caller past its limit never makes the service read or parse a body: 429 with
``Retry-After`` (whole seconds), naming the class and its limit. The buckets are in Redis
(``service.stores.quotas``: one key and one script call a request), shared by every API
process, except those of ``LOCAL_CLASSES`` (featurize, predict), kept in each API process's
memory so the latency-critical path makes no Redis round trip for them.

``CAPS`` bounds what one key may create (``SELECTIVITY_MAX_STREAMS_PER_KEY``,
``SELECTIVITY_MAX_QUEUES_PER_KEY``): a slot is reserved atomically before the creation runs
and given back if it fails, so concurrent creations never overshoot; past the cap, 403
``QuotaExceeded`` naming it. The counter counts creations by the key (nothing deletes a
stream or a queue today)."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Response

from service.admin.service import Principal
from service.context import AppContext
from service.errors import Forbidden, TooManyRequests

# (method, path) → class. What each class is for, and its default: service.config.RATE_LIMITS.
CLASSES: dict[tuple[str, str], str] = {
    ("POST", "/v1/streams/{stream}/observations"): "ingest",
    ("POST", "/v1/streams/{stream}/featurize"): "serve",
    ("POST", "/v1/streams/{stream}/predict"): "serve",
    ("GET", "/v1/streams/{stream}/trainset"): "export",
    ("GET", "/v1/queues/{queue}/labels"): "export",
    ("GET", "/v1/admin/unlock-requests/{request_id}/export"): "export",
    ("GET", "/v1/anonymizations/{a}/result"): "export",
    ("POST", "/v1/queues/{queue}/candidates"): "queue",
    ("GET", "/v1/queues/{queue}/next"): "queue",
    ("POST", "/v1/queues/{queue}/tasks/{task_id}/heartbeat"): "queue",
    ("POST", "/v1/queues/{queue}/tasks/{task_id}/skip"): "queue",
    ("POST", "/v1/queues/{queue}/tasks/{task_id}/label"): "queue",
    ("POST", "/v1/privacy/sampling-k-anonymity"): "compute",
    ("POST", "/v1/privacy/plan"): "compute",
    ("GET", "/v1/streams/{stream}/privacy"): "compute",
    ("GET", "/v1/streams/{stream}/label-rates"): "compute",
    ("GET", "/v1/queues/{queue}/privacy"): "compute",
    ("GET", "/v1/admin/audit/verify"): "compute",
    ("POST", "/v1/anonymizations"): "jobs",
    ("POST", "/v1/anonymizations/weights"): "jobs",
    ("POST", "/v1/anonymizations/weights/{session}"): "jobs",
    ("POST", "/v1/audits/reidentification"): "jobs",
    ("POST", "/v1/streams"): "manage",
    ("POST", "/v1/queues"): "manage",
    ("POST", "/v1/admin/keys"): "manage",
    ("POST", "/v1/streams/{stream}/models"): "manage",
    ("POST", "/v1/streams/{stream}/models/{model_id}/trained"): "manage",
    ("POST", "/v1/streams/{stream}/roll"): "manage",
    ("POST", "/v1/admin/unlock-requests"): "manage",
    ("POST", "/v1/admin/unlock-requests/{request_id}/approve"): "manage",
    ("POST", "/v1/admin/unlock-requests/{request_id}/close"): "manage",
}
LOOKUPS: frozenset[tuple[str, str]] = frozenset(
    {
        ("GET", "/v1/streams"),
        ("GET", "/v1/streams/{stream}"),
        ("GET", "/v1/streams/{stream}/windows"),
        ("GET", "/v1/streams/{stream}/tables"),
        ("GET", "/v1/streams/{stream}/quality"),
        ("GET", "/v1/streams/{stream}/models"),
        ("GET", "/v1/streams/{stream}/models/{model_id}"),
        ("GET", "/v1/streams/{stream}/events"),
        ("GET", "/v1/queues"),
        ("GET", "/v1/queues/{queue}"),
        ("GET", "/v1/queues/{queue}/stats"),
        ("GET", "/v1/anonymizations/{a}"),
        ("GET", "/v1/anonymizations/example-hierarchies"),
        ("GET", "/v1/audits/reidentification/{a}"),
        ("GET", "/v1/admin/audit"),
        ("GET", "/v1/admin/audit/recent"),
        ("GET", "/v1/admin/unlock-requests"),
        ("GET", "/v1/admin/unlock-requests/{request_id}"),
        ("GET", "/v1/whoami"),
    }
)
# (method, path) → (what is counted, the setting that caps it)
CAPS: dict[tuple[str, str], tuple[str, str]] = {
    ("POST", "/v1/streams"): ("streams", "max_streams_per_key"),
    ("POST", "/v1/queues"): ("queues", "max_queues_per_key"),
}

# (``service.api.openapi`` gives every error response the ErrorBody schema)
RESPONSE_429: dict[str, Any] = {
    "description": "TooManyRequests: this key's rate limit for the operation's class is "
    "reached; Retry-After says when to retry",
}


class QuotaExceeded(Forbidden):
    pass


def class_of(methods: set[str] | None, path: str) -> str | None:
    return next((CLASSES[m, path] for m in sorted(methods or ()) if (m, path) in CLASSES), None)


def cap_of(methods: set[str] | None, path: str) -> tuple[str, str] | None:
    return next((CAPS[m, path] for m in sorted(methods or ()) if (m, path) in CAPS), None)


# Classes limited in each API process rather than in Redis: featurize and predict are the
# latency-critical path (one row in about a millisecond), and a Redis round trip a request cost
# them a third more (`selectivity bench speed`: one-row featurize p50 1.51× → 1.98× a no-op).
# With N API processes a key may make N times the class's rate.
LOCAL_CLASSES = frozenset({"serve"})
LOCAL_BUCKETS_MAX = 100_000  # (key, class) pairs kept; all are dropped past it (full buckets)


def _take_local(ctx: AppContext, key_id: str, cls: str, interval: float, burst: int) -> int:
    """GCRA in process memory, as ``rate.lua`` in Redis: microseconds to wait, 0 when taken."""
    buckets = ctx.caches.rate_buckets
    now = time.monotonic()
    tat = max(buckets.get((key_id, cls), now), now)
    new_tat = tat + interval
    excess = new_tat - now - burst * interval
    if excess > 0:
        return max(1, math.ceil(excess * 1_000_000))
    if len(buckets) >= LOCAL_BUCKETS_MAX and (key_id, cls) not in buckets:
        buckets.clear()
    buckets[key_id, cls] = new_tat
    return 0


async def take(ctx: AppContext, principal: Principal, cls: str) -> None:
    """A token of ``principal``'s bucket for class ``cls``, or ``TooManyRequests``."""
    spec = ctx.settings.rate_limit_table.get(cls)
    if spec is None:
        return
    requests, seconds = spec
    if cls in LOCAL_CLASSES:
        wait_us = _take_local(ctx, principal.key_id, cls, seconds / requests, requests)
    else:
        wait_us = await ctx.stores.quotas.take(
            key_id=principal.key_id,
            cls=cls,
            interval_us=round(seconds * 1_000_000 / requests),
            burst=requests,
        )
    if wait_us > 0:
        retry = max(1, math.ceil(wait_us / 1_000_000))
        raise TooManyRequests(
            f"rate limit of this key for {cls!r} operations reached: {requests} per "
            f"{seconds:g} s (SELECTIVITY_RATE_LIMITS); retry after {retry} s",
            retry_after=retry,
        )


async def within_cap(
    ctx: AppContext,
    principal: Principal,
    cap: tuple[str, str],
    call: Callable[[], Awaitable[Response]],
) -> Response:
    """``call()`` (a creation) if ``principal`` has created fewer than its cap of that kind;
    the reserved slot is given back when the creation fails."""
    kind, setting = cap
    limit = int(getattr(ctx.settings, setting))
    store = ctx.stores.quotas
    ok, made = await store.reserve(key_id=principal.key_id, kind=kind, cap=limit)
    if not ok:
        raise QuotaExceeded(
            f"this key has created {made} {kind}, its limit "
            f"(SELECTIVITY_{setting.upper()} = {limit})"
        )
    try:
        response = await call()
    except BaseException:
        await store.release(key_id=principal.key_id, kind=kind)
        raise
    if response.status_code >= 400:
        await store.release(key_id=principal.key_id, kind=kind)
    return response

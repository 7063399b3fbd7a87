"""Durable work for the worker: jobs enqueued by name on SAQ queues in Redis (``workers.jobs``
holds their bodies). A job is keyed: enqueuing a key that is queued or running already is a
no-op, so callers may enqueue freely (the scheduler tick re-enqueues every unfinished
follow-up).

Two classes of job, each on its own queue, run by its own worker slots (docs/ARCHITECTURE.md,
"Jobs"), so that the service's own work never waits behind what users ask for:

- ``service``: the crons (roll scheduler, counting, seal and expiry, grants, annotation queue
  releases), one counting job per stream and the roll's follow-ups;
- ``user``: the jobs a user request enqueues (``USER_FUNCTIONS``: k-anonymised releases and
  re-identification audits). A request gets a user job only through ``Jobs.admission``: at
  most ``Settings.user_jobs_per_key`` of one key's and ``Settings.user_job_backlog`` of all
  keys' user jobs are queued or running at once, else 429 with ``Retry-After``."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis
from saq.queue.redis import RedisQueue

from service.config import Settings
from service.errors import TooManyRequests
from service.stores.keys import Keys

SERVICE = "service"
USER = "user"
CLASSES = (SERVICE, USER)
USER_FUNCTIONS = frozenset({"anonymize_run", "reidentification_run"})
"""The jobs a user request enqueues; every other job is the service's own."""
RESERVATION_SECONDS = 120
"""A request's place in the user-job backlog, between its admission and its job's enqueue,
lapses this long after its admission if the request never gives it back (a killed API)."""
RETRY_AFTER_SECONDS = 30
"""``Retry-After`` of a refused user job: about the run time of an inline k-anonymisation at
its size bound (BENCHMARKS.md, "Anonymization job size"), when a place may have freed."""


def job_class(function: str) -> str:
    return USER if function in USER_FUNCTIONS else SERVICE


def queue_name(keys: Keys, klass: str = SERVICE) -> str:
    """The SAQ queue of job class ``klass``: a hash tag, so that every key SAQ derives from it
    (its lists, sets and job records) lands in one slot of a Redis Cluster and its scripts run
    there. The service queue keeps the name it had when it was the only one."""
    if klass not in CLASSES:
        raise ValueError(f"job class must be one of {CLASSES}, got {klass=}")
    return f"{{{keys.prefix}:jobs}}" if klass == SERVICE else f"{{{keys.prefix}:jobs:{klass}}}"


def _owner_tag(owner: str) -> str:
    """``owner`` as it goes into a user job's key: a key id as it is, anything else hashed (a
    ':' would let one owner's prefix match another's)."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", owner):
        return owner
    return "h" + hashlib.sha256(owner.encode()).hexdigest()[:32]


# KEYS: the user queue's incomplete jobs (SAQ's zset of queued, scheduled and active job ids),
# the reservations (zset: member '<owner>:<token>', score its lapse in ms).
# ARGV: now (ms), the owner's job id prefix, the new reservation, its owner prefix, the
# per-key limit, the backlog, the reservation's lapse (ms).
# Returns 0 (admitted: the reservation is added), 1 (backlog full) or 2 (the key's share).
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local jobs = redis.call('ZRANGE', KEYS[1], 0, -1)
local held = redis.call('ZRANGE', KEYS[2], 0, -1)
if #jobs + #held >= tonumber(ARGV[6]) then return 1 end
local mine = 0
for _, id in ipairs(jobs) do
  if string.sub(id, 1, #ARGV[2]) == ARGV[2] then mine = mine + 1 end
end
for _, m in ipairs(held) do
  if string.sub(m, 1, #ARGV[4]) == ARGV[4] then mine = mine + 1 end
end
if mine >= tonumber(ARGV[5]) then return 2 end
redis.call('ZADD', KEYS[2], tonumber(ARGV[1]) + tonumber(ARGV[7]), ARGV[3])
return 0
"""


class Jobs:
    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.settings = settings
        self.queues = {k: RedisQueue(redis, name=queue_name(keys, k)) for k in CLASSES}
        self.queue = self.queues[SERVICE]
        self._admit: Any = None

    def _key(self, function: str, key: str, owner: str | None) -> tuple[RedisQueue, str]:
        """The queue of ``function`` and its job's key there: the queue's hash tag first (SAQ's
        abort key is per job key), then, for a user job, its owner's tag (so the admission
        counts a key's jobs from the queue itself)."""
        klass = job_class(function)
        queue = self.queues[klass]
        if klass == SERVICE:
            return queue, f"{queue.name}:{key}"
        if owner is None:
            raise ValueError(f"user job {function!r} needs its owner")
        return queue, f"{queue.name}:{_owner_tag(owner)}:{key}"

    async def enqueue(
        self,
        function: str,
        *,
        key: str,
        timeout: int = 600,
        retries: int = 3,
        owner: str | None = None,
        **kwargs: Any,
    ) -> bool:
        """Enqueue ``function(**kwargs)`` under ``key`` on its class's queue; False when that
        key is already queued or running. ``retries``: runs after a failure or a lost worker
        (a worker that died mid-job: ``workers.runner`` requeues its jobs within seconds).
        ``owner``: the key id a user job belongs to (required for one; call it inside
        ``admission``)."""
        queue, job_key = self._key(function, key, owner)
        job = await queue.enqueue(function, key=job_key, timeout=timeout, retries=retries, **kwargs)
        return job is not None

    @asynccontextmanager
    async def admission(self, *, owner: str) -> AsyncIterator[None]:
        """Room for one more user job of key ``owner``, held while the block runs (it enqueues
        the job, whose place in the queue then counts): TooManyRequests (429, ``Retry-After``)
        when the key already has ``user_jobs_per_key`` user jobs queued or running, or all keys
        together ``user_job_backlog``. Checked and taken in one script, so concurrent requests
        never overshoot."""
        queue = self.queues[USER]
        tag = _owner_tag(owner)
        member = f"{tag}:{secrets.token_hex(8)}"
        reservations = queue.namespace("admission")
        if self._admit is None:
            self._admit = queue.redis.register_script(_ADMIT)
        per_key, backlog = self.settings.user_jobs_per_key, self.settings.user_job_backlog
        refused = await self._admit(
            keys=[queue.namespace("incomplete"), reservations],
            args=[
                int(time.time() * 1000),
                queue.job_id(f"{queue.name}:{tag}:"),
                member,
                f"{tag}:",
                per_key,
                backlog,
                RESERVATION_SECONDS * 1000,
            ],
        )
        if refused == 1:
            raise TooManyRequests(
                f"the user-job backlog is full: {backlog} anonymisations and audits queued or "
                "running (SELECTIVITY_USER_JOB_BACKLOG); retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        if refused == 2:
            raise TooManyRequests(
                f"this key has {per_key} anonymisations or audits queued or running, its limit "
                "(SELECTIVITY_USER_JOBS_PER_KEY); retry when one has finished",
                retry_after=RETRY_AFTER_SECONDS,
            )
        try:
            yield
        finally:
            await queue.redis.zrem(reservations, member)

"""The workers: SAQ on the service's Redis, with all jobs and cron schedules declared here. One
SAQ worker per job class (``service.jobs``: the service's own jobs and crons, and user jobs),
each on its own queue with its own slots; ``selectivity worker [--queues ...]`` runs them
alone (production), embedded mode inside the API. Each recovers the lost jobs of its own queue.

Recovery from a killed worker. A worker killed with ``kill -9`` leaves its jobs ``active`` in
Redis, and SAQ (0.26) frees them only when its sweep finds them past their ``timeout`` (up to
an hour for the seal); until then a unique cron job's key stays taken and the cron does not
run. SAQ records on each job the id of the worker running it and keeps a ``worker_info`` key
per worker, renewed by the worker's upkeep loop. Here every worker renews that key each
``WORKER_BEAT_SECONDS`` with a ``WORKER_LOST_SECONDS`` lifetime, and each ``RECOVER_SECONDS``
reads the queue's active jobs: a job whose worker's key has lapsed has lost its worker. It is
requeued at once if it is a cron job (its cron would run it again anyway) or has retries
left, else finished ``aborted``. A job left ``queued`` in the active list (its worker died
between taking it and marking it active) is requeued once it has sat there unchanged that
long; SAQ's own sweep, which would abort such a job even under a live worker, leaves it
alone. Each change is one Lua script that first compares the whole job record (and that the
worker's key is still absent), so workers recovering at the same time, SAQ's sweep, a
re-enqueue of the same key or a late write of the old worker are never clobbered.

A live worker is not taken for lost while its event loop runs: its key lapses only if the
loop stalls for ``WORKER_LOST_SECONDS`` (jobs keep the loop free: heavy work goes to the
process pool), and a worker never recovers its own jobs. Jobs need no heartbeat of their
own, however long they run; ``timeout`` still bounds a job that hangs in a live worker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import math
import os
import signal
import time
from typing import Any, cast

from redis.asyncio import Redis
from saq import CronJob, Worker
from saq.job import Job, Status
from saq.queue.redis import RedisQueue
from saq.types import PartialTimersDict, WorkerInfo
from saq.utils import cancel_tasks, millis, now

from service.context import AppContext, make_process_pool
from service.core import logsafe
from service.jobs import CLASSES, SERVICE, USER, job_class, queue_name
from workers.jobs import FUNCTIONS

log = logging.getLogger("selectivity.worker")

WORKER_BEAT_SECONDS = 1
"""How often a worker renews its ``worker_info`` key (SAQ's default: 10)."""
WORKER_LOST_SECONDS = 4
"""A worker whose key was not renewed for this long is gone; its jobs are recovered."""
RECOVER_SECONDS = 1.0
"""How often each worker looks for the jobs of lost workers."""
SERVICE_CONCURRENCY = 4
"""Slots of the service's own jobs, a worker (user jobs have ``user_job_concurrency`` of their
own)."""
SHUTDOWN_GRACE_SECONDS = 5.0
"""How long a stopping worker waits for its running jobs before cancelling them."""
LOST_ERROR = "worker lost"
CRON_KEY = "cron:"
"""SAQ's key prefix of a unique cron job."""


def cron_key(queue: str, function: str) -> str:
    """The key a unique cron job of ``function`` gets on the queue named ``queue``: SAQ's
    ``cron:<function>`` with the queue's hash tag in it (``RecoveringQueue.enqueue``)."""
    return f"{CRON_KEY}{queue}:{function}"


# KEYS: the job, its worker's info key, active, incomplete, queued.
# ARGV: the record as read, the new record, 'retry' | 'finish', the finished record's ttl,
# '1' if the worker's key must still be absent, the new status (published as SAQ does).
_RECOVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('LREM', KEYS[3], 0, KEYS[1])
if ARGV[3] == 'retry' then
  redis.call('LREM', KEYS[5], 0, KEYS[1])
  redis.call('ZADD', KEYS[4], 0, KEYS[1])
  redis.call('RPUSH', KEYS[5], KEYS[1])
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('ZREM', KEYS[4], KEYS[1])
  local ttl = tonumber(ARGV[4])
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
  elseif ttl == 0 then
    redis.call('SET', KEYS[1], ARGV[2])
  else
    redis.call('DEL', KEYS[1])
  end
end
redis.call('PUBLISH', KEYS[1], ARGV[6])
return 1
"""

# KEYS: the sweep lock, active. ARGV: the lock's seconds. As SAQ's: one sweeper at a time.
_SWEEP = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
redis.call('SETEX', KEYS[1], ARGV[1], 1)
local found = {}
for i, v in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  found[i] = {v, redis.call('GET', v)}
end
return found
"""


class RecoveringQueue(RedisQueue):
    """SAQ's Redis queue, plus the recovery of the jobs of workers that died."""

    def __init__(self, redis: Redis, name: str, *, lost_seconds: int = WORKER_LOST_SECONDS) -> None:
        super().__init__(redis, name=name)
        self.lost_seconds = lost_seconds
        self._recover_script: Any = None
        self._sweep_script: Any = None
        # job id -> (record, first seen): jobs seen ``queued`` in the active list
        self._unclaimed: dict[bytes, tuple[bytes, float]] = {}

    async def enqueue(self, job_or_func: str | Job, **kwargs: Any) -> Job | None:
        """SAQ's enqueue, with the queue's hash tag put into the key of a unique cron job
        (SAQ keys it ``cron:<function>``): its abort key, ``saq:abort:<key>``, is one of the
        enqueue script's keys, and on a Redis Cluster they must all be in the queue's slot
        (without the tag no cron job ever ran on a cluster: ``EVALSHA - all keys must map to
        the same key slot``; found by ``bench scale``)."""
        key = kwargs.get("key")
        tagged = cron_key(self.name, "")
        if isinstance(key, str) and key.startswith(CRON_KEY) and not key.startswith(tagged):
            kwargs["key"] = cron_key(self.name, key[len(CRON_KEY) :])
        return await super().enqueue(job_or_func, **kwargs)

    async def sweep(self, lock: int = 60, abort: float = 5.0) -> list[str]:
        """SAQ's sweep (jobs past their ``timeout`` or ``heartbeat``, records gone), except for a
        job ``queued`` in the active list: a worker has just taken it and is about to mark it
        active, and SAQ's sweep would abort it under that worker (tobymao/saq#124, #277; it
        happens at a worker's start, when its first sweep meets its first dequeues).
        ``recover_lost`` requeues such a job if it stays so."""
        if self._sweep_script is None:
            self._sweep_script = self.redis.register_script(_SWEEP)
        found = await self._sweep_script(
            keys=[self.namespace("sweep"), self.namespace("active")], args=[lock]
        )
        swept: list[str] = []
        for job_id, raw in found:
            job = self.deserialize(raw)
            if job is None:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.lrem(self.namespace("active"), 0, job_id)
                    pipe.zrem(self.namespace("incomplete"), job_id)
                    await pipe.execute()
            elif job.status == Status.QUEUED or (job.status == Status.ACTIVE and not job.stuck):
                continue
            else:  # as SAQ: abort it, give its worker ``abort`` seconds, then settle it
                await self.abort(job, error=self.swept_error_message)
                with contextlib.suppress(asyncio.TimeoutError):
                    await job.refresh(abort)
                if job.retryable:
                    await self.retry(job, error=self.swept_error_message)
                else:
                    await self.finish(job, Status.ABORTED, error=self.swept_error_message)
            log.info("swept job %s", job_id)
            swept.append(job_id.decode())
        return swept

    async def write_worker_info(self, worker_id: str, info: WorkerInfo, ttl: int) -> None:
        """As SAQ's, with ``SET EX`` for the deprecated ``SETEX``: this key is the worker's
        liveness, it must not fail where warnings are errors."""
        current = now()
        key = self.worker_key(worker_id)
        stats = self.namespace("stats")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(key, json.dumps(info), ex=ttl)
            pipe.zremrangebyscore(stats, 0, current)
            pipe.zadd(stats, {key: current + millis(ttl)})
            pipe.expire(stats, ttl)
            await pipe.execute()

    def worker_key(self, worker_id: str) -> str:
        """The key SAQ's ``write_worker_info`` keeps while the worker lives."""
        return self.namespace(f"worker_info:{worker_id}")

    async def recover_lost(self, *, own: str | None = None) -> list[str]:
        """Requeue or finish the active jobs whose worker is gone (never ``own``'s); returns
        their keys."""
        ids: list[Any] = await self.redis.lrange(self.namespace("active"), 0, -1)
        raws: list[Any] = await self.redis.mget(ids) if ids else []
        found: list[tuple[bytes, bytes, Job]] = []
        for job_id, raw in zip(ids, raws, strict=True):
            with contextlib.suppress(Exception):  # a record SAQ itself could not read
                job = self.deserialize(raw)
                if job is not None:
                    found.append((job_id, raw, job))
        owners = sorted(
            {
                j.worker_id
                for _, _, j in found
                if j.status == Status.ACTIVE and j.worker_id and j.worker_id != own
            }
        )
        alive = await self.redis.mget([self.worker_key(w) for w in owners]) if owners else []
        lost = {w for w, info in zip(owners, alive, strict=True) if info is None}
        clock = time.monotonic()
        unclaimed: dict[bytes, tuple[bytes, float]] = {}
        recovered: list[str] = []
        for job_id, raw, job in found:
            if job.status == Status.ACTIVE and job.worker_id in lost:
                if await self._recover(job_id, raw, job, worker=job.worker_id):
                    recovered.append(job.key)
            elif job.status == Status.QUEUED:
                seen = self._unclaimed.get(job_id)
                since = seen[1] if seen is not None and seen[0] == raw else clock
                if clock - since < self.lost_seconds:
                    unclaimed[job_id] = (raw, since)
                elif await self._recover(job_id, raw, job, worker=None):
                    recovered.append(job.key)
        self._unclaimed = unclaimed
        return recovered

    async def _recover(self, job_id: bytes, raw: bytes, job: Job, *, worker: str | None) -> bool:
        new: bytes | str = raw
        if job.status == Status.QUEUED:  # never marked active: as it was
            mode = "retry"
        elif job.retryable or job.key.startswith(CRON_KEY):  # as SAQ's ``retry``
            mode = "retry"
            job.status, job.error = Status.QUEUED, LOST_ERROR
            job.completed = job.started = 0
            job.progress = 0.0
            job.touched = now()
            new = self.serialize(job)
        else:
            mode = "finish"
            job.status, job.error, job.completed = Status.ABORTED, LOST_ERROR, now()
            new = self.serialize(job)
        if self._recover_script is None:
            self._recover_script = self.redis.register_script(_RECOVER)
        done = await self._recover_script(
            keys=[
                job_id,
                self.worker_key(worker) if worker else job_id,
                self.namespace("active"),
                self.namespace("incomplete"),
                self.namespace("queued"),
            ],
            args=[raw, new, mode, job.ttl, "1" if worker else "0", job.status.value],
        )
        if done:
            if mode == "retry":
                self.retried += 1
            else:
                self.aborted += 1
            log.warning(
                "job %s %s: its worker %s is gone",
                job.key,
                "requeued" if mode == "retry" else "aborted",
                worker or "(unknown, never marked it active)",
            )
        return bool(done)


class RecoveringWorker(Worker[Any]):
    """SAQ's worker that keeps its ``worker_info`` key short-lived and recovers the jobs of
    lost workers (see the module's docstring)."""

    def __init__(
        self,
        queue: RecoveringQueue,
        functions: Any,
        *,
        shutdown_grace: float = SHUTDOWN_GRACE_SECONDS,
        **kwargs: Any,
    ) -> None:
        timers = {"worker_info": WORKER_BEAT_SECONDS, **kwargs.pop("timers", {})}
        super().__init__(queue, functions, timers=cast(PartialTimersDict, timers), **kwargs)
        self.recovering = queue
        self.shutdown_grace = shutdown_grace

    async def worker_info(self, ttl: int = 60) -> WorkerInfo:
        return await super().worker_info(ttl=self.recovering.lost_seconds)

    async def upkeep(self) -> list[asyncio.Task[None]]:
        await self.worker_info()  # alive before the first job is marked with this id
        tasks = await super().upkeep()
        tasks.append(asyncio.create_task(self._recover_forever()))
        return tasks

    async def stop(self) -> None:
        """Stop at once when idle: SAQ's ``stop`` waits its grace period (0 by default) for
        every task, and its upkeep loops and idle dequeues never end by themselves, so it always
        "did not finish" and cancels them. Here running jobs get ``shutdown_grace`` seconds to
        finish (none for user jobs, which start over when retried); then the upkeep loops and
        the waiting dequeues are cancelled, and SAQ's ``stop`` shuts the thread pool down and
        runs the shutdown hooks."""
        self.event.set()
        running = [c["task"] for c in self.job_task_contexts.values() if not c["task"].done()]
        if running and self.shutdown_grace > 0:
            await asyncio.wait(running, timeout=self.shutdown_grace)
            processing = [t for t in self.tasks if t.get_name() == "process"]
            if processing:  # let a finished job's process task record it
                await asyncio.wait(processing, timeout=0.5)
        tasks = list(self.tasks)
        self.tasks.clear()
        await cancel_tasks(tasks, timeout=1.0)
        await super().stop()

    async def _recover_forever(self) -> None:
        while not self.event.is_set():
            try:
                await self.recovering.recover_lost(own=self.id)
            except Exception:
                log.exception("looking for the jobs of lost workers failed")
            await asyncio.sleep(RECOVER_SECONDS)


def cron_every(seconds: float) -> str:
    """A six-field (seconds) cron expression firing every ``seconds`` (rounded, 1..59)."""
    s = min(59, max(1, math.ceil(seconds)))
    return f"* * * * * */{s}"


class JobFailed(logsafe.SafeMessageError):
    """A job's exception as SAQ records it (the job's ``error`` in Redis, its "Error
    processing job" log line): the original's type and frames (``logsafe.format_exception``),
    never its message, which may hold a row or a SQL parameter."""


def recorded_safely(fn: Any) -> Any:
    """The job function ``fn``, raising ``JobFailed`` in place of any exception (SAQ stores
    ``traceback.format_exc()`` in the job's record)."""

    @functools.wraps(fn)
    async def run(ctx: dict[str, Any], **kwargs: Any) -> Any:
        try:
            return await fn(ctx, **kwargs)
        except Exception as exc:
            raise JobFailed(logsafe.format_exception(exc)) from None

    return run


def make_queue(app: AppContext, klass: str = SERVICE) -> RecoveringQueue:
    return RecoveringQueue(app.redis, name=queue_name(app.keys, klass))


def _crons(app: AppContext, safe: dict[str, Any]) -> list[CronJob]:
    s = app.settings
    return [
        CronJob(
            safe["windows_tick"], cron=cron_every(s.scheduler_seconds), unique=True, timeout=600
        ),
        CronJob(safe["ingest_count"], cron=cron_every(s.count_seconds), unique=True, timeout=600),
        CronJob(
            safe["coldstore_seal"], cron=cron_every(s.scheduler_seconds), unique=True, timeout=3600
        ),
        CronJob(safe["unlock_expire_grants"], cron=cron_every(10), unique=True, timeout=60),
        CronJob(
            safe["queues_release"], cron=cron_every(s.scheduler_seconds), unique=True, timeout=600
        ),
    ]


def make_worker(app: AppContext, klass: str = SERVICE) -> RecoveringWorker:
    """The worker of job class ``klass`` (``service.jobs``): the service's own jobs and every
    cron on ``SERVICE_CONCURRENCY`` slots, or the user jobs on ``user_job_concurrency``."""
    queue = make_queue(app, klass)
    logsafe.install("saq", "selectivity")  # SAQ's own records too (promise 1)
    # by SAQ's name for it
    safe = {f.__qualname__: recorded_safely(f) for f in FUNCTIONS if job_class(f.__name__) == klass}

    async def startup(ctx: dict[str, Any]) -> None:
        ctx["app"] = app

    if klass == SERVICE:
        concurrency, crons, grace = SERVICE_CONCURRENCY, _crons(app, safe), SHUTDOWN_GRACE_SECONDS
    else:  # a user job (an audit, an anonymisation) is retried from its start: cancelled at once
        concurrency, crons, grace = app.settings.user_job_concurrency, [], 0.0
    return RecoveringWorker(
        queue,
        functions=list(safe.values()),
        concurrency=concurrency,
        startup=startup,
        cron_jobs=crons,
        shutdown_grace=grace,
    )


def parse_classes(value: str) -> tuple[str, ...]:
    """``--queues``: comma-separated job classes, each once (``service``, ``user``)."""
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in CLASSES]
    if not names or unknown:
        raise ValueError(
            f"queues must be a comma-separated list of {', '.join(CLASSES)}, got {value!r}"
        )
    return names


def _room_for_user_jobs(app: AppContext, classes: tuple[str, ...]) -> None:
    """The loop's default thread pool (``asyncio.to_thread``: a user job's computation, and
    the service's own Redis-side and numpy steps) gets one thread more per user-job slot than
    Python's default, so user jobs never take the threads the service's jobs (and, embedded,
    its requests) would have had."""
    if USER not in classes:
        return
    threads = min(32, (os.cpu_count() or 1) + 4) + app.settings.user_job_concurrency
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="asyncio")
    )


async def run_in_process(
    app: AppContext, *, handle_signals: bool = False, classes: tuple[str, ...] = CLASSES
) -> None:
    """Run the workers of ``classes`` (each its queue and slots) until cancelled, or, with
    ``handle_signals``, until SIGINT or SIGTERM. Inside the API process, uvicorn owns those
    signals (SAQ would otherwise take them over and the server would never shut down); SAQ's
    own handlers are off in any case, as two workers in one process would replace each
    other's."""
    workers = [make_worker(app, klass) for klass in classes]
    _room_for_user_jobs(app, classes)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = [signal.SIGINT, signal.SIGTERM] if handle_signals else []
    for w in workers:
        w.SIGNALS = []
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    running = [asyncio.create_task(w.start(), name=f"worker-{w.queue.name}") for w in workers]
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([*running, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
        await asyncio.gather(*running, return_exceptions=True)
        for signum in signals:
            loop.remove_signal_handler(signum)


async def run_standalone(app: AppContext, classes: tuple[str, ...] = CLASSES) -> None:
    app.executor = make_process_pool()
    log.info("worker started: %s jobs", " and ".join(classes))
    with contextlib.suppress(asyncio.CancelledError):
        await run_in_process(app, handle_signals=True, classes=classes)

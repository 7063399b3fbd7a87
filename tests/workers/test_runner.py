"""A worker killed with ``kill -9`` leaves its SAQ jobs ``active`` in Redis; the jobs of a lost
worker are recovered within seconds (requeued, or finished so their cron runs again), and the
jobs of a live worker never are, however long they run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis
from saq.job import Status
from saq.utils import now

from service.config import Settings
from service.db.migrate import upgrade
from tests.conftest import Backend, unique
from tests.helpers import cancel_and_wait
from workers.runner import (
    LOST_ERROR,
    WORKER_LOST_SECONDS,
    RecoveringQueue,
    RecoveringWorker,
    cron_key,
)

# SAQ (0.26) finishes and aborts jobs with redis-py's deprecated SETEX
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

CRONS = ("coldstore_seal", "ingest_count", "windows_tick")
RESUME_SECONDS = 10.0

# ``selectivity worker``, whose jobs named in SEL_TEST_HANG hang (stay ``active``) until killed.
CHILD = r"""
import asyncio, functools, os
import workers.jobs as jobs

def hang(fn):
    @functools.wraps(fn)  # keeps __qualname__: SAQ's function name and cron key
    async def hung(ctx, **kwargs):
        await asyncio.sleep(3600)
    return hung

for name in filter(None, os.environ.get("SEL_TEST_HANG", "").split(",")):
    fn = getattr(jobs, name)
    setattr(jobs, name, hang(fn))
    if fn in jobs.FUNCTIONS:
        jobs.FUNCTIONS[jobs.FUNCTIONS.index(fn)] = getattr(jobs, name)

from service.cli.entry import main
main(["worker"])
"""


def _redis_url(backend: Backend) -> str:
    if backend.embedded is not None:
        return f"unix://{backend.embedded.socket}"
    assert backend.settings.redis_url
    return backend.settings.redis_url


def _drop(r: redis.Redis, queue: str) -> None:
    for pattern in (f"saq:{queue}:*", f"saq:job:{queue}:*"):
        for k in r.scan_iter(match=pattern, count=1000):
            r.delete(k)


class _Workers:
    """``selectivity worker`` subprocesses on one Redis prefix and one data dir."""

    def __init__(self, tmp_path: Path, backend: Backend) -> None:
        self.prefix = unique("selw").replace("-", "")
        self.queue = f"{{{self.prefix}:jobs}}"  # service.jobs.queue_name
        data = tmp_path / "data"
        data.mkdir()
        settings = Settings(data_dir=data)
        upgrade(settings.resolved_database_url)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
        self.env |= {
            "SELECTIVITY_DATA_DIR": str(data),
            "SELECTIVITY_REDIS_URL": _redis_url(backend),
            "SELECTIVITY_REDIS_PREFIX": self.prefix,
            "SELECTIVITY_SCHEDULER_SECONDS": "1",
            "SELECTIVITY_COUNT_SECONDS": "1",
        }
        self.redis = redis.Redis.from_url(_redis_url(backend))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, *, hang: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        log = self.env["SELECTIVITY_DATA_DIR"] + f"/worker{len(self.procs)}.log"
        self.logs.append(Path(log))
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD],
                env={**self.env, "SEL_TEST_HANG": ",".join(hang)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def status(self, function: str) -> str | None:
        """The status of the cron job of ``function``."""
        raw = self.redis.get(f"saq:job:{self.queue}:{cron_key(self.queue, function)}")
        return json.loads(raw)["status"] if raw else None

    def alive(self) -> list[bytes]:
        """The ``worker_info`` keys of the live workers."""
        return list(self.redis.scan_iter(match=f"saq:{self.queue}:worker_info:*"))

    def output(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in self.logs if p.exists())

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        _drop(self.redis, self.queue)
        self.redis.close()


def _wait(what: str, ok: Callable[[], bool], workers: _Workers, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        assert all(p.poll() is None for p in workers.procs), workers.output()
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s\n{workers.output()}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("other", ["restarted", "running"])
def test_a_worker_killed_mid_job_has_its_crons_resumed_within_seconds(
    workers: _Workers, other: str
) -> None:
    """The dead worker's seal, count and roll scheduler complete within RESUME_SECONDS of the
    restart of a worker (``restarted``), or of the kill when another worker shares the queue
    (``running``)."""
    first = workers.start(hang=CRONS)
    _wait("crons active", lambda: all(workers.status(f) == "active" for f in CRONS), workers)
    if other == "running":
        second = workers.start()
        _wait("second worker up", lambda: len(workers.alive()) == 2, workers)
    pubsub = workers.redis.pubsub()
    pubsub.psubscribe(f"saq:job:{workers.queue}:{cron_key(workers.queue, '*')}")
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    killed = time.monotonic()
    # what the dead worker leaves: its cron jobs marked active, their unique keys taken
    active = set(workers.redis.lrange(f"saq:{workers.queue}:active", 0, -1))
    for f in CRONS:
        assert workers.status(f) == "active"
        assert f"saq:job:{workers.queue}:{cron_key(workers.queue, f)}".encode() in active
    if other == "restarted":
        second = workers.start()
    started = time.monotonic()
    done: dict[str, float] = {}
    try:
        while len(done) < len(CRONS) and time.monotonic() - started < 3 * RESUME_SECONDS:
            msg = pubsub.get_message(timeout=0.2)
            if msg is None or msg["type"] != "pmessage" or msg["data"] != b"complete":
                continue
            function = msg["channel"].decode().rsplit(":", 1)[-1]
            if function in CRONS:
                done.setdefault(function, time.monotonic() - started)
        assert second.poll() is None, workers.output()
    finally:
        pubsub.close()
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    report = ", ".join(f"{f} {done.get(f, float('inf')):.1f} s" for f in CRONS)
    since = "its restart" if other == "restarted" else "the kill"
    print(f"\nnext completed run after {since} ({started - killed:.1f} s after the kill): {report}")
    assert set(done) == set(CRONS), f"{report}\n{workers.output()}"
    assert max(done.values()) < RESUME_SECONDS, f"{report}\n{workers.output()}"
    assert "is gone" in workers.logs[1].read_text()


# --- the recovery itself, in process, on crafted queue states ---------------------------------


@pytest.fixture
async def queue(backend: Backend) -> AsyncIterator[RecoveringQueue]:
    client = backend.embedded.client() if backend.embedded else Redis.from_url(_redis_url(backend))
    q = RecoveringQueue(client, name=unique(f"{backend.settings.redis_prefix}:q"))
    yield q
    for pattern in (f"saq:{q.name}:*", f"saq:job:{q.name}:*"):
        async for k in client.scan_iter(match=pattern, count=1000):
            await client.delete(k)
    await client.aclose()


async def _run(q: RecoveringQueue, key: str, *, worker: str, retries: int = 1) -> bytes:
    """Enqueue ``key``, take it and mark it active as ``worker`` would; returns its id."""
    await q.enqueue("f", key=key, retries=retries, timeout=3600)
    job = await q.dequeue()
    assert job is not None and job.key == key
    job.started, job.attempts, job.worker_id = now(), 1, worker
    await job.update(status=Status.ACTIVE)
    return job.id.encode()


async def _state(q: RecoveringQueue, job_id: bytes) -> tuple[bool, bool, bool]:
    """(in active, in incomplete, in queued)"""
    r = q.redis
    return (
        job_id in await r.lrange(q.namespace("active"), 0, -1),
        await r.zscore(q.namespace("incomplete"), job_id) is not None,
        job_id in await r.lrange(q.namespace("queued"), 0, -1),
    )


async def test_the_job_of_a_dead_worker_is_finished_and_its_key_freed(
    queue: RecoveringQueue,
) -> None:
    job_id = await _run(queue, "k", worker="dead")
    assert await queue.enqueue("f", key="k") is None  # the key is taken
    assert await queue.recover_lost(own="me") == ["k"]
    job = await queue.job("k")
    assert job is not None and job.status == Status.ABORTED and job.error == LOST_ERROR
    assert await _state(queue, job_id) == (False, False, False)
    assert await queue.enqueue("f", key="k") is not None  # it can run again
    assert await queue.recover_lost(own="me") == []


@pytest.mark.parametrize("key, retries", [("k", 3), ("cron:f", 1)])
async def test_the_job_of_a_dead_worker_with_retries_left_or_a_cron_is_requeued(
    queue: RecoveringQueue, key: str, retries: int
) -> None:
    if key == "cron:f":
        key = cron_key(queue.name, "f")  # what the queue makes of SAQ's cron key
    job_id = await _run(queue, key, worker="dead", retries=retries)
    assert await queue.enqueue("f", key=key) is None  # the key is taken
    assert await queue.recover_lost(own="me") == [key]
    job = await queue.job(key)
    assert job is not None and job.status == Status.QUEUED and job.attempts == 1
    assert job.error == LOST_ERROR
    assert await _state(queue, job_id) == (False, True, True)
    again = await queue.dequeue()
    assert again is not None and again.key == key
    assert await queue.recover_lost(own="me") == []


async def test_a_cron_key_carries_the_queue_hash_tag(queue: RecoveringQueue) -> None:
    """SAQ keys a unique cron job ``cron:<function>``; its abort key must share the queue's
    Redis Cluster slot, so the queue puts its tag in the key (other keys are left as given)."""
    job = await queue.enqueue("f", key="cron:f")
    assert job is not None and job.key == cron_key(queue.name, "f")
    assert job.abort_id == f"saq:abort:cron:{queue.name}:f"
    assert await queue.enqueue("f", key="cron:f") is None  # still unique
    other = await queue.enqueue("g", key="plain")
    assert other is not None and other.key == "plain"


async def test_the_jobs_of_live_workers_and_its_own_are_left_alone(
    queue: RecoveringQueue,
) -> None:
    await queue.redis.set(queue.worker_key("live"), "{}", ex=60)
    live = await _run(queue, "a", worker="live")
    own = await _run(queue, "b", worker="me")
    assert await queue.recover_lost(own="me") == []
    for key, job_id in (("a", live), ("b", own)):
        job = await queue.job(key)
        assert job is not None and job.status == Status.ACTIVE
        assert await _state(queue, job_id) == (True, True, False)


async def test_a_record_changed_since_it_was_read_is_not_touched(
    queue: RecoveringQueue,
) -> None:
    job_id = await _run(queue, "k", worker="dead")
    stale_raw = await queue.redis.get(job_id)
    stale = queue.deserialize(stale_raw)
    assert stale is not None
    current = await queue.job("k")
    assert current is not None
    await current.update(progress=0.5)  # e.g. the key already runs again elsewhere
    assert not await queue._recover(job_id, stale_raw, stale, worker="dead")
    job = await queue.job("k")
    assert job is not None and job.status == Status.ACTIVE and job.progress == 0.5
    # nor is a job whose worker's key is back
    await queue.redis.set(queue.worker_key("dead"), "{}", ex=60)
    fresh_raw = await queue.redis.get(job_id)
    assert not await queue._recover(job_id, fresh_raw, queue.deserialize(fresh_raw), worker="dead")


async def test_a_job_taken_but_never_marked_active_is_requeued_after_a_while(
    queue: RecoveringQueue,
) -> None:
    queue.lost_seconds = 0.3  # type: ignore[assignment]  # counted from the sweep that first saw it
    await queue.enqueue("f", key="k")
    taken = await queue.dequeue()  # and the worker dies before marking it active
    assert taken is not None and taken.status == Status.QUEUED
    assert await queue.recover_lost(own="me") == []  # it may be about to be marked
    await asyncio.sleep(0.4)
    assert await queue.recover_lost(own="me") == ["k"]
    assert await _state(queue, taken.id.encode()) == (False, True, True)


async def test_the_sweep_leaves_a_job_being_taken_and_settles_a_job_past_its_timeout(
    queue: RecoveringQueue,
) -> None:
    await queue.enqueue("f", key="taken")
    taken = await queue.dequeue()  # a worker is about to mark it active
    assert taken is not None
    late = await _run(queue, "late", worker="live")
    record = await queue.job("late")
    assert record is not None
    await record.update(timeout=1, started=now() - 5000)
    assert await queue.sweep(lock=1, abort=0.1) == [late.decode()]
    job = await queue.job("late")
    assert job is not None and job.status == Status.ABORTED and job.error == "swept"
    job = await queue.job("taken")
    assert job is not None and job.status == Status.QUEUED
    assert await _state(queue, taken.id.encode()) == (True, True, False)


@pytest.mark.slow
async def test_a_long_job_of_a_live_worker_is_never_taken_over(queue: RecoveringQueue) -> None:
    """Two workers share the queue; a job running longer than WORKER_LOST_SECONDS on one of
    them completes there, once, while the other looks for lost jobs every second."""
    runs: list[str] = []

    async def long(ctx: dict[str, object]) -> str:
        runs.append(str(ctx["worker"].id))  # type: ignore[attr-defined]
        await asyncio.sleep(WORKER_LOST_SECONDS + 2)
        return "done"

    busy = RecoveringWorker(queue, [("long", long)], concurrency=1)
    idle = RecoveringWorker(queue, [("long", long)], concurrency=1)
    busy.SIGNALS = idle.SIGNALS = []
    job = await queue.enqueue("long", key="long", timeout=60)
    assert job is not None
    first = asyncio.create_task(busy.start())
    for _ in range(50):
        await job.refresh()
        if job.status == Status.ACTIVE:
            break
        await asyncio.sleep(0.1)
    second = asyncio.create_task(idle.start())
    try:
        for _ in range(10 * (WORKER_LOST_SECONDS + 10)):
            await job.refresh()
            if job.status not in (Status.QUEUED, Status.ACTIVE):
                break
            await asyncio.sleep(0.1)
        assert job.status == Status.COMPLETE and job.result == "done"
        assert runs == [busy.id] and job.error is None
    finally:
        for w, t in ((busy, first), (idle, second)):
            await w.stop()
            await cancel_and_wait(t)

"""User jobs (k-anonymised releases, re-identification audits) have their own queue and worker
slots: a flood of them never delays the service's own crons (a short-window stream still rolls
and seals on schedule), and a request beyond the per-key share or the backlog is a 429 with
Retry-After."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from service import resources
from service.coldstore import service as coldstore
from service.config import Settings
from service.db.models import Stream, Window
from service.errors import TooManyRequests
from service.jobs import SERVICE, USER, USER_FUNCTIONS, Jobs, job_class, queue_name
from service.stores.keys import Keys
from tests.conftest import Api, Backend, in_process_api, unique
from tests.workers.test_runner import _drop, _Workers
from workers.jobs import FUNCTIONS
from workers.runner import parse_classes

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

URL = "/v1/anonymizations"
FLOOD = 12

# ``selectivity worker [SEL_TEST_ARGS]`` whose user jobs hang until killed (as a heavy job)
CHILD = r"""
import asyncio, functools, os
import workers.jobs as jobs

def hang(fn):
    @functools.wraps(fn)
    async def hung(ctx, **kwargs):
        await asyncio.sleep(3600)
    return hung

for name in ("anonymize_run", "reidentification_run"):
    fn = getattr(jobs, name)
    jobs.FUNCTIONS[jobs.FUNCTIONS.index(fn)] = hang(fn)

from service.cli.entry import main
main(["worker", *filter(None, os.environ.get("SEL_TEST_ARGS", "").split(" "))])
"""


def test_every_job_has_a_class_and_user_jobs_are_those_a_request_enqueues() -> None:
    assert {f.__name__ for f in FUNCTIONS if job_class(f.__name__) == USER} == USER_FUNCTIONS
    assert job_class("windows_tick") == job_class("count_stream") == SERVICE
    assert job_class("selection_round") == job_class("coldstore_seal") == SERVICE
    keys = Keys("p")
    assert queue_name(keys) == "{p:jobs}"  # the service queue keeps its name
    assert queue_name(keys, USER) == "{p:jobs:user}"
    assert parse_classes("user") == (USER,)
    assert parse_classes(" service , user,service") == (SERVICE, USER)
    for bad in ("", "users", "service,cron"):
        with pytest.raises(ValueError, match="queues must be"):
            parse_classes(bad)


def _jobs(backend: Backend, **limits: int) -> Jobs:
    redis = (
        backend.embedded.client()
        if backend.embedded
        else Redis.from_url(backend.settings.redis_url or "")
    )
    settings = backend.settings.model_copy(update=limits)
    return Jobs(redis, Keys(unique("seljc").replace("-", "")), settings)


async def _close(jobs: Jobs) -> None:
    for q in jobs.queues.values():
        for pattern in (f"saq:{q.name}:*", f"saq:job:{q.name}:*"):
            async for k in q.redis.scan_iter(match=pattern, count=1000):
                await q.redis.delete(k)
    await jobs.queue.redis.aclose()


async def test_user_jobs_go_to_their_own_queue_with_their_owner(backend: Backend) -> None:
    jobs = _jobs(backend)
    try:
        assert await jobs.enqueue("count_stream", key="count:s", stream="s")
        async with jobs.admission(owner="k1"):
            assert await jobs.enqueue("anonymize_run", key="anonymize:a", owner="k1", id="a")
        with pytest.raises(ValueError, match="needs its owner"):
            await jobs.enqueue("reidentification_run", key="reidentification:b", id="b")
        service, user = jobs.queues[SERVICE], jobs.queues[USER]
        assert await service.count("queued") == 1 and await user.count("queued") == 1
        job = await user.job(f"{user.name}:k1:anonymize:a")
        assert job is not None and job.function == "anonymize_run" and job.kwargs == {"id": "a"}
    finally:
        await _close(jobs)


async def test_admission_holds_a_key_to_its_share_and_everyone_to_the_backlog(
    backend: Backend,
) -> None:
    jobs = _jobs(backend, user_jobs_per_key=2, user_job_backlog=3)
    try:

        async def submit(owner: str, n: int) -> bool:
            try:
                async with jobs.admission(owner=owner):
                    await asyncio.sleep(0.01)  # as a request storing its rows
                    await jobs.enqueue("anonymize_run", key=f"a:{n}", owner=owner, id=str(n))
            except TooManyRequests as exc:
                assert exc.retry_after > 0 and exc.headers == {"Retry-After": str(exc.retry_after)}
                assert "SELECTIVITY_USER_JOBS_PER_KEY" in exc.detail, exc.detail
                return False
            return True

        # concurrent requests of one key never overshoot its share
        assert sum(await asyncio.gather(*(submit("k1", n) for n in range(10)))) == 2
        assert await submit("k2", 20)  # the backlog's last place
        with pytest.raises(TooManyRequests, match="SELECTIVITY_USER_JOB_BACKLOG"):
            async with jobs.admission(owner="k3"):
                raise AssertionError("admitted past the backlog")  # pragma: no cover
        # a request that fails before it enqueues gives its place back
        user = jobs.queues[USER]
        await user.redis.zrem(user.namespace("incomplete"), user.job_id(f"{user.name}:k2:a:20"))
        with pytest.raises(RuntimeError):
            async with jobs.admission(owner="k2"):
                raise RuntimeError("refused")
        assert await submit("k2", 21)
        # a finished job frees its place
        job = await user.dequeue()
        assert job is not None
        await user.finish(job, job.status.COMPLETE)
        assert await submit("k4", 22)
    finally:
        await _close(jobs)


async def test_a_full_share_or_backlog_is_a_429_with_retry_after(api: Api) -> None:
    rows = [{"age": a, "sex": "f" if a % 2 else "m"} for a in range(20)]
    body = {
        "source": {"rows": rows},
        "k": 2,
        "quasi_identifiers": [
            {"name": "age", "kind": "range"},
            {"name": "sex", "kind": "hierarchy"},
        ],
    }
    api.ctx.jobs.settings = api.ctx.settings.model_copy(update={"user_jobs_per_key": 1})
    r = await api.post(URL, role="analyst", json=body)
    assert r.status_code == 202, r.text
    r = await api.post(URL, role="analyst", json=body)
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) > 0
    assert r.json()["error"] == "TooManyRequests"
    assert "SELECTIVITY_USER_JOBS_PER_KEY" in r.json()["detail"]
    audit = {
        "source": {"rows": [[0.0, 1.0], [1.0, 0.0]], "labels": ["1", "0"]},
        "positive_label": "1",
        "release": {"kind": "class_mean", "epsilon": 1.0, "value_range": [-1, 1]},
    }
    r = await api.post("/v1/audits/reidentification", role="analyst", json=audit)
    assert r.status_code == 429, r.text  # the same share: anonymisations and audits together
    user = api.ctx.jobs.queues[USER]
    queued = int(await user.redis.zcard(user.namespace("incomplete")))
    api.ctx.jobs.settings = api.ctx.settings.model_copy(update={"user_job_backlog": queued})
    r = await api.post(URL, role="admin", json=body)  # another key: the backlog is full
    assert r.status_code == 429, r.text
    assert "SELECTIVITY_USER_JOB_BACKLOG" in r.json()["detail"]
    assert int(r.headers["Retry-After"]) > 0


def _start(workers: _Workers, args: str = "") -> subprocess.Popen[bytes]:
    log = workers.env["SELECTIVITY_DATA_DIR"] + f"/worker{len(workers.procs)}.log"
    workers.logs.append(Path(log))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env={**workers.env, "SEL_TEST_ARGS": args},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    workers.procs.append(proc)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("apart", [False, True], ids=["one-worker", "service-and-user-workers"])
async def test_a_flood_of_user_jobs_never_delays_rolls_and_seals(
    workers: _Workers, apart: bool
) -> None:
    """FLOOD user jobs that never end (more than the worker's slots, user and service ones
    together) are queued; a stream of 2-second windows still rolls every window and its closed
    windows are sealed, by a worker running both classes or by one worker per class."""
    settings = Settings(
        data_dir=Path(workers.env["SELECTIVITY_DATA_DIR"]),
        redis_url=workers.env["SELECTIVITY_REDIS_URL"],
        redis_prefix=workers.prefix,
        embedded_worker=False,
    )
    ctx = await resources.build(settings)
    user = ctx.jobs.queues[USER]
    name = unique("flood")
    try:
        await coldstore.init_key(sessionmaker=ctx.sessionmaker, shares=2, threshold=2, actor="test")
        for n in range(FLOOD):
            assert await ctx.jobs.enqueue(
                "anonymize_run", key=f"anonymize:{n}", owner=f"k{n}", id=f"an_{n}"
            )
        body = {
            "name": name,
            "features": [{"name": "a"}],
            "labels": ["0", "1"],
            "window_seconds": 2,
            "hot_windows": 1,
            "sketch": {"width": 64, "depth": 2},
            "privacy": {"mechanism": "none"},
        }
        rows = [{"features": {"a": f"v{i % 3}"}, "label": str(i % 2)} for i in range(50)]
        async with in_process_api(ctx, roles=("admin", "producer")) as api:
            r = await api.post("/v1/streams", json=body)
            assert r.status_code == 201, r.text
            r = await api.post(
                f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
            )
            assert r.status_code == 202, r.text
        if apart:
            _start(workers, "--queues service")
            _start(workers, "--queues user")
        else:
            _start(workers)

        async def state() -> tuple[int, int]:
            """(the stream's open epoch, its sealed windows)"""
            async with ctx.sessionmaker() as session:
                sid = (
                    await session.execute(select(Stream.id).where(Stream.name == name))
                ).scalar_one()
                wins = (
                    (await session.execute(select(Window).where(Window.stream_id == sid)))
                    .scalars()
                    .all()
                )
            return max(w.epoch for w in wins), sum(w.cold_sealed_at is not None for w in wins)

        started = time.monotonic()
        epoch, sealed = await state()
        while epoch < 4 or sealed < 2:
            assert all(p.poll() is None for p in workers.procs), workers.output()
            assert time.monotonic() - started < 40, (
                f"epoch {epoch}, {sealed} sealed after 40 s\n{workers.output()}"
            )
            await asyncio.sleep(0.2)
            epoch, sealed = await state()
        took = time.monotonic() - started
        # the flood is real: the user slots are all busy, the rest waits
        active = await user.count("active")
        assert active == settings.user_job_concurrency, active
        assert await user.count("queued") == FLOOD - active
        print(f"\nepoch {epoch}, {sealed} windows sealed {took:.1f} s after the worker's start")
    finally:
        for proc in workers.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers.procs:
            proc.wait(timeout=30)
        _drop(workers.redis, queue_name(Keys(workers.prefix), USER))
        await resources.close(ctx)

"""A re-identification audit interrupted mid-way resumes from its checkpoints: the job cancelled
(the worker stopping) or its worker killed with ``kill -9`` (``workers.runner`` requeues the
job), the next run keeps the draws that finished, re-trains the unfinished one on its stored
release, draws no noise twice, shows a progress that never goes back, and ends ``done`` with the
same kind of result as an uninterrupted run. A failed audit keeps the progress it reached and
says why."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis

from service.audits import service as audits_service
from service.cli.audit import progress_line
from service.config import Settings
from service.core.reidentification import attacks as pu
from service.db.migrate import upgrade
from tests.audits.test_reidentification import _rolled_stream, _stream_rows
from tests.conftest import Api, Backend, Jobs
from tests.helpers import ingest
from workers.jobs import reidentification_run

URL = "/v1/audits/reidentification"
SMALL = pu.PUConfig(batch_size=100, t_pre=200, t_tune=200, pu_epochs=60, oracle_epochs=60)
DRAWS = 3


def _body() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    y = rng.random(300) < 0.4
    x = rng.normal(size=(300, 4)) + np.where(y[:, None], 3.0, -3.0)
    return {
        "source": {"rows": x.round(4).tolist(), "labels": ["1" if v else "0" for v in y]},
        "positive_label": "1",
        "release": {"kind": "class_mean", "epsilon": 1.0, "value_range": [-8, 8]},
        "attacks": ["nnpu", "upu"],
        "classifier": "linear",
        "draws": DRAWS,
    }


def _meta_key(api: Api, a: str) -> str:
    return f"{api.ctx.keys.prefix}:{{ra:{a}}}:meta"


async def _create(api: Api) -> str:
    r = await api.post(URL, role="analyst", json=_body())
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


class _Sampler:
    """Every progress value the audit's ``meta`` shows, polled until stopped. Stopped by a
    flag, not by cancelling: on Python 3.11 a cancellation that arrives as redis-py's
    ``asyncio.wait_for`` around a command's send completes is lost, and the poll went on
    for ever (the test hung about one run in five)."""

    def __init__(self, api: Api, a: str) -> None:
        self.seen: list[float] = []
        self.stopped = False
        self.task = asyncio.ensure_future(self._poll(api.ctx.redis, _meta_key(api, a)))

    async def _poll(self, r: Any, key: str) -> None:
        while not self.stopped:
            v = await r.hget(key, "progress")
            if v is not None and (not self.seen or float(v) != self.seen[-1]):
                self.seen.append(float(v))
            await asyncio.sleep(0.002)

    async def stop(self) -> list[float]:
        self.stopped = True
        await self.task
        return self.seen


def _slow(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Each progress report of the attacks waits ``seconds`` (the interruption comes mid-draw
    whatever the machine's speed)."""
    audit = pu.audit

    def slow_audit(*args: Any, progress: Any, **kwargs: Any) -> Any:
        def tick(p: float, stage: str) -> None:
            progress(p, stage)
            time.sleep(seconds)

        return audit(*args, progress=tick, **kwargs)

    monkeypatch.setattr(pu, "audit", slow_audit)


async def test_a_cancelled_audit_resumes_from_its_last_draw(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audits_service, "CONFIG", SMALL)
    monkeypatch.setattr(audits_service, "PROGRESS_SECONDS", 0.005)
    audit = pu.audit
    calls: list[int] = []
    midway, resume = threading.Event(), threading.Event()

    def held(*args: Any, progress: Any, **kwargs: Any) -> Any:
        calls.append(1)
        call = len(calls)

        def tick(p: float, stage: str) -> None:
            progress(p, stage)
            time.sleep(0.002)
            if call == 2 and p > 0.3:  # the second draw, a third of the way: interrupted here
                midway.set()
                resume.wait(30)

        return audit(*args, progress=tick, **kwargs)

    monkeypatch.setattr(pu, "audit", held)
    drawn: list[int] = []
    draw = pu.SumRelease.draw

    def counted(self: pu.SumRelease, *args: Any, **kwargs: Any) -> Any:
        drawn.append(1)
        return draw(self, *args, **kwargs)

    monkeypatch.setattr(pu.SumRelease, "draw", counted)
    a = await _create(api)
    meta = _meta_key(api, a)
    sampler = _Sampler(api, a)
    job = asyncio.ensure_future(reidentification_run({"app": api.ctx}, id=a))
    try:
        assert await asyncio.to_thread(midway.wait, 60)
        await asyncio.sleep(0.05)  # the job writes the progress it saw
        job.cancel()  # the worker stops
        with pytest.raises(asyncio.CancelledError):
            await job
    finally:
        resume.set()  # the thread ends at its next progress report
    kept = await api.ctx.redis.hgetall(meta)
    assert b"draw:0" in kept and b"draw:1" not in kept and b"release:2" not in kept
    interrupted_at = float(kept[b"progress"])
    assert 0 < interrupted_at < 1
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "running" and st["progress"] == pytest.approx(interrupted_at)

    assert (await reidentification_run({"app": api.ctx}, id=a))["status"] == "done"
    seen = await sampler.stop()
    after = await api.ctx.redis.hgetall(meta)
    # no draw redone, no release drawn twice: DRAWS noise draws in all, draw 2's the one kept
    assert len(drawn) == DRAWS, drawn
    assert after[b"draw:0"] == kept[b"draw:0"] and after[b"release:1"] == kept[b"release:1"]
    # the progress never went back, and the first run's work was not shown again from 0
    assert seen == sorted(seen) and after[b"progress"] == b"1", seen
    assert min(v for v in seen if v >= interrupted_at) == pytest.approx(interrupted_at)
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "done" and st["draws"] == DRAWS and st["epsilon"] == 1.0
    for attack in ("nnpu", "upu"):
        assert st["results"][attack]["draws"] == DRAWS
    first = orjson.loads(kept[b"draw:0"])
    spread = st["results"]["nnpu"]["spread"]["accuracy"]
    assert spread["min"] <= first["nnpu"]["scores"]["accuracy"] <= spread["max"]
    assert set(st["results"]) == {"nnpu", "upu", "prior", "oracle"}
    assert st["guarantee"]["epsilon"] == 1.0 and st["noise_scale"] > 0


async def test_a_failed_audit_keeps_its_progress_and_says_why(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audits_service, "CONFIG", SMALL)
    audit = pu.audit
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the second draw
            raise ValueError("x: a reason naming the field")
        return audit(*args, **kwargs)

    monkeypatch.setattr(pu, "audit", failing)
    a = await _create(api)
    assert (await reidentification_run({"app": api.ctx}, id=a))["status"] == "failed"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "failed" and st["progress"] > 0 and st["stage"] == "failed"
    assert st["error"] == "x: a reason naming the field"
    line = progress_line(st)
    assert line == f"failed at {100 * st['progress']:.1f} %: x: a reason naming the field"
    assert "0.0 % failed" not in line


def test_progress_lines() -> None:
    running = {"status": "running", "progress": 0.25, "stage": "nnpu (draw 2/3)"}
    assert progress_line(running) == " 25.0 % nnpu (draw 2/3)"
    failed = {"status": "failed", "progress": 0.0, "stage": "failed", "error": "why"}
    assert progress_line(failed) == "failed at 0.0 %: why"


# --- kill -9 of the worker running it -----------------------------------------------------------

CHILD = r"""
import os, time
from service.audits import service as audits
from service.core.reidentification import attacks as pu
audits.CONFIG = pu.PUConfig(batch_size=100, t_pre=200, t_tune=200, pu_epochs=60, oracle_epochs=60)
audits.PROGRESS_SECONDS = 0.02
audit = pu.audit
def slow_audit(*args, progress, **kwargs):
    def tick(p, stage):
        progress(p, stage)
        time.sleep(float(os.environ["SEL_TEST_TICK"]))
    return audit(*args, progress=tick, **kwargs)
pu.audit = slow_audit
from service.cli.entry import main
main(["worker", "--queues", "user"])
"""


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD], env=env, stdout=out, stderr=subprocess.STDOUT
        )


@pytest.mark.slow
async def test_an_audit_whose_worker_is_killed_resumes_in_another(
    api: Api, backend: Backend, tmp_path: Path
) -> None:
    """``selectivity worker`` killed with SIGKILL while the audit's second draw trains; a new
    worker takes the job over within seconds and finishes it from the checkpoint."""
    settings = backend.settings
    url = settings.redis_url or f"unix://{backend.embedded.socket}"  # type: ignore[union-attr]
    data = tmp_path / "data"
    data.mkdir()
    upgrade(Settings(data_dir=data).resolved_database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    env |= {
        "SELECTIVITY_DATA_DIR": str(data),
        "SELECTIVITY_REDIS_URL": url,
        "SELECTIVITY_REDIS_PREFIX": settings.redis_prefix,
        "SEL_TEST_TICK": "0.01",
    }
    log = tmp_path / "worker.log"
    a = await _create(api)
    meta = _meta_key(api, a)
    r = redis.Redis.from_url(url)
    procs = [_worker(env, log)]
    try:
        sampler = _Sampler(api, a)
        deadline = time.monotonic() + 120
        while not r.hexists(meta, "release:1"):
            assert procs[0].poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        procs[0].send_signal(signal.SIGKILL)
        assert procs[0].wait(timeout=30) == -signal.SIGKILL
        kept = r.hgetall(meta)
        assert b"draw:0" in kept and b"final" not in kept
        procs.append(_worker(env, log))
        deadline = time.monotonic() + 120
        while r.hget(meta, "status") == b"running":
            assert procs[1].poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.05)
        seen = await sampler.stop()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    after = r.hgetall(meta)
    r.close()
    assert after[b"status"] == b"done", (after.get(b"error"), log.read_text()[-3000:])
    assert after[b"draw:0"] == kept[b"draw:0"] and after[b"release:1"] == kept[b"release:1"]
    assert seen == sorted(seen) and after[b"progress"] == b"1", seen
    assert "is gone" in log.read_text()  # the runner requeued the dead worker's job
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "done" and st["results"]["nnpu"]["draws"] == DRAWS


async def test_a_stream_audit_resumes_on_the_records_it_read(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream source's records are read once, kept encoded (one bit a value) until the audit
    ends: the resumed run reads the stream no more, attacks the same records (rows ingested
    meanwhile are not among them) and the table release it read, then deletes them."""
    monkeypatch.setattr(audits_service, "CONFIG", SMALL)
    name = await _rolled_stream(api, jobs, _stream_rows(240, seed=4))
    r = await api.post(
        URL,
        role="analyst",
        json={
            "source": {"stream": name},
            "positive_label": "1",
            "release": {"kind": "count_tables"},
            "attacks": ["nnpu"],
            "draws": 2,
        },
    )
    assert r.status_code == 202, r.text
    a = str(r.json()["id"])
    meta = _meta_key(api, a)
    audit = pu.audit

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise asyncio.CancelledError  # the worker stops as the first draw starts

    monkeypatch.setattr(pu, "audit", interrupted)
    with pytest.raises(asyncio.CancelledError):
        await reidentification_run({"app": api.ctx}, id=a)
    kept = await api.ctx.redis.hgetall(meta)
    assert b"inputs" in kept and b"draw:0" not in kept
    assert await api.ctx.redis.exists(f"{api.ctx.keys.prefix}:{{ra:{a}}}:input")
    assert await ingest(api, name, _stream_rows(50, seed=5)) == 2  # more hot records

    monkeypatch.setattr(pu, "audit", audit)
    read: list[int] = []
    hot = audits_service._hot_columns

    async def reading(*args: Any) -> Any:
        read.append(1)
        return await hot(*args)

    monkeypatch.setattr(audits_service, "_hot_columns", reading)
    assert (await reidentification_run({"app": api.ctx}, id=a)) == {"status": "done", "n": 240}
    assert read == []
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    saved = orjson.loads(kept[b"inputs"])
    assert st["n"] == 240 and st["epoch"] == saved["epoch"] == 2
    assert st["n_hat_p"] == saved["n_hat_p"] and st["results"]["nnpu"]["draws"] == 2
    assert not await api.ctx.redis.exists(f"{api.ctx.keys.prefix}:{{ra:{a}}}:input")


async def test_an_audit_interrupted_on_every_run_is_failed_not_left_running(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's last run (SAQ's last retry) marks an audit whose every earlier run was
    interrupted as failed, saying why, instead of leaving it "running" until it expires."""
    monkeypatch.setattr(audits_service, "CONFIG", SMALL)
    a = await _create(api)
    await api.ctx.redis.hset(_meta_key(api, a), "runs", audits_service.RESUMES)
    assert (await reidentification_run({"app": api.ctx}, id=a))["status"] == "failed"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "failed" and "given up" in st["error"], st
    # one run fewer interrupted: that run still computes
    b = await _create(api)
    await api.ctx.redis.hset(_meta_key(api, b), "runs", audits_service.RESUMES - 1)
    assert (await reidentification_run({"app": api.ctx}, id=b))["status"] == "done"

"""`selectivity serve` in embedded mode restarts on its data dir after ``kill -9`` of its whole
process group, every time, with what it acknowledged before. The killed service's redis-server
is stopped by its watchdog (its AOF flushed); one that outlived its watchdog too is replaced
by the restart (shut down, its AOF flushed), never adopted, and not leaked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.serving import CLI, cli_env, free_port, wait_gone

pytestmark = pytest.mark.slow  # `selectivity serve` in subprocesses, killed and restarted

RESTARTS = 8
ROWS = 5


def _start(data: Path, port: int) -> subprocess.Popen[str]:
    """``serve`` in a process group of its own (as a shell job), ready on ``port``."""
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port)],
        env=cli_env(DATA_DIR=str(data)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"serve not ready: {proc.communicate()[0][-3000:]}")


def _redis_pid(data: Path) -> int:
    registry = (data / "redis" / "redis.rdb.settings").read_text()
    pidfile = Path(json.loads(registry)["pidfile"])
    return int(pidfile.read_text().strip())


def _watchdog(serve: int, redis: int) -> psutil.Process:
    """The watchdog of redis-server ``redis``, a child of the server ``serve``."""
    (dog,) = [
        c
        for c in psutil.Process(serve).children()
        if c.cmdline()[1:2] == ["-c"] and c.cmdline()[-1] == str(redis)
    ]
    return dog


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _observed(base: str, h: dict[str, str]) -> int:
    r = httpx.get(f"{base}/v1/streams/s/windows", headers=h, timeout=30)
    assert r.status_code == 200, r.text
    return sum(w["observations"] or 0 for w in r.json()["windows"])


def test_restart_after_kill_9_always_works_and_keeps_acknowledged_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(data, port)
    h = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
    body = {"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]}
    r = httpx.post(f"{base}/v1/streams", headers=h, json=body, timeout=30)
    assert r.status_code == 201, r.text
    acknowledged = 0
    earlier: list[int] = []
    try:
        for attempt in range(RESTARTS):
            obs = [
                {"id": f"r{attempt}-{i}", "features": {"a": f"v{i}"}, "label": str(i % 2)}
                for i in range(ROWS)
            ]
            r = httpx.post(
                f"{base}/v1/streams/s/observations",
                headers=h,
                json={"observations": obs},
                timeout=30,
            )
            assert r.status_code == 202, r.text
            acknowledged += ROWS
            earlier.append(_redis_pid(data))
            outlives = attempt % 2 == 1
            if outlives:  # its watchdog killed first: the redis-server outlives the service
                _watchdog(proc.pid, earlier[-1]).kill()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            if outlives:
                assert _alive(earlier[-1])
            else:  # its watchdog stops it
                assert not wait_gone([earlier[-1]], timeout=10)
            proc = _start(data, port)
            assert _observed(base, h) == acknowledged
            assert not _alive(earlier[-1])  # replaced, not adopted
            assert _redis_pid(data) != earlier[-1]
        earlier.append(_redis_pid(data))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-3000:]
        leaked = [pid for pid in earlier if _alive(pid)]
        assert not leaked, f"redis-servers left running: {leaked}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid in [*earlier, _redis_pid_or_none(data) or 0]:  # never leave one behind
            if pid and _alive(pid):
                psutil.Process(pid).kill()


def _redis_pid_or_none(data: Path) -> int | None:
    try:
        return _redis_pid(data)
    except (OSError, ValueError, KeyError):
        return None

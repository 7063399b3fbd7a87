"""The noise's process pool never outlives the service that started it: a service killed with
SIGKILL takes its pool worker and the worker's forkserver along (``service.context``,
``_pool_worker_init``). Before, both stayed: the worker holds both ends of its own call queue
and the forkserver's "alive" pipe, so neither ever saw the service go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a service in a subprocess, SIGKILLed

SERVICE = """
import asyncio
from service.context import start_process_pool

async def main():
    pool = await start_process_pool(1)
    print(*pool._processes, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_killed_service_takes_its_pool_worker_and_forkserver_along() -> None:
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert service.stdout is not None
        [worker] = (int(pid) for pid in service.stdout.readline().split())
        forkserver = _parent(worker)
        assert forkserver != service.pid and _running(worker) and _running(forkserver)
        os.kill(service.pid, signal.SIGKILL)
        service.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_running(worker) or _running(forkserver)):
            time.sleep(0.05)
        assert not _running(worker), "the pool worker outlived the service"
        assert not _running(forkserver), "the forkserver outlived the service"
    finally:
        service.kill()
        service.wait(timeout=10)

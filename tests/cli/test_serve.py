"""`selectivity serve` on the embedded defaults, as `make run` starts it: it comes up with
migrations, the bootstrap admin key and the in-process worker, serves, and stops cleanly (exit
0, no task left to cancel, no traceback, no process left) on SIGTERM or SIGINT (Ctrl-C), idle
or with a user job running; killed with SIGKILL, its embedded redis-server goes with it; with
its port taken it fails at once, before starting anything, naming the port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.serving import CLI, alive, cli_env, free_port, serving, wait_gone

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess


def test_serve_embedded_starts_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        key_file = server.data_dir / "admin.key"
        assert key_file.stat().st_mode & 0o077 == 0
        r = httpx.post(
            f"{server.base}/v1/streams",
            headers={"Authorization": f"Bearer {server.admin_key}"},
            json={"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]},
            timeout=60,  # a loaded machine
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


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_a_fresh_server_is_ready_to_draw_noise_before_it_listens(tmp_path: Path) -> None:
    """The first stream creation draws its windows' noise in the process pool: the pool's
    worker runs before the server answers, with the noise's modules (numpy) loaded from its
    forkserver, and the first creation starts no process (it took seconds of CPU when it
    started the forkserver and imported the service there)."""
    with serving(tmp_path) as server:
        (forkserver,) = [  # its workers, forked, show the same command line
            p
            for p in psutil.Process(server.proc.pid).children()
            if "multiprocessing.forkserver" in " ".join(p.cmdline())
        ]
        workers = forkserver.children()
        assert workers, "no pool worker before the first request"
        assert any("numpy" in m.path for m in workers[0].memory_maps())
        before = {p.pid for p in _descendants(server.proc.pid)}
        r = httpx.post(
            f"{server.base}/v1/streams",
            headers={"Authorization": f"Bearer {server.admin_key}"},
            json={"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]},
            timeout=60,
        )
        assert r.status_code == 201, r.text
        assert {p.pid for p in _descendants(server.proc.pid)} == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_with_an_audit_running_stops_cleanly_and_leaves_no_process(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C reaches the terminal's whole process group (the process pool's forkserver and
    worker too): the running re-identification audit is cancelled (it starts over on the
    next start) rather than waited for, no child prints a traceback, and nothing survives the
    server: pool processes, the embedded redis-server and its watchdog."""
    rnd = random.Random(3)
    rows = [[rnd.random() for _ in range(20)] for _ in range(4000)]
    audit = {  # the perceptron on 4000 records: a minute of CPU, far longer than this test
        "source": {"rows": rows, "labels": [str(int(r[0] > 0.5)) for r in rows]},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
        "classifier": "mlp",
    }
    with serving(tmp_path) as server, httpx.Client(timeout=60) as http:
        h = {"Authorization": f"Bearer {server.admin_key}"}
        body = {"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]}
        assert http.post(f"{server.base}/v1/streams", headers=h, json=body).status_code == 201
        r = http.post(f"{server.base}/v1/audits/reidentification", headers=h, json=audit)
        assert r.status_code == 202, r.text
        url = f"{server.base}/v1/audits/reidentification/{r.json()['id']}"
        deadline = time.monotonic() + 120
        while http.get(url, headers=h).json()["status"] != "running":
            assert time.monotonic() < deadline, "the audit did not start"
            time.sleep(0.2)
        children = _descendants(server.proc.pid)
        assert children  # the pool's forkserver and worker, and multiprocessing's tracker
        redis = server.redis_pid()
        started = time.monotonic()
        os.killpg(server.proc.pid, sig)  # as a terminal's Ctrl-C (or a kill of the job)
        server.log, _ = server.proc.communicate(timeout=60)  # a hang guard, not a benchmark
        took = time.monotonic() - started
    print(f"{sig.name} with an audit running: stopped in {took:.2f} s")
    assert server.proc.returncode == 0, server.log
    assert "Traceback" not in server.log, server.log
    assert "Application shutdown complete" in server.log
    assert not wait_gone([c.pid for c in children] + [redis], timeout=10)


@pytest.mark.parametrize("group", [False, True], ids=["kill-9-pid", "kill-9-group"])
def test_a_killed_serve_takes_its_redis_server_along(tmp_path: Path, group: bool) -> None:
    """``kill -9`` of the server (or of its process group, as a failing test's clean-up does)
    leaves no embedded redis-server running: its watchdog stops it."""
    with serving(tmp_path) as server:
        redis = server.redis_pid()
        assert alive(redis)
        if group:
            os.killpg(server.proc.pid, signal.SIGKILL)
        else:
            server.proc.kill()
        server.proc.wait(timeout=30)
        assert not wait_gone([redis], timeout=10), "the redis-server outlived its server"


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

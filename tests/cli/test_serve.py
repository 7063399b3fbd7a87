"""`selectivity serve` on the embedded defaults, as `make run` starts it: it comes up with
migrations, the bootstrap admin key and the in-process worker, serves, and stops cleanly on
SIGTERM (Ctrl-C)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_embedded_starts_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    env["SELECTIVITY_DATA_DIR"] = str(tmp_path / "data")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        key = (tmp_path / "data" / "admin.key").read_text().strip()
        assert (tmp_path / "data" / "admin.key").stat().st_mode & 0o077 == 0
        r = httpx.post(
            f"{base}/v1/streams",
            headers={"Authorization": f"Bearer {key}"},
            json={"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]},
        )
        assert r.status_code == 201, r.text
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal
    assert "admin key" in out and "Application shutdown complete" in out

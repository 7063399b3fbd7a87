"""`selectivity serve` on the embedded defaults, as `make run` starts it: it comes up with
migrations, the bootstrap admin key and the in-process worker, serves, and stops cleanly on
SIGTERM (Ctrl-C)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.serving import serving

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
    assert server.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal
    assert "admin key" in out and "Application shutdown complete" in out

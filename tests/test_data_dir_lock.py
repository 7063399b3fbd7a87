"""One process runs a data dir's embedded Redis: a second one (another `selectivity serve`, a
test or a benchmark on the same `SELECTIVITY_DATA_DIR`) would stop the first one's server
under it, so it is refused, naming the owner; the claim goes with its process however it ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import resources
from service.config import Settings
from tests.serving import cli, cli_env, free_port


def test_a_second_embedded_redis_on_one_data_dir_is_refused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, redis_url=None, database_url=None)
    first = resources.EmbeddedRedis(settings)
    try:
        with pytest.raises(resources.DataDirInUse) as refused:
            resources.EmbeddedRedis(settings)
        assert f"pid {os.getpid()}" in str(refused.value)
        assert first.client() is not None
        with pytest.raises(resources.DataDirInUse):
            resources.check_data_dir_free(tmp_path)
    finally:
        first.close()
    resources.check_data_dir_free(tmp_path)  # released by close
    again = resources.EmbeddedRedis(settings)
    again.close()


def test_serve_refuses_a_data_dir_another_process_runs(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from service import resources; "
            "resources.claim_data_dir(Path(sys.argv[1])); print('held', flush=True); "
            "sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = cli(
            "serve", "--port", str(free_port()), env=cli_env(DATA_DIR=str(tmp_path)), timeout=60
        )
        assert done.returncode == 1
        assert f"data dir {tmp_path} is in use by another process (pid {holder.pid})" in (
            done.stderr
        )
    finally:
        holder.kill()  # as kill -9: the kernel drops its lock
        holder.wait()
    resources.check_data_dir_free(tmp_path)

"""The production deployment files: parsed, validated by both compose implementations, and
migrate, api and worker run as compose runs them against the local PostgreSQL and Redis. The
images built and the compose file brought up under Docker: tests/deploy/test_compose_up.py."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from service.config import Settings
from tests.conftest import pg_schema
from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_an_empty_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose passes `SELECTIVITY_ADMIN_KEY: ${SELECTIVITY_ADMIN_KEY:-}` as "" when unset."""
    for name in ("ADMIN_KEY", "REDIS_URL", "DATABASE_URL", "COLDSTORE_DIR"):
        monkeypatch.setenv(f"SELECTIVITY_{name}", "")
    s = Settings()
    assert s.admin_key is None and s.redis_url is None and s.database_url is None
    assert s.coldstore_dir is None


@pytest.mark.slow
def test_migrate_runs_with_the_empty_variables_compose_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    env |= {"SELECTIVITY_DATA_DIR": str(tmp_path / "data"), "SELECTIVITY_ADMIN_KEY": ""}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.entry", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "data" / "admin.key").read_text().strip()


def test_the_image_creates_its_volumes_owned_by_its_user() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    user_at = lines.index("USER selectivity")
    assert any("useradd" in line and "selectivity" in line for line in lines[:user_at])
    made = [line for line in lines[:user_at] if "install -d" in line]
    assert made and all(
        p in made[0] for p in ("-m 0700", "-o selectivity", "-g selectivity", "/data", "/coldstore")
    )
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = compose["x-app"]["volumes"]
    assert "data:/data" in volumes and "coldstore:/coldstore" in volumes


def test_the_build_context_leaves_out_the_venv_and_the_secrets() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".selectivity", ".git"} <= set(ignored)


def test_the_compose_file_declares_the_whole_service() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"redis", "postgres", "migrate", "api", "worker"} <= set(compose["services"])
    env = compose["x-app"]["environment"]
    assert env["SELECTIVITY_ENV"] == "production"
    assert env["SELECTIVITY_ADMIN_KEY"] == "${SELECTIVITY_ADMIN_KEY:-}"  # "" when unset


def _compose_env(compose: dict, **local: str) -> dict[str, str]:
    """x-app's environment as compose passes it with nothing set in the shell
    (``${VAR:-default}`` is the default, ``""`` for ``${VAR:-}``), then ``local`` (servers
    and paths of this machine for compose's host names and volumes) over it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    for name, value in compose["x-app"]["environment"].items():
        env[name] = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
    return env | local


def _command(compose: dict, service: str, **replace: str) -> list[str]:
    """The service's command with ``selectivity`` as this venv's module and ``replace``d
    arguments (``{"8000": "<free port>"}``)."""
    command = [replace.get(a, a) for a in compose["services"][service]["command"]]
    assert command[0] == "selectivity"
    return [sys.executable, "-m", "service.cli.entry", *command[1:]]


@pytest.mark.slow
@pytest.mark.skipif(
    not (
        os.environ.get("SELECTIVITY_TEST_DATABASE_URL")
        and os.environ.get("SELECTIVITY_TEST_REDIS_URL")
    ),
    reason="needs SELECTIVITY_TEST_DATABASE_URL and SELECTIVITY_TEST_REDIS_URL (the CI sets them)",
)
def test_migrate_api_worker_run_as_compose_runs_them(tmp_path: Path) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    redis_url = os.environ["SELECTIVITY_TEST_REDIS_URL"]
    prefix = f"seldeploy{secrets.token_hex(4)}"
    port = free_port()
    with pg_schema(f"seldeploy_{secrets.token_hex(4)}") as database_url:
        env = _compose_env(
            compose,
            SELECTIVITY_REDIS_URL=redis_url,
            SELECTIVITY_DATABASE_URL=database_url,
            SELECTIVITY_COLDSTORE_DIR=str(tmp_path / "coldstore"),
            SELECTIVITY_DATA_DIR=str(tmp_path / "data"),  # the image's ENV
            SELECTIVITY_REDIS_PREFIX=prefix,
        )
        assert env["SELECTIVITY_ADMIN_KEY"] == "" and env["SELECTIVITY_ENV"] == "production"
        r = redis.Redis.from_url(redis_url)
        procs: list[subprocess.Popen[str]] = []
        try:
            done = subprocess.run(
                _command(compose, "migrate"), env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr[-3000:]
            admin = (tmp_path / "data" / "admin.key").read_text().strip()
            api_cmd = _command(compose, "api", **{"8000": str(port), "0.0.0.0": "127.0.0.1"})
            assert "--no-migrate" in api_cmd
            for command in (api_cmd, _command(compose, "worker")):
                procs.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
            api, worker = procs
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            ready = registered = False
            while time.monotonic() < deadline and not (ready and registered):
                assert api.poll() is None and worker.poll() is None, "api or worker exited"
                with contextlib.suppress(httpx.TransportError):
                    ready = httpx.get(f"{base}/readyz", timeout=1).status_code == 200
                registered = any(r.scan_iter(match=f"saq:{{{prefix}:jobs}}:worker_info:*"))
                time.sleep(0.2)
            assert ready and registered, f"api ready: {ready}, worker registered: {registered}"
            h = {"Authorization": f"Bearer {admin}"}
            body = {"name": "s", "features": [{"name": "a"}], "labels": ["0", "1"]}
            got = httpx.post(f"{base}/v1/streams", headers=h, json=body, timeout=30)
            assert got.status_code == 201, got.text
            logs = []
            for p in procs:
                p.send_signal(signal.SIGTERM)
                logs.append(p.communicate(timeout=30)[0])
            assert api.returncode == 0, logs[0][-3000:]
            assert worker.returncode == 0, logs[1][-3000:]
            assert "worker started" in logs[1]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            for pattern in (f"{prefix}:*", f"saq:{{{prefix}:jobs}}*"):
                for k in r.scan_iter(match=pattern, count=1000):
                    r.delete(k)
            r.close()


@pytest.mark.parametrize("compose", [["docker", "compose"], ["docker-compose"]], ids=["v2", "v1"])
def test_docker_compose_config_is_valid(compose: list[str]) -> None:
    """The Compose v2 plugin and Debian's docker-compose 1.29 both accept the file (CI has both)."""
    if shutil.which(compose[0]) is None:
        pytest.skip(f"no {compose[0]} here")
    probe = subprocess.run([*compose, "version"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"{' '.join(compose)} does not run here: {probe.stderr.strip()[:200]}")
    done = subprocess.run(
        [*compose, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")},
    )
    assert done.returncode == 0, done.stderr[-2000:]

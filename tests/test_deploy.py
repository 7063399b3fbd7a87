"""The production deployment files (issue 13, items 15, 16, 18 and 19 as far as this machine
allows: there is no Docker here, so the files are parsed and the compose commands run as
compose would run them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.config import Settings

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
        [sys.executable, "-m", "service.cli", "migrate"],
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

"""The compose deployment built and run for real: the images (`Dockerfile`, and test-only Redis
and PostgreSQL images on a debootstrap Debian where no registry is reachable), then
`docker-compose.yml` brought up with each compose implementation here (Debian's docker-compose
1.29 and the Compose v2 plugin), the README walkthrough against it, acknowledged batches across
SIGKILLed api, worker and Redis containers, a roll the restarted worker seals, and `down -v`.

Skips when no Docker engine answers, unless SELECTIVITY_REQUIRE_DOCKER=1 (`.ci/run`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.cli.test_readme import _bash, _on, _walkthrough
from tests.conftest import unavailable
from tests.serving import free_port

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
BASE = "selectivity-base:bookworm"
IMAGE = "selectivity:ci"
REDIS = "selectivity-test-redis:7"
POSTGRES = "selectivity-test-postgres:15"
REQUIRED_BY = "SELECTIVITY_REQUIRE_DOCKER"


def _run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"{' '.join(args[:4])}: {done.stderr[-3000:]}"
    return done


def _implementations() -> dict[str, list[str]]:
    """The compose commands that answer here: the v2 plugin and Debian's docker-compose."""
    found: dict[str, list[str]] = {}
    for name, command in (("v2", ["docker", "compose"]), ("v1", ["docker-compose"])):
        if shutil.which(command[0]) is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            if _run(*command, "version", timeout=30, check=False).returncode == 0:
                found[name] = command
    return found


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """A line in the test run's output even when output is captured (image size, timings)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"[deploy] {line}")


@pytest.fixture(scope="module")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """The base, the test-only Redis and PostgreSQL images and the service's image (by
    compose's build, with the base as build argument); the environment compose runs with."""
    if shutil.which("docker") is None:
        unavailable("no docker CLI here", required_by=REQUIRED_BY)
    try:
        info = _run("docker", "info", timeout=30, check=False)
        why = info.stderr.strip()[:200] if info.returncode else ""
    except subprocess.TimeoutExpired:
        why = "docker info timed out"
    if why:
        unavailable(f"no Docker engine answers: {why}", required_by=REQUIRED_BY)
    if not _implementations():
        unavailable("neither docker compose nor docker-compose runs here", required_by=REQUIRED_BY)
    started = time.monotonic()
    _run("bash", str(ROOT / "deploy" / "build-base.sh"), BASE, timeout=1200)
    for tag, folder in ((REDIS, "redis"), (POSTGRES, "postgres")):
        _run(
            "docker",
            "build",
            "-q",
            "--build-arg",
            f"BASE={BASE}",
            "-t",
            tag,
            str(ROOT / "deploy" / "test-images" / folder),
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SELECTIVITY_", "COMPOSE_"))}
    env |= {
        "SELECTIVITY_BASE_IMAGE": BASE,
        "SELECTIVITY_IMAGE": IMAGE,
        "SELECTIVITY_REDIS_IMAGE": REDIS,
        "SELECTIVITY_POSTGRES_IMAGE": POSTGRES,
    }
    # One image for migrate, api and both workers: building one service builds it.
    compose = next(iter(_implementations().values()))
    _run(*compose, "-p", "selectivitybuild", "build", "api", env=env, timeout=1800)
    size = int(_run("docker", "image", "inspect", "-f", "{{.Size}}", IMAGE).stdout)
    _say(
        request,
        f"images built in {time.monotonic() - started:.0f} s; {IMAGE} is "
        f"{size / 1e6:.0f} MB on {BASE}",
    )
    return env


def test_the_image_has_no_build_tools_runs_as_non_root_and_has_a_healthcheck(
    images: dict[str, str],
) -> None:
    tools = _run(
        "docker", "run", "--rm", IMAGE, "sh", "-c", "command -v gcc cc make c++ pip pip3 || true"
    ).stdout
    assert tools.strip() == "", f"build tools in the running image: {tools}"
    assert _run("docker", "run", "--rm", IMAGE, "id", "-u").stdout.strip() == "10001"
    health = orjson.loads(
        _run("docker", "image", "inspect", "-f", "{{json .Config.Healthcheck}}", IMAGE).stdout
    )
    assert "/readyz" in " ".join(health["Test"])
    imports = "import lightgbm, numpy, pyarrow, service.app, workers"
    _run("docker", "run", "--rm", IMAGE, "python", "-c", imports)


@dataclass
class Deployment:
    compose: list[str]
    project: str
    env: dict[str, str]
    base: str

    def __call__(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            *self.compose, "-p", self.project, *args, env=self.env, timeout=timeout, check=check
        )

    def container(self, service: str) -> str:
        cid = self("ps", "-q", service).stdout.split()
        assert len(cid) == 1, f"{service}: {cid}"
        return cid[0]

    def wait_healthy(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        status = ""
        while time.monotonic() < deadline:
            cid = self("ps", "-q", "api").stdout.split()
            if cid:
                status = _run(
                    "docker", "inspect", "-f", "{{.State.Health.Status}}", cid[0], check=False
                ).stdout.strip()
                if status == "healthy":
                    return
            time.sleep(1)
        raise AssertionError(f"api not healthy after {timeout} s: {status or 'no container'}")


@contextlib.contextmanager
def _up(compose: list[str], env: dict[str, str]) -> Iterator[Deployment]:
    port = free_port()
    env = env | {
        "SELECTIVITY_PORT": str(port),
        "POSTGRES_PASSWORD": secrets.token_hex(16),
        "SELECTIVITY_METRICS_TOKEN": secrets.token_hex(16),
    }
    d = Deployment(compose, f"seltest{secrets.token_hex(4)}", env, f"http://127.0.0.1:{port}")
    try:
        d("up", "-d")
        d.wait_healthy()
        yield d
    except BaseException:
        logs = d("logs", "--no-color", "--tail", "40", check=False)
        print(logs.stdout[-8000:])  # shown with the failure; the service logs no raw data
        raise
    finally:
        d("down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def _batch(i: int, n: int = 25) -> dict[str, object]:
    return {
        "observations": [
            {
                "id": f"b{i}-{j}",
                "features": {"user_id": str(j % 7), "movie_id": str(i), "age": 20 + j},
                "label": str(j % 2),
            }
            for j in range(n)
        ]
    }


@pytest.mark.parametrize("impl", ["v1", "v2"])
def test_compose_up_walkthrough_kill_and_down(
    impl: str, images: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    compose = _implementations().get(impl)
    if compose is None:
        unavailable(f"compose {impl} does not run here", required_by=REQUIRED_BY)
    started = time.monotonic()
    with _up(compose, images) as d:
        up_s = time.monotonic() - started
        # The bootstrap admin key, as the README says: written by migrate to the data volume.
        admin = d("exec", "-T", "api", "cat", "/data/admin.key").stdout.strip()
        assert admin
        (tmp_path / "admin.key").write_text(admin + "\n")
        # The key ceremony (README, "Production"), its shares kept out of the test's output.
        ceremony = d(
            "run",
            "--rm",
            "-T",
            "migrate",
            "selectivity",
            "admin",
            "init-coldstore",
            "--shares",
            "5",
            "--threshold",
            "3",
            check=False,
        )
        assert ceremony.returncode == 0, "init-coldstore failed"
        shares = ceremony.stdout.count("share ")  # counted, never shown
        assert shares >= 5

        # The README walkthrough, as written, against the compose deployment.
        walk = _bash(_on(d.base, tmp_path, _walkthrough()), timeout=180)
        assert walk.returncode == 0, walk.stderr
        outputs = [line for line in walk.stdout.splitlines() if line.strip()]
        assert orjson.loads(outputs[0])["name"] == "movielens"
        assert orjson.loads(outputs[1]) == {"accepted": 3, "window": 1}
        assert orjson.loads(outputs[2]) == {"epoch": 2}
        assert orjson.loads(outputs[3])["window"] == 2
        assert orjson.loads(outputs[4])["epoch"] == 2
        assert '"error"' not in walk.stdout

        # Acknowledged batches across SIGKILLed api, worker and Redis (AOF on).
        h = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=d.base, timeout=30) as c:
            got = c.post("/v1/admin/keys", headers=h, json={"role": "producer"})
            assert got.status_code == 201, got.text
            producer = {"Authorization": f"Bearer {got.json()['key']}"}
        batches = 120  # sent back to back: the kill lands while some are in flight
        acked: dict[int, int] = {}

        def ingest(i: int, client: httpx.Client) -> None:
            with contextlib.suppress(httpx.TransportError):
                r = client.post(
                    "/v1/streams/movielens/observations",
                    headers=producer | {"Idempotency-Key": f"durable-{i}"},
                    json=_batch(i),
                )
                if r.status_code == 202:
                    acked[i] = r.json()["accepted"]

        def producer_loop() -> None:
            with httpx.Client(base_url=d.base, timeout=10) as client:
                for i in range(batches):
                    ingest(i, client)

        victims = [d.container(s) for s in ("api", "worker", "redis")]
        thread = threading.Thread(target=producer_loop)
        thread.start()
        deadline = time.monotonic() + 120
        while len(acked) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(acked) >= 10, f"only {len(acked)} batches acknowledged"
        _run("docker", "kill", *victims)
        thread.join(180)
        assert not thread.is_alive()
        before_restart = dict(acked)
        d("up", "-d")
        d.wait_healthy()
        with httpx.Client(base_url=d.base, timeout=30) as c:
            for i in range(batches):  # the unacknowledged ones again, with the same key
                for _ in range(20):
                    if i in acked:
                        break
                    ingest(i, c)
                assert i in acked, f"batch {i} never acknowledged after the restart"
            windows = c.get("/v1/streams/movielens/windows", headers=h).json()
            hot = [w for w in windows["windows"] if w["epoch"] == 2]
            expected = 1 + 25 * batches  # the walkthrough's r4, then every batch once
            assert all(acked[i] == 25 for i in before_restart)
            assert hot[0]["observations"] == expected, (hot, len(before_restart))
            model = c.post("/v1/admin/keys", headers=h, json={"role": "model"}).json()["key"]
            rows = c.get(
                "/v1/streams/movielens/trainset?format=ndjson",
                headers={"Authorization": f"Bearer {model}"},
            )
            assert rows.status_code == 200 and len(rows.text.splitlines()) == expected

            # A roll, then the restarted worker seals window 2 into the cold store.
            assert c.post("/v1/streams/movielens/roll", headers=h).json() == {"epoch": 3}
            deadline = time.monotonic() + 120
            sealed = None
            while sealed is None and time.monotonic() < deadline:
                windows = c.get("/v1/streams/movielens/windows", headers=h).json()
                sealed = next(w for w in windows["windows"] if w["epoch"] == 2)["cold_sealed_at"]
                time.sleep(1)
            assert sealed, "the worker did not seal window 2 after the restart"
        _say(
            request,
            f"compose {impl}: up in {up_s:.0f} s, "
            f"{len(before_restart)}/{batches} batches acknowledged before the kill, "
            f"all {expected} observations counted after it; "
            f"whole run {time.monotonic() - started:.0f} s",
        )

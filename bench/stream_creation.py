"""``python -m bench.stream_creation``: a stream with a large sketch is created on the embedded
defaults (Redis, SQLite) while one admin creates keys back to back and ``/healthz`` is polled.
Prints the creation's time, how many keys were created meanwhile with their statuses and
slowest latency, and the slowest ``/healthz``: a creation holds no SQL transaction while it
prepares its windows in Redis, so keys never fail (docs/ARCHITECTURE.md, "Life cycle")."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from service import resources
from service.admin import service as keys
from service.app import create_app
from service.config import Settings
from service.db.migrate import upgrade


async def run(data: Path, width: int, depth: int, max_tables: int) -> None:
    settings = Settings(data_dir=data, embedded_worker=False)
    embedded = resources.EmbeddedRedis(settings)
    upgrade(settings.resolved_database_url)
    ctx = await resources.build(settings, embedded=embedded)
    try:
        async with ctx.sessionmaker() as session, session.begin():
            admin = (await keys.create(session=session, role="admin")).key
        transport = httpx.ASGITransport(app=create_app(ctx=ctx))
        h = {"Authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            body = {
                "name": "big",
                "features": [{"name": "user"}, {"name": "item"}],
                "labels": ["0", "1"],
                "sketch": {"width": width, "depth": depth},
                "max_tables": max_tables,
            }
            start = time.perf_counter()
            creating = asyncio.create_task(c.post("/v1/streams", headers=h, json=body))
            answers: list[tuple[int, float]] = []
            health: list[float] = []
            while not creating.done():
                t = time.perf_counter()
                r = await c.post("/v1/admin/keys", headers=h, json={"role": "analyst"})
                answers.append((r.status_code, time.perf_counter() - t))
                t = time.perf_counter()
                await c.get("/healthz")
                health.append(time.perf_counter() - t)
                await asyncio.sleep(0.2)
            r = await creating
        print(f"create {width}x{depth}, max_tables {max_tables}: {r.status_code} in "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        statuses = sorted({s for s, _ in answers})
        slowest = max((latency for _, latency in answers), default=0.0)
        print(f"keys meanwhile: {len(answers)}, statuses {statuses}, slowest {slowest:.3f} s")
        print(f"/healthz slowest {max(health, default=0.0):.3f} s")
    finally:
        await resources.close(ctx)
        embedded.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=int, default=2**21)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--max-tables", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
        asyncio.run(run(Path(tmp), a.width, a.depth, a.max_tables))


if __name__ == "__main__":
    main()

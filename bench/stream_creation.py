"""``python -m bench.stream_creation``: a stream with a large sketch is created on the embedded
defaults (Redis, SQLite: ``bench.harness``) while one admin creates keys back to back and
``/healthz`` is polled. Prints the creation's time, how many keys were created meanwhile with
their statuses and slowest latency, and the slowest ``/healthz``: a creation holds no SQL
transaction while it prepares its windows in Redis, so keys never fail (docs/ARCHITECTURE.md,
"Life cycle")."""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.harness import InProcess


async def run(width: int, depth: int, max_tables: int) -> None:
    async with InProcess() as svc:
        c, h = svc.client, {"Authorization": f"Bearer {svc.keys['admin']}"}
        body = {
            "name": "big",
            "features": [{"name": "user"}, {"name": "item"}],
            "labels": ["0", "1"],
            "sketch": {"width": width, "depth": depth},
            "max_tables": max_tables,
            # a slot beyond features + 1 is selection's: on, so that max_tables 4 is accepted
            "privacy": {"epsilon_selection": 1.0},
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
        if r.status_code != 201:
            print(r.text[:500])
        statuses = sorted({s for s, _ in answers})
        slowest = max((latency for _, latency in answers), default=0.0)
        print(f"keys meanwhile: {len(answers)}, statuses {statuses}, slowest {slowest:.3f} s")
        print(f"/healthz slowest {max(health, default=0.0):.3f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=int, default=2**21)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--max-tables", type=int, default=4)
    a = p.parse_args()
    asyncio.run(run(a.width, a.depth, a.max_tables))


if __name__ == "__main__":
    main()

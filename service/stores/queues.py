"""Redis side of annotation queues: the sketches, the exact counts of flagged keys, the pool,
the leases (DESIGN §11). Every key of a queue carries the hash tag ``{q:<queue>}``.

What Redis holds of a candidate before its release: its keyed digest (in the HyperLogLog, the
Count-Mean-Min cells, and, once flagged, the exact-count hash). Raw payloads enter Redis only
with a release (the ``tasks`` hash), as the canonical form of a k-anonymous example."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source

SKIP_MEMORY_SECONDS = 86_400
LOOK_PAST = 200  # pool entries a lease may pass over (the annotator's skipped tasks)
HISTOGRAM_BINS = 10


@dataclass(frozen=True)
class Sampled:
    """One candidate kept by sampling, as the script needs it."""

    digest: str
    cells: list[int]
    uncertainty: float
    task_id: str
    payload: bytes


@dataclass(frozen=True)
class Lease:
    id: str
    expires_ms: int
    payload: bytes
    uncertainty: float


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def candidates_call(
    keys: Keys, queue: str, k: int, width: int, depth: int, received: int, sampled: list[Sampled]
) -> tuple[list[str], list[bytes | str | int | float]]:
    """KEYS and ARGV of ``queue_candidates.lua``."""
    names = ("hll", "cmm", "cmm_totals", "watch", "released", "pool", "scores", "tasks", "stats")
    args: list[bytes | str | int | float] = [k, width, depth, received, len(sampled)]
    for s in sampled:
        args.append(s.digest)
        args.extend(s.cells)
        args += [repr(float(s.uncertainty)), s.task_id, s.payload]
    return [keys.queue(queue, w) for w in names], args


class QueueStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._candidates = redis.register_script(source("queue_candidates"))
        self._lease = redis.register_script(source("queue_lease"))
        self._task = redis.register_script(source("queue_task"))

    def _key(self, q: str, what: str) -> str:
        return self.k.queue(q, what)

    async def apply(
        self, *, queue: str, k: int, width: int, depth: int, received: int, sampled: list[Sampled]
    ) -> list[str]:
        """Apply a batch's sampled candidates; returns the task ids released by it."""
        keys, args = candidates_call(self.k, queue, k, width, depth, received, sampled)
        return [_s(x) for x in await self._candidates(keys=keys, args=args)]

    async def lease(
        self, *, queue: str, owner: str, n: int, now_ms: int, ttl_ms: int
    ) -> tuple[int, list[Lease]]:
        """Requeue expired leases, then lease up to ``n`` of the most uncertain tasks."""
        keys = [
            self._key(queue, "pool"),
            self._key(queue, "leases"),
            self._key(queue, "owners"),
            self._key(queue, "scores"),
            self._key(queue, "tasks"),
            self.k.queue_skipped(queue, owner),
        ]
        out = await self._lease(keys=keys, args=[now_ms, ttl_ms, n, owner, LOOK_PAST])
        leases = [
            Lease(_s(out[i]), int(out[i + 1]), bytes(out[i + 2]), float(out[i + 3]))
            for i in range(1, len(out), 4)
        ]
        return int(out[0]), leases

    async def act(
        self, *, queue: str, action: str, task_id: str, owner: str, now_ms: int, arg: str | int
    ) -> list[bytes | int]:
        keys = [
            self._key(queue, w)
            for w in ("pool", "leases", "owners", "scores", "tasks", "labelled", "stats")
        ]
        keys.append(self.k.queue_skipped(queue, owner))
        return list(await self._task(keys=keys, args=[action, task_id, owner, now_ms, arg]))

    async def forget_payload(self, *, queue: str, task_id: str) -> None:
        """After the label is committed to SQL, the payload leaves Redis."""
        await self.r.hdel(self._key(queue, "tasks"), task_id)

    async def stats(self, *, queue: str) -> dict[str, Any]:
        pool = self._key(queue, "pool")
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self._key(queue, "stats"))
        pipe.pfcount(self._key(queue, "hll"))
        pipe.hlen(self._key(queue, "watch"))
        pipe.zcard(pool)
        pipe.zcard(self._key(queue, "leases"))
        for i in range(HISTOGRAM_BINS):
            lo = i / HISTOGRAM_BINS
            hi = (i + 1) / HISTOGRAM_BINS
            pipe.zcount(pool, lo, hi if i == HISTOGRAM_BINS - 1 else f"({hi}")
        res = await pipe.execute()
        counters = {_s(k): int(v) for k, v in res[0].items()}
        return {
            **{
                f: counters.get(f, 0)
                for f in ("received", "sampled", "released", "labelled", "skipped")
            },
            "distinct": int(res[1]),
            "tracking": int(res[2]),
            "in_pool": int(res[3]),
            "leased": int(res[4]),
            "histogram": [int(x) for x in res[5:]],
        }

    async def requeue_expired(self, *, queue: str, now_ms: int) -> int:
        requeued, _ = await self.lease(queue=queue, owner="-", n=0, now_ms=now_ms, ttl_ms=0)
        return requeued

"""Redis side of annotation queues: the per-period counts, the releases, the pool, the leases
(docs/ARCHITECTURE.md, "Annotation queues"). Every key of a queue carries the hash tag
``{q:<queue>}``.

What Redis holds of a candidate below k: its class's keyed digest and sampled count, in the
counts of its release period (``p:<period>:counts``), deleted when the period is released. A
payload enters Redis only once its class has k sampled occurrences in the period (``ready``,
until the period's release) and with the release (the ``tasks`` hash), as the canonical form of
a k-anonymous example. A candidate not kept by the sampling reaches Redis only as placeholders
of its lengths (``Candidate.placeholder``): the submission's Redis work is the same whatever
was kept (``queue_candidates.lua``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from service.lua import source
from service.stores.keys import Keys

SKIP_MEMORY_SECONDS = 86_400
CLOSED_RETRIES = 8
LOOK_PAST = 200  # pool entries a lease may pass over (the annotator's skipped tasks)
HISTOGRAM_BINS = 10
STATS_COUNTERS = (
    "received",
    "released",
    "labelled",
    "skipped",
    "scored_by_model",
    "scored_by_fallback",
)


PLACEHOLDER = "~"  # the first character of a placeholder class (never a hex digest's)


@dataclass(frozen=True)
class Candidate:
    """One candidate of a batch as ``queue_candidates.lua`` takes it: kept by the sampling
    (its key, class and release blob), or the placeholder of one that was not."""

    kept: bool
    key: str  # keyed digest of the canonical form (hex): one release per key
    cls: str  # its class in the period: the key, or key and uncertainty bucket
    blob: bytes  # what the release needs once the class is ready (JSON)

    def placeholder(self) -> Candidate:
        """The same lengths, none of the content: what a candidate not kept sends, so that
        the script's work and its arguments' sizes do not depend on the coin."""
        return Candidate(
            kept=False,
            key="0" * len(self.key),
            cls=PLACEHOLDER * len(self.cls),
            blob=b"\0" * len(self.blob),
        )


@dataclass(frozen=True)
class Release:
    """One task of a period's release, as ``queue_release.lua`` needs it."""

    key: str
    task_id: str
    uncertainty: float
    payload: bytes
    model_epoch: int | None = None  # the reference model's epoch, when it gave the score


@dataclass(frozen=True)
class Lease:
    id: str
    expires_ms: int
    payload: bytes
    uncertainty: float


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def period_keys(keys: Keys, queue: str, period: int) -> list[str]:
    """The period's counts (hash: class -> sampled occurrences) and ready classes (hash:
    class -> release blob)."""
    return [keys.queue(queue, f"p:{period}:{w}") for w in ("counts", "ready")]


def candidates_call(
    keys: Keys, queue: str, k: int, period: int, received: int, batch: list[Candidate]
) -> tuple[list[str], list[bytes | str | int]]:
    """KEYS and ARGV of ``queue_candidates.lua``: every candidate of the batch, kept or a
    placeholder, with its coin."""
    names = ("stats", "closed", "periods", "released")
    args: list[bytes | str | int] = [k, received, str(period), len(batch)]
    for c in batch:
        args += ["1" if c.kept else "0", c.key, c.cls, c.blob]
    return [keys.queue(queue, w) for w in names] + period_keys(keys, queue, period), args


def release_keys(keys: Keys, queue: str, period: int) -> list[str]:
    """KEYS of ``queue_release.lua``."""
    names = ("closed", "periods", "released", "pool", "scores", "tasks", "stats")
    scored = keys.queue(queue, "scored")
    return [keys.queue(queue, w) for w in names] + period_keys(keys, queue, period) + [scored]


class QueueStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._candidates = redis.register_script(source("queue_candidates"))
        self._release = redis.register_script(source("queue_release"))
        self._lease = redis.register_script(source("queue_lease"))
        self._task = redis.register_script(source("queue_task"))

    def _key(self, q: str, what: str) -> str:
        return self.k.queue(q, what)

    async def add(
        self, *, queue: str, k: int, period: int, received: int, batch: list[Candidate]
    ) -> int:
        """Count a batch (its kept candidates and the placeholders of the others) into
        ``period``, or into the first period not yet closed when that one is (a clock behind
        the releasing worker's); returns the period."""
        for _ in range(CLOSED_RETRIES):
            keys, args = candidates_call(self.k, queue, k, period, received, batch)
            res = await self._candidates(keys=keys, args=args)
            if _s(res[0]) == "ok":
                return period
            period = int(res[1]) + 1
        raise RuntimeError(f"queue {queue!r}: every period tried was closed meanwhile")

    async def due_periods(self, *, queue: str, before: int) -> list[int]:
        """Periods before ``before`` that hold counts not released yet, oldest first."""
        raw = await self.r.zrangebyscore(self._key(queue, "periods"), "-inf", f"({before}")
        return [int(_s(x)) for x in raw]

    async def close(self, *, queue: str, period: int) -> None:
        keys = release_keys(self.k, queue, period)
        await self._release(keys=keys, args=["close", str(period)])

    async def ready(self, *, queue: str, period: int) -> list[bytes]:
        """The release blobs of the period's classes that reached k (final once closed); the
        placeholder fields are passed over."""
        raw = await self.r.hgetall(period_keys(self.k, queue, period)[1])
        return [
            v if isinstance(v, bytes) else v.encode()
            for f, v in raw.items()
            if not _s(f).startswith(PLACEHOLDER)
        ]

    async def release(self, *, queue: str, period: int, tasks: list[Release]) -> list[str]:
        """Release a closed period (once: a rerun releases nothing); returns the task ids that
        entered the pool (a key released before is passed over)."""
        args: list[bytes | str | int] = ["release", str(period), len(tasks)]
        for t in tasks:
            epoch = "" if t.model_epoch is None else str(t.model_epoch)
            args += [t.key, t.task_id, repr(float(t.uncertainty)), t.payload, epoch]
        out = await self._release(keys=release_keys(self.k, queue, period), args=args)
        return [_s(x) for x in out]

    async def forget_scores(self, *, queue: str, before_epoch: int | None, fallback: float) -> int:
        """Give every task scored by a reference model of an epoch before ``before_epoch``
        (every one, when None) the uncertainty ``fallback``; returns how many."""
        keys = release_keys(self.k, queue, 0)
        before = "1e300" if before_epoch is None else str(before_epoch)
        return int(await self._release(keys=keys, args=["forget", before, repr(fallback)]))

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
        keys += [self.k.queue_skipped(queue, owner), self._key(queue, "labellers")]
        return list(await self._task(keys=keys, args=[action, task_id, owner, now_ms, arg]))

    async def forget_payload(self, *, queue: str, task_id: str) -> None:
        """After the label is committed to SQL, the payload leaves Redis."""
        await self.r.hdel(self._key(queue, "tasks"), task_id)

    async def count(self, *, queue: str, field: str, n: int) -> None:
        """Add ``n`` to one of the queue's ``STATS_COUNTERS``."""
        await self.r.hincrby(self._key(queue, "stats"), field, n)

    async def stats(self, *, queue: str) -> dict[str, Any]:
        """Counters a submitter may see: none depends on which candidates were sampled
        (received, and what follows from the releases)."""
        pool = self._key(queue, "pool")
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self._key(queue, "stats"))
        pipe.zcard(pool)
        pipe.zcard(self._key(queue, "leases"))
        for i in range(HISTOGRAM_BINS):
            lo = i / HISTOGRAM_BINS
            hi = (i + 1) / HISTOGRAM_BINS
            pipe.zcount(pool, lo, hi if i == HISTOGRAM_BINS - 1 else f"({hi}")
        res = await pipe.execute()
        counters = {_s(k): int(v) for k, v in res[0].items()}
        return {
            **{f: counters.get(f, 0) for f in STATS_COUNTERS},
            "in_pool": int(res[1]),
            "leased": int(res[2]),
            "histogram": [int(x) for x in res[3:]],
        }

    async def requeue_expired(self, *, queue: str, now_ms: int) -> int:
        requeued, _ = await self.lease(queue=queue, owner="-", n=0, now_ms=now_ms, ttl_ms=0)
        return requeued

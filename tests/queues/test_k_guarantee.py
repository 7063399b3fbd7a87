"""The release rule of ``queue_candidates.lua`` and ``queue_release.lua`` under adversarial
orderings (docs/ARCHITECTURE.md, "Annotation queues", steps 2-3): a period releases exactly
the keys that have a class with k sampled candidates *within that period* and were never
released before, whatever order the candidates come in, however the batches are cut, and
whatever other keys or other periods hold, and whatever placeholders of candidates not kept
by the sampling come with them. That is a strongly-safe k-anonymisation of each
period's sample (Li, Qardaji & Su, Thm 5), periods being disjoint. Runs the real scripts on
the test's Redis (a sync client, so Hypothesis drives it directly)."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.lua import source
from service.stores.keys import Keys
from service.stores.queues import Candidate, candidates_call, period_keys, release_keys
from tests.conftest import REDIS_URL, Backend


@pytest.fixture(scope="module")
def sync_redis(backend: Backend) -> Iterator[redis.Redis]:
    if backend.embedded is not None:
        r = redis.Redis(unix_socket_path=backend.embedded.socket)
    else:
        r = redis.Redis.from_url(REDIS_URL)  # type: ignore[arg-type]
    yield r
    r.close()


def item(key: int, bucket: int) -> Candidate:
    k = f"{key:032x}"
    blob = orjson.dumps({"key": k, "bucket": bucket, "payload": {"text": f"t{key}"}})
    return Candidate(kept=True, key=k, cls=f"{k}:{bucket}", blob=blob)


class Queue:
    """The scripts of one queue, driven as the service drives them."""

    def __init__(self, r: redis.Redis, keys: Keys, k: int) -> None:
        self.r, self.keys, self.k = r, keys, k
        self.q = "prop-" + secrets.token_hex(6)
        self.cand = r.register_script(source("queue_candidates"))
        self.rel = r.register_script(source("queue_release"))

    def add(self, period: int, batch: list[Candidate], received: int | None = None) -> list:
        n = len(batch) if received is None else received
        ks, args = candidates_call(self.keys, self.q, self.k, period, n, batch)
        return [x.decode() if isinstance(x, bytes) else x for x in self.cand(keys=ks, args=args)]

    def release(self, period: int) -> list[str]:
        """Close, read the ready classes, release one task per key (the task id is the key)."""
        ks = release_keys(self.keys, self.q, period)
        self.rel(keys=ks, args=["close", str(period)])
        held = self.r.hgetall(period_keys(self.keys, self.q, period)[1])
        ready = [orjson.loads(b) for f, b in held.items() if not f.startswith(b"~")]
        args: list = ["release", str(period), 0]
        for key in sorted({x["key"] for x in ready}):
            args += [key, key, "0.5", b"{}", ""]
        args[2] = (len(args) - 3) // 5
        return [x.decode() for x in self.rel(keys=ks, args=args)]

    def drop(self) -> None:
        for key in self.r.scan_iter(match=self.keys.queue_pattern(self.q)):
            self.r.delete(key)


def expected(periods: list[list[tuple[int, int]]], k: int) -> list[set[str]]:
    """Per period: the keys with a class (key, bucket) counted k times in it, not released
    before: a function of each period's class counts alone."""
    out, seen = [], set()
    for cands in periods:
        counts = Counter(cands)
        ready = {f"{key:032x}" for (key, _), n in counts.items() if n >= k} - seen
        out.append(ready)
        seen |= ready
    return out


# bursts of one class (an adversary repeating a candidate), optionally shuffled
bursts = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 2), st.integers(1, 12)), min_size=1, max_size=30
)
period_data = st.tuples(bursts, st.booleans()).flatmap(
    lambda b: (
        st.permutations([(x, u) for x, u, n in b[0] for _ in range(n)])
        if b[1]
        else st.just([(x, u) for x, u, n in b[0] for _ in range(n)])
    )
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    periods=st.lists(period_data, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    k=st.integers(1, 10),
    dropped=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 2), st.integers(0, 400))),
)
def test_each_period_releases_exactly_its_own_classes_with_k_candidates(
    sync_redis: redis.Redis,
    backend: Backend,
    periods: list[list[tuple[int, int]]],
    cuts: list[int],
    k: int,
    dropped: list[tuple[int, int, int]],
) -> None:
    q = Queue(sync_redis, Keys(backend.settings.redis_prefix), k)
    try:
        got = []
        for p, cands in enumerate(periods):
            items = [item(x, u) for x, u in cands]
            for x, u, at in dropped:  # candidates the sampling did not keep: no effect
                items.insert(at % (len(items) + 1), item(x, u).placeholder())
            bounds = sorted({0, len(items), *(c % (len(items) + 1) for c in cuts)})
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                assert q.add(p, items[lo:hi]) == ["ok"]
            got.append(set(q.release(p)))
        assert got == expected(periods, k)
        # nothing of a released period is left: its counts and ready classes are gone
        for p in range(len(periods)):
            assert not any(sync_redis.exists(x) for x in period_keys(q.keys, q.q, p))
    finally:
        q.drop()


def test_a_class_completed_in_a_later_period_is_never_released(
    sync_redis: redis.Redis, backend: Backend
) -> None:
    # the attack of issue 12, item 9: k−1 sampled copies of a key early, the target's copy
    # alone later. Released the moment the k-th copy arrived, the release pinned the target's
    # submission; counted per period, neither period has k of the class.
    k = 5
    q = Queue(sync_redis, Keys(backend.settings.redis_prefix), k)
    try:
        q.add(0, [item(1, 3)] * (k - 1))
        assert q.release(0) == []
        q.add(1, [item(1, 3)])
        assert q.release(1) == []
        # k in one period, but in two uncertainty buckets: two classes, neither has k
        q.add(2, [item(1, 3)] * (k - 1) + [item(1, 7)])
        assert q.release(2) == []
        q.add(3, [item(1, 3)] * k)
        assert q.release(3) == [f"{1:032x}"]
        q.add(4, [item(1, 3)] * k)  # released once per key
        assert q.release(4) == []
    finally:
        q.drop()


def test_a_closed_period_counts_nothing_more_and_releases_once(
    sync_redis: redis.Redis, backend: Backend
) -> None:
    q = Queue(sync_redis, Keys(backend.settings.redis_prefix), 2)
    try:
        assert q.add(7, [item(9, 0)] * 2) == ["ok"]
        assert q.release(7) == [f"{9:032x}"]
        assert q.release(7) == []  # a rerun (or a second worker) releases nothing
        # a batch stamped with a closed period (a clock behind the worker's) is refused, so
        # the caller counts it into the next period; nothing was written
        assert q.add(7, [item(8, 0)] * 2, received=5) == ["closed", 7]
        assert q.add(5, [item(8, 0)] * 2) == ["closed", 7]
        stats = sync_redis.hgetall(q.keys.queue(q.q, "stats"))
        assert int(stats[b"received"]) == 2
    finally:
        q.drop()

"""The release rule of ``queue_candidates.lua`` under adversarial orderings (DESIGN §11.3): no
key with fewer than k sampled occurrences is ever released, whatever order the occurrences
come in, however the batches are cut, and however badly a tiny sketch over-estimates. Runs
the real script on the test's Redis (a sync client, so Hypothesis drives it directly)."""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.cmm import CMMSpec, CountMeanMin, cells
from service.keys import Keys
from service.lua import source
from service.queues.store import Sampled, candidates_call
from tests.conftest import REDIS_URL, Backend

SPEC = CMMSpec(width=256, depth=2)
TINY = 16  # the property test's width (below the API's minimum): collisions everywhere, so
# the sketch over-estimates rare keys and flags them early


@pytest.fixture(scope="module")
def sync_redis(backend: Backend) -> Iterator[redis.Redis]:
    if backend.embedded is not None:
        r = redis.Redis(unix_socket_path=backend.embedded.socket)
    else:
        r = redis.Redis.from_url(REDIS_URL)  # type: ignore[arg-type]
    yield r
    r.close()


def digest(key: int) -> bytes:
    return hashlib.sha256(b"key-%d" % key).digest()


def sampled(key: int, i: int, width: int = SPEC.width) -> Sampled:
    d = digest(key)
    cs = [c % width for c in cells(d, SPEC)]
    return Sampled(d[:16].hex(), cs, (key % 97) / 97, f"t_{i:016x}", b'{"text":"x"}')


def run(r: redis.Redis, keys: Keys, order: list[int], cuts: list[int], k: int) -> list[str]:
    script = r.register_script(source("queue_candidates"))
    q = "prop-" + secrets.token_hex(6)
    items = [sampled(key, i, TINY) for i, key in enumerate(order)]
    released: list[str] = []
    bounds = sorted({0, len(items), *(c % (len(items) + 1) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        ks, args = candidates_call(keys, q, k, TINY, SPEC.depth, hi - lo, items[lo:hi])
        released += [x.decode() for x in script(keys=ks, args=args)]
    for key in r.scan_iter(match=keys.queue_pattern(q)):
        r.delete(key)
    by_task = {s.task_id: s.digest for s in items}
    return [by_task[t] for t in released]


# bursts of one key (an adversary repeating a key to inflate its cells), optionally shuffled
bursts = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 15)), min_size=1, max_size=40)
orders = st.tuples(bursts, st.booleans()).flatmap(
    lambda b: (
        st.permutations([x for x, n in b[0] for _ in range(n)])
        if b[1]
        else st.just([x for x, n in b[0] for _ in range(n)])
    )
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    order=orders,
    heavy=st.lists(st.integers(1000, 1010), max_size=300),
    cuts=st.lists(st.integers(0, 700), max_size=6),
    k=st.integers(1, 12),
    heavy_first=st.booleans(),
)
def test_no_release_below_k_sampled_occurrences(
    sync_redis: redis.Redis,
    backend: Backend,
    order: list[int],
    heavy: list[int],
    cuts: list[int],
    k: int,
    heavy_first: bool,
) -> None:
    # heavy hitters inflate the cells the rare keys share: the sketch then flags rare keys
    seq = heavy + order if heavy_first else order + heavy
    keys = Keys(backend.settings.redis_prefix)
    released = run(sync_redis, keys, seq, cuts, k)
    truth = Counter(digest(x)[:16].hex() for x in seq)
    assert len(released) == len(set(released))  # once per key
    for d in released:
        assert truth[d] >= k, (truth[d], k)


def test_an_over_estimate_alone_never_releases(sync_redis: redis.Redis, backend: Backend) -> None:
    # two keys with the same cells in every row: a is flagged at its k-th occurrence and
    # released at its (2k−1)-th; then b's estimate is 2k + 1 at its first occurrence: b is
    # flagged, but released only at its k-th
    seen: dict[tuple[int, ...], int] = {}
    for x in range(10_000):
        c = tuple(x % TINY for x in cells(digest(x), SPEC))
        if c in seen:
            a, b = seen[c], x
            break
        seen[c] = x
    keys = Keys(backend.settings.redis_prefix)
    k = 5
    ha, hb = digest(a)[:16].hex(), digest(b)[:16].hex()
    assert run(sync_redis, keys, [a] * (2 * k) + [b], [], k) == [ha]
    assert run(sync_redis, keys, [a] * (2 * k) + [b] * (k - 1), [], k) == [ha]
    assert run(sync_redis, keys, [a] * (2 * k) + [b] * k, [], k) == [ha, hb]


def test_lua_sketch_matches_the_reference(sync_redis: redis.Redis, backend: Backend) -> None:
    keys = Keys(backend.settings.redis_prefix)
    script = sync_redis.register_script(source("queue_candidates"))
    q = "ref-" + secrets.token_hex(6)
    seq = [i % 37 for i in range(500)] + [5] * 40
    ref = CountMeanMin(SPEC)
    for key in seq:
        ref.update(digest(key))
    items = [sampled(key, i) for i, key in enumerate(seq)]
    ks, args = candidates_call(keys, q, 10**6, SPEC.width, SPEC.depth, len(items), items)
    script(keys=ks, args=args)
    got = CountMeanMin.from_bytes(sync_redis.get(keys.queue(q, "cmm")) or b"", SPEC)
    totals = sync_redis.hgetall(keys.queue(q, "cmm_totals"))
    assert (got.table == ref.table).all()
    assert [int(totals[str(i).encode()]) for i in range(SPEC.depth)] == ref.totals.tolist()
    assert sync_redis.pfcount(keys.queue(q, "hll")) == pytest.approx(37, abs=2)
    for key in sync_redis.scan_iter(match=keys.queue_pattern(q)):
        sync_redis.delete(key)

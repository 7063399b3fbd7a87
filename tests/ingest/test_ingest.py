from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.ingest import service as ingest_service
from service.windows.service import store_of
from tests.conftest import Api, unique
from tests.helpers import obs, prior_of, stream_body, window_cells


async def _stream(api: Api, **over: object) -> str:
    name = unique("ing")
    r = await api.post("/v1/streams", json=stream_body(name, **over))
    assert r.status_code == 201, r.text
    return name


async def test_ingest_counts_and_appends(api: Api) -> None:
    name = await _stream(api)
    batch = [obs("u1", "i1", 20, "1", "a"), obs("u1", "i2", 30, "0"), obs("u2", "i1", 40, "1")]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
    )
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": 3, "window": 1}
    cells = await window_cells(api.ctx, name, 1)
    assert cells["_hot"] == b"3"
    np.testing.assert_array_equal(prior_of(cells["_prior"]), [1, 2])  # mechanism none: exact


async def test_idempotent_retry_never_double_counts_even_after_a_roll(api: Api) -> None:
    name = await _stream(api, hot_windows=2)
    body = {"observations": [obs("u1", "i1", 20, "1"), obs("u2", "i2", 50, "0")]}
    h = {"Idempotency-Key": "batch-42"}
    r1 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    before = await window_cells(api.ctx, name, 1)
    r2 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    assert r2.status_code == 202 and r2.json() == r1.json()
    assert r2.headers.get("Idempotent-Replayed") == "true"
    assert await window_cells(api.ctx, name, 1) == before
    # the stream rolls; the retry must not land again in window 2
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r3 = await api.post(f"/v1/streams/{name}/observations", role="producer", json=body, headers=h)
    assert r3.json() == {"accepted": 2, "window": 1}
    assert (await window_cells(api.ctx, name, 2))["_hot"] == b"0"
    assert await window_cells(api.ctx, name, 1) == before
    # a different key is a different batch
    r4 = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json=body,
        headers={"Idempotency-Key": "batch-43"},
    )
    assert r4.json() == {"accepted": 2, "window": 2}


async def test_batch_racing_a_roll_lands_in_the_next_window(api: Api) -> None:
    name = await _stream(api)
    ctx = api.ctx
    # this process believes window 1 is open (cached) ...
    await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert ctx.caches["open_epoch"][name] == 1
    # ... while another process rolls the stream
    from service.windows import service as windows

    assert await windows.roll(ctx=ctx, name=name) == 2
    ctx.caches["open_epoch"][name] = 1  # as if the roll happened elsewhere
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "0")]},
    )
    assert r.json() == {"accepted": 1, "window": 2}
    assert (await window_cells(ctx, name, 1))["_hot"] == b"1"
    assert (await window_cells(ctx, name, 2))["_hot"] == b"1"


async def test_concurrent_batches_and_rolls_lose_and_double_count_nothing(api: Api) -> None:
    name = await _stream(api, retention_windows=50)
    from service.windows import service as windows

    async def producer(k: int) -> int:
        total = 0
        for j in range(15):
            r = await api.post(
                f"/v1/streams/{name}/observations",
                role="producer",
                json={"observations": [obs(f"u{k}", f"i{j}", 30, "1")] * 3},
                headers={"Idempotency-Key": f"p{k}-{j}"},
            )
            assert r.status_code == 202, r.text
            total += r.json()["accepted"]
        return total

    async def roller() -> None:
        for _ in range(4):
            await windows.roll(ctx=api.ctx, name=name)
            await asyncio.sleep(0)

    results = await asyncio.gather(producer(0), producer(1), producer(2), roller())
    sent = sum(r for r in results if r)
    epoch = await store_of(api.ctx).epoch(name)
    assert epoch == 5
    hot = prior = 0
    for w in range(1, epoch + 1):
        cells = await window_cells(api.ctx, name, w)
        hot += int(cells["_hot"] or 0)
        prior += int(prior_of(cells["_prior"]).sum())
    assert hot == sent == prior == 3 * 15 * 3


@pytest.mark.parametrize(
    ("observation", "status", "needle"),
    [
        ({"features": {"nope": "x"}, "label": "1"}, 422, "nope"),
        ({"features": {"user": "u"}, "label": "7"}, 422, "label"),
        ({"features": {"user": "u" * 300}, "label": "1"}, 422, "256"),
        ({"features": {"age": "old"}, "label": "1"}, 422, "numeric"),
        ({"features": {"user": {"a": 1}}, "label": "1"}, 422, "user"),
        ({"features": {"user": "u"}}, 422, "label"),
        ({"features": {"user": "u"}, "label": "1", "event_time": "yesterday"}, 422, "event_time"),
        ({"features": {"user": "u"}, "label": "1", "extra": 1}, 422, "extra"),
    ],
)
async def test_bad_observations_are_refused_and_change_nothing(
    api: Api, observation: dict, status: int, needle: str
) -> None:
    name = await _stream(api)
    good = obs("u", "i", 20, "1")
    before = await window_cells(api.ctx, name, 1)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [good, observation]},
    )
    assert r.status_code == status, r.text
    assert r.json()["error"] == "ValidationError"
    assert needle in r.json()["detail"]
    assert await window_cells(api.ctx, name, 1) == before


async def test_limits_and_auth(api: Api) -> None:
    name = await _stream(api)
    limit = api.ctx.settings.max_batch
    before = await window_cells(api.ctx, name, 1)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")] * (limit + 1)},
    )
    assert r.status_code == 413 and str(limit) in r.json()["detail"]
    big = {"observations": [obs("u" * 200, "i", 20, "1")] * 20000}
    r = await api.post(f"/v1/streams/{name}/observations", role="producer", json=big)
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"
    for bad in (
        b"{not json",
        b'{"observations": [{"features": {"age": NaN}, "label": "1"}]}',
        b'{"observations": [{"features": {"age": 1e999999}, "label": "1"}]}',
        b'{"observations": [{"features": {"user": "\xff"}, "label": "1"}]}',
    ):
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            content=bad,
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 422, (bad, r.text)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="model",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert r.status_code == 403
    r = await api.post(
        "/v1/streams/nope/observations",
        role="producer",
        json={"observations": [obs("u", "i", 20, "1")]},
    )
    assert r.status_code == 404
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": []}
    )
    assert r.status_code == 422
    assert await window_cells(api.ctx, name, 1) == before


def _ops(rt, body):  # type: ignore[no-untyped-def]
    """The increments the counting job computes for a batch: from its rows as the hot stream
    stores them (JSON), not from the request's values."""
    rows = ingest_service.batch_rows(body)
    tables = ingest_service.tables_of(rt, 1)
    parsed, _ = ingest_service.parse_rows(rt, b",".join(rows), after=b"", last=b"")
    ops = ingest_service.count_increments(rt, tables, parsed.encoded, parsed.labels).packed()
    return [t.id for t in tables], ops, rows


async def test_batch_ops_sum_increments_per_cell(api: Api) -> None:
    """Two identical observations make one op of +2 (or -2) per row, not two ops."""
    name = await _stream(api)
    from service.ingest.schemas import IngestIn
    from service.streams import service as streams

    rt = await streams.runtime(ctx=api.ctx, name=name)
    body = IngestIn.model_validate({"observations": [obs("u", "i", 20, "1")] * 2})
    _, ops, rows = _ops(rt, body)
    assert len(rows) == 2
    for table_ops in ops[:-1]:
        _, deltas = ingest_service.unpack_ops(table_ops)
        assert len(deltas) == rt.spec.depth and all(abs(d) == 2 for d in deltas.tolist())
    assert ops[-1] == ingest_service.pack_ops(np.array([1]), np.array([2]))  # prior: "1" twice
    cells, deltas = ingest_service.unpack_ops(ops[-1])
    assert (cells.tolist(), deltas.tolist()) == ([1], [2])


async def test_batch_ops_equal_the_per_table_reference(api: Api) -> None:
    """Increments computed per distinct (label, key) for all tables at once are exactly the
    per-observation, per-table sums (canonical keys, the pinned hash, aggregate_increments)."""
    from service.core.featurize import row_keys, table_keys
    from service.core.sketch import aggregate_increments, hash_keys
    from service.ingest.schemas import IngestIn
    from service.streams import service as streams

    name = await _stream(api)
    rt = await streams.runtime(ctx=api.ctx, name=name)
    rng = np.random.default_rng(11)
    pool = ["u1", "u2", "196", 196, 196.0, True, 1, False, 0, None, "é"]
    observations = [
        obs(
            pool[int(rng.integers(0, len(pool)))],  # type: ignore[arg-type]
            pool[int(rng.integers(0, len(pool)))],  # type: ignore[arg-type]
            float(rng.choice([5, 18, 24.5, 25, 60])),
            str(rng.integers(0, 2)),
        )
        for _ in range(700)
    ]
    body = IngestIn.model_validate({"observations": observations})
    table_ids, ops, rows = _ops(rt, body)
    feats = [o.features for o in body.observations]
    labels = np.array([rt.label_index[o.label] for o in body.observations])
    values = row_keys(feats, rt.features)
    assert table_ids == [t.id for t in rt.tables] and len(ops) == len(table_ids) + 1
    for t, packed in zip(rt.tables, ops, strict=False):
        b, s = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        want_cells, want_deltas = aggregate_increments(labels, b, s, rt.spec)
        cells, deltas = ingest_service.unpack_ops(packed)
        assert np.array_equal(cells, want_cells) and np.array_equal(deltas, want_deltas)
        assert packed == b" ".join(
            b"#%d %d" % (c, d)
            for c, d in zip(want_cells.tolist(), want_deltas.tolist(), strict=True)
        )
    prior_cells, prior_deltas = ingest_service.unpack_ops(ops[-1])
    assert prior_deltas.tolist() == np.bincount(labels)[prior_cells].tolist()
    assert len(rows) == 700


def test_pack_ops_is_the_decimal_bitfield_arguments() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        m = int(rng.integers(1, 40))
        cells = rng.integers(0, 2**27, m)
        deltas = rng.integers(-(10**6), 10**6, m)
        cells[0], deltas[-1] = 0, -1
        packed = ingest_service.pack_ops(cells, deltas)
        assert packed == b" ".join(
            b"#%d %d" % (c, d) for c, d in zip(cells.tolist(), deltas.tolist(), strict=True)
        )
        back = ingest_service.unpack_ops(packed)
        assert np.array_equal(back[0], cells) and np.array_equal(back[1], deltas)
        bounds = np.r_[0, np.sort(rng.integers(0, m + 1, 3)), m]
        parts = ingest_service.pack_ops_split(cells, deltas, bounds)
        assert parts == [
            ingest_service.pack_ops(cells[lo:hi], deltas[lo:hi])
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        ]
    assert ingest_service.pack_ops(np.array([], int), np.array([], int)) == b""


async def test_lua_applies_exactly_the_batch_increments(api: Api) -> None:
    """The script turns the packed ops into BITFIELD calls (over 1000 ops per table here, so in
    several calls): the window's cells are the reference increments (no noise: zeros + ops)."""
    from service.core.featurize import row_keys, table_keys
    from service.core.sketch import aggregate_increments, hash_keys
    from service.ingest.schemas import IngestIn
    from service.streams import service as streams

    name = await _stream(api)
    observations = [obs(f"user{i}", f"item{i % 97}", 20 + i % 50, str(i % 2)) for i in range(900)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": observations}
    )
    assert r.status_code == 202, r.text
    rt = await streams.runtime(ctx=api.ctx, name=name)
    body = IngestIn.model_validate({"observations": observations})
    feats = [o.features for o in body.observations]
    labels = np.array([rt.label_index[o.label] for o in body.observations])
    values = row_keys(feats, rt.features)
    cells = await window_cells(api.ctx, name, 1)
    n_ops = 0
    for t in rt.tables:
        b, s = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        idx, deltas = aggregate_increments(labels, b, s, rt.spec)
        want = np.zeros(rt.spec.cells, np.int64)
        want[idx] = deltas
        n_ops = max(n_ops, idx.size)
        assert np.array_equal(prior_of(cells[t.name]), want), t.name
    assert n_ops > 1000  # the user table needed more than one BITFIELD call
    assert prior_of(cells["_prior"]).tolist() == [450, 450]


@pytest.mark.parametrize("dense_ratio", [0, 10**9], ids=["bitfield", "whole-tables"])
async def test_accepted_rows_are_counted_once_by_racing_and_crashing_counters(
    api: Api, monkeypatch: pytest.MonkeyPatch, dense_ratio: int
) -> None:
    """Counting runs from a checkpoint by compare-and-set: two counters racing over the same
    window, and a counter that dies after some chunks, still count every row exactly once,
    whether tables are incremented op by op or read, added to and written whole."""
    from service.ingest.store import IngestStore

    name = await _stream(api)
    monkeypatch.setattr(ingest_service, "DENSE_RATIO", dense_ratio)
    monkeypatch.setattr(ingest_service, "COUNT_CHUNK", 37)  # many chunks, many CAS rounds
    batches = [
        [
            obs(f"user{i % 13}", f"item{(i * 7) % 29}", 20 + i % 50, str(i % 2))
            for i in range(k, k + 60)
        ]
        for k in range(0, 600, 60)
    ]
    for batch in batches[:5]:
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202, r.text
    rt = await ingest_service.streams.runtime(ctx=api.ctx, name=name)

    calls = 0
    real = IngestStore.count

    async def dies_on_the_third(self, **kw):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionError("killed")
        return await real(self, **kw)

    monkeypatch.setattr(IngestStore, "count", dies_on_the_third)
    with pytest.raises(ConnectionError):
        await ingest_service.count_window(ctx=api.ctx, rt=rt, window=1)
    monkeypatch.setattr(IngestStore, "count", real)
    assert 0 < await api.ctx.redis.xlen(api.ctx.keys.hot(name, 1)) == 300
    for batch in batches[5:]:  # more rows arrive while two counters race
        r = await api.post(
            f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
        )
        assert r.status_code == 202
    done = await asyncio.gather(
        *(ingest_service.count_window(ctx=api.ctx, rt=rt, window=1) for _ in range(2))
    )
    assert sum(done) + 2 * 37 == 600  # each row counted by exactly one run
    cells = await window_cells(api.ctx, name, 1)
    every = [o for batch in batches for o in batch]
    assert prior_of(cells["_prior"]).tolist() == [300, 300]
    from service.ingest.schemas import IngestIn

    _, ops, _ = _ops(rt, IngestIn.model_validate({"observations": every}))
    for t, packed in zip(rt.tables, ops, strict=False):
        idx, deltas = ingest_service.unpack_ops(packed)
        want = np.zeros(rt.spec.cells, np.int64)
        want[idx] = deltas
        assert np.array_equal(prior_of(cells[t.name]), want), t.name
    assert await ingest_service.count_window(ctx=api.ctx, rt=rt, window=1) == 0


async def test_tables_wait_for_the_counter_and_a_roll_counts_the_rest(api: Api) -> None:
    """Accepting a batch only appends its rows; the tables change when they are counted, and a
    roll counts what is left before the window joins the count period."""
    from service.windows import service as windows

    name = await _stream(api)
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs("u1", "i1", 20, "1")] * 3},
    )
    assert r.status_code == 202
    raw = await api.ctx.redis.get(api.ctx.keys.prior(name, 1))
    assert prior_of(raw).tolist() == [0, 0]  # accepted, not counted yet
    assert await windows.roll(ctx=api.ctx, name=name) == 2
    raw = await api.ctx.redis.get(api.ctx.keys.prior(name, 1))
    assert prior_of(raw).tolist() == [0, 3]


def test_whole_table_addition_saturates_like_bitfield() -> None:
    """``Increments.added_to`` gives what ``BITFIELD ... OVERFLOW SAT INCRBY i32`` gives for
    one summed increment per cell: int32 cells, big-endian, saturated at the bounds."""
    lo, hi = -(2**31), 2**31 - 1
    table = np.array([0, 5, hi - 1, lo + 1, -7, 3], dtype=">i4").tobytes()
    inc = ingest_service.Increments(
        cells=np.array([1, 2, 3, 4, 0], dtype=np.int64),
        deltas=np.array([-9, 5, -5, 7, 1], dtype=np.int64),
        bounds=np.array([0, 4, 5]),
    )
    out = np.frombuffer(inc.added_to(0, table), dtype=">i4").tolist()
    assert out == [0, -4, hi, lo, 0, 3]
    assert inc.packed([1]) == [b"#0 1"] and inc.packed() == [b"#1 -9 #2 5 #3 -5 #4 7", b"#0 1"]

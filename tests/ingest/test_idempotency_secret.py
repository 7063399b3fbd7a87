"""Idempotency records (docs/ARCHITECTURE.md, "Storage" and "Data path"): a keyed batch's
record holds a fingerprint keyed by the stream's secret (which is not in Redis), never an
unkeyed hash of its rows a Redis reader could recompute; a batch without a key is recorded
nowhere; and a window's records outlive its hot period only as keyed hashes with a TTL
(``tests/ingest/test_idempotency_ttl.py``: the key is honoured until then)."""

from __future__ import annotations

import hashlib

from sqlalchemy import select

from service.db.models import Stream
from service.ingest.schemas import IngestIn
from service.ingest.service import batch_fingerprint, batch_rows, key_token
from tests.conftest import Api
from tests.helpers import new_stream, obs, producer_scope, redis_dump


async def _idem_keys(api: Api, name: str) -> list[bytes]:
    return [k async for k in api.ctx.redis.scan_iter(match=f"*{{{name}:*}}:idem*", count=1000)]


async def _seed(api: Api, name: str) -> bytes:
    async with api.ctx.sessionmaker() as s:
        seed = await s.scalar(select(Stream.hash_seed).where(Stream.name == name))
    assert seed is not None
    return seed


async def test_the_fingerprint_is_keyed_by_a_secret_that_is_not_in_redis(api: Api) -> None:
    name = await new_stream(api, "idk", hot_windows=2)
    body = {"observations": [obs("u1", "i1", 20, "1")]}  # one low-entropy row
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json=body,
        headers={"Idempotency-Key": "batch-1"},
    )
    assert r.status_code == 202, r.text
    [key] = await _idem_keys(api, name)
    record = await api.ctx.redis.hgetall(key)
    [(field, value)] = record.items()
    rows = batch_rows(IngestIn.model_validate(body))
    unkeyed = hashlib.sha256()
    for row in rows:
        unkeyed.update(b"%d:" % len(row))
        unkeyed.update(row)
    stored = value[:64].decode()
    assert stored != unkeyed.hexdigest()  # what was stored before: SHA-256 of the rows
    assert stored != hashlib.sha256(b"".join(rows)).hexdigest()
    assert stored != hashlib.blake2b(b"".join(rows), digest_size=32).hexdigest()
    seed = await _seed(api, name)
    token = key_token("batch-1", seed, producer_scope(api))
    assert stored == batch_fingerprint(rows, seed, token)  # keyed by the stream's hash seed
    assert stored != batch_fingerprint(rows, b"\x00" * 32, token)
    # and bound to the key: who holds the seed must guess the key as well as the batch
    assert stored != batch_fingerprint(rows, seed)
    assert stored != batch_fingerprint(rows, seed, key_token("batch-2", seed, producer_scope(api)))
    # the client's key is not stored either, and the secret is nowhere in Redis
    assert field.decode() == token
    assert field != hashlib.sha256(b"batch-1").hexdigest().encode()
    dump = await redis_dump(api.ctx)
    assert seed not in dump and seed.hex().encode() not in dump
    assert b"batch-1" not in dump


async def test_a_window_keeps_its_keyed_records_past_its_hot_period_until_their_ttl(
    api: Api,
) -> None:
    name = await new_stream(api, "idk", hot_windows=2)
    url = f"/v1/streams/{name}/observations"
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    h = {"Idempotency-Key": "batch-9"}
    assert (await api.post(url, role="producer", json=body)).status_code == 202  # no key
    keys = await _idem_keys(api, name)
    assert keys == []  # a batch without a key is recorded nowhere
    assert [k async for k in api.ctx.redis.scan_iter(match=f"*{{{name}}}:idk:*")] == []
    r1 = await api.post(url, role="producer", json=body, headers=h)
    assert r1.json() == {"accepted": 1, "window": 1}
    [record] = await _idem_keys(api, name)
    # epoch 2: window 1 is still hot, the key is honoured
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r2 = await api.post(url, role="producer", json=body, headers=h)
    assert r2.json() == r1.json() and r2.headers.get("Idempotent-Replayed") == "true"
    # epoch 3: window 1 left the hot period (not sealed): its rows are deleted at sealing,
    # its keyed record (no row) stays until its TTL, and the key is still honoured
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    assert await _idem_keys(api, name) == [record]
    assert 0 < await api.ctx.redis.ttl(record) <= api.ctx.settings.idempotency_ttl_seconds
    r3 = await api.post(url, role="producer", json=body, headers=h)
    assert r3.json() == r1.json() and r3.headers.get("Idempotent-Replayed") == "true"

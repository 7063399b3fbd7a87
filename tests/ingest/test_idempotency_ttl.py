"""An Idempotency-Key is honoured for ``idempotency_ttl_seconds`` whatever the rolls
(docs/ARCHITECTURE.md, "Data path"): a retry is replayed, never counted again, with one hot
window and after any number of rolls; the same key with another body is refused just as long;
the records hold no row, expire by their TTL, and a key whose records expired is a new batch;
a stream remembers at most ``idempotency_max_keys`` keys."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from service.ingest.schemas import IngestIn
from service.ingest.service import batch_fingerprint, batch_rows, key_token
from service.lifecycle import roll as lifecycle_roll
from service.streams import service as streams
from tests.conftest import Api
from tests.helpers import new_stream, obs, producer_scope, window_cells

REUSED = "Idempotency-Key reused with a different request body"


def _url(name: str) -> str:
    return f"/v1/streams/{name}/observations"


async def _all_cells(api: Api, name: str, windows: range) -> dict[int, dict[str, bytes | None]]:
    return {w: await window_cells(api.ctx, name, w) for w in windows}


async def test_a_retry_after_three_rolls_with_one_hot_window_is_replayed_not_counted(
    api: Api,
) -> None:
    name = await new_stream(api, "idt", hot_windows=1, retention_windows=10)
    body = {"observations": [obs("u1", "i1", 20, "1"), obs("u2", "i2", 40, "0")]}
    h = {"Idempotency-Key": "idem-A"}
    r1 = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r1.status_code == 202 and r1.json() == {"accepted": 2, "window": 1}, r1.text
    for epoch in (2, 3, 4):
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
    before = await _all_cells(api, name, range(1, 5))
    assert [before[w]["_hot"] for w in (2, 3, 4)] == [b"0"] * 3
    r2 = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r2.status_code == 202, r2.text
    assert r2.content == r1.content  # the first answer, byte for byte: nothing more
    assert r2.headers.get("Idempotent-Replayed") == "true"
    assert await _all_cells(api, name, range(1, 5)) == before  # counted once, nowhere else
    # the same key with another body is still refused, and accepted nowhere
    other = {"observations": [obs("u1", "i1", 20, "0")]}
    r3 = await api.post(_url(name), role="producer", json=other, headers=h)
    assert r3.status_code == 422 and r3.json()["detail"] == REUSED, r3.text
    assert "Idempotent-Replayed" not in r3.headers
    assert await _all_cells(api, name, range(1, 5)) == before


async def test_the_issue_sequence_send_roll_send_roll_send(api: Api) -> None:
    """The same body and key three times with a roll between each: one acceptance."""
    name = await new_stream(api, "idt", hot_windows=1, retention_windows=10)
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    h = {"Idempotency-Key": "idem-A"}
    answers = []
    for epoch in (2, 3, None):
        r = await api.post(_url(name), role="producer", json=body, headers=h)
        assert r.status_code == 202, r.text
        answers.append(r.json())
        if epoch is not None:
            assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
    assert answers == [{"accepted": 1, "window": 1}] * 3
    cells = await _all_cells(api, name, range(1, 4))
    assert [cells[w]["_hot"] for w in (1, 2, 3)] == [b"1", b"0", b"0"]


@pytest.mark.parametrize("hot_windows", [1, 2])
async def test_racing_identical_requests_across_rolls(api: Api, hot_windows: int) -> None:
    """Retries racing several rolls land in one window only, with one hot window too."""
    name = await new_stream(api, "idt", hot_windows=hot_windows, retention_windows=20)
    body = {"observations": [obs("u1", "i1", 20, "1")] * 2}

    async def rolls() -> None:
        for _ in range(4):
            await lifecycle_roll.roll(ctx=api.ctx, name=name)
            await asyncio.sleep(0)

    async def retries() -> list[Any]:
        out = []
        for _ in range(6):
            out.append(await api.post(_url(name), role="producer", json=body, headers=h))
        return out

    h = {"Idempotency-Key": "k-race"}
    results = await asyncio.gather(retries(), retries(), retries(), rolls())
    rs = [r for batch in results if batch is not None for r in batch]
    rs.append(await api.post(_url(name), role="producer", json=body, headers=h))  # rolls done
    assert all(r.status_code == 202 for r in rs), [r.text for r in rs]
    assert len({r.content for r in rs}) == 1
    assert sum("Idempotent-Replayed" not in r.headers for r in rs) == 1
    cells = await _all_cells(api, name, range(1, 6))
    assert sum(int(c["_hot"] or 0) for c in cells.values()) == 2


async def test_a_pointer_left_at_a_window_that_never_took_the_batch_moves_on(api: Api) -> None:
    """A request that made its key's pointer and died before accepting (the pointer names a
    window without the batch): once that window is closed, a retry is accepted, once, in the
    open window."""
    name = await new_stream(api, "idt", hot_windows=1, retention_windows=10)
    rt = await streams.runtime(ctx=api.ctx, name=name)
    store = api.ctx.stores.ingest
    token = key_token("idem-died", rt.hash_seed, producer_scope(api))
    status, window, _ = await store.claim(stream=name, token=token, ttl=600, cap=10)
    assert (status, window) == ("new", 1)
    for epoch in (2, 3):
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    h = {"Idempotency-Key": "idem-died"}
    r1 = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r1.status_code == 202 and r1.json() == {"accepted": 1, "window": 3}, r1.text
    assert "Idempotent-Replayed" not in r1.headers
    r2 = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r2.json() == r1.json() and r2.headers.get("Idempotent-Replayed") == "true"
    cells = await _all_cells(api, name, range(1, 4))
    assert [cells[w]["_hot"] for w in (1, 2, 3)] == [b"0", b"0", b"1"]


async def test_records_hold_no_row_expire_by_ttl_and_then_the_key_is_new(api: Api) -> None:
    name = await new_stream(api, "idt", hot_windows=1, retention_windows=10)
    body = {"observations": [obs("canary-user", "canary-item", 20, "1")]}
    h = {"Idempotency-Key": "idem-T"}
    assert (await api.post(_url(name), role="producer", json=body, headers=h)).status_code == 202
    for epoch in (2, 3):
        assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": epoch}
    r = api.ctx.redis
    ttl = api.ctx.settings.idempotency_ttl_seconds
    rt = await streams.runtime(ctx=api.ctx, name=name)
    token = key_token("idem-T", rt.hash_seed, producer_scope(api))
    pointer = api.ctx.keys.idem_pointer(name, token)
    record = api.ctx.keys.idem_window(name, 1)
    # the pointer holds the window; the record a keyed token, a keyed fingerprint, the answer
    assert await r.get(pointer) == b"1"
    [(field, value)] = (await r.hgetall(record)).items()
    assert field == token.encode()
    assert re.fullmatch(rb"[0-9a-f]{64}\{\"accepted\":1,\"window\":1\}", value), value
    for key in (pointer, record):
        assert 0 < await r.ttl(key) <= ttl
    # what a key leaves in Redis after its window's hot period: those two keys, no row
    mine = [k async for k in r.scan_iter(match=f"*{{{name}*", count=1000)]
    left = b"".join([k for k in mine if b"idem" in k or b"idk" in k])
    assert b"canary" not in left and b"idem-T" not in left
    # the TTL passed (its keys expired): the same key and body are a new batch
    await r.delete(pointer, record)
    again = await api.post(_url(name), role="producer", json=body, headers=h)
    assert (
        again.json() == {"accepted": 1, "window": 3} and "Idempotent-Replayed" not in again.headers
    )


async def test_records_made_before_pointers_go_with_the_hot_period(api: Api) -> None:
    """A window's record hash without a TTL (made when records went with the hot period and
    fingerprints were the rows' alone; no pointer leads to it) is still a retry while its
    window is hot, and deleted when it leaves the hot period."""
    name = await new_stream(api, "idt", hot_windows=2, retention_windows=10)
    rt = await streams.runtime(ctx=api.ctx, name=name)
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    fingerprint = batch_fingerprint(batch_rows(IngestIn.model_validate(body)), rt.hash_seed)
    record = api.ctx.keys.idem_window(name, 1)
    token = key_token("idem-old", rt.hash_seed)
    await api.ctx.redis.hset(record, token, fingerprint + '{"accepted":1,"window":1}')
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    h = {"Idempotency-Key": "idem-old"}
    for _ in range(2):  # found there each time: no pointer is made to the open window
        r = await api.post(_url(name), role="producer", json=body, headers=h)
        assert r.json() == {"accepted": 1, "window": 1} and r.headers.get("Idempotent-Replayed")
        assert not await api.ctx.redis.exists(api.ctx.keys.idem_pointer(name, token))
    assert (await window_cells(api.ctx, name, 2))["_hot"] == b"0"
    # one made in the open window, with the rows' fingerprint alone, is a retry there too
    other = key_token("idem-old2", rt.hash_seed)
    open_record = api.ctx.keys.idem_window(name, 2)
    await api.ctx.redis.hset(open_record, other, fingerprint + '{"accepted":1,"window":2}')
    h = {"Idempotency-Key": "idem-old2"}
    r = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r.json() == {"accepted": 1, "window": 2} and r.headers.get("Idempotent-Replayed")
    assert (await window_cells(api.ctx, name, 2))["_hot"] == b"0"
    assert await api.ctx.redis.ttl(open_record) > 0  # a pointer leads there now: kept as long
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    assert not await api.ctx.redis.exists(record)


async def test_a_stream_remembers_at_most_its_cap_of_keys(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond the cap a new key is refused (429, Retry-After, nothing accepted); its
    remembered keys are still replayed, batches without a key still accepted."""
    monkeypatch.setattr(api.ctx.settings, "idempotency_max_keys", 3)
    name = await new_stream(api, "idt", hot_windows=1, retention_windows=10)
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    for k in range(3):
        h = {"Idempotency-Key": f"cap-{k}"}
        r = await api.post(_url(name), role="producer", json=body, headers=h)
        assert r.status_code == 202 and "Idempotent-Replayed" not in r.headers, r.text
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r = await api.post(_url(name), role="producer", json=body, headers={"Idempotency-Key": "cap-3"})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert "IDEMPOTENCY_MAX_KEYS" in r.json()["detail"]
    r = await api.post(_url(name), role="producer", json=body, headers={"Idempotency-Key": "cap-1"})
    assert r.json() == {"accepted": 1, "window": 1} and r.headers.get("Idempotent-Replayed")
    assert (await api.post(_url(name), role="producer", json=body)).status_code == 202
    cells = await _all_cells(api, name, range(1, 3))
    assert [cells[w]["_hot"] for w in (1, 2)] == [b"3", b"1"]

"""An Idempotency-Key belongs to the producer that sent it (``service.ingest.service.key_scope``):
another producer sending the same key and body is neither told that batch exists (no replay,
no 422) nor able to block it; keys first sent before scoping keep their records until they
expire."""

from __future__ import annotations

from service.ingest.schemas import IngestIn
from service.ingest.service import batch_fingerprint, batch_rows, key_token
from service.streams import service as streams
from tests.conftest import Api
from tests.helpers import new_stream, obs, producer_scope, window_cells


def _url(name: str) -> str:
    return f"/v1/streams/{name}/observations"


async def test_another_producer_can_neither_confirm_nor_block_a_batch(api: Api) -> None:
    await api.add_keys(rival="producer")
    name = await new_stream(api, "ids", hot_windows=1, retention_windows=10)
    body = {"observations": [obs("victim", "item", 20, "1")]}
    h = {"Idempotency-Key": "order-1"}
    first = await api.post(_url(name), role="producer", json=body, headers=h)
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    # the rival guesses key and body: a new batch of its own, not a replay of the victim's
    guess = await api.post(_url(name), role="rival", json=body, headers=h)
    assert guess.status_code == 202 and "Idempotent-Replayed" not in guess.headers, guess.text
    # its retry is its own replay; another body under the key is its own key reused (422)
    mine = await api.post(_url(name), role="rival", json=body, headers=h)
    assert mine.headers.get("Idempotent-Replayed") == "true"
    other = {"observations": [obs("other", "item", 30, "0")]}
    assert (await api.post(_url(name), role="rival", json=other, headers=h)).status_code == 422
    # the victim's retry is still its replay; nothing was double counted for it
    again = await api.post(_url(name), role="producer", json=body, headers=h)
    assert again.json() == first.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert (await window_cells(api.ctx, name, 1))["_hot"] == b"2"  # victim's + rival's


async def test_a_rival_cannot_claim_a_key_first(api: Api) -> None:
    """Keys are often predictable (an order number): a rival sending under it first does not
    make the producer's own batch refused."""
    await api.add_keys(rival="producer")
    name = await new_stream(api, "ids", hot_windows=1, retention_windows=10)
    h = {"Idempotency-Key": "order-2"}
    junk = {"observations": [obs("junk", "item", 20, "0")]}
    assert (await api.post(_url(name), role="rival", json=junk, headers=h)).status_code == 202
    body = {"observations": [obs("real", "item", 20, "1")]}
    r = await api.post(_url(name), role="producer", json=body, headers=h)
    assert r.status_code == 202 and "Idempotent-Replayed" not in r.headers, r.text


async def test_a_key_first_sent_before_scoping_is_still_a_retry(api: Api) -> None:
    """A pointer and record made with the unscoped token (before keys were scoped) are found
    by the retry, which is not accepted again."""
    name = await new_stream(api, "ids", hot_windows=1, retention_windows=10)
    rt = await streams.runtime(ctx=api.ctx, name=name)
    body = {"observations": [obs("u1", "i1", 20, "1")]}
    rows = batch_rows(IngestIn.model_validate(body))
    old = key_token("order-3", rt.hash_seed)
    assert old != key_token("order-3", rt.hash_seed, producer_scope(api))
    r = api.ctx.redis
    await r.set(api.ctx.keys.idem_pointer(name, old), b"1", ex=600)
    record = batch_fingerprint(rows, rt.hash_seed, old) + '{"accepted":1,"window":1}'
    await r.hset(api.ctx.keys.idem_window(name, 1), old, record)
    await r.expire(api.ctx.keys.idem_window(name, 1), 600)
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    h = {"Idempotency-Key": "order-3"}
    again = await api.post(_url(name), role="producer", json=body, headers=h)
    assert again.json() == {"accepted": 1, "window": 1}, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert (await window_cells(api.ctx, name, 2))["_hot"] == b"0"

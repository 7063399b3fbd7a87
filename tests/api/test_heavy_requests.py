"""No request keeps the event loop: bodies are capped per endpoint before they are read, a
large one is parsed and validated in a worker thread a few at a time, and the calculator's
work is bounded and cached. Each heavy request kind runs while ``/healthz`` is polled, which
must keep answering within a second (it waited 69 s for one request of U+FDFA candidates, and
8.7 s for eight large anonymisation bodies)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from service.api import limits
from service.context import AppContext
from service.core.annotation import sampled_kanon as kanon
from service.privacy import service as privacy_service
from tests.conftest import Api, in_process_api
from tests.helpers import new_stream, obs
from tests.queues.test_queues import make_queue

HEALTHZ_BOUND = 1.0  # seconds: generous, on a shared 2-core machine
ROLES = ("admin", "producer", "curator", "analyst")
JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def api_with(ctx: AppContext, **settings: Any) -> AsyncIterator[Api]:
    """The in-process API on ``ctx`` with some settings changed."""
    changed = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=settings))
    async with in_process_api(changed, ROLES) as api:
        yield api


@asynccontextmanager
async def healthz_watch(client: httpx.AsyncClient) -> AsyncIterator[list[float]]:
    """Poll ``/healthz`` every 20 ms meanwhile; yields how long each poll waited past its due
    time (a blocked loop delays the wake-up as well as the answer)."""
    waits: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            due = loop.time() + 0.02
            await asyncio.sleep(0.02)
            r = await client.get("/healthz")
            assert r.status_code == 200
            waits.append(loop.time() - due)

    task = asyncio.create_task(poll())
    await asyncio.sleep(0.05)
    try:
        yield waits
    finally:
        done.set()
        await task


def assert_fast(waits: list[float]) -> None:
    print(f"/healthz: {len(waits)} polls, the longest waited {max(waits):.3f} s")
    assert len(waits) >= 3 and max(waits) < HEALTHZ_BOUND, f"/healthz waited {max(waits):.2f} s"


# --- body sizes ------------------------------------------------------------------------------


async def test_the_large_body_routes_are_routes_with_a_body(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    with_body = {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if "requestBody" in op
    }
    assert limits.LARGE_BODY_ROUTES.issubset(with_body)
    settings = api.ctx.settings
    for method, path in with_body:
        concrete = path.replace("{stream}", "s1").replace("{queue}", "q1")
        want = (
            settings.max_body_bytes
            if (method, path) in limits.LARGE_BODY_ROUTES
            else min(settings.max_small_body_bytes, settings.max_body_bytes)
        )
        assert limits.body_limit(settings, method, concrete) == want, path


async def test_a_small_endpoint_refuses_a_large_body_before_anything(api: Api) -> None:
    small = api.ctx.settings.max_small_body_bytes
    body = b"{" + b" " * small + b"}"
    r = await api.client.post("/v1/admin/keys", content=body, headers=JSON)  # no key
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "PayloadTooLarge" and str(small) in r.json()["detail"]
    # the same size is fine where batches go (here: no key, so 401)
    r = await api.client.post("/v1/streams/s1/observations", content=body, headers=JSON)
    assert r.status_code == 401, r.text


async def test_a_chunked_body_over_a_small_endpoints_limit_is_413(api: Api) -> None:
    small = api.ctx.settings.max_small_body_bytes

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"role": "producer", "name": "'
        for _ in range(small // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    r = await api.post("/v1/admin/keys", content=chunks(), headers=JSON)
    assert r.status_code == 413, r.text
    assert str(small) in r.json()["detail"]


# --- heavy bodies: a thread, a few at a time ---------------------------------------------------


async def test_a_heavy_body_is_validated_in_a_worker_thread(
    ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    validate = limits.validate

    def spy(field: Any, raw: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return validate(field, raw)

    monkeypatch.setattr(limits, "validate", spy)
    async with api_with(ctx, heavy_body_bytes=1024) as api:
        name = await new_stream(api, "heavy")
        url = f"/v1/streams/{name}/observations"
        rows = [obs(f"u{i}", f"i{i}", 30, "1") for i in range(50)]
        r = await api.post(url, "producer", json={"observations": rows})
        assert r.status_code == 202, r.text
        assert threads and threads[-1] != threading.main_thread().name
        # its errors are the light path's: a missing field, then a malformed body
        bad = {"observations": [*rows[:49], {"item": "i"}]}
        r = await api.post(url, "producer", json=bad)
        assert r.status_code == 422 and r.json()["detail"].startswith("observations[49]")
        r = await api.post(url, "producer", content=b"[" * 2000, headers=JSON)
        assert r.status_code == 422 and "JSON decode error" in r.json()["detail"]
        assert len(threads) == 3
        # a light body is parsed by FastAPI on the loop, as before
        r = await api.post(url, "producer", json={"observations": rows[:1]})
        assert r.status_code == 202 and len(threads) == 3


async def test_a_heavy_body_that_finds_no_slot_is_429_with_retry_after(ctx: AppContext) -> None:
    async with api_with(
        ctx, heavy_body_bytes=1024, heavy_requests=1, heavy_wait_seconds=0.2
    ) as api:
        name = await new_stream(api, "gate")
        url = f"/v1/streams/{name}/observations"
        rows = orjson.dumps({"observations": [obs(f"u{i}", "i", 30, "1") for i in range(50)]})
        release = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:  # chunked: heavy, holds its slot
            yield rows[:100]
            await release.wait()
            yield rows[100:]

        first = asyncio.create_task(api.post(url, "producer", content=slow_body(), headers=JSON))
        await asyncio.sleep(0.1)
        r = await api.post(url, "producer", content=rows, headers=JSON)
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == str(limits.RETRY_AFTER_SECONDS)
        assert "SELECTIVITY_HEAVY_REQUESTS" in r.json()["detail"]
        # a light body does not wait for the slot
        light = {"observations": [obs("u", "i", 30, "1")]}
        assert (await api.post(url, "producer", json=light)).status_code == 202
        release.set()
        assert (await first).status_code == 202
        # the slot came back
        assert (await api.post(url, "producer", content=rows, headers=JSON)).status_code == 202


@pytest.mark.slow
async def test_healthz_stays_fast_during_u_fdfa_candidates(api: Api) -> None:
    await api.add_keys(curator="curator")
    q = await make_queue(api)
    url = f"/v1/queues/{q}/candidates"
    n = api.ctx.settings.max_batch
    # each 550 code points sent and 9,900 characters once normalised: refused at the first
    refused = orjson.dumps({"candidates": [{"text": "\ufdfa" * 550, "uncertainty": 0.5}] * n})
    # each 1,998 characters once normalised: accepted, normalised in a thread
    accepted = orjson.dumps({"candidates": [{"text": "\ufdfa" * 111, "uncertainty": 0.5}] * n})
    async with healthz_watch(api.client) as waits:
        r = await api.post(url, "curator", content=refused, headers=JSON)
        assert r.status_code == 422 and r.json()["detail"].startswith("candidates[0].text")
        r = await api.post(url, "curator", content=accepted, headers=JSON)
        assert r.status_code == 200, r.text
    assert_fast(waits)


@pytest.mark.slow
async def test_healthz_stays_fast_during_eight_large_anonymisation_bodies(ctx: AppContext) -> None:
    # 15 MB each, within the run-size limit (rows² × (quasi-identifiers + 1)); many small
    # values, the costliest kind to validate (each is checked against the row's value types)
    rows = [{f"c{j}": (i * 7 + j) % 100_000 for j in range(30)} for i in range(44_000)]
    body = orjson.dumps(
        {"source": {"rows": rows}, "k": 2, "quasi_identifiers": [{"name": "c0", "kind": "range"}]}
    )
    del rows
    assert len(body) > 15_000_000
    async with api_with(ctx, max_body_bytes=32 * 1024 * 1024, heavy_wait_seconds=60) as api:
        async with healthz_watch(api.client) as waits:
            answers = await asyncio.gather(
                *(
                    api.post("/v1/anonymizations", "analyst", content=body, headers=JSON)
                    for _ in range(8)
                )
            )
        # 429: no heavy slot in time, or the user-job backlog is full
        assert {a.status_code for a in answers} <= {202, 429}, [a.text for a in answers]
        assert any(a.status_code == 202 for a in answers)
    assert_fast(waits)


# --- the calculator ----------------------------------------------------------------------------

URL = "/v1/privacy/sampling-k-anonymity"
ISSUE = {"k": 1_000_000, "epsilon": 0.0011, "delta": 1e-300}  # took 20.7 s


@pytest.fixture
def fresh_answers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Empty answer and δ caches (a parametrised rerun in the same process would find the
    work done), and the count of answers computed."""
    monkeypatch.setattr(privacy_service, "_answers", OrderedDict())
    kanon.delta.cache_clear()
    computed: list[int] = []
    answer = privacy_service._answer

    def counting(body: Any) -> Any:
        computed.append(1)
        return answer(body)

    monkeypatch.setattr(privacy_service, "_answer", counting)
    return computed


@pytest.mark.slow
async def test_the_calculator_bounds_its_work_and_caches_the_answer(
    api: Api, fresh_answers: list[int]
) -> None:
    async with healthz_watch(api.client) as waits:
        r = await api.post(URL, "analyst", json=ISSUE)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("beta, delta: solving for beta at k=1000000, epsilon=0.0011")
    assert "131072 evaluations" in detail
    assert_fast(waits)
    # asked again: the cached 422, not another second of work
    r = await api.post(URL, "analyst", json=ISSUE)
    assert r.status_code == 422 and r.json()["detail"] == detail
    ok = {"k": 1_000_000, "epsilon": 1.0, "delta": 1e-300}
    first = await api.post(URL, "analyst", json=ok)
    again = await api.post(URL, "analyst", json=ok)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert len(fresh_answers) == 2


async def test_a_calculation_that_finds_no_slot_is_429(
    ctx: AppContext, fresh_answers: list[int]
) -> None:
    async with api_with(ctx, calculator_concurrency=1, heavy_wait_seconds=0.1) as api:
        gate = limits.Gate(slots=1, wait_seconds=0.1, busy="the calculator")
        api.client._transport.app.state.gates = {"calculator": gate}  # type: ignore[attr-defined]
        async with gate.hold():  # another calculation holds the only slot
            r = await api.post(URL, "analyst", json={"k": 10, "beta": 0.1, "epsilon": 1.0})
        assert r.status_code == 429 and r.headers["Retry-After"], r.text
        r = await api.post(URL, "analyst", json={"k": 10, "beta": 0.1, "epsilon": 1.0})
        assert r.status_code == 200 and len(fresh_answers) == 1

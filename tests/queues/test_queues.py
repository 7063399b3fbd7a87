"""Annotation queues end to end on the real Redis and SQL backends (docs/ARCHITECTURE.md,
"Annotation queues"). The service's clock is the test's (``clock``): a release period ends when
the test says so, and ``release`` runs the release job's service for one queue."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from service.core.annotation import sampled_kanon as kanon
from service.core.annotation import sampling
from service.queues import service as qservice
from tests.conftest import Api, unique
from tests.helpers import stream_body

HOUR_MS = 3_600_000


class MaskSpy:
    """Records which candidates the real CSPRNG sampling kept (the ground truth of the test);
    ``force`` replaces the draw (to make a path deterministic)."""

    def __init__(self, force: bool | None = None) -> None:
        self.kept: list[np.ndarray] = []
        self.force = force

    def __call__(self, n: int, beta: float, **kw: Any) -> np.ndarray:
        mask = (
            np.full(n, self.force, dtype=bool)
            if self.force is not None
            else sampling.bernoulli_mask(n, beta, **kw)
        )
        self.kept.append(mask)
        return mask


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> MaskSpy:
    s = MaskSpy()
    monkeypatch.setattr(qservice, "bernoulli_mask", s)
    return s


@pytest.fixture
def keep_all(monkeypatch: pytest.MonkeyPatch) -> MaskSpy:
    s = MaskSpy(force=True)
    monkeypatch.setattr(qservice, "bernoulli_mask", s)
    return s


class Clock:
    """The service's ``_now_ms``: fixed, ten minutes into an hour, moved by the test."""

    def __init__(self) -> None:
        self.ms = 500_000 * HOUR_MS + 600_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(qservice, "_now_ms", c)
    return c


async def release(api: Api, q: str, clock: Clock, hours: float = 1) -> dict[str, int]:
    """Let ``hours`` pass, then run the release job's service on queue ``q``."""
    clock.ms += int(hours * HOUR_MS)
    rt = await qservice.runtime(ctx=api.ctx, name=q)
    return await qservice.release_queue(api.ctx, rt, now_ms=clock.ms)


async def make_queue(api: Api, **over: Any) -> str:
    """Most test queues are far above the default δ ceiling (1e-6): they say they mean it."""
    body: dict[str, Any] = {
        "name": unique("q"),
        "beta": 0.5,
        "k": 10,
        "labels": ["0", "1"],
        "payload_kind": "text",
        "uncertainty": "client",
        "accept_delta_above_ceiling": True,
    }
    body.update(over)
    r = await api.post("/v1/queues", "curator", json=body)
    assert r.status_code == 201, r.text
    return body["name"]


def unc_of(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) / 0xFFFFFF


async def submit(api: Api, q: str, texts: list[str], batch: int = 500) -> None:
    for i in range(0, len(texts), batch):
        chunk = [
            {"text": t, "uncertainty": unc_of(sampling.canonical_text(t))}
            for t in texts[i : i + batch]
        ]
        r = await api.post(f"/v1/queues/{q}/candidates", "curator", json={"candidates": chunk})
        assert r.status_code == 200, r.text
        assert r.json() == {"received": len(chunk)}


async def lease_all(api: Api, q: str, who: str = "ann1") -> list[dict]:
    out = []
    while True:
        r = await api.get(f"/v1/queues/{q}/next?n=50", who)
        assert r.status_code == 200, r.text
        if not r.json()["tasks"]:
            return out
        out += r.json()["tasks"]


async def test_zipf_stream_releases_exactly_the_k_anonymous_examples_in_uncertainty_order(
    qapi: Api, spy: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=10)
    rng = np.random.default_rng(3)
    ranks = rng.zipf(1.3, size=6000)
    # many unique queries: most ranks are rare; mixed case and spacing canonicalise together
    texts = [f"Query  number {r}" if i % 2 else f"query number {r}" for i, r in enumerate(ranks)]
    await submit(qapi, q, texts)
    assert await lease_all(qapi, q) == []  # nothing before the release period ends
    assert (await release(qapi, q, clock))["periods"] == 1
    kept = np.concatenate(spy.kept)
    sampled = Counter(
        sampling.canonical_text(t) for t, m in zip(texts, kept.tolist(), strict=True) if m
    )
    tasks = await lease_all(qapi, q)
    released = [t["text"] for t in tasks]
    assert len(set(released)) == len(released)  # one release per distinct key
    # exactly the keys with k sampled candidates in the period (one bucket per key here)
    assert sorted(released) == sorted(t for t, n in sampled.items() if n >= 10)
    assert sum(1 for n in sampled.values() if n < 10) > 100  # the rare ones are not
    # releases follow uncertainty order; the uncertainty is the class's bucket, not a score
    us = [t["uncertainty"] for t in tasks]
    assert us == sorted(us, reverse=True)
    for t in tasks:
        u = qservice.bucket_middle(qservice.bucket_of(unc_of(t["text"])))
        assert t["uncertainty"] == u
    r = await qapi.get(f"/v1/queues/{q}/stats", "curator")
    s = r.json()
    assert s["received"] == 6000
    assert s["released"] == len(released) and s["leased"] == len(released)
    assert not {"sampled", "distinct", "tracking", "waiting_under_k"} & set(s)


async def test_candidate_response_never_says_whether_sampled(qapi: Api) -> None:
    q = await make_queue(qapi, beta=0.01, k=1)
    bodies = set()
    for _ in range(20):
        r = await qapi.post(
            f"/v1/queues/{q}/candidates",
            "curator",
            json={"candidates": [{"text": "hello there", "uncertainty": 0.5}]},
        )
        bodies.add((r.status_code, r.content))
    assert bodies == {(200, b'{"received":1}')}


async def test_unsampled_and_unreleased_candidates_are_stored_nowhere(
    qapi: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=3)
    drop = MaskSpy(force=False)
    monkeypatch.setattr(qservice, "bernoulli_mask", drop)
    await submit(qapi, q, ["secret-unsampled alpha"] * 5)
    keep = MaskSpy(force=True)
    monkeypatch.setattr(qservice, "bernoulli_mask", keep)
    await submit(qapi, q, ["secret-rare bravo", "secret-rare bravo"])  # 2 < k
    r = qapi.ctx.redis
    found = []
    async for key in r.scan_iter(match=qapi.ctx.keys.queue_pattern(q), count=1000):
        kind = (await r.type(key)).decode()
        if kind == "string":
            blob = await r.get(key)
        elif kind == "hash":
            blob = repr(await r.hgetall(key)).encode()
        elif kind == "set":
            blob = repr(await r.smembers(key)).encode()
        elif kind == "zset":
            blob = repr(await r.zrange(key, 0, -1)).encode()
        else:
            blob = await r.dump(key) or b""
        found.append(blob)
    assert found and not any(b"secret" in b for b in found)
    assert not any("secret" in m for m in caplog.messages)
    # the release of the period deletes even the keyed digests of what stayed below k
    await release(qapi, q, clock)
    left = [
        key
        async for key in r.scan_iter(match=qapi.ctx.keys.queue_pattern(q), count=1000)
        if b":p:" in key
    ]
    assert left == []
    assert (await lease_all(qapi, q)) == []
    assert (await qapi.get(f"/v1/queues/{q}/labels", "curator")).json()["labels"] == []
    s = (await qapi.get(f"/v1/queues/{q}/stats", "curator")).json()
    assert s["received"] == 7 and s["released"] == 0


async def test_two_concurrent_annotators_never_hold_the_same_task(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=1)
    await submit(qapi, q, [f"example {i}" for i in range(60)])
    await release(qapi, q, clock)
    results = await asyncio.gather(
        *(qapi.get(f"/v1/queues/{q}/next?n=3", who) for _ in range(12) for who in ("ann1", "ann2"))
    )
    ids = [t["id"] for r in results for t in r.json()["tasks"]]
    assert len(ids) == 60 and len(set(ids)) == 60


async def test_expired_lease_is_requeued_and_heartbeat_extends(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=1, lease_seconds=10)
    await submit(qapi, q, ["one", "two"])
    await release(qapi, q, clock)
    a = (await qapi.get(f"/v1/queues/{q}/next?n=2", "ann1")).json()["tasks"]
    assert len(a) == 2
    held, lost = a[0]["id"], a[1]["id"]
    clock.ms += 8_000
    r = await qapi.post(f"/v1/queues/{q}/tasks/{held}/heartbeat", "ann1")
    assert r.status_code == 200, r.text
    r = await qapi.post(f"/v1/queues/{q}/tasks/{held}/heartbeat", "ann2")
    assert r.status_code == 404  # not ann2's lease: as if there were no such task
    clock.ms += 4_000  # 12 s: `lost` expired, `held` was extended to 18 s
    b = (await qapi.get(f"/v1/queues/{q}/next?n=2", "ann2")).json()["tasks"]
    assert [t["id"] for t in b] == [lost]
    r = await qapi.post(f"/v1/queues/{q}/tasks/{lost}/heartbeat", "ann1")
    assert r.status_code == 404  # ann2's now
    # ann1's late label of the task ann2 now holds is refused, saying nothing of ann2
    r = await qapi.post(f"/v1/queues/{q}/tasks/{lost}/label", "ann1", json={"label": "1"})
    assert r.status_code == 404 and "not leased to you" in r.json()["detail"]


async def test_skip_returns_the_task_to_others_only(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=1)
    await submit(qapi, q, ["only one"])
    await release(qapi, q, clock)
    t = (await qapi.get(f"/v1/queues/{q}/next", "ann1")).json()["tasks"][0]
    r = await qapi.post(f"/v1/queues/{q}/tasks/{t['id']}/skip", "ann1")
    assert r.status_code == 200 and r.json()["skipped"] is True
    assert (await qapi.get(f"/v1/queues/{q}/next", "ann1")).json()["tasks"] == []
    again = (await qapi.get(f"/v1/queues/{q}/next", "ann2")).json()["tasks"]
    assert [x["id"] for x in again] == [t["id"]]


async def test_labels_are_idempotent_and_exported(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=2)
    # three spellings of one key (k = 2 reached), one of another (not)
    await submit(qapi, q, ["Hello  World", "hello world", " HELLO world", "other"])
    await release(qapi, q, clock)
    (t,) = (await qapi.get(f"/v1/queues/{q}/next?n=5", "ann1")).json()["tasks"]
    assert t["text"] == "hello world"  # the canonical form, not one submitter's spelling
    url = f"/v1/queues/{q}/tasks/{t['id']}/label"
    r1 = await qapi.post(url, "ann1", json={"label": "1"})
    r2 = await qapi.post(url, "ann1", json={"label": "1"})
    assert r1.status_code == r2.status_code == 200
    assert r1.json()["replayed"] is False and r2.json()["replayed"] is True
    r3 = await qapi.post(url, "ann1", json={"label": "0"})  # a label is final
    assert r3.status_code == 409 and "already labelled by you" in r3.json()["detail"]
    assert "'1'" not in r3.json()["detail"]
    r4 = await qapi.post(url, "ann1", json={"label": "7"})
    assert r4.status_code == 422 and "label" in r4.json()["detail"]
    r5 = await qapi.post(
        f"/v1/queues/{q}/tasks/t_0123456789abcdef/label", "ann1", json={"label": "1"}
    )
    assert r5.status_code == 404
    export = (await qapi.get(f"/v1/queues/{q}/labels", "curator")).json()
    assert [(x["text"], x["label"]) for x in export["labels"]] == [("hello world", "1")]
    assert export["next_after"] is None
    s = (await qapi.get(f"/v1/queues/{q}/stats", "ann1")).json()
    assert s["labelled"] == 1 and s["label_counts"] == {"1": 1} and s["in_pool"] == 0
    assert await qapi.ctx.redis.hget(qapi.ctx.keys.queue(q, "tasks"), t["id"]) is None
    # roles: annotators cannot export or submit; curators cannot lease
    assert (await qapi.get(f"/v1/queues/{q}/labels", "ann1")).status_code == 403
    assert (await qapi.get(f"/v1/queues/{q}/next", "curator")).status_code == 403
    r = await qapi.post(f"/v1/queues/{q}/candidates", "ann1", json={"candidates": [{"text": "x"}]})
    assert r.status_code == 403


async def test_labelled_record_becomes_one_observation(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:

    name = unique("qs")
    r = await qapi.post("/v1/streams", json=stream_body(name))
    assert r.status_code == 201, r.text
    q = await make_queue(
        qapi,
        payload_kind="record",
        stream=name,
        labels=None,
        uncertainty="model",
        k=1,
    )
    rec = {"user": "u1", "item": "i9", "age": 31.0}
    r = await qapi.post(
        f"/v1/queues/{q}/candidates", "curator", json={"candidates": [{"record": rec}]}
    )
    assert r.status_code == 200, r.text
    await release(qapi, q, clock)
    (t,) = (await qapi.get(f"/v1/queues/{q}/next", "ann1")).json()["tasks"]
    assert t["record"] == {"age": 31, "item": "i9", "user": "u1"}
    assert t["uncertainty"] == 0.5  # no reference model yet: the documented fallback
    epoch = (await qapi.get(f"/v1/streams/{name}", "analyst")).json()["epoch"]
    before = await qapi.ctx.stores.windows.hot_length(name, epoch)
    url = f"/v1/queues/{q}/tasks/{t['id']}/label"
    r1 = await qapi.post(url, "ann1", json={"label": "1"})
    assert r1.status_code == 200, r1.text
    assert r1.json()["observation_window"] == epoch
    assert (await qapi.post(url, "ann1", json={"label": "1"})).json()["replayed"] is True
    assert await qapi.ctx.stores.windows.hot_length(name, epoch) == before + 1
    s = (await qapi.get(f"/v1/queues/{q}/stats", "curator")).json()
    assert s["scored_by_fallback"] == 1 and s["scored_by_model"] == 0
    # bad records are refused before sampling, naming the field
    r = await qapi.post(
        f"/v1/queues/{q}/candidates", "curator", json={"candidates": [{"record": {"nope": 1}}]}
    )
    assert r.status_code == 422 and "nope" in r.json()["detail"]


async def test_queue_privacy_and_stream_ledger(qapi: Api) -> None:
    name = unique("ql")
    r = await qapi.post(
        "/v1/streams",
        json=stream_body(name, privacy={"mechanism": "laplace", "epsilon": 0.5}),
    )
    assert r.status_code == 201
    q = await make_queue(
        qapi,
        payload_kind="record",
        stream=name,
        labels=None,
        beta=0.1,
        k=10,
        accept_delta_above_ceiling=False,  # 6.8e-08 is below the default ceiling
    )
    p = (await qapi.get(f"/v1/queues/{q}/privacy", "analyst")).json()
    assert p["epsilon"] == 1.0 and p["delta"] == pytest.approx(6.840415e-08, rel=1e-6)
    assert p["min_epsilon"] == pytest.approx(-np.log1p(-0.1))
    led = (await qapi.get(f"/v1/streams/{name}/privacy", "analyst")).json()
    obs = led["observation"]
    names = [part["name"] for part in obs["parts"]]
    assert names == ["count_tables", f"annotation_queue:{q}"]
    assert obs["epsilon"] == pytest.approx(0.5 + 1.0)
    assert obs["delta"] == pytest.approx(6.840415e-08, rel=1e-6)
    assert "Li, Qardaji & Su" in obs["parts"][1]["source"]
    assert led["annotation_queue"][0]["parameters"] == {
        "queue": q,
        "beta": 0.1,
        "k": 10,
        "release_seconds": 3600,
        "accept_delta_above_ceiling": False,
    }
    assert "accepted explicitly" not in obs["parts"][1]["source"]
    assert p["above_ceiling"] is False and p["delta_ceiling"] == 1e-6
    assert p["guarantee"].startswith("(ε, δ) = (1, 6.8e-08).")
    assert "2.72 times more or less likely" in p["guarantee"]


@pytest.mark.parametrize(
    ("over", "status", "needle"),
    [
        ({"beta": 1.2}, 422, "beta: Input should be less than or equal to 0.99"),
        ({"k": 0}, 422, "k: Input should be greater than or equal to 1"),
        ({"k": 10**7}, 422, "k: Input should be less than or equal to 1000000"),
        ({"epsilon": 0.1}, 422, "epsilon: must be >= -ln(1-beta)"),
        ({"uncertainty": "model"}, 422, "uncertainty: 'model' needs payload_kind 'record'"),
        ({"payload_kind": "record"}, 422, "stream: a 'record' queue needs"),
        ({"payload_kind": "record", "stream": "nosuchstream"}, 404, "stream 'nosuchstream'"),
        ({"labels": None}, 422, "labels: a 'text' queue needs"),
        ({"release_seconds": 0}, 422, "release_seconds: Input should be greater than or equal"),
        ({"release_seconds": 10**8}, 422, "release_seconds: Input should be less than or equal"),
        ({"lease_seconds": 1}, 422, "lease_seconds: Input should be greater than or equal to 5"),
        (
            {"accept_delta_above_ceiling": False},
            422,
            "k: the queue's delta = 0.0193 at beta=0.5, k=10, epsilon=1 exceeds the ceiling "
            "delta <= 1e-06 (SELECTIVITY_QUEUE_DELTA_CEILING)",
        ),
    ],
)
async def test_queue_creation_limits(qapi: Api, over: dict, status: int, needle: str) -> None:
    body = {
        "name": unique("q"),
        "beta": 0.5,
        "k": 10,
        "labels": ["0", "1"],
        "accept_delta_above_ceiling": True,
    }
    body.update(over)
    r = await qapi.post("/v1/queues", "curator", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]


async def test_candidate_limits(qapi: Api) -> None:
    q = await make_queue(qapi)
    url = f"/v1/queues/{q}/candidates"
    cases = [
        ({"candidates": [{"text": "x" * 2001, "uncertainty": 0.1}]}, 422, "2000"),
        ({"candidates": [{"text": "a", "uncertainty": 1.5}]}, 422, "uncertainty"),
        ({"candidates": [{"text": "a"}]}, 422, "candidates[0].uncertainty: required"),
        ({"candidates": [{"text": "   ", "uncertainty": 0.1}]}, 422, "empty after"),
        ({"candidates": [{"record": {"a": 1}, "uncertainty": 0.1}]}, 422, "takes text"),
        ({"candidates": []}, 422, "candidates"),
        ({"candidates": [{"text": "a", "uncertainty": 0.1}] * 2001}, 413, "limit of 2000"),
    ]
    for body, status, needle in cases:
        r = await qapi.post(url, "curator", json=body)
        assert r.status_code == status, (body, r.text)
        assert needle in r.json()["detail"], r.text
    r = await qapi.get(f"/v1/queues/{q}/next?n=51", "ann1")
    assert r.status_code == 422 and "50" in r.json()["detail"]
    assert (await qapi.get("/v1/queues/nosuch/stats", "curator")).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "check"),
    [
        ({"beta": 0.1, "k": 10, "epsilon": 1.0}, 200, {"delta": 6.840415e-08}),
        ({"beta": 0.1, "k": 5, "epsilon": 2.0}, 200, {"delta": 1e-05}),
        ({"beta": 0.1, "epsilon": 1.0, "delta": 1e-6}, 200, {"k": 9}),
        ({"k": 10, "epsilon": 1.0, "delta": 1e-6}, 200, {"solved_for": "beta"}),
        ({"beta": 0.5, "k": 10, "epsilon": 0.5}, 422, "epsilon: must be >= -ln(1-beta)"),
        (
            {"beta": 0.995, "k": 10, "epsilon": 9},
            422,
            "beta: Input should be less than or equal to 0.99",
        ),
        (
            {"beta": 0.1, "k": 2_000_000, "epsilon": 1},
            422,
            "k: Input should be less than or equal to 1000000",
        ),
        (
            {"beta": 0.1, "k": 10, "epsilon": 60},
            422,
            "epsilon: Input should be less than or equal to 50",
        ),
        ({"beta": 0.1, "epsilon": 1}, 422, "delta: required to solve for k"),
        ({"beta": 0.1, "k": 10, "epsilon": 1, "delta": 1e-5}, 422, "delta: give delta only"),
        ({"k": 1, "epsilon": 0.01, "delta": 1e-12}, 422, "not reachable"),
        ({"beta": 0.1, "k": 10, "epsilon": "NaN"}, 422, "epsilon"),
        # ε = −ln(1−β) computed in floating point, here a rounding error below log1p's value
        (
            {"beta": 0.1338862374271648, "k": 10, "epsilon": -math.log(1 - 0.1338862374271648)},
            200,
            {"epsilon": kanon.covered_epsilon(beta=0.1338862374271648)},
        ),
    ],
)
async def test_calculator_endpoint(qapi: Api, body: dict, status: int, check: Any) -> None:
    r = await qapi.post("/v1/privacy/sampling-k-anonymity", "analyst", json=body)
    assert r.status_code == status, r.text
    if status == 200:
        out = r.json()
        for k, v in check.items():
            assert out[k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v)
        if out["solved_for"] == "beta":
            assert out["delta"] <= 1e-6 and out["beta"] == pytest.approx(0.1325, abs=1e-3)
            assert out["delta"] == kanon.delta(k=10, beta=out["beta"], epsilon=1.0).delta
    else:
        assert check in r.json()["detail"]

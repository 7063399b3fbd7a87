"""What a k-anonymised release of a stream may hold, how long, and for whom
(docs/ARCHITECTURE.md, "k-anonymised releases"): never the user key, only the columns the
operator marks releasable; gone from Redis and the AOF at the roll that ends its oldest
window's hot period; readable by its creator only."""

from __future__ import annotations

import random
import secrets
from typing import Any

import pytest

from service.anonymize.store import AnonymizationStore
from service.coldstore import service as coldstore
from tests.conftest import Api, Backend, Jobs
from tests.helpers import aof_rewritten, ingest, new_stream, obs, redis_dump, stream_body
from workers.jobs import anonymize_run

URL = "/v1/anonymizations"
KEYED = {"mechanism": "none", "user_key": "user"}


def _rows(n: int, *, user: str = "u", item: str = "i", seed: int = 3) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    return [
        obs(f"{user}{i % 4}", f"{item}{i % 3}", rnd.randint(18, 70), "01"[i % 2]) for i in range(n)
    ]


def _body(name: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": {"stream": name},
        "k": 2,
        "quasi_identifiers": [{"name": "age", "kind": "range"}],
        "keep": [],
    }
    body.update(over)
    return body


async def _done(api: Api, body: dict[str, Any], role: str = "analyst") -> str:
    r = await api.post(URL, role=role, json=body)
    assert r.status_code == 202, r.text
    a = str(r.json()["id"])
    assert (await anonymize_run({"app": api.ctx}, id=a))["status"] == "done"
    return a


async def test_the_user_key_is_never_kept_nor_generalised(api: Api) -> None:
    canary = f"CANARYUSER-{secrets.token_hex(6)}"
    name = await new_stream(api, "anonuk", privacy=KEYED, releasable=["age", "item", "label"])
    await ingest(api, name, [obs(canary, "i", 30, "1"), *_rows(20)])
    for over, field in (
        ({"keep": ["user"]}, "keep"),
        ({"quasi_identifiers": [{"name": "user", "kind": "hierarchy"}]}, "quasi_identifiers"),
    ):
        r = await api.post(URL, role="analyst", json=_body(name, **over))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert field in detail and "'user' is the user key" in detail, detail
        assert canary not in r.text
    r = await api.post(
        f"{URL}/weights",
        role="analyst",
        json={
            "source": {"stream": name},
            "k": 2,
            "quasi_identifiers": [{"name": "user", "kind": "hierarchy"}],
            "sample": 6,
        },
    )
    assert r.status_code == 422 and "user key" in r.json()["detail"], r.text
    assert canary not in r.text
    # nor can the operator mark it releasable
    r = await api.post(
        "/v1/streams", json=stream_body(name + "-b", privacy=KEYED, releasable=["user"])
    )
    assert r.status_code == 422 and "releasable" in r.text and "user_key" in r.text, r.text


async def test_only_releasable_columns_are_read(api: Api) -> None:
    name = await new_stream(api, "anonrel", releasable=["age", "label"])
    await ingest(api, name, _rows(20))
    for over, field in (
        ({"keep": ["item"]}, "keep"),
        ({"keep": ["user"]}, "keep"),  # no user key here: a feature like any other
        ({"quasi_identifiers": [{"name": "item", "kind": "hierarchy"}]}, "quasi_identifiers"),
    ):
        r = await api.post(URL, role="analyst", json=_body(name, **over))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith(field) and "is not releasable" in detail, detail
        assert "['age', 'label']" in detail  # what is releasable
    a = await _done(api, _body(name, keep=["label"]))
    r = await api.get(f"{URL}/{a}/result?format=ndjson", role="analyst")
    assert r.status_code == 200 and r.text.count('"label"') == 20
    # a stream that marks nothing releasable (the default) releases nothing
    bare = await new_stream(api, "anonbare")
    await ingest(api, bare, _rows(10))
    r = await api.post(URL, role="analyst", json=_body(bare))
    assert r.status_code == 422 and "quasi_identifiers: 'age' is not releasable" in r.text
    # an unknown releasable column is refused when the stream is created
    r = await api.post("/v1/streams", json=stream_body(bare + "-b", releasable=["nope"]))
    assert r.status_code == 422 and "releasable" in r.text, r.text


async def test_a_release_is_gone_at_the_roll_that_ends_its_hot_period(
    api: Api, jobs: Jobs, backend: Backend
) -> None:
    ctx = api.ctx
    canary = f"CANARYITEM-{secrets.token_hex(6)}"
    name = await new_stream(api, "anonroll", releasable=["age", "item"])  # one hot window
    await ingest(api, name, [obs("u", canary, 44, "1"), *_rows(30)])
    a = await _done(api, _body(name, keep=["item"]))
    late = (await api.post(URL, role="analyst", json=_body(name, keep=["item"]))).json()["id"]
    r = await api.get(f"{URL}/{a}/result?format=csv", role="analyst")
    assert r.status_code == 200 and canary in r.text
    weights = {k: v for k, v in _body(name).items() if k != "keep"} | {"sample": 6}
    r = await api.post(f"{URL}/weights", role="analyst", json=weights)
    assert r.status_code == 201, r.text
    session = r.json()["session"]
    keys = [ctx.keys.anonymization(x, w) for x in (a, late) for w in ("meta", "result")]
    keys.append(ctx.keys.anonymization(session, "iml"))
    assert await ctx.redis.exists(*keys) == 4  # the late run has no result yet

    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # to 2: [2, 2]
    assert await ctx.redis.exists(*keys) == 0
    for url in (f"{URL}/{a}", f"{URL}/{a}/result", f"{URL}/{late}"):
        assert (await api.get(url, role="analyst")).status_code == 404
    r = await api.post(f"{URL}/weights/{session}", role="analyst", json={"choice": 0})
    assert r.status_code == 404, r.text
    # a job that runs after the roll computes nothing and re-creates nothing
    assert (await anonymize_run({"app": ctx}, id=late))["status"] == "expired"
    assert await ctx.redis.exists(*keys) == 0

    # once the hot rows are sealed and deleted too, the canary is nowhere in Redis or the AOF
    await jobs()
    assert (await coldstore.seal_stream(ctx=ctx, name=name)).windows_sealed >= 1
    assert canary.encode() not in await redis_dump(ctx)
    if backend.embedded is not None:
        await aof_rewritten(ctx)
        files = [p for p in backend.settings.data_dir.resolve().rglob("*aof*") if p.is_file()]
        assert files
        for p in files:
            assert canary.encode() not in p.read_bytes(), p


async def test_a_run_deleted_while_it_computes_is_not_written(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll's expire deletes a run whose job is computing: the job's end writes nothing
    (it would re-create the run with its rows)."""
    name = await new_stream(api, "anonrace", releasable=["age"])
    await ingest(api, name, _rows(20))
    r = await api.post(URL, role="analyst", json=_body(name))
    a = r.json()["id"]
    real_finish = AnonymizationStore.finish

    async def finish_after_delete(self: AnonymizationStore, run: str, **kw: Any) -> bool:
        await self.delete(name, [run])  # what expire does, between the compute and the write
        return await real_finish(self, run, **kw)

    monkeypatch.setattr(AnonymizationStore, "finish", finish_after_delete)
    assert (await anonymize_run({"app": api.ctx}, id=a))["status"] == "expired"
    for w in ("meta", "input", "result"):
        assert not await api.ctx.redis.exists(api.ctx.keys.anonymization(a, w))


async def test_a_release_belongs_to_its_creator(api: Api) -> None:
    name = await new_stream(api, "anonown", releasable=["age", "label"])
    await ingest(api, name, _rows(20))
    await api.add_keys(other="analyst", admin2="admin")
    a = await _done(api, _body(name, keep=["label"]))
    missing = "an_" + "0" * 32
    for role in ("other", "admin2", "admin"):
        for url in (f"{URL}/{a}", f"{URL}/{a}/result", f"{URL}/{a}/result?format=arrow"):
            r = await api.get(url, role=role)
            assert r.status_code == 404, (role, url, r.text)
            unknown = await api.get(url.replace(a, missing), role=role)
            assert r.json()["detail"] == unknown.json()["detail"].replace(missing, a)
    assert (await api.get(f"{URL}/{a}/result", role="analyst")).status_code == 200
    # an admin's own release is the admin's
    b = await _done(api, _body(name), role="admin2")
    assert (await api.get(f"{URL}/{b}", role="admin2")).status_code == 200
    assert (await api.get(f"{URL}/{b}", role="analyst")).status_code == 404
    # iML sessions too (inline rows: any column of the caller's own data)
    rows = [{"age": i, "city": f"c{i % 3}"} for i in range(12)]
    r = await api.post(
        f"{URL}/weights",
        role="analyst",
        json={
            "source": {"rows": rows},
            "k": 2,
            "quasi_identifiers": [
                {"name": "age", "kind": "range"},
                {"name": "city", "kind": "hierarchy"},
            ],
            "sample": 12,
        },
    )  # fmt: skip
    assert r.status_code == 201, r.text
    s = r.json()["session"]
    for role in ("other", "admin"):
        r = await api.post(f"{URL}/weights/{s}", role=role, json={"choice": 0})
        assert r.status_code == 404, r.text
    r = await api.post(f"{URL}/weights/{s}", role="analyst", json={"choice": 0})
    assert r.status_code == 200 and r.json()["answered"] == 1, r.text

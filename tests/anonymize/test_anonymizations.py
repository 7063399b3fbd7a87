"""k-anonymised releases over HTTP: inline rows and a stream's hot period, run by the worker's
job function, checked against the raw rows independently of the core (k-anonymity, the
generalised values, GIL/NGIL and the per-attribute loss), with roles, limits, lifetimes and
the audit log."""

from __future__ import annotations

import asyncio
import io
import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy import select

from service.anonymize import service as anonymize_service
from service.anonymize.schemas import MAX_INLINE_ROWS, AnonymizationCreate
from service.context import AppContext
from service.core.anonymity.hierarchy import Hierarchy, lca_by_walk, parse_hierarchy
from service.db.models import AuditEntry
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs
from workers.jobs import anonymize_run

EDUCATION = json.loads(
    (Path(__file__).resolve().parents[2] / "examples/adult/hierarchies/education.json").read_text()
)
URL = "/v1/anonymizations"


def _leaves(tree: dict[str, Any]) -> list[str]:
    kids = tree.get("children") or []
    return [tree["value"]] if not kids else [v for c in kids for v in _leaves(c)]


def _rows(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    edu = _leaves(EDUCATION)
    return [
        {
            "age": rnd.randint(17, 90),
            "hours": round(rnd.uniform(1, 99), 1),
            "education": rnd.choice(edu),
            "sex": rnd.choice(["Male", "Female"]),
            "income": rnd.choice(["<=50K", ">50K"]),
            "note": f"row-{i}",
        }
        for i in range(n)
    ]


QIS = [
    {"name": "age", "kind": "range"},
    {"name": "hours", "kind": "range"},
    {"name": "education", "kind": "hierarchy", "hierarchy": EDUCATION},
    {"name": "sex", "kind": "hierarchy"},
]


def _body(rows: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    body = {
        "source": {"rows": rows},
        "k": 5,
        "quasi_identifiers": QIS,
        "weights": {"age": 3.0, "education": 2.0},
        "keep": ["income"],
    }
    body.update(over)
    return body


async def _run(api: Api, a: str) -> dict[str, Any]:
    return await anonymize_run({"app": api.ctx}, id=a)


async def _create(api: Api, body: dict[str, Any], role: str = "analyst") -> str:
    r = await api.post(URL, role=role, json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def _download(api: Api, a: str, fmt: str) -> pa.Table:
    r = await api.get(f"{URL}/{a}/result?format={fmt}", role="analyst")
    assert r.status_code == 200, r.text
    if fmt == "csv":
        return pacsv.read_csv(
            io.BytesIO(r.content),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in ("age", "hours", "education", "sex")}
            ),
        )
    if fmt == "parquet":
        return pq.read_table(io.BytesIO(r.content))
    if fmt == "arrow":
        return pa.ipc.open_stream(r.content).read_all()
    return pa.Table.from_pylist([orjson.loads(line) for line in r.content.splitlines()])


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _check_release(
    table: pa.Table,
    rows: list[dict[str, Any]],
    *,
    k: int,
    ranges: list[str],
    trees: dict[str, Hierarchy],
    weights: dict[str, float],
    keep: list[str],
) -> tuple[float, dict[str, float]]:
    """Everything a release promises, from the raw rows alone (no core code but the tree
    parser and a parent walk): one row per input row in order, every cluster ≥ k rows and one
    generalised QI tuple per cluster, each range the cluster's [min, max], each hierarchy value
    the lowest common ancestor of the cluster's values, kept columns unchanged. Returns NGIL
    and the per-attribute loss recomputed."""
    out = table.to_pylist()
    assert len(out) == len(rows)
    members: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(out):
        members[int(row["cluster"])].append(i)
    qis = [*ranges, *trees]
    # k-anonymity of the released table itself: every QI tuple occurs at least k times
    tuples = Counter(tuple(str(row[q]) for q in qis) for row in out)
    assert min(tuples.values()) >= k
    assert min(len(m) for m in members.values()) >= k
    mean = sum(weights.get(q, 1.0) for q in qis) / len(qis)
    w = {q: weights.get(q, 1.0) / mean for q in qis}
    span = {q: max(float(r[q]) for r in rows) - min(float(r[q]) for r in rows) for q in ranges}
    total = 0.0
    loss = dict.fromkeys(qis, 0.0)
    for cl in members.values():
        cost = 0.0
        for q in ranges:
            vals = [float(rows[i][q]) for i in cl]
            lo, hi = min(vals), max(vals)
            want = _fmt(lo) if lo == hi else f"{_fmt(lo)}-{_fmt(hi)}"
            assert {str(out[i][q]) for i in cl} == {want}
            frac = (hi - lo) / span[q] if span[q] else 0.0
            loss[q] += len(cl) * frac
            cost += w[q] * frac
        for q, h in trees.items():
            index = h.index()
            node = lca_by_walk(h, (index[str(rows[i][q])] for i in cl))
            assert {out[i][q] for i in cl} == {h.names[node]}
            frac = int(h.subtree_height[node]) / h.height if h.height else 0.0
            loss[q] += len(cl) * frac
            cost += w[q] * frac
        total += len(cl) * cost
    for i, row in enumerate(out):
        for c in keep:
            assert row[c] == rows[i][c]
    n = len(rows)
    return total / (n * len(qis)), {q: v / n for q, v in loss.items()}


async def _audit(ctx: AppContext, target: str) -> list[AuditEntry]:
    async with ctx.sessionmaker() as s:
        res = await s.execute(
            select(AuditEntry).where(AuditEntry.target == target).order_by(AuditEntry.seq)
        )
        return list(res.scalars())


async def test_inline_release_end_to_end(api: Api) -> None:
    rows = _rows(300)
    a = await _create(api, _body(rows))
    r = await api.get(f"{URL}/{a}", role="analyst")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running" and r.json()["progress"] == 0
    r = await api.get(f"{URL}/{a}/result", role="analyst")
    assert r.status_code == 409, r.text  # not done yet
    keys = api.ctx.keys
    assert await api.ctx.redis.exists(keys.anonymization(a, "input"))

    assert (await _run(api, a))["status"] == "done"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "done" and st["progress"] == 1
    assert st["k"] == 5 and st["rows"] == 300 and st["source"] == "inline"
    assert st["weights"] == pytest.approx(
        {"age": 12 / 7, "hours": 4 / 7, "education": 8 / 7, "sex": 4 / 7}
    )
    assert 300 // 9 <= st["clusters"] <= 300 // 5 and st["seconds"] >= 0
    assert sum(st["weighted_loss"].values()) == pytest.approx(st["ngil"])

    trees = {"education": parse_hierarchy(EDUCATION), "sex": None}
    trees["sex"] = parse_hierarchy(
        {"value": "*", "children": [{"value": "Female"}, {"value": "Male"}]}
    )
    tables = {fmt: await _download(api, a, fmt) for fmt in ("csv", "parquet", "arrow", "ndjson")}
    assert tables["arrow"].column_names == ["cluster", "age", "hours", "education", "sex", "income"]
    for fmt, table in tables.items():
        ngil, loss = _check_release(
            table,
            rows,
            k=5,
            ranges=["age", "hours"],
            trees=trees,  # type: ignore[arg-type]
            weights={"age": 3.0, "education": 2.0},
            keep=["income"],
        )
        assert ngil == pytest.approx(st["ngil"], rel=1e-9), fmt
        assert loss == pytest.approx(st["loss"], rel=1e-9), fmt

    # the inline rows are gone; what is left expires within the configured lifetime
    assert not await api.ctx.redis.exists(keys.anonymization(a, "input"))
    ttl = api.ctx.settings.anonymization_ttl_seconds * 1000
    for what in ("meta", "result"):
        assert 0 < await api.ctx.redis.pttl(keys.anonymization(a, what)) <= ttl

    entries = await _audit(api.ctx, f"anonymization:{a}")
    assert [e.action for e in entries] == ["anonymization.create"] + ["anonymization.download"] * 4
    assert entries[0].detail["rows"] == 300 and entries[0].detail["k"] == 5
    logged = orjson.dumps([e.detail for e in entries])
    assert b"row-1" not in logged and b"Masters" not in logged  # names and counts, no values


async def test_a_run_again_is_a_no_op_and_a_crashed_run_starts_over(api: Api) -> None:
    rows = _rows(60, seed=3)
    a = await _create(api, _body(rows, k=4))
    meta = api.ctx.keys.anonymization(a, "meta")
    await api.ctx.redis.hset(meta, "progress", "0.5")  # a worker died half-way
    assert (await _run(api, a))["status"] == "done"
    first = (await api.get(f"{URL}/{a}/result?format=arrow", role="analyst")).content
    assert (await _run(api, a)) == {"status": "done"}  # SAQ ran it again: nothing redone
    assert (await api.get(f"{URL}/{a}/result?format=arrow", role="analyst")).content == first


async def test_progress_is_written_while_it_runs(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anonymize_service, "PROGRESS_SECONDS", 0.005)
    rows = _rows(6000, seed=5)
    a = await _create(api, _body(rows, k=3, weights=None))
    meta = api.ctx.keys.anonymization(a, "meta")
    job = asyncio.ensure_future(_run(api, a))
    seen = set()
    while not job.done():
        seen.add(float(await api.ctx.redis.hget(meta, "progress") or 0))
        await asyncio.sleep(0.002)
    assert (await job)["status"] == "done"
    assert any(0 < p < 1 for p in seen), seen


async def test_a_stream_hot_period_release(api: Api) -> None:
    name = await new_stream(api, "anon", releasable=["age", "item", "label", "user"])
    rnd = random.Random(11)
    raw = [
        obs(f"u{rnd.randint(0, 5)}", f"i{rnd.randint(0, 3)}", rnd.randint(18, 70), rnd.choice("01"))
        for _ in range(40)
    ]
    await ingest(api, name, raw)
    body = {
        "source": {"stream": name},
        "k": 4,
        "quasi_identifiers": [
            {"name": "age", "kind": "range"},
            {"name": "item", "kind": "hierarchy"},
        ],
        "keep": ["label", "user"],
    }
    a = await _create(api, body)
    assert (await _run(api, a))["status"] == "done"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["rows"] == 40 and st["source"] == f"stream:{name}"
    rows = [{**o["features"], "label": o["label"]} for o in raw]
    items = sorted({r["item"] for r in rows})
    tree = parse_hierarchy({"value": "*", "children": [{"value": v} for v in items]})
    ngil, loss = _check_release(
        await _download(api, a, "arrow"),
        rows,
        k=4,
        ranges=["age"],
        trees={"item": tree},
        weights={},
        keep=["label", "user"],
    )
    assert ngil == pytest.approx(st["ngil"]) and loss == pytest.approx(st["loss"])
    # a release of hot rows lives no longer than one window (3600 s here) of the hot period
    # (and is deleted at the roll that ends it: tests/anonymize/test_release_privacy.py)
    for what in ("meta", "result"):
        assert 0 < await api.ctx.redis.pttl(api.ctx.keys.anonymization(a, what)) <= 3600 * 1000

    r = await api.post(URL, json={**body, "keep": ["nope"]})
    assert r.status_code == 422 and "keep" in r.json()["detail"], r.text
    r = await api.post(URL, json={**body, "source": {"stream": "no-such-stream"}})
    assert r.status_code == 404, r.text


async def test_roles(api: Api) -> None:
    body = _body(_rows(10), k=2)
    for role in ("producer", "model"):
        r = await api.post(URL, role=role, json=body)
        assert r.status_code == 403, r.text
    a = await _create(api, body, role="analyst")
    await _create(api, body, role="admin")
    assert (await api.get(f"{URL}/{a}", role="producer")).status_code == 403
    assert (await api.get(f"{URL}/{a}/result", role="model")).status_code == 403
    r = await api.client.post(URL, json=body)
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"k": 1}, "k"),
        ({"k": 10_001}, "k"),
        ({"k": 11}, "source.rows"),  # fewer rows than k
        ({"quasi_identifiers": []}, "quasi_identifiers"),
        (
            {"quasi_identifiers": [{"name": f"q{i}", "kind": "range"} for i in range(33)]},
            "quasi_identifiers",
        ),
        ({"quasi_identifiers": [{"name": "age", "kind": "ordinal"}]}, "quasi_identifiers[0].kind"),
        (
            {"quasi_identifiers": [{"name": "x" * 129, "kind": "range"}]},
            "quasi_identifiers[0].name",
        ),
        ({"quasi_identifiers": [{"name": "age", "kind": "range"}] * 2}, "quasi_identifiers"),
        (
            {"quasi_identifiers": [{"name": "sex", "kind": "hierarchy", "hierarchy": {"v": 1}}]},
            "sex.hierarchy",
        ),
        ({"weights": {"age": 0}}, "weights.age"),
        ({"weights": {"age": 1e7}}, "weights.age"),
        ({"weights": {"nope": 1}}, "weights"),
        ({"keep": ["age"]}, "keep"),
        ({"keep": ["missing"]}, "source.rows[0]"),
        ({"keep": [f"c{i}" for i in range(65)]}, "keep"),
        ({"source": {}}, "source"),
        ({"source": {"rows": [], "stream": "s"}}, "source"),
        ({"source": {"rows": [{"age": "x" * 1025}]}}, "source.rows[0].age"),
        ({"source": {"stream": "Bad Name"}}, "source.stream"),
        ({"extra": 1}, "extra"),
    ],
)
async def test_limits_are_422_naming_the_field(api: Api, over: dict[str, Any], field: str) -> None:
    r = await api.post(URL, role="analyst", json=_body(_rows(10), **over))
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"], r.json()


def test_more_inline_rows_than_the_limit_are_refused() -> None:
    """(Over HTTP the test backend's 4 MiB body limit answers 413 first.)"""
    body = {
        "source": {"rows": [{"age": 1}] * (MAX_INLINE_ROWS + 1)},
        "k": 2,
        "quasi_identifiers": [{"name": "age", "kind": "range"}],
    }
    with pytest.raises(PydanticValidationError, match=f"at most {MAX_INLINE_ROWS} items"):
        AnonymizationCreate.model_validate(body)


async def test_unknown_and_malformed_ids(api: Api) -> None:
    missing = "an_" + "0" * 32
    for url in (f"{URL}/{missing}", f"{URL}/{missing}/result"):
        r = await api.get(url, role="analyst")
        assert r.status_code == 404 and r.json()["error"] == "NotFound", r.text
    r = await api.get(f"{URL}/nope", role="analyst")
    assert r.status_code == 422, r.text
    r = await api.get(f"{URL}/{missing}/result?format=xlsx", role="analyst")
    assert r.status_code == 422 and "format" in r.json()["detail"], r.text


async def test_a_bad_column_fails_the_run_without_its_values(api: Api) -> None:
    rows = _rows(20)
    rows[3]["age"] = "secret-value"
    a = await _create(api, _body(rows, k=2))
    assert (await _run(api, a))["status"] == "failed"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "failed" and "age" in st["error"]
    assert "secret-value" not in st["error"]
    assert not await api.ctx.redis.exists(api.ctx.keys.anonymization(a, "input"))
    assert (await api.get(f"{URL}/{a}/result", role="analyst")).status_code == 409


async def test_weights_shift_the_loss_between_attributes(api: Api) -> None:
    rows = _rows(300, seed=9)
    qis = QIS[:1] + QIS[2:3]  # age (range), education (hierarchy)
    loss = {}
    for heavy in ("age", "education"):
        a = await _create(api, _body(rows, quasi_identifiers=qis, weights={heavy: 10.0}))
        assert (await _run(api, a))["status"] == "done"
        loss[heavy] = (await api.get(f"{URL}/{a}", role="analyst")).json()["loss"]
    assert loss["age"]["age"] < loss["education"]["age"]
    assert loss["age"]["education"] > loss["education"]["education"]

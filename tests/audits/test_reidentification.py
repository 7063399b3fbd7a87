"""Re-identification audits over HTTP: inline records and a real stream's count tables, run by
the worker's job function, with progress, roles, owners, bad input, lifetimes (the roll that
ends the hot period deletes a stream's audits), the audit log and the stream's privacy ledger
field. The attacks run on small budgets here (their accuracy is
``tests/core/test_pu.py``'s subject); what is checked is the plumbing: the records and the
release the attacks get, and the figures that come back."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np
import orjson
import pytest
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy import select
from threadpoolctl import threadpool_info, threadpool_limits

from service.audits import service as audits_service
from service.audits.schemas import MAX_INLINE_ROWS, MAX_INLINE_VALUES, AuditCreate
from service.context import AppContext
from service.core.reidentification import attacks as pu
from service.db.models import AuditEntry
from tests.conftest import Api, Jobs
from tests.helpers import ingest, new_stream, obs
from workers.jobs import reidentification_run

URL = "/v1/audits/reidentification"
SMALL = pu.PUConfig(batch_size=100, t_pre=200, t_tune=200, pu_epochs=60, oracle_epochs=60)


@pytest.fixture(autouse=True)
def small_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audits_service, "CONFIG", SMALL)


def _mixture(n: int, seed: int = 1) -> tuple[list[list[float]], list[str]]:
    """Two well separated Gaussian classes in 4 dimensions, about 40 % positive ("1")."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.4
    x = rng.normal(size=(n, 4)) + np.where(y[:, None], 3.0, -3.0)
    return x.round(4).tolist(), ["1" if v else "0" for v in y]


async def _create(api: Api, body: dict[str, Any], role: str = "analyst") -> str:
    r = await api.post(URL, role=role, json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def _run(api: Api, a: str) -> dict[str, Any]:
    return await reidentification_run({"app": api.ctx}, id=a)


async def _audit_log(ctx: AppContext, target: str) -> list[AuditEntry]:
    async with ctx.sessionmaker() as s:
        res = await s.execute(
            select(AuditEntry).where(AuditEntry.target == target).order_by(AuditEntry.seq)
        )
        return list(res.scalars())


def _key(api: Api, a: str, what: str) -> str:
    return f"{api.ctx.keys.prefix}:{{ra:{a}}}:{what}"


async def test_inline_round_trip(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audits_service, "PROGRESS_SECONDS", 0.005)
    # 400 records take ~0.1 s: the first ten progress reports past 0 wait 20 ms each, so that
    # the job's writer (every 5 ms) and the poll below (every 2 ms) see one whatever the
    # machine's speed and load (every report waiting made the test 6 s)
    audit = pu.audit

    def slow_audit(*args: Any, progress: Any, **kwargs: Any) -> Any:
        waited = [0]

        def tick(p: float, stage: str) -> None:
            progress(p, stage)
            if 0 < p < 1 and waited[0] < 10:
                waited[0] += 1
                time.sleep(0.02)

        return audit(*args, progress=tick, **kwargs)

    monkeypatch.setattr(pu, "audit", slow_audit)
    rows, labels = _mixture(400)
    body = {
        "source": {"rows": rows, "labels": labels},
        "positive_label": "1",
        "release": {"kind": "class_mean", "epsilon": 1.0, "value_range": [-8, 8]},
        "attacks": ["nnpu", "upu", "kmeans"],
        "classifier": "linear",
        "draws": 2,
    }
    a = await _create(api, body)
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "running" and st["progress"] == 0 and st["results"] is None
    assert await api.ctx.redis.exists(_key(api, a, "input"))

    job = asyncio.ensure_future(_run(api, a))
    seen = set()
    while not job.done():
        seen.add(float(await api.ctx.redis.hget(_key(api, a, "meta"), "progress") or 0))
        await asyncio.sleep(0.002)
    assert (await job)["status"] == "done"
    assert any(0 < p < 1 for p in seen), seen

    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "done" and st["progress"] == 1 and st["stage"] == "done"
    pi_p = labels.count("1") / len(labels)
    assert st["n"] == 400 and st["dimensions"] == 4 and st["pi_p"] == pytest.approx(pi_p)
    assert st["epsilon"] == 1.0 and st["source"] == "inline" and st["positive_label"] == "1"
    # ε for the whole record: the sum's L1 bound is d·(max − min)/2 = 4 · 8 of the declared
    # range, 0.9 ε to the sum and 0.1 ε to the count; nothing read from the records
    g = st["guarantee"]
    assert g["epsilon"] == 1.0 and g["neighbours"] == "add or remove one record"
    assert g["epsilon_sum"] + g["epsilon_count"] == pytest.approx(1.0)
    assert g["epsilon_count"] == pytest.approx(0.1) and g["l1_bound"] == pytest.approx(32.0)
    assert g["domain"] == {"kind": "box", "min": -8.0, "max": 8.0}
    assert g["source"] == "the 400 inline rows" and st["draws"] == 2
    assert st["noise_scale"] == pytest.approx(32.0 / 0.9, rel=1e-6)
    assert st["count_noise_scale"] == pytest.approx(1 / 0.1, rel=1e-6)
    res = st["results"]
    assert set(res) == {"nnpu", "upu", "kmeans", "prior", "oracle"}
    assert res["prior"]["accuracy"] == pytest.approx(max(pi_p, 1 - pi_p))
    assert all(0 <= r["accuracy"] <= 1 for r in res.values())
    for attack in ("nnpu", "upu"):  # per attack: precision, recall, gains, over 2 draws
        r = res[attack]
        assert r["draws"] == 2 and set(r["spread"]) >= {"accuracy", "precision", "recall"}
        acc = r["spread"]["accuracy"]
        assert acc["min"] <= r["accuracy"] == acc["mean"] <= acc["max"] and acc["sd"] >= 0
        assert r["accuracy_gain"] == pytest.approx(r["accuracy"] - res["prior"]["accuracy"])
        assert 0 <= r["recall"] <= 1
        if r["precision"] is not None:
            assert r["precision_gain"] == pytest.approx(r["precision"] - pi_p)
    assert res["kmeans"]["accuracy"] > 0.95  # six standard deviations apart: 2-means finds them
    assert st["seconds"] >= 0

    # the records are gone; what is left expires within a day
    assert not await api.ctx.redis.exists(_key(api, a, "input"))
    assert 0 < await api.ctx.redis.pttl(_key(api, a, "meta")) <= 86_400 * 1000
    assert (await _run(api, a)) == {"status": "done"}  # SAQ ran it again: nothing redone

    entries = await _audit_log(api.ctx, f"reidentification:{a}")
    assert [e.action for e in entries] == ["reidentification.create"]
    assert entries[0].detail["rows"] == 400 and entries[0].detail["source"] == "inline"
    assert str(rows[0][0]).encode() not in orjson.dumps(entries[0].detail)  # no values


def _stream_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Ten users, ten items, ages; the label is "1" for items i0–i3 (5 % flipped)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        item = rnd.randint(0, 9)
        label = (item < 4) ^ (rnd.random() < 0.05)
        out.append(obs(f"u{rnd.randint(0, 9)}", f"i{item}", rnd.randint(18, 70), str(int(label))))
    return out


async def _rolled_stream(api: Api, jobs: Jobs, rows: list[dict[str, Any]], **over: Any) -> str:
    """A stream whose count period (window 1) and hot period (window 2) hold ``rows`` each."""
    name = await new_stream(api, "reid", sketch={"width": 16384, "depth": 3}, **over)
    assert await ingest(api, name, rows) == 1
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()
    assert await ingest(api, name, rows) == 2
    return name


async def test_count_tables_of_a_real_stream(api: Api, jobs: Jobs) -> None:
    rows = _stream_rows(240, seed=4)
    name = await _rolled_stream(api, jobs, rows)
    r = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert r.status_code == 200 and r.json()["reidentification"] is None

    body = {
        "source": {"stream": name},
        "positive_label": 1,  # an integer label is compared as text
        "release": {"kind": "count_tables"},
        "attacks": ["growpu", "upu", "kmeans"],
    }
    a = await _create(api, body)
    # What the attack gets: the hot records one-hot per table (user, item, age buckets), and
    # the class mean read off the count period's tables. Without noise, and with the same
    # records in both periods, that is the exact class mean of the hot records (a sketch
    # collision could spoil one key: with 16384 buckets and 3 rows about 1 run in 30,000).
    spec = orjson.loads((await api.ctx.redis.hget(_key(api, a, "meta"), "spec")) or b"{}")
    assert spec["owner"] and spec["draws"] == 5  # the default
    inp = await audits_service._stream_input(api.ctx, spec)
    x, y = inp["x"], inp["y"]
    distinct = [len({o["features"][f] for o in rows}) for f in ("user", "item")]
    ages = len({min(sum(o["features"]["age"] >= e for e in (18, 25, 35, 45, 56)), 5) for o in rows})
    assert x.shape == (240, sum(distinct) + ages)
    assert (x.sum(axis=1) == 3).all()  # one key per table
    assert list(y) == [o["label"] for o in rows]
    exact = x[y == "1"].astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(inp["released"], exact, rtol=1e-12)
    assert inp["n_hat_p"] == (y == "1").sum() and inp["mechanism"] == "none"

    assert (await _run(api, a))["status"] == "done"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "done", st
    assert st["n"] == 240 and st["epoch"] == 2 and st["epsilon"] is None
    assert st["mechanism"] == "none" and st["noise_scale"] is None
    assert st["guarantee"]["source"] == "the count tables of windows 1-1"
    assert st["count_period"] == [1, 1] and st["n_hat_p"] == (y == "1").sum()
    assert st["dropped_columns"] == 0
    assert st["positive_label"] == "1" and st["source"] == f"stream:{name}"
    res = st["results"]
    assert set(res) == {"growpu", "upu", "kmeans", "prior", "oracle"}
    assert res["prior"]["accuracy"] == pytest.approx(max(np.mean(y == "1"), np.mean(y != "1")))
    # results about hot rows live no longer than one window (3600 s) of the hot period
    assert 0 < await api.ctx.redis.pttl(_key(api, a, "meta")) <= 3600 * 1000

    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    ri = led["reidentification"]
    assert ri["id"] == a and ri["release"] == "count_tables" and ri["n"] == 240
    assert ri["epsilon"] is None and ri["at"].endswith("Z")
    assert ri["accuracy"] == {k: res[k]["accuracy"] for k in res}
    best = max(res["growpu"]["accuracy"], res["upu"]["accuracy"])
    assert ri["summary"].startswith(
        "an attacker who knows these records and reads these tables labels "
        f"{100 * best:.1f} % of them correctly"
    )
    assert f"prior {100 * res['prior']['accuracy']:.1f} %" in ri["summary"]
    assert f"K-means {100 * res['kmeans']['accuracy']:.1f} %" in ri["summary"]
    assert f"oracle {100 * res['oracle']['accuracy']:.1f} %" in ri["summary"]

    # a class_mean audit of the same stream replaces it as the latest
    b = await _create(
        api, {**body, "release": {"kind": "class_mean", "epsilon": 0.5}, "attacks": ["kmeans"]}
    )
    assert (await _run(api, b))["status"] == "done"
    st = (await api.get(f"{URL}/{b}", role="analyst")).json()
    # one-hot records with one 1 per table (user, item, age): L1 bound 3, whatever the data
    assert st["noise_scale"] == pytest.approx(3 / (0.9 * 0.5))
    g = st["guarantee"]
    assert g["domain"] == {"kind": "one_hot", "tables": 3} and g["l1_bound"] == 3
    assert g["source"].startswith("the first 240 records (at most 20000) of the hot period")
    ri = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()["reidentification"]
    assert ri["id"] == b and ri["release"] == "class_mean" and ri["epsilon"] == 0.5
    assert set(ri["accuracy"]) == {"kmeans", "prior", "oracle"}
    assert "reads the mean of class '1' (ε = 0.5 for a whole record, add/remove)" in ri["summary"]


async def test_count_tables_report_the_stream_epsilon(api: Api, jobs: Jobs) -> None:
    name = await _rolled_stream(
        api, jobs, _stream_rows(120, seed=8), privacy={"mechanism": "laplace", "epsilon": 2.0}
    )
    body = {
        "source": {"stream": name},
        "positive_label": "1",
        "release": {"kind": "count_tables"},
        "attacks": ["kmeans", "nnpu"],
    }
    a = await _create(api, body)
    assert (await _run(api, a))["status"] == "done"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["epsilon"] == 2.0 and st["mechanism"] == "laplace" and st["n"] == 120
    assert set(st["results"]) == {"nnpu", "kmeans", "prior", "oracle"}


async def test_stream_errors(api: Api) -> None:
    body = {
        "source": {"stream": "no-such-stream"},
        "positive_label": "1",
        "release": {"kind": "count_tables"},
    }
    assert (await api.post(URL, json=body)).status_code == 404
    name = await new_stream(api, "reid")
    r = await api.post(URL, json={**body, "source": {"stream": name}})
    assert r.status_code == 409 and "count period" in r.json()["detail"], r.text
    r = await api.post(URL, json={**body, "source": {"stream": name}, "positive_label": "7"})
    assert r.status_code == 422 and "positive_label" in r.json()["detail"], r.text
    # class_mean needs no count period; a hot period of one label fails the audit, by name
    await ingest(api, name, [obs("u1", "i1", 30, "1")] * 5)
    cm = {**body, "source": {"stream": name}, "release": {"kind": "class_mean"}}
    a = await _create(api, {**cm, "attacks": ["kmeans"]})
    assert (await _run(api, a))["status"] == "failed"
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "failed" and "positive label" in st["error"] and "u1" not in st["error"]
    r = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert r.json()["reidentification"] is None  # a failed audit is not shown


async def test_roles(api: Api) -> None:
    rows, labels = _mixture(10)
    body = {
        "source": {"rows": rows, "labels": labels},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
        "attacks": ["kmeans"],
    }
    a = await _create(api, body, role="admin")
    await api.add_keys(curator="curator", annotator="annotator")
    for role in ("producer", "model", "curator", "annotator"):
        assert (await api.post(URL, role=role, json=body)).status_code == 403, role
        assert (await api.get(f"{URL}/{a}", role=role)).status_code == 403, role
    assert (await api.get(f"{URL}/{a}", role="admin")).status_code == 200
    r = await api.get(f"{URL}/ra_{'0' * 32}", role="analyst")
    assert r.status_code == 404
    assert (await api.get(f"{URL}/nope", role="analyst")).status_code == 422


def _bad_bodies() -> list[tuple[dict[str, Any], str]]:
    ok: dict[str, Any] = {
        "source": {"rows": [[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]], "labels": ["1", "0", "0"]},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
    }
    src: dict[str, Any] = ok["source"]
    return [
        ({**ok, "source": {}}, "source"),
        ({**ok, "source": {**src, "stream": "s"}}, "source"),
        ({**ok, "source": {"rows": src["rows"]}}, "labels"),
        ({**ok, "source": {**src, "labels": ["1", "0"]}}, "labels"),
        ({**ok, "source": {**src, "rows": [[0.0], [1.0, 0.0], [1.0]]}}, "rows[1]"),
        ({**ok, "source": {**src, "rows": [[0.0], [float("1e31")], [1.0]]}}, "source.rows"),
        ({**ok, "source": {**src, "rows": [[]] * 3}}, "source.rows"),
        ({**ok, "source": {"rows": [[0.0]] * (MAX_INLINE_ROWS + 1)}}, "source.rows"),
        ({**ok, "source": {"stream": "Bad Name"}}, "source.stream"),
        ({**ok, "source": {"stream": "s", "labels": ["1"]}}, "labels"),
        ({**ok, "positive_label": "2"}, "positive_label"),
        ({**ok, "positive_label": "x" * 65}, "positive_label"),
        ({**ok, "source": {**src, "labels": ["1", "1", "1"]}}, "source.labels"),
        ({**ok, "release": {"kind": "count_tables"}}, "count_tables"),
        ({**ok, "release": {"kind": "histogram"}}, "release.kind"),
        ({**ok, "release": {"kind": "class_mean", "epsilon": 0}}, "release.epsilon"),
        ({**ok, "release": {"kind": "class_mean", "epsilon": 1e-300}}, "release.epsilon"),
        ({**ok, "release": {"kind": "class_mean", "epsilon": 1e7}}, "release.epsilon"),
        ({**ok, "release": {"kind": "count_tables", "epsilon": 1}}, "epsilon"),
        ({**ok, "attacks": []}, "attacks"),
        ({**ok, "attacks": ["growpu", "growpu"]}, "attacks"),
        ({**ok, "attacks": ["svm"]}, "attacks"),
        ({**ok, "classifier": "forest"}, "classifier"),
        ({**ok, "extra": 1}, "extra"),
        # an ε-DP release of inline rows needs their declared range (never read from them)
        ({**ok, "release": {"kind": "class_mean", "epsilon": 1}}, "release.value_range"),
        ({**ok, "release": {"kind": "class_mean", "value_range": [0, 1]}}, "value_range"),
        (
            {**ok, "release": {"kind": "class_mean", "epsilon": 1, "value_range": [1, 1]}},
            "value_range",
        ),
        (
            {**ok, "release": {"kind": "class_mean", "epsilon": 1, "value_range": [0]}},
            "release.value_range",
        ),
        (
            {
                **ok,
                "source": {"stream": "s"},
                "release": {"kind": "class_mean", "epsilon": 1, "value_range": [0, 1]},
            },
            "release.value_range",
        ),
        ({**ok, "draws": 0}, "draws"),
        ({**ok, "draws": 21}, "draws"),
    ]


@pytest.mark.parametrize(("body", "field"), _bad_bodies())
async def test_bad_input_is_a_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    r = await api.post(URL, role="analyst", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"], r.text


def test_the_total_size_of_inline_rows_is_bounded() -> None:
    """(Over HTTP the tests' 4 MB body limit answers 413 first; the default is 32 MB.)"""
    d = 4096
    n = MAX_INLINE_VALUES // d + 1
    body = {
        "source": {"rows": [[0.0] * d] * n, "labels": ["1"] + ["0"] * (n - 1)},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
    }
    with pytest.raises(PydanticValidationError, match=f"rows: .* limit of {MAX_INLINE_VALUES}"):
        AuditCreate.model_validate(body)
    body["source"] = {"rows": [[0.0] * d] * (n - 1), "labels": ["1"] + ["0"] * (n - 2)}
    assert len(AuditCreate.model_validate(body).source.rows or []) == n - 1


async def test_an_audit_past_its_deadline_fails_and_stops_its_thread(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job fails itself before SAQ's timeout would cancel it (which would leave it
    "running" until it expired), and the computation stops at its next progress report."""
    monkeypatch.setattr(audits_service, "PROGRESS_SECONDS", 0.01)
    monkeypatch.setattr(audits_service, "COMPUTE_SECONDS", 0.0)
    stopped: list[BaseException] = []
    real = audits_service._compute

    def compute(*args: Any) -> dict[str, Any]:
        # a computation longer than the loop's first look at the deadline, however fast the
        # attacks of one draw are here: the job finds it past its deadline while it runs
        time.sleep(0.5)
        try:
            return real(*args)
        except BaseException as exc:
            stopped.append(exc)
            raise

    monkeypatch.setattr(audits_service, "_compute", compute)
    rows, labels = _mixture(400)
    body = {
        "source": {"rows": rows, "labels": labels},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
        "attacks": ["nnpu", "upu"],
        "classifier": "linear",
    }
    a = await _create(api, body)
    assert (await _run(api, a)) == {"status": "failed"}
    st = (await api.get(f"{URL}/{a}", role="analyst")).json()
    assert st["status"] == "failed" and "ran longer than" in st["error"], st
    for _ in range(500):  # the thread ends at its next progress report
        if stopped:
            break
        await asyncio.sleep(0.01)
    assert [type(e).__name__ for e in stopped] == ["_Stopped"]


@pytest.mark.parametrize("threads", [1, 2])
async def test_the_computation_runs_on_the_configured_threads(
    api: Api, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Inside the job's computation every BLAS and OpenMP library of the process reports
    ``audit_threads`` threads, whatever the limit outside (3 here: neither setting, nor this
    2-core machine's default); the job puts the outside limit back."""
    seen: list[list[dict[str, Any]]] = []
    real = pu.audit

    def audit(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(threadpool_info())
        return real(*args, **kwargs)

    monkeypatch.setattr(pu, "audit", audit)
    monkeypatch.setattr(api.ctx.settings, "audit_threads", threads)
    rows, labels = _mixture(200)
    body = {
        "source": {"rows": rows, "labels": labels},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
        "attacks": ["kmeans"],
        "classifier": "linear",
    }
    a = await _create(api, body)
    with threadpool_limits(limits=3):
        outside = [(i["filepath"], i["num_threads"]) for i in threadpool_info()]
        assert (await _run(api, a))["status"] == "done"
        assert [(i["filepath"], i["num_threads"]) for i in threadpool_info()] == outside
    assert {n for _, n in outside} == {3}
    [inside] = seen
    assert {i["user_api"] for i in inside} >= {"blas"}, inside
    assert {(i["filepath"], i["num_threads"]) for i in inside} == {
        (path, threads) for path, _ in outside
    }


async def test_an_audit_is_read_only_by_the_key_that_created_it(api: Api) -> None:
    """Another analyst, or an admin, gets the 404 of an unknown id (the same answer), before
    and after the audit ran."""
    await api.add_keys(analyst2="analyst", admin2="admin")
    rows, labels = _mixture(40)
    body = {
        "source": {"rows": rows, "labels": labels},
        "positive_label": "1",
        "release": {"kind": "class_mean"},
        "attacks": ["kmeans"],
        "draws": 1,
    }
    a = await _create(api, body, role="analyst")
    unknown_id = f"ra_{'0' * 32}"
    unknown = await api.get(f"{URL}/{unknown_id}", role="analyst")
    assert unknown.status_code == 404
    for ran in (False, True):
        if ran:
            assert (await _run(api, a))["status"] == "done"
        assert (await api.get(f"{URL}/{a}", role="analyst")).status_code == 200
        for role in ("analyst2", "admin", "admin2"):
            r = await api.get(f"{URL}/{a}", role=role)
            assert r.status_code == 404, (role, r.text)
            assert r.json() == orjson.loads(
                unknown.content.replace(unknown_id.encode(), a.encode())
            )
    b = await _create(api, body, role="admin")  # an admin's own audit is the admin's
    assert (await api.get(f"{URL}/{b}", role="admin")).status_code == 200
    assert (await api.get(f"{URL}/{b}", role="admin2")).status_code == 404


async def _stream_audit(api: Api, name: str) -> str:
    body = {
        "source": {"stream": name},
        "positive_label": "1",
        "release": {"kind": "class_mean", "epsilon": 1.0},
        "attacks": ["nnpu"],
        "draws": 1,
    }
    return await _create(api, body)


def _index(api: Api, name: str) -> str:
    return f"{api.ctx.keys.prefix}:{{ra-stream:{name}}}:index"


async def test_the_roll_that_ends_the_hot_period_deletes_the_streams_audits(
    api: Api, jobs: Jobs
) -> None:
    """An audit of window 2's hot records (hot_windows 1) lives until the roll to epoch 3, which
    deletes every key of it and the ledger's pointer, long before its expiry (a window)."""
    name = await _rolled_stream(api, jobs, _stream_rows(120, seed=9))
    a = await _stream_audit(api, name)
    assert (await _run(api, a))["status"] == "done"
    assert await api.ctx.redis.zscore(_index(api, name), a) == 2  # the oldest window read
    assert (await api.get(f"{URL}/{a}", role="analyst")).status_code == 200
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    assert led["reidentification"]["id"] == a
    latest = f"{api.ctx.keys.prefix}:{{ra-stream:{name}}}:latest"
    assert await api.ctx.redis.exists(latest)

    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 3}
    assert not await api.ctx.redis.exists(_key(api, a, "meta"))
    assert not await api.ctx.redis.exists(latest)
    assert not await api.ctx.redis.zrange(_index(api, name), 0, -1)
    assert (await api.get(f"{URL}/{a}", role="analyst")).status_code == 404
    led = (await api.get(f"/v1/streams/{name}/privacy", role="analyst")).json()
    assert led["reidentification"] is None


async def test_an_audit_deleted_by_a_roll_while_it_runs_writes_nothing(
    api: Api, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll comes while the attacks train (after the records were read): the job's
    progress and results never re-create the deleted audit. And a roll while the records are
    read: the job deletes the audit itself (the roll's expiry may have run before it was
    listed)."""
    name = await _rolled_stream(api, jobs, _stream_rows(120, seed=10))
    rolled: list[int] = []
    audit = pu.audit

    def rolling_audit(*args: Any, progress: Any, **kwargs: Any) -> Any:
        def tick(p: float, stage: str) -> None:
            progress(p, stage)
            if p > 0.5 and not rolled:
                fut = asyncio.run_coroutine_threadsafe(api.post(f"/v1/streams/{name}/roll"), loop)
                rolled.append(fut.result(timeout=60).json()["epoch"])

        return audit(*args, progress=tick, **kwargs)

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(pu, "audit", rolling_audit)
    monkeypatch.setattr(audits_service, "PROGRESS_SECONDS", 0.005)
    a = await _stream_audit(api, name)
    assert await _run(api, a) == {"status": "expired"}
    assert rolled == [3]
    assert not await api.ctx.redis.exists(_key(api, a, "meta"))
    assert (await api.get(f"{URL}/{a}", role="analyst")).status_code == 404

    await jobs()
    await ingest(api, name, _stream_rows(60, seed=11))  # window 3
    read = audits_service._hot_columns

    async def read_then_roll(*args: Any) -> Any:
        out = await read(*args)
        await api.post(f"/v1/streams/{name}/roll")
        return out

    monkeypatch.setattr(pu, "audit", audit)
    monkeypatch.setattr(audits_service, "_hot_columns", read_then_roll)
    b = await _stream_audit(api, name)
    assert await _run(api, b) == {"status": "expired"}
    assert not await api.ctx.redis.exists(_key(api, b, "meta"))
    assert not await api.ctx.redis.zrange(_index(api, name), 0, -1)

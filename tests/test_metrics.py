"""What an operator alerts on: the gauges follow the state they describe through ingest,
counting, a roll and the seal; every metric the alert rules and the dashboard in deploy/ use
is one the service exports; /metrics answers only the metrics token, from gauges a background
refresh computed (a scrape computes nothing), and shows no count of raw observations."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from service.api import metrics as operator_metrics
from service.coldstore import service as coldstore
from service.config import Settings
from service.context import AppContext
from service.core.annotation import sampled_kanon as kanon
from service.counting import service as counting
from service.lifecycle import roll as lifecycle_roll
from service.queues import service as queues_service
from tests.conftest import Api, Backend, Jobs, app_context, own_database, unique
from tests.helpers import cancel_and_wait, obs, stream_body
from workers import jobs as worker_jobs
from workers.jobs import JOB_FAILURES

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
TOKEN = secrets.token_hex(32)


@pytest.fixture(scope="module")
def metrics_backend(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    with own_database(backend, tmp_path_factory.mktemp("metrics")) as b:
        yield b


@pytest.fixture
async def ctx(metrics_backend: Backend) -> AsyncIterator[AppContext]:
    """On the module's own database: a refresh, ``count_all`` and ``seal_all`` go through
    every stream, here only this module's."""
    async with app_context(metrics_backend.settings, metrics_backend.embedded) as c:
        yield c


@pytest.fixture
def metrics_on(api: Api, monkeypatch: pytest.MonkeyPatch) -> Api:
    """``api`` with SELECTIVITY_METRICS_TOKEN set to ``TOKEN``."""
    over = {**api.ctx.settings.model_dump(), "metrics_token": TOKEN}
    monkeypatch.setattr(api.ctx, "settings", Settings(**over))
    return api


def _value(text: str, metric: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name == metric and rest.startswith(want + "}"):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(metric + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def _scrape(api: Api, *, refresh: bool = True) -> str:
    """The gauges after a refresh (the API's lifespan runs it in the background; tests own
    their context, so they run it here), as Prometheus scrapes them."""
    if refresh:
        await operator_metrics.refresh(api.ctx)
    r = await api.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return r.text


async def test_metrics_answer_only_the_metrics_token(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = await api.client.get("/metrics")  # no token set: off
    assert r.status_code == 404 and "SELECTIVITY_METRICS_TOKEN" in r.json()["detail"]
    r = await api.get("/metrics")  # not even for an admin key
    assert r.status_code == 404

    over = {**api.ctx.settings.model_dump(), "metrics_token": TOKEN}
    monkeypatch.setattr(api.ctx, "settings", Settings(**over))
    for headers in (
        {},
        api.auth("admin"),
        {"Authorization": f"Bearer {TOKEN[:-1]}x"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer ²".encode("latin-1")},
    ):
        r = await api.client.get("/metrics", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"] == "MetricsUnauthorized"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "selectivity_" not in r.text
    r = await api.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and "selectivity_requests_total" in r.text


def test_a_short_metrics_token_is_refused() -> None:
    with pytest.raises(ValueError, match="SELECTIVITY_METRICS_TOKEN must be at least 32") as e:
        Settings(metrics_token="tooshort-secret")
    assert "tooshort-secret" not in str(e.value)  # the refused token is not repeated


async def test_gauges_follow_counting_the_roll_and_the_seal(metrics_on: Api, jobs: Jobs) -> None:
    api = metrics_on
    name = unique("met")
    body = stream_body(name, privacy={"mechanism": "laplace", "epsilon": 0.5})
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rows = [obs(f"u{i}", f"i{i % 3}", 30, str(i % 2)) for i in range(7)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202

    text = await _scrape(api)
    assert (_value(text, "selectivity_counting_lag_seconds", stream=name) or 0) >= 0
    assert _value(text, "selectivity_stream_epoch", stream=name) == 1
    assert _value(text, "selectivity_privacy_epsilon", stream=name) == 0.5
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 0

    rt = await api.ctx.stores.windows.epoch(name)
    assert rt == 1
    await counting.count_all(api.ctx)
    text = await _scrape(api)
    assert _value(text, "selectivity_counting_lag_seconds", stream=name) == 0

    # the roll closes window 1, which leaves the hot period (H = 1) but is not sealed yet:
    # its raw rows wait for the seal, past their deletion deadline
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    text = await _scrape(api)
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 1
    assert _value(text, "selectivity_hot_past_deadline_windows", stream=name) == 1
    assert _value(text, "selectivity_stream_epoch", stream=name) == 2
    assert (_value(text, "selectivity_roll_seconds_count") or 0) >= 1

    await coldstore.seal_all(ctx=api.ctx)  # sealed; kept for the roll's selection round
    text = await _scrape(api)
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 0
    assert _value(text, "selectivity_hot_past_deadline_windows", stream=name) == 1
    await jobs()  # the round's follow-up expires it
    text = await _scrape(api)
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 0
    assert _value(text, "selectivity_hot_past_deadline_windows", stream=name) == 0
    assert _value(text, "selectivity_hot_past_deadline_seconds", stream=name) == 0
    assert _value(text, "selectivity_metrics_refresh_errors") == 0
    assert _value(text, "selectivity_unlock_requests", status="pending") is not None
    assert 0 <= (_value(text, "selectivity_metrics_age_seconds") or -1) < 60


def _values_of(text: str, name: str) -> list[float]:
    """The values of every series labelled with stream or queue ``name``."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if not line.startswith("#") and f'"{name}"' in line
    ]


async def test_no_count_of_raw_observations(metrics_on: Api) -> None:
    """37 rows accepted, then closed and waiting for the seal: no series of the stream says
    37 (the rows waiting to be counted, and the hot rows waiting for the seal, were exported
    exactly)."""
    api = metrics_on
    name = unique("beta")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    rows = [obs(f"u{i}", f"i{i % 5}", 30, str(i % 2)) for i in range(37)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202
    text = await _scrape(api)
    values = _values_of(text, name)
    assert values and 37 not in values, text
    assert "lag_rows" not in text and "backlog_rows" not in text

    await counting.count_all(api.ctx)
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # 37 hot rows await the seal
    text = await _scrape(api)
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 1
    assert 37 not in _values_of(text, name), text


async def test_a_scrape_computes_nothing(metrics_on: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """With record queues on a stream, a scrape answers from the last refresh: it computes no
    ledger and no queue δ, however many queues there are."""
    api = metrics_on
    await api.add_keys(curator="curator")
    name = unique("led")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    queues = [unique("rq") for _ in range(6)]
    for q in queues:
        body = {
            "name": q,
            "beta": 0.5,
            "k": 5,
            "payload_kind": "record",
            "stream": name,
            "accept_delta_above_ceiling": True,
        }
        r = await api.post("/v1/queues", "curator", json=body)
        assert r.status_code == 201, r.text
    await operator_metrics.refresh(api.ctx)

    calls: list[str] = []

    def counted(fn, what: str):  # type: ignore[no-untyped-def]
        def wrapper(*a, **kw):  # type: ignore[no-untyped-def]
            calls.append(what)
            return fn(*a, **kw)

        return wrapper

    monkeypatch.setattr(queues_service.kanon, "delta", counted(queues_service.kanon.delta, "delta"))
    monkeypatch.setattr(operator_metrics, "ledger", counted(operator_metrics.ledger, "ledger"))
    for _ in range(5):
        text = await _scrape(api, refresh=False)
        for q in queues:
            assert _value(text, "selectivity_queue_tasks", queue=q, state="in_pool") == 0
        assert _value(text, "selectivity_privacy_delta", stream=name) is not None
    assert calls == []
    await operator_metrics.refresh(api.ctx)  # the background refresh is where they run
    assert "ledger" in calls


@pytest.mark.slow
async def test_healthz_stays_fast_while_scraping_costly_record_queues(metrics_on: Api) -> None:
    """Ten record queues whose δ is costly (k = 10⁶, β = 0.001, ε at the smallest the bound
    covers: ~0.13 s each on a 2-core machine): scrapes answer from the last refresh, so none
    takes, or keeps /healthz waiting, a second (when a scrape computed the ledgers, each took
    ~2 s and held /healthz as long). Generous bound: the test shares 2 cores."""
    api = metrics_on
    await api.add_keys(curator="curator")
    name = unique("costly")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    for _ in range(10):
        body = {
            "name": unique("rq"),
            "beta": 0.001,
            "k": 1_000_000,
            "epsilon": kanon.covered_epsilon(beta=0.001),
            "payload_kind": "record",
            "stream": name,
            "accept_delta_above_ceiling": True,
        }
        assert (await api.post("/v1/queues", "curator", json=body)).status_code == 201
    await operator_metrics.refresh(api.ctx)  # (the lifespan's background task)
    waits: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            t = time.perf_counter()
            assert (await api.client.get("/healthz")).status_code == 200
            waits.append(time.perf_counter() - t)
            await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll())
    try:
        for _ in range(5):
            t = time.perf_counter()
            text = await _scrape(api, refresh=False)
            assert time.perf_counter() - t < 1.0
            assert _value(text, "selectivity_privacy_delta", stream=name) is not None
            await asyncio.sleep(0.05)
    finally:
        done.set()
        await poller
    assert waits and max(waits) < 1.0, max(waits)


async def test_the_background_refresh_keeps_the_gauges_fresh(metrics_on: Api) -> None:
    api = metrics_on
    name = unique("bg")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    task = asyncio.create_task(operator_metrics.refresh_forever(api.ctx))
    try:
        for _ in range(200):  # the first refresh starts at once
            text = await _scrape(api, refresh=False)
            if _value(text, "selectivity_stream_epoch", stream=name) == 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the background refresh never published the stream")
    finally:
        await cancel_and_wait(task)


async def test_queue_gauges(metrics_on: Api) -> None:
    api = metrics_on
    queue = unique("q")
    r = await api.post(
        "/v1/queues", json={"name": queue, "beta": 0.1, "k": 20, "labels": ["a", "b"]}
    )
    assert r.status_code == 201, r.text
    text = await _scrape(api)
    assert _value(text, "selectivity_queue_tasks", queue=queue, state="in_pool") == 0


def _used_metrics() -> set[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [rule["expr"] for g in rules["groups"] for rule in g["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "selectivity.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"\bselectivity_[a-z_]+", e)}


async def test_rules_and_dashboard_use_only_exported_metrics(metrics_on: Api) -> None:
    text = await _scrape(metrics_on)
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    used = _used_metrics()
    assert len(used) >= 12
    missing = []
    for metric in used:
        base = re.sub(r"_(bucket|total|count|sum)$", "", metric)
        if metric not in families and base not in families:
            missing.append(metric)
    assert not missing, f"used by deploy/ but not exported: {sorted(missing)}"


def test_the_prometheus_example_scrapes_with_the_token() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["metrics_path"] == "/metrics"]
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"]
    assert "alerts.yml" in " ".join(config["rule_files"])


async def test_a_failing_job_is_counted(metrics_on: Api) -> None:
    api = metrics_on
    before = JOB_FAILURES.labels("ingest_count")._value.get()
    with pytest.raises(KeyError):  # a worker context without the app: the job raises
        await worker_jobs.ingest_count({})
    assert JOB_FAILURES.labels("ingest_count")._value.get() == before + 1
    assert await worker_jobs.ingest_count({"app": api.ctx}) is not None  # success: not counted
    assert JOB_FAILURES.labels("ingest_count")._value.get() == before + 1
    text = await _scrape(api)
    assert (_value(text, "selectivity_job_failures_total", job="ingest_count") or 0) >= 1

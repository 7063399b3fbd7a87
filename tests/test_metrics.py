"""What an operator alerts on (issue 16 part 3): the gauges follow the state they describe
through ingest, counting, a roll and the seal, and every metric the alert rules and the
dashboard in deploy/ use is one the service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from service.coldstore import service as coldstore
from service.counting import service as counting
from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Jobs, unique
from tests.helpers import obs, stream_body
from workers import jobs as worker_jobs
from workers.jobs import JOB_FAILURES

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def _value(text: str, metric: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name == metric and rest.startswith(want + "}"):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(metric + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def _scrape(api: Api) -> str:
    r = await api.client.get("/metrics")
    assert r.status_code == 200
    return r.text


async def test_gauges_follow_counting_the_roll_and_the_seal(api: Api, jobs: Jobs) -> None:
    name = unique("met")
    body = stream_body(name, privacy={"mechanism": "laplace", "epsilon": 0.5})
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rows = [obs(f"u{i}", f"i{i % 3}", 30, str(i % 2)) for i in range(7)]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 202

    text = await _scrape(api)
    assert _value(text, "selectivity_counting_lag_rows", stream=name) == 7
    assert (_value(text, "selectivity_counting_lag_seconds", stream=name) or 0) >= 0
    assert _value(text, "selectivity_stream_epoch", stream=name) == 1
    assert _value(text, "selectivity_privacy_epsilon", stream=name) == 0.5
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 0

    rt = await api.ctx.stores.windows.epoch(name)
    assert rt == 1
    await counting.count_all(api.ctx)
    text = await _scrape(api)
    assert _value(text, "selectivity_counting_lag_rows", stream=name) == 0
    assert _value(text, "selectivity_counting_lag_seconds", stream=name) == 0

    # the roll closes window 1, which leaves the hot period (H = 1) but is not sealed yet:
    # its raw rows wait for the seal, past their deletion deadline
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2
    text = await _scrape(api)
    assert _value(text, "selectivity_seal_backlog_windows", stream=name) == 1
    assert _value(text, "selectivity_seal_backlog_rows", stream=name) == 7
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
    assert _value(text, "selectivity_metrics_scrape_errors") == 0
    assert _value(text, "selectivity_unlock_requests", status="pending") is not None


async def test_queue_gauges(api: Api) -> None:
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


async def test_rules_and_dashboard_use_only_exported_metrics(api: Api) -> None:
    text = await _scrape(api)
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    used = _used_metrics()
    assert len(used) >= 12
    missing = []
    for metric in used:
        base = re.sub(r"_(bucket|total|count|sum)$", "", metric)
        if metric not in families and base not in families:
            missing.append(metric)
    assert not missing, f"used by deploy/ but not exported: {sorted(missing)}"


async def test_a_failing_job_is_counted(api: Api) -> None:
    before = JOB_FAILURES.labels("ingest_count")._value.get()
    with pytest.raises(KeyError):  # a worker context without the app: the job raises
        await worker_jobs.ingest_count({})
    assert JOB_FAILURES.labels("ingest_count")._value.get() == before + 1
    assert await worker_jobs.ingest_count({"app": api.ctx}) is not None  # success: not counted
    assert JOB_FAILURES.labels("ingest_count")._value.get() == before + 1
    text = await _scrape(api)
    assert (_value(text, "selectivity_job_failures_total", job="ingest_count") or 0) >= 1

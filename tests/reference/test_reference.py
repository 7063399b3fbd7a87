"""The reference model: trained after each roll, served by /predict, scored per epoch on the
observations that arrived during it."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.conftest import Api, unique
from tests.helpers import stream_body


def _rows(rng: np.random.Generator, n: int) -> list[dict]:
    """Even users like 85 % of items, odd users 15 %: a signal the user's counts carry."""
    users = rng.integers(0, 40, n)
    items = rng.integers(0, 30, n)
    rate = np.where(users % 2 == 0, 0.85, 0.15)
    labels = np.where(rng.random(n) < rate, "1", "0")
    return [
        {"features": {"user": f"u{u}", "item": f"i{i}", "age": 30}, "label": str(lab)}
        for u, i, lab in zip(users, items, labels, strict=True)
    ]


async def _settle(api: Api) -> None:
    for _ in range(600):
        if not api.ctx.caches.get("background"):
            return
        await asyncio.sleep(0.05)


async def test_reference_model_trains_predicts_and_reports_quality(api: Api) -> None:
    name = unique("ref")
    body = stream_body(name, hot_windows=2, retention_windows=10)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(7)
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json={"rows": [{"user": "u1"}]})
    assert r.status_code == 503 and "reference model" in r.json()["detail"]
    for _ in range(5):
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            json={"observations": _rows(rng, 800)},
        )
        assert r.status_code == 202
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
        await _settle(api)
    q = (await api.get(f"/v1/streams/{name}/quality", role="model")).json()
    by_epoch = {p["epoch"]: p for p in q["epochs"]}
    assert sorted(by_epoch) == [2, 3, 4, 5, 6]
    # epoch 2 trains on window 1 (800 rows) but count features are empty then (no count
    # period yet); from epoch 4 on the counts carry the signal
    assert by_epoch[2]["trained"] and by_epoch[2]["train_rows"] == 800
    for e in (4, 5):
        p = by_epoch[e]
        assert p["eval_rows"] == 800
        assert p["log_loss"] < p["prior_log_loss"] - 0.1, p
        assert p["auc"] > 0.8, p
    assert by_epoch[6]["eval_rows"] is None  # epoch 6 is still open
    r = await api.post(
        f"/v1/streams/{name}/predict",
        role="model",
        json={"rows": [{"user": "u2", "item": "i4"}, {"user": "u3", "item": "i4"}]},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["labels"] == ["0", "1"] and out["epoch"] == 6 and out["model_epoch"] == 6
    p_like, p_dislike = out["probabilities"][0][1], out["probabilities"][1][1]
    assert p_like > 0.6 > 0.4 > p_dislike
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json={"rows": [{"x": 1}]})
    assert r.status_code == 422


async def test_report_quality_cli_writes_a_png(api: Api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    from service.reference import report
    from service.reference.schemas import QualityOut, QualityPoint

    q = QualityOut(
        stream="s",
        description="",
        epochs=[
            QualityPoint(
                epoch=e,
                train_rows=10,
                trained=True,
                eval_rows=10,
                log_loss=0.5 + e / 100,
                auc=0.7,
                prior_log_loss=0.69,
            )
            for e in range(2, 6)
        ],
    )
    out = tmp_path / "q.png"
    report.plot_quality(q, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTIVITY_")}
    env["SELECTIVITY_DATABASE_URL"] = api.ctx.settings.resolved_database_url
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "report",
            "quality",
            "--stream",
            "missing",
            "--out",
            str(tmp_path / "x.png"),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "not found" in r.stderr

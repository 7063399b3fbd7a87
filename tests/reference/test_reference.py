"""The reference model: trained after each roll, scored on the newest rows of its train set,
served by /predict during its epoch only (docs/PRIVACY.md, promise 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from service.context import AppContext
from service.core.features.featurizer import Featurizer
from service.db.models import ReferenceModel, Stream
from service.features import service as features
from service.reference import report
from service.reference import service as reference
from service.reference.schemas import QualityOut, QualityPoint
from tests.conftest import Api, Jobs, unique
from tests.helpers import ingest, stream_body
from tests.serving import cli, cli_env


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


async def test_reference_model_trains_predicts_and_reports_quality(api: Api, jobs: Jobs) -> None:
    """Each epoch's model is fitted on its hot period's closed windows but their newest fifth,
    scored on that fifth, and lives during its epoch only: after a roll /predict answers 503
    until the new one is trained, and the quality report holds the current epoch alone."""
    name = unique("ref")
    body = stream_body(name, hot_windows=2, retention_windows=10)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    rng = np.random.default_rng(7)
    probe = {"rows": [{"user": "u1"}]}
    r = await api.post(f"/v1/streams/{name}/predict", role="model", json=probe)
    assert r.status_code == 503 and "reference model" in r.json()["detail"]
    for epoch in range(2, 7):
        await ingest(api, name, _rows(rng, 800))
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
        r = await api.post(f"/v1/streams/{name}/predict", role="model", json=probe)
        assert r.status_code == 503, r.text  # the previous epoch's model is gone
        assert "no reference model for the current hot period" in r.json()["detail"]
        await jobs()  # the follow-ups the roll left to the worker
        q = (await api.get(f"/v1/streams/{name}/quality", role="model")).json()
        assert [p["epoch"] for p in q["epochs"]] == [epoch]
        p = q["epochs"][0]
        # epoch e trains on window e-1: 800 rows, the newest 160 held out
        assert p["trained"] and (p["train_rows"], p["eval_rows"]) == (640, 160), p
        if epoch >= 4:  # count features are empty until the count period has a window
            assert p["log_loss"] < p["prior_log_loss"] - 0.1, p
            assert p["auc"] > 0.8, p
        r = await api.post(f"/v1/streams/{name}/predict", role="model", json=probe)
        assert r.status_code == 200 and r.json()["model_epoch"] == epoch
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


async def test_a_model_trained_after_its_epoch_ended_is_not_stored(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training that finishes after a roll moved past its epoch stores nothing: its oldest
    training window has left the hot period."""
    name = unique("ref")
    body = stream_body(name, hot_windows=2, retention_windows=10)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    await ingest(api, name, _rows(np.random.default_rng(3), 400))
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 2
    fz = await features.featurizer(ctx=api.ctx, name=name)
    real = features.featurizer

    async def roll_during_training(*, ctx: AppContext, name: str) -> Featurizer:
        out = await real(ctx=ctx, name=name)
        assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200  # epoch 3
        return out

    assert fz.epoch == 2
    monkeypatch.setattr(features, "featurizer", roll_during_training)
    assert await reference.train(ctx=api.ctx, name=name, epoch=2) is None
    async with api.ctx.sessionmaker() as session:
        sid = await session.scalar(select(Stream.id).where(Stream.name == name))
        left = await session.scalar(
            select(func.count()).select_from(ReferenceModel).where(ReferenceModel.stream_id == sid)
        )
    assert left == 0


def test_report_quality_writes_a_png(tmp_path: Path) -> None:
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
    assert report.no_data(q) is None and not report.quality_figure(q).texts


@pytest.mark.parametrize(
    ("points", "why"),
    [
        ([], "has no reference model"),
        (
            [
                QualityPoint(
                    epoch=2,
                    train_rows=3,
                    trained=False,
                    eval_rows=None,
                    log_loss=None,
                    auc=None,
                    prior_log_loss=None,
                )
            ],
            "epoch 2 was not fitted: 3 rows, at least 50",
        ),
    ],
)
def test_report_quality_without_data_says_so(
    tmp_path: Path, points: list[QualityPoint], why: str
) -> None:
    """No scored epoch: the figure carries a "no data yet" note with the reason, not empty
    axes."""
    q = QualityOut(stream="s", description="", epochs=points)
    assert why in (report.no_data(q) or "")
    [note] = report.quality_figure(q).texts
    text = " ".join(note.get_text().split())
    assert text.startswith("no data yet: ") and why in text
    out = tmp_path / "q.png"
    report.plot_quality(q, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
async def test_report_quality_cli_refuses_a_missing_stream(api: Api, tmp_path: Path) -> None:
    env = cli_env(DATABASE_URL=api.ctx.settings.resolved_database_url)
    r = cli("report", "quality", "--stream", "missing", "--out", str(tmp_path / "x.png"), env=env)
    assert r.returncode != 0 and "not found" in r.stderr


@pytest.mark.slow
async def test_report_quality_cli_says_when_there_is_no_data(api: Api, tmp_path: Path) -> None:
    name = unique("noq")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    env = cli_env(DATABASE_URL=api.ctx.settings.resolved_database_url)
    out = tmp_path / "q.png"
    r = cli("report", "quality", "--stream", name, "--out", str(out), env=env)
    assert r.returncode == 0, r.stderr
    assert f"no data yet: stream {name!r} has no reference model" in r.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""The stream's reference model (docs/ARCHITECTURE.md, "Models and forced retraining"): after
each roll a worker trains LightGBM on the train set (in the process pool, never on the event
loop), scores it on a temporal holdout, and serves ``/predict`` with it until the next roll.

Epoch e's model is fitted at the start of epoch e on the hot period's closed windows
(e−H+1 … e−1), featurized with the count period of e, all but the newest fifth of the rows (in
arrival order); that fifth scores it (log-loss, AUC, the prior's log-loss), so the cost of a
privacy setting is visible. With ``hot_windows = 1`` the train set is empty when an epoch
starts, so there is no reference model (the default ``hot_windows = 2`` has one).

Lifetime (promise 1): a LightGBM model holds raw values (split thresholds are midpoints of
adjacent raw values of a feature; ``feature_infos`` the exact minimum and maximum of every
passthrough feature), and its statistics (row counts, label rates, holdout scores) are exact
functions of raw rows. Window e−H+1 leaves the hot period at the roll to e+1, so the model of
epoch e and its statistics live during epoch e only: ``expire`` deletes every model of an
earlier epoch at each roll, a model is stored only while its epoch is still the stream's, and
``/predict`` serves the current epoch's model or answers 503, never an older one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.features.featurizer import Featurizer
from service.core.metrics import auc, log_loss
from service.db.models import ReferenceModel
from service.errors import PayloadTooLarge, Unavailable
from service.features import service as features
from service.reference import learner, repository
from service.reference.schemas import PredictOut, QualityOut, QualityPoint
from service.streams import repository as streams_repository
from service.streams import service as streams
from service.streams.validation import check_rows

MIN_TRAIN_ROWS = 50
HOLDOUT = 5  # the newest 1/HOLDOUT of the train set (arrival order) scores the model


async def _train_matrix(ctx: AppContext, fz: Featurizer) -> tuple[np.ndarray, np.ndarray]:
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    index = fz.rt.label_index
    async for batch in features.train_batches(ctx, fz):
        # the float columns only: categorical passthrough values (strings) are not its features
        xs.append(
            np.column_stack([batch.column(c).to_numpy(zero_copy_only=False) for c in fz.columns])
        )
        ys.append(np.array([index[v] for v in batch.column("label").to_pylist()], np.int64))
    if not xs:
        return np.zeros((0, len(fz.columns))), np.zeros(0, np.int64)
    return np.vstack(xs), np.concatenate(ys)


async def train(*, ctx: AppContext, name: str, epoch: int) -> ReferenceModel | None:
    """Train epoch ``epoch``'s reference model once (idempotent) and score it on the newest
    rows of its train set. Stored only if the stream is still at ``epoch`` (else its hot
    period is over, and with it the model's lifetime)."""
    rt = await streams.runtime(ctx=ctx, name=name)
    async with ctx.sessionmaker() as session:
        if await repository.get(session, rt.id, epoch) is not None:
            return None
    fz = await features.featurizer(ctx=ctx, name=name)
    if fz.epoch != epoch:
        return None  # the stream has moved on: that epoch's train set is gone
    x, y = await _train_matrix(ctx, fz)
    n_labels = len(rt.labels)
    cut = len(y) - len(y) // HOLDOUT
    fit_x, fit_y, eval_x, eval_y = x[:cut], y[:cut], x[cut:], y[cut:]
    rates = np.bincount(fit_y, minlength=n_labels) / max(len(fit_y), 1)
    model = None
    if len(fit_y) >= MIN_TRAIN_ROWS and len(np.unique(fit_y)) > 1:
        model = await ctx.run_cpu(learner.fit, fit_x, fit_y, n_labels)
    scores: dict[str, Any] = {"eval_rows": len(eval_y), "evaluated_at": datetime.now(UTC)}
    if len(eval_y):
        prior = np.clip(rates, 1e-6, 1.0)
        scores["prior_log_loss"] = log_loss(eval_y, np.tile(prior / prior.sum(), (len(eval_y), 1)))
        if model is not None:
            booster = learner.load(model)
            proba = await asyncio.to_thread(learner.predict_proba, booster, eval_x, n_labels)
            scores["log_loss"] = log_loss(eval_y, proba)
            a = auc(eval_y, proba)
            scores["auc"] = None if np.isnan(a) else a
    row = ReferenceModel(
        stream_id=rt.id,
        epoch=epoch,
        model=model,
        columns=fz.columns,
        train_rows=len(fit_y),
        train_label_rates=rates.tolist(),
        **scores,
    )
    async with ctx.sessionmaker() as session, session.begin():
        stream = await streams_repository.get_by_name(session, name, for_update=True)
        if stream is None or stream.epoch != epoch or stream.roll_target is not None:
            return None  # a roll moved past ``epoch``: the model's training windows may be gone
        if await repository.get(session, rt.id, epoch) is None:
            await repository.add(session, row)
    return row


async def expire(*, ctx: AppContext, session: AsyncSession, stream_id: int, epoch: int) -> int:
    """In ``lifecycle.expire``'s transaction at epoch ``epoch``: delete the reference models of
    earlier epochs with every statistic stored beside them (model e trained on windows up to
    e−H+1, which left the hot period at the roll to e+1), and drop their boosters from this
    process's cache. Returns how many were deleted."""
    deleted = await repository.delete_before(session, stream_id, epoch)
    cache = ctx.caches.boosters
    for key in [k for k in cache if k[0] == stream_id and k[1] < epoch]:
        del cache[key]
    return deleted


async def predict(
    *, ctx: AppContext, name: str, rows: Sequence[Mapping[str, object]]
) -> PredictOut:
    if len(rows) > ctx.settings.max_batch:
        raise PayloadTooLarge(f"rows: {len(rows)} exceeds the limit of {ctx.settings.max_batch}")
    fz = await features.featurizer(ctx=ctx, name=name)
    check_rows(fz.rt, rows, where="rows", max_string=ctx.settings.max_string_length)
    cache = ctx.caches.boosters
    key = (fz.rt.id, fz.epoch)
    hit = cache.get(key)
    if hit is None:
        cache.clear()  # a booster of an earlier epoch is never served again
        async with ctx.sessionmaker() as session:
            row = await repository.get(session, fz.rt.id, fz.epoch)
        if row is None or row.model is None:
            raise Unavailable(
                f"no reference model for the current hot period of stream {name!r} (epoch "
                f"{fz.epoch}): one is trained after each roll from a train set of at least "
                f"{MIN_TRAIN_ROWS} rows with two labels; earlier models are deleted with "
                "their hot period"
            )
        hit = (row.epoch, learner.load(row.model))
        cache[key] = hit
    proba = learner.predict_proba(hit[1], fz.transform(rows), len(fz.rt.labels))
    return PredictOut(
        epoch=fz.epoch, model_epoch=hit[0], labels=fz.rt.labels, probabilities=proba.tolist()
    )


async def quality(*, session: AsyncSession, name: str, limit: int) -> QualityOut:
    stream = await streams.get(session=session, name=name)
    rows = await repository.all_of(session, stream.id, since=stream.epoch, limit=limit)
    return QualityOut(
        stream=name,
        description="the current epoch's reference model, fitted at the start of the epoch on "
        "the hot period's closed windows but their newest fifth of rows, scored on that fifth "
        "(temporal holdout); deleted with its statistics at the next roll, when its oldest "
        "training window leaves the hot period",
        epochs=[
            QualityPoint(
                epoch=r.epoch,
                train_rows=r.train_rows,
                trained=r.model is not None,
                eval_rows=r.eval_rows,
                log_loss=r.log_loss,
                auc=r.auc,
                prior_log_loss=r.prior_log_loss,
            )
            for r in rows
        ],
    )

"""The stream's reference model (DESIGN §9): after each roll a worker trains LightGBM on the
train set (in the process pool, never on the event loop), serves ``/predict`` with it, and,
when the epoch is over, measures its quality on the observations that arrived during that
epoch (progressive validation), so the cost of a privacy setting is visible.

Epoch e's model is trained at the start of epoch e on the hot period's rows featurized with the
count period of e; its quality is measured on window e's rows (those that arrived during e),
featurized the same way. With ``hot_windows = 1`` the train set is empty when an epoch starts,
so there is no reference model (the default ``hot_windows = 2`` has one)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.metrics import auc, log_loss
from service.db.models import ReferenceModel
from service.errors import PayloadTooLarge, Unavailable
from service.features import service as features
from service.features.validation import check_rows
from service.reference import learner, repository
from service.reference.schemas import PredictOut, QualityOut, QualityPoint
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.service import store_of

log = logging.getLogger("selectivity.reference")
MIN_TRAIN_ROWS = 50
EVAL_CHUNK = 5000


async def _train_matrix(ctx: AppContext, fz: features.Featurizer) -> tuple[np.ndarray, np.ndarray]:
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    index = fz.rt.label_index
    async for batch in features.train_batches(ctx, fz):
        cols = batch.schema.names
        first = cols.index("label") + 1
        xs.append(
            np.column_stack(
                [batch.column(i).to_numpy(zero_copy_only=False) for i in range(first, len(cols))]
            )
        )
        ys.append(np.array([index[v] for v in batch.column("label").to_pylist()], np.int64))
    if not xs:
        return np.zeros((0, len(fz.columns))), np.zeros(0, np.int64)
    return np.vstack(xs), np.concatenate(ys)


async def train(*, ctx: AppContext, name: str, epoch: int) -> ReferenceModel | None:
    """Train epoch ``epoch``'s reference model once (idempotent)."""
    rt = await streams.runtime(ctx=ctx, name=name)
    async with ctx.sessionmaker() as session:
        if await repository.get(session, rt.id, epoch) is not None:
            return None
    fz = await features.featurizer(ctx=ctx, name=name)
    if fz.epoch != epoch:
        return None  # the stream has moved on: that epoch's train set is gone
    x, y = await _train_matrix(ctx, fz)
    n_labels = len(rt.labels)
    rates = (np.bincount(y, minlength=n_labels) / max(len(y), 1)).tolist()
    model = None
    if len(y) >= MIN_TRAIN_ROWS and len(np.unique(y)) > 1:
        model = await ctx.run_cpu(learner.fit, x, y, n_labels)
    row = ReferenceModel(
        stream_id=rt.id,
        epoch=epoch,
        model=model,
        columns=fz.columns,
        train_rows=len(y),
        train_label_rates=rates,
    )
    async with ctx.sessionmaker() as session, session.begin():
        if await repository.get(session, rt.id, epoch) is None:
            await repository.add(session, row)
    return row


async def _window_rows(ctx: AppContext, rt: StreamRuntime, w: int):  # type: ignore[no-untyped-def]
    store = store_of(ctx)
    last = await store.hot_last_id(rt.name, w)
    if last is None:
        return
    start: bytes | str = "-"
    while True:
        entries = await store.hot_range(rt.name, w, start, last, EVAL_CHUNK)
        if not entries:
            return
        yield [orjson.loads(fields[b"d"]) for _, fields in entries]
        if entries[-1][0] == last:
            return
        start = b"(" + entries[-1][0]


async def evaluate(*, ctx: AppContext, name: str, epoch: int) -> ReferenceModel | None:
    """Quality of epoch ``epoch``'s model on the rows that arrived during it (once)."""
    rt = await streams.runtime(ctx=ctx, name=name)
    async with ctx.sessionmaker() as session:
        row = await repository.get(session, rt.id, epoch)
    if row is None or row.evaluated_at is not None:
        return row
    agg = await store_of(ctx).read_agg(name, epoch)
    if agg is None:
        return row
    fz = features.Featurizer.build(rt.counted_at(epoch), agg)
    booster = learner.load(row.model) if row.model else None
    ys, probas = [], []
    async for recs in _window_rows(ctx, rt, epoch):
        x = fz.transform([r["f"] for r in recs])
        ys.append(np.array([rt.label_index[r["y"]] for r in recs], np.int64))
        if booster is not None:
            probas.append(
                await asyncio.to_thread(learner.predict_proba, booster, x, len(rt.labels))
            )
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    values: dict[str, Any] = {"eval_rows": len(y), "evaluated_at": datetime.now(UTC)}
    if len(y):
        rates = np.clip(np.asarray(row.train_label_rates, float), 1e-6, 1.0)
        values["prior_log_loss"] = log_loss(y, np.tile(rates / rates.sum(), (len(y), 1)))
        if probas:
            proba = np.vstack(probas)
            values["log_loss"] = log_loss(y, proba)
            a = auc(y, proba)
            values["auc"] = None if np.isnan(a) else a
    async with ctx.sessionmaker() as session, session.begin():
        fresh = await repository.get(session, rt.id, epoch)
        assert fresh is not None
        for k, v in values.items():
            setattr(fresh, k, v)
    return fresh


async def after_roll(*, ctx: AppContext, name: str, epoch: int) -> None:
    """The worker's job after a roll to ``epoch``: evaluate the previous epoch's model, train
    this one's. Failures are logged, never raised into the roll."""
    try:
        await evaluate(ctx=ctx, name=name, epoch=epoch - 1)
        await train(ctx=ctx, name=name, epoch=epoch)
    except Exception as exc:
        log.error("reference model of %s at epoch %d failed: %s", name, epoch, type(exc).__name__)


async def predict(
    *, ctx: AppContext, name: str, rows: Sequence[Mapping[str, object]]
) -> PredictOut:
    if len(rows) > ctx.settings.max_batch:
        raise PayloadTooLarge(f"rows: {len(rows)} exceeds the limit of {ctx.settings.max_batch}")
    fz = await features.featurizer(ctx=ctx, name=name)
    check_rows(fz.rt, rows, where="rows", max_string=ctx.settings.max_string_length)
    cache: dict[tuple[int, int], tuple[int, Any]] = ctx.caches.setdefault("boosters", {})
    key = (fz.rt.id, fz.epoch)
    hit = cache.get(key)
    if hit is None:
        async with ctx.sessionmaker() as session:
            row = await repository.latest_trained(session, fz.rt.id, fz.epoch)
        if row is None or row.model is None:
            raise Unavailable(
                f"stream {name!r} has no reference model yet (it is trained "
                f"after a roll, from a train set of at least {MIN_TRAIN_ROWS} rows)"
            )
        hit = (row.epoch, learner.load(row.model))
        cache.clear()
        cache[key] = hit
    proba = learner.predict_proba(hit[1], fz.transform(rows), len(fz.rt.labels))
    return PredictOut(
        epoch=fz.epoch, model_epoch=hit[0], labels=fz.rt.labels, probabilities=proba.tolist()
    )


async def quality(*, session: AsyncSession, name: str, limit: int) -> QualityOut:
    stream = await streams.get(session=session, name=name)
    rows = await repository.all_of(session, stream.id, limit=limit)
    return QualityOut(
        stream=name,
        description="per epoch: the reference model trained at the start of the epoch, scored "
        "on the observations that arrived during it (progressive validation)",
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

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from service.api.deps import CtxDep, JsonRoute, ModelKey
from service.api.streams import StreamPath
from service.errors import (
    NotFound,
    PayloadTooLarge,
    RetrainRequired,
    Unavailable,
    ValidationError,
    error_responses,
)
from service.features import service
from service.features.schemas import FeaturizeIn, FeaturizeOut, LabelRatesOut
from service.models import service as models
from service.streams.validation import check_integers

router = APIRouter(prefix="/v1/streams", tags=["features"], route_class=JsonRoute)


@router.post(
    "/{stream}/featurize",
    response_model=FeaturizeOut,
    responses=error_responses(
        NotFound, PayloadTooLarge, ValidationError, Unavailable, RetrainRequired
    ),
)
async def featurize(
    body: FeaturizeIn, request: Request, ctx: CtxDep, _: ModelKey, stream: str = StreamPath
) -> Response:
    """``{"rows": [...]}`` (at most ``SELECTIVITY_MAX_BATCH``) → ``{"epoch", "columns",
    "rows"}``: each row's count features from the served epoch's noisy tables. The rows are
    not kept."""
    check_integers(await request.body(), items="rows")  # read already: the parsed body's bytes
    if body.model_id is not None:
        await models.check_serving(ctx=ctx, name=stream, model_id=body.model_id)
    out = await service.featurize(ctx=ctx, name=stream, rows=body.rows)
    return Response(service.featurize_json(out), media_type="application/json")


@router.get(
    "/{stream}/label-rates",
    response_model=LabelRatesOut,
    responses=error_responses(NotFound, ValidationError, Unavailable),
)
async def label_rates(
    ctx: CtxDep,
    _: ModelKey,
    stream: str = StreamPath,
    half_life: float = Query(
        default=2.0, gt=0, le=1000, description="windows after which a window weighs half"
    ),
) -> dict:
    """The label rate's history: each window of the served epoch's count period with its
    noisy label counts (the prior table featurize reads, per window), oldest first, and the
    rates pooled over them (``recent``: weighted 2^(−age/half_life)). A model trained on the
    hot period has that period's base rate; where the rate moves, a client may shift its
    predictions toward ``recent`` (docs/USING.md, "Base rate"). Post-processing of released
    noisy tables: no privacy cost."""
    return await service.label_rates(ctx=ctx, name=stream, half_life=half_life)


@router.get(
    "/{stream}/trainset",
    responses={
        200: {
            "content": {m: {} for m in service.MEDIA_TYPES.values()},
            "description": "the hot period, featurized; epoch in X-Selectivity-Epoch",
        },
        **error_responses(NotFound, Unavailable),
    },
)
async def trainset(
    ctx: CtxDep,
    _: ModelKey,
    stream: str = StreamPath,
    format: Literal["arrow", "parquet", "ndjson"] = Query(default="arrow"),  # noqa: A002
    model_id: str | None = Query(
        default=None, max_length=40, description="records a training of this model at the epoch"
    ),
) -> StreamingResponse:
    """The hot period's observations featurized at the served epoch, streamed as Arrow IPC
    (default), Parquet or NDJSON; the epoch is in ``X-Selectivity-Epoch``. With ``model_id``,
    the model is recorded as trained at that epoch."""
    epoch, body = await service.trainset(ctx=ctx, name=stream, fmt=format)
    if model_id is not None:
        await models.record_trainset(ctx=ctx, name=stream, model_id=model_id, epoch=epoch)
    return StreamingResponse(
        body, media_type=service.MEDIA_TYPES[format], headers={"X-Selectivity-Epoch": str(epoch)}
    )

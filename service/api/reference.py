from __future__ import annotations

from fastapi import APIRouter, Query, Request

from service.api.deps import CtxDep, JsonRoute, ModelKey, SessionDep
from service.api.streams import StreamPath
from service.errors import NotFound, PayloadTooLarge, Unavailable, ValidationError, error_responses
from service.reference import service
from service.reference.schemas import PredictIn, PredictOut, QualityOut
from service.streams.validation import check_integers

router = APIRouter(prefix="/v1/streams", tags=["reference model"], route_class=JsonRoute)


@router.post(
    "/{stream}/predict",
    response_model=PredictOut,
    responses=error_responses(NotFound, PayloadTooLarge, ValidationError, Unavailable),
)
async def predict(
    body: PredictIn, request: Request, ctx: CtxDep, _: ModelKey, stream: str = StreamPath
) -> PredictOut:
    """The stream's reference model's probabilities for ``{"rows": [...]}``."""
    check_integers(await request.body(), items="rows")  # read already: the parsed body's bytes
    return await service.predict(ctx=ctx, name=stream, rows=list(body.rows))


@router.get("/{stream}/quality", response_model=QualityOut, responses=error_responses(NotFound))
async def quality(
    session: SessionDep,
    _: ModelKey,
    stream: str = StreamPath,
    limit: int = Query(default=200, ge=1, le=10_000),
) -> QualityOut:
    """The reference model's quality per epoch, measured on the newest part of each train set."""
    return await service.quality(session=session, name=stream, limit=limit)

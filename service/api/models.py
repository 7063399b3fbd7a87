from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from sqlalchemy import select

from service.api.deps import INT64_MAX, CtxDep, JsonRoute, ModelKey, SessionDep
from service.api.streams import StreamPath
from service.db.models import Model
from service.errors import Conflict, NotFound, ValidationError, error_responses
from service.models import service
from service.models.schemas import ModelCreate, ModelCreated, ModelOut, TrainedIn
from service.models.webhooks import Allowlist
from service.streams import service as streams

router = APIRouter(prefix="/v1/streams", tags=["models"], route_class=JsonRoute)
ModelPath = Path(pattern=r"^m_[0-9a-f]{16}$")


@router.post(
    "/{stream}/models",
    status_code=201,
    response_model=ModelCreated,
    responses=error_responses(NotFound, Conflict, ValidationError),
)
async def register(
    body: ModelCreate, ctx: CtxDep, session: SessionDep, _: ModelKey, stream: str = StreamPath
) -> ModelCreated:
    """Register a model of the stream (a name, an optional ``webhook_url``): the service
    tells it, by events and the webhook, when a roll makes it stale."""
    return await service.create(
        session=session,
        name=stream,
        model_in=body,
        allow=Allowlist.parse(ctx.settings.webhook_allow),
    )


class ModelList(BaseModel):
    models: list[ModelOut]


@router.get("/{stream}/models", response_model=ModelList, responses=error_responses(NotFound))
async def list_models(
    session: SessionDep,
    _: ModelKey,
    stream: str = StreamPath,
    limit: int = Query(default=100, ge=1, le=1000),
) -> ModelList:
    """The stream's models, oldest first, with their status (current, stale, untrained,
    refused) and retrain deadline (the console's streams page)."""
    sid = (await streams.get(session=session, name=stream)).id
    ids = list(
        await session.scalars(
            select(Model.id).where(Model.stream_id == sid).order_by(Model.created_at).limit(limit)
        )
    )
    return ModelList(
        models=[await service.get(session=session, name=stream, model_id=i) for i in ids]
    )


@router.get(
    "/{stream}/models/{model_id}", response_model=ModelOut, responses=error_responses(NotFound)
)
async def status(
    session: SessionDep, _: ModelKey, stream: str = StreamPath, model_id: str = ModelPath
) -> ModelOut:
    """One model: its status (``current``, ``stale``, ``untrained``, ``refused``) and the
    epoch it was last trained at."""
    return await service.get(session=session, name=stream, model_id=model_id)


@router.post(
    "/{stream}/models/{model_id}/trained",
    response_model=ModelOut,
    responses=error_responses(NotFound, ValidationError),
)
async def trained(
    body: TrainedIn,
    ctx: CtxDep,
    session: SessionDep,
    _: ModelKey,
    stream: str = StreamPath,
    model_id: str = ModelPath,
) -> ModelOut:
    """Report a training of the model on the train set of ``{"epoch": e}``."""
    return await service.report_trained(
        ctx=ctx, session=session, name=stream, model_id=model_id, epoch=body.epoch
    )


EVENT_ID = re.compile(r"[0-9]{1,19}")


def event_id(header: str | None) -> int:
    """``Last-Event-ID``: an id this service sent, ASCII digits from 0 to 2⁶³−1 (0, or no
    header: from the start). ``str.isdigit`` is no test: it accepts '²' and other digits
    ``int`` refuses. The value is never repeated."""
    if not header:
        return 0
    if not EVENT_ID.fullmatch(header) or int(header) > INT64_MAX:
        raise ValidationError(
            f"Last-Event-ID: must be the id of an event this service sent, ASCII digits from 0 "
            f"to {INT64_MAX}"
        )
    return int(header)


@router.get(
    "/{stream}/events",
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "server-sent events: roll, retrain_required",
        },
        **error_responses(NotFound),
    },
)
async def events(
    ctx: CtxDep,
    _: ModelKey,
    stream: str = StreamPath,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
    after: int | None = Query(
        default=None, ge=0, le=INT64_MAX, description="instead of Last-Event-ID"
    ),
    follow_seconds: float = Query(
        default=300, ge=0, le=3600, description="how long to wait for new events; 0: backlog"
    ),
) -> StreamingResponse:
    """Server-sent events of the stream (``roll``, ``retrain_required``) for up to
    ``follow_seconds``; resumable with ``Last-Event-ID``."""
    start = after if after is not None else event_id(last_event_id)
    body = await service.events(ctx=ctx, name=stream, after=start, follow_seconds=follow_seconds)
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )

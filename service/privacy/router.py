from __future__ import annotations

import orjson
from fastapi import APIRouter, Response

from service.deps import AnyKey, SessionDep
from service.errors import NotFound, error_responses
from service.privacy import service
from service.streams.router import StreamPath

router = APIRouter(prefix="/v1/streams", tags=["privacy"])


@router.get(
    "/{stream}/privacy",
    responses={
        200: {
            "description": "the privacy ledger: per observation and per user, with the parts, "
            "their parameters and sources (ε is null where there is no guarantee)"
        },
        **error_responses(NotFound),
    },
)
async def privacy(session: SessionDep, _: AnyKey, stream: str = StreamPath) -> Response:
    # orjson writes a missing guarantee (ε = ∞, mechanism 'none') as null
    return Response(
        orjson.dumps(await service.get(session=session, name=stream)), media_type="application/json"
    )

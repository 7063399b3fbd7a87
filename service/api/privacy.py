from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response

from service.api import limits
from service.api.deps import AnyKey, CtxDep, JsonRoute, SessionDep
from service.api.streams import StreamPath
from service.errors import NotFound, TooManyRequests, ValidationError, error_responses
from service.privacy import service
from service.privacy.releases import Viewer
from service.privacy.schemas import KAnonIn, KAnonOut

router = APIRouter(prefix="/v1/streams", tags=["privacy"], route_class=JsonRoute)


@router.get(
    "/{stream}/privacy",
    responses={
        200: {
            "description": "the privacy ledger: per observation and per user, with the parts, "
            "their parameters and sources (ε is null where there is no guarantee); "
            "releases: every release kind of the stream, DP or not, in the same fields; "
            "reidentification: the latest re-identification audit of the stream, or null "
            "(its exact figures only for admins and its creator)"
        },
        **error_responses(NotFound),
    },
)
async def privacy(
    session: SessionDep, ctx: CtxDep, who: AnyKey, stream: str = StreamPath
) -> Response:
    """The stream's privacy ledger: what each release costs per observation and per user,
    under which neighbour relation and against which observer."""
    # orjson writes a missing guarantee (ε = ∞, mechanism 'none') as null
    viewer = Viewer(key_id=who.key_id, role=who.role)
    out = await service.get(session=session, name=stream, ctx=ctx, viewer=viewer)
    return Response(orjson.dumps(out), media_type="application/json")


calculator_router = APIRouter(prefix="/v1/privacy", tags=["privacy"], route_class=JsonRoute)


@calculator_router.post(
    "/sampling-k-anonymity",
    response_model=KAnonOut,
    responses=error_responses(ValidationError, TooManyRequests),
)
async def sampling_k_anonymity(body: KAnonIn, request: Request, _: AnyKey) -> KAnonOut:
    """(β, k, ε) → δ by Li, Qardaji & Su's Theorem 5; omit k or beta and give delta to solve
    for the smallest k or the largest β that reaches it. A solve that would need more than
    the calculator's bound of work (under a second) is a 422; answers are cached."""
    slot = limits.gate(request, "calculator").hold()
    return await service.sampling_k_anonymity(body, slot=slot)

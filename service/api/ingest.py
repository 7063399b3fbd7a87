from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from service.api.deps import CtxDep, JsonRoute, ProducerKey
from service.api.streams import StreamPath
from service.errors import (
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unavailable,
    ValidationError,
    error_responses,
)
from service.ingest import service
from service.ingest.schemas import IngestIn, IngestOut
from service.streams.validation import check_integers

router = APIRouter(prefix="/v1/streams", tags=["ingest"], route_class=JsonRoute)


@router.post(
    "/{stream}/observations",
    status_code=202,
    response_model=IngestOut,
    responses=error_responses(
        NotFound, PayloadTooLarge, ValidationError, TooManyRequests, Unavailable
    ),
)
async def ingest(
    body: IngestIn,
    request: Request,
    ctx: CtxDep,
    producer: ProducerKey,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=200,
            description="a retry with the same key and body gets the first answer "
            "(Idempotent-Replayed: true) and is not accepted again; the same key with another "
            "body gets 422",
        ),
    ] = None,
    stream: str = StreamPath,
) -> IngestOut:
    """Accept a batch of observations (at most ``SELECTIVITY_MAX_BATCH`` rows, 10,000 by
    default) into the open window: 202 ``{"accepted", "window"}`` once they are stored; the
    worker counts them into the window's tables soon after. With an ``Idempotency-Key`` header
    (the producer's own: the same key from another producer is another batch), a retry of the
    same body is answered as the first time and counted once, for
    ``SELECTIVITY_IDEMPOTENCY_TTL_SECONDS`` (7 days) whatever the rolls; a stream remembers at
    most ``SELECTIVITY_IDEMPOTENCY_MAX_KEYS`` keys (a new key beyond them: 429)."""
    # read already: the parsed body's bytes
    check_integers(await request.body(), items="observations", values="features")
    out, replayed = await service.ingest(
        ctx=ctx,
        name=stream,
        body=body,
        idempotency_key=idempotency_key,
        scope=service.key_scope(actor=producer.actor or producer.key_id),
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return out

"""k-anonymised releases (SaNGreeA): roles analyst and admin, every creation and download
audited (docs/ARCHITECTURE.md, "k-anonymised releases"); a run or iML session is read only by
the key that created it (others, admins too, get 404); and the example generalisation trees
the page offers (read-only)."""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response

from service.admin.service import Principal
from service.anonymize import service
from service.anonymize.schemas import (
    ID_PATTERN,
    IML_ID_PATTERN,
    AnonymizationCreate,
    AnonymizationOut,
    ChoiceIn,
    CreatedOut,
    WeightsSessionCreate,
    WeightsSessionOut,
)
from service.api.deps import CtxDep, JsonRoute, require
from service.audit import service as audit
from service.errors import Conflict, NotFound, TooManyRequests, ValidationError, error_responses

router = APIRouter(prefix="/v1/anonymizations", tags=["anonymizations"], route_class=JsonRoute)
AnalystKey = Annotated[Principal, Depends(require("analyst"))]
IdPath = Path(pattern=ID_PATTERN)
SessionPath = Path(pattern=IML_ID_PATTERN)
FormatQuery = Query(default="csv", description="csv, parquet, arrow (IPC stream) or ndjson")
EXAMPLE_HIERARCHIES = files("service.web").joinpath("static", "anonymize-example-hierarchies.json")
"""``{"adult": {attribute: tree}}``: the trees of ``examples/adult/hierarchies`` in one file
inside the package (``tests/anonymize/test_page.py`` checks that the two agree)."""


@functools.cache
def _example_hierarchies() -> dict[str, dict[str, dict[str, Any]]]:
    return dict(json.loads(EXAMPLE_HIERARCHIES.read_text(encoding="utf-8")))


@router.post(
    "",
    status_code=202,
    response_model=CreatedOut,
    responses=error_responses(NotFound, ValidationError, Conflict, TooManyRequests),
)
async def create(body: AnonymizationCreate, ctx: CtxDep, who: AnalystKey) -> CreatedOut:
    """Start a k-anonymised release (SaNGreeA) of inline rows or of a stream's hot rows,
    with hierarchies and weights: 202 with the job; its progress at ``GET …/{a}``."""
    async with ctx.jobs.admission(owner=who.key_id):  # 429 when the user jobs are full
        a, detail = await service.create(ctx=ctx, body=body, owner=who.key_id)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="anonymization.create",
        target=f"anonymization:{a}",
        detail=detail,
    )
    return CreatedOut(id=a)


@router.post(
    "/weights",
    status_code=201,
    response_model=WeightsSessionOut,
    responses=error_responses(NotFound, ValidationError, Conflict),
)
async def start_weights(
    body: WeightsSessionCreate, ctx: CtxDep, who: AnalystKey
) -> WeightsSessionOut:
    """An iML session: each answer moves the weights by the rule of ``service.anonymize.iml``."""
    out = await service.start_weights(ctx=ctx, body=body, owner=who.key_id)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="anonymization.weights",
        target=f"weights:{out.session}",
        detail={
            "source": "inline" if body.source.stream is None else f"stream:{body.source.stream}",
            "k": body.k,
            "sample": body.sample,
            "quasi_identifiers": [q.name for q in body.quasi_identifiers],
        },
    )
    return out


@router.post(
    "/weights/{session}",
    response_model=WeightsSessionOut,
    responses=error_responses(NotFound, ValidationError),
)
async def answer_weights(
    body: ChoiceIn, ctx: CtxDep, who: AnalystKey, session: str = SessionPath
) -> WeightsSessionOut:
    """Answer the weight session's question: the next question, or the learned weights."""
    return await service.answer_weights(
        ctx=ctx, session=session, choice=body.choice, owner=who.key_id
    )


@router.get("/example-hierarchies", response_model=dict[str, dict[str, dict[str, Any]]])
async def example_hierarchies(_: AnalystKey) -> dict[str, dict[str, dict[str, Any]]]:
    """Example generalisation trees by data set and attribute (``{"adult": {"workclass":
    {"value": "*", "children": [...]}, ...}}``), to pass as a quasi-identifier's
    ``hierarchy``; the same for every caller, no data of the service."""
    return _example_hierarchies()


@router.get("/{a}", response_model=AnonymizationOut, responses=error_responses(NotFound))
async def get(ctx: CtxDep, who: AnalystKey, a: str = IdPath) -> AnonymizationOut:
    """A release job's state and progress (its creator only)."""
    return await service.get(ctx=ctx, a=a, owner=who.key_id)


@router.get(
    "/{a}/result",
    responses={
        200: {
            "content": {m: {} for m in service.MEDIA_TYPES.values()},
            "description": "one row per input row: cluster, the generalised QIs, the kept columns",
        },
        **error_responses(NotFound, Conflict),
    },
)
async def result(
    ctx: CtxDep,
    who: AnalystKey,
    a: str = IdPath,
    format: service.Format = FormatQuery,  # noqa: A002
) -> Response:
    """The released k-anonymous table (its creator only), until its oldest window's hot
    period ends."""
    body = await service.result(ctx=ctx, a=a, fmt=format, owner=who.key_id)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="anonymization.download",
        target=f"anonymization:{a}",
        detail={"format": format, "bytes": len(body)},
    )
    return Response(body, media_type=service.MEDIA_TYPES[format])

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from service.admin.service import Principal
from service.api.deps import INT64_MAX, AnyKey, CtxDep, JsonRoute, SessionDep, require
from service.audit import service as audit
from service.errors import (
    Conflict,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    ValidationError,
    error_responses,
)
from service.queues import privacy as queue_privacy
from service.queues import service
from service.queues.schemas import (
    MAX_NEXT,
    CandidatesIn,
    CandidatesOut,
    LabelIn,
    LabelOut,
    LabelsOut,
    LeaseOut,
    PrivacyOut,
    QueueCreate,
    QueueList,
    QueueOut,
    SkipOut,
    StatsOut,
    TasksOut,
)
from service.streams.schemas import NAME_PATTERN
from service.streams.validation import check_integers

router = APIRouter(prefix="/v1/queues", tags=["queues"], route_class=JsonRoute)
QueuePath = Path(pattern=NAME_PATTERN, max_length=64)
TaskPath = Path(pattern=r"^t_[0-9a-f]{16}$")

CuratorKey = Annotated[Principal, Depends(require("curator"))]
AnnotatorKey = Annotated[Principal, Depends(require("annotator"))]
QueueKey = Annotated[Principal, Depends(require("curator", "annotator"))]


@router.post(
    "",
    status_code=201,
    response_model=QueueOut,
    responses=error_responses(Conflict, NotFound, ValidationError),
)
async def create_queue(
    body: QueueCreate, ctx: CtxDep, session: SessionDep, who: CuratorKey
) -> QueueOut:
    """Create an annotation queue: the candidates submitted to it reach annotators only
    under its (ε, δ) guarantee (each kept with the queue's sampling probability, released when
    k of a key have arrived in a period)."""
    out = await service.create(
        session=session,
        queue_in=body,
        created_by=who.key_id,
        delta_ceiling=ctx.settings.queue_delta_ceiling,
    )
    await session.commit()
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="queue.create",
        target=f"queue:{out.name}",
        detail={
            "config": body.model_dump(mode="json", exclude={"name"}),
            "epsilon": out.epsilon,
            "delta": out.delta,
        },
    )
    return out


@router.get("", response_model=QueueList)
async def list_queues(session: SessionDep, _: QueueKey) -> QueueList:
    """Every queue, with its settings."""
    return QueueList(queues=await service.list_out(session=session))


@router.get("/{queue}", response_model=QueueOut, responses=error_responses(NotFound))
async def get_queue(ctx: CtxDep, _: QueueKey, queue: str = QueuePath) -> QueueOut:
    """One queue: its settings and its guarantee."""
    return await service.get_out(ctx=ctx, name=queue)


@router.post(
    "/{queue}/candidates",
    response_model=CandidatesOut,
    responses=error_responses(NotFound, PayloadTooLarge, ValidationError, Unavailable),
)
async def candidates(
    body: CandidatesIn, request: Request, ctx: CtxDep, _: CuratorKey, queue: str = QueuePath
) -> CandidatesOut:
    """Submit candidate examples. The answer and its timing are the same whether or not a
    candidate was kept, so that a submitter cannot tell."""
    # read already: the parsed body's bytes
    check_integers(await request.body(), items="candidates", values="record")
    return await service.submit(ctx=ctx, name=queue, body=body)


@router.get("/{queue}/next", response_model=TasksOut, responses=error_responses(NotFound))
async def next_tasks(
    ctx: CtxDep,
    who: AnnotatorKey,
    queue: str = QueuePath,
    n: int = Query(default=1, ge=1, le=MAX_NEXT, description="how many tasks to lease"),
) -> TasksOut:
    """Lease released tasks to the calling annotator."""
    return await service.next_tasks(ctx=ctx, name=queue, owner=who.key_id, n=n)


@router.post(
    "/{queue}/tasks/{task_id}/heartbeat",
    response_model=LeaseOut,
    responses=error_responses(NotFound, Conflict),
)
async def heartbeat(
    ctx: CtxDep, who: AnnotatorKey, queue: str = QueuePath, task_id: str = TaskPath
) -> LeaseOut:
    """Extend the caller's lease on a task."""
    return await service.heartbeat(ctx=ctx, name=queue, task_id=task_id, owner=who.key_id)


@router.post(
    "/{queue}/tasks/{task_id}/skip",
    response_model=SkipOut,
    responses=error_responses(NotFound, Conflict),
)
async def skip(
    ctx: CtxDep, who: AnnotatorKey, queue: str = QueuePath, task_id: str = TaskPath
) -> SkipOut:
    """Give a leased task back without a label."""
    return await service.skip(ctx=ctx, name=queue, task_id=task_id, owner=who.key_id)


@router.post(
    "/{queue}/tasks/{task_id}/label",
    response_model=LabelOut,
    responses=error_responses(NotFound, Conflict, ValidationError, Unavailable),
)
async def label(
    body: LabelIn, ctx: CtxDep, who: AnnotatorKey, queue: str = QueuePath, task_id: str = TaskPath
) -> LabelOut:
    """Label a task the caller leased."""
    return await service.label(
        ctx=ctx, name=queue, task_id=task_id, owner=who.key_id, label=body.label
    )


@router.get("/{queue}/labels", response_model=LabelsOut, responses=error_responses(NotFound))
async def labels(
    ctx: CtxDep,
    who: CuratorKey,
    queue: str = QueuePath,
    after: int = Query(
        default=0, ge=0, le=INT64_MAX, description="the next_after of the previous page"
    ),
    limit: int = Query(default=1000, ge=1, le=10_000),
) -> LabelsOut:
    """The queue's labelled examples, exported."""
    out = await service.labels(ctx=ctx, name=queue, after=after, limit=limit)
    await audit.record(  # an export of labelled, released examples: never their content
        ctx.sessionmaker,
        actor=who.key_id,
        action="queue.export_labels",
        target=f"queue:{queue}",
        detail={"after": after, "limit": limit, "exported": len(out.labels)},
    )
    return out


@router.get("/{queue}/stats", response_model=StatsOut, responses=error_responses(NotFound))
async def stats(ctx: CtxDep, who: QueueKey, queue: str = QueuePath) -> StatsOut:
    """The queue's counters that do not depend on which candidates were sampled."""
    return await service.stats(ctx=ctx, name=queue, submitter=who.role != "annotator")


@router.get("/{queue}/privacy", response_model=PrivacyOut, responses=error_responses(NotFound))
async def privacy(ctx: CtxDep, _: AnyKey, queue: str = QueuePath) -> PrivacyOut:
    """The queue's (ε, δ) guarantee per release period and what it has spent."""
    return await queue_privacy.privacy(ctx=ctx, name=queue)

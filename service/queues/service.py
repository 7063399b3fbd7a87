"""The k-anonymous active-learning annotation queue (DESIGN §11).

A submitted batch is validated and canonicalised as a whole (so errors never depend on the
sampling), then each candidate is kept with probability β drawn from the OS CSPRNG; the others
are dropped here, in memory: they are never written to Redis, SQL or a log. A kept candidate
is named by HMAC-SHA256(queue secret, canonical form): that digest, never the text, goes into
the HyperLogLog (distinct count), the Count-Mean-Min sketch (frequency) and, once the sketch
flags it, an exact counter. ``queue_candidates.lua`` does all of it atomically per batch and
releases a key when its exact count reaches k, once per key, into a pool ranked by
uncertainty.

Where the raw payload is kept, and why: only a released example's canonical form is stored
(the Redis ``tasks`` hash while it waits for a label, the SQL ``annotation_task`` row for the
export), because annotators must see it and the export must carry it. It is the canonical
form, not any submitter's spelling, so case or spacing never identifies one of the k. An
unreleased candidate's payload exists only in the request's memory.

Annotators lease tasks (``queue_lease.lua``: most uncertain first, TTL, expired leases
requeued), heartbeat, skip, and label once (``queue_task.lua`` decides atomically who labelled
first; a repeat is a replay). A labelled record becomes an observation of its stream through
the ingest service, with an Idempotency-Key derived from the task id."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core import cmm, kanon
from service.core.accounting import Part
from service.core.sampling import bernoulli_mask, canonical_record, canonical_text
from service.db.models import AnnotationQueue, AnnotationTask
from service.errors import Conflict, NotFound, PayloadTooLarge, Unavailable, ValidationError
from service.features.validation import check_rows
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn, ObservationIn
from service.queues import repository
from service.queues.schemas import (
    CandidatesIn,
    CandidatesOut,
    LabelledTask,
    LabelOut,
    LabelsOut,
    LeaseOut,
    PrivacyOut,
    QueueCreate,
    QueueOut,
    SketchIn,
    SkipOut,
    StatsOut,
    TaskOut,
    TasksOut,
)
from service.queues.store import SKIP_MEMORY_SECONDS, QueueStore, Sampled
from service.reference import service as reference
from service.streams import service as streams

log = logging.getLogger("selectivity.queues")
RUNTIME_TTL_SECONDS = 5.0
FALLBACK_UNCERTAINTY = 0.5
SOURCE = (
    "Li, Qardaji & Su 2012 (arXiv 1101.2604), Thm 5: β-sampling followed by suppression of "
    "every key with fewer than k sampled occurrences is (ε, δ)-DP for ε ≥ −ln(1−β)"
)


@dataclass(frozen=True)
class QueueRuntime:
    id: int
    name: str
    beta: float
    k: int
    labels: list[str]
    payload_kind: str
    stream: str | None
    stream_id: int | None
    uncertainty: str
    lease_seconds: int
    epsilon: float
    spec: cmm.CMMSpec
    secret: bytes
    created_at: datetime


def _runtime(q: AnnotationQueue) -> QueueRuntime:
    c = q.config
    return QueueRuntime(
        id=q.id,
        name=q.name,
        beta=float(c["beta"]),
        k=int(c["k"]),
        labels=list(c["labels"]),
        payload_kind=c["payload_kind"],
        stream=c.get("stream"),
        stream_id=q.stream_id,
        uncertainty=c["uncertainty"],
        lease_seconds=int(c["lease_seconds"]),
        epsilon=float(c["epsilon"]),
        spec=cmm.CMMSpec(width=int(c["sketch"]["width"]), depth=int(c["sketch"]["depth"])),
        secret=q.secret,
        created_at=q.created_at,
    )


def store_of(ctx: AppContext) -> QueueStore:
    st = ctx.caches.get("queue_store")
    if st is None:
        st = ctx.caches["queue_store"] = QueueStore(ctx.redis, ctx.keys)
    return st


def default_epsilon(beta: float) -> float:
    return max(1.0, kanon.min_epsilon(beta=beta))


def _out(rt: QueueRuntime) -> QueueOut:
    return QueueOut(
        name=rt.name,
        beta=rt.beta,
        k=rt.k,
        labels=rt.labels,
        payload_kind=rt.payload_kind,  # type: ignore[arg-type]
        stream=rt.stream,
        uncertainty=rt.uncertainty,  # type: ignore[arg-type]
        lease_seconds=rt.lease_seconds,
        epsilon=rt.epsilon,
        delta=kanon.delta(k=rt.k, beta=rt.beta, epsilon=rt.epsilon).delta,
        sketch=SketchIn(width=rt.spec.width, depth=rt.spec.depth),
        created_at=rt.created_at,
    )


async def create(*, session: AsyncSession, queue_in: QueueCreate, created_by: str) -> QueueOut:
    if await repository.get_by_name(session, queue_in.name) is not None:
        raise Conflict(f"queue {queue_in.name!r} already exists")
    labels = queue_in.labels
    stream_id = None
    if queue_in.payload_kind == "record":
        assert queue_in.stream is not None
        stream = await streams.get(session=session, name=queue_in.stream)
        stream_labels = list(stream.config["labels"])
        if labels is None:
            labels = stream_labels
        elif unknown := sorted(set(labels) - set(stream_labels)):
            raise ValidationError(
                f"labels: {unknown} are not labels of stream {queue_in.stream!r} "
                f"({stream_labels}); a labelled record becomes an observation of it"
            )
        stream_id = stream.id
    config = queue_in.model_dump(exclude={"name"})
    config["labels"] = labels
    config["epsilon"] = queue_in.epsilon or default_epsilon(queue_in.beta)
    row = await repository.create(
        session,
        AnnotationQueue(
            name=queue_in.name,
            config=config,
            stream_id=stream_id,
            secret=secrets.token_bytes(32),
            created_by=created_by,
        ),
    )
    return _out(_runtime(row))


async def get(*, session: AsyncSession, name: str) -> AnnotationQueue:
    row = await repository.get_by_name(session, name)
    if row is None:
        raise NotFound(f"queue {name!r} not found")
    return row


async def runtime(*, ctx: AppContext, name: str) -> QueueRuntime:
    """The queue's configuration, cached per process for a few seconds (queues never change
    after creation)."""
    cache: dict[str, tuple[float, QueueRuntime]] = ctx.caches.setdefault("queue_runtime", {})
    hit = cache.get(name)
    now = time.monotonic()
    if hit is not None and now - hit[0] < RUNTIME_TTL_SECONDS:
        return hit[1]
    async with ctx.sessionmaker() as session:
        rt = _runtime(await get(session=session, name=name))
    cache[name] = (now, rt)
    return rt


async def get_out(*, ctx: AppContext, name: str) -> QueueOut:
    return _out(await runtime(ctx=ctx, name=name))


async def list_out(*, session: AsyncSession) -> list[QueueOut]:
    return [_out(_runtime(q)) for q in await repository.list_queues(session)]


# --- candidates ------------------------------------------------------------------------------


def digest_of(secret: bytes, kind: str, canonical: bytes) -> bytes:
    """HMAC-SHA256 of the canonical form under the queue's secret (kind-separated)."""
    return hmac.new(secret, kind.encode() + b"\x00" + canonical, hashlib.sha256).digest()


@dataclass
class _Prepared:
    digest: bytes
    payload: dict[str, Any]  # {"text": ...} or {"record": {...}}, canonical
    uncertainty: float | None


async def _model_uncertainty(
    ctx: AppContext, rt: QueueRuntime, records: list[dict[str, Any]]
) -> list[float] | None:
    """1 − max probability, scaled to [0, 1] by 1 − 1/L; None when the stream has no reference
    model yet (the caller falls back)."""
    assert rt.stream is not None
    try:
        pred = await reference.predict(ctx=ctx, name=rt.stream, rows=records)
    except Unavailable:
        return None
    p = np.asarray(pred.probabilities, dtype=np.float64)
    n_labels = p.shape[1]
    u = (1.0 - p.max(axis=1)) / (1.0 - 1.0 / n_labels)
    return np.clip(u, 0.0, 1.0).tolist()


async def _prepare(ctx: AppContext, rt: QueueRuntime, body: CandidatesIn) -> list[_Prepared]:
    """Validate and canonicalise the whole batch (before sampling, so that an error never
    says anything about which candidates were kept)."""
    out: list[_Prepared] = []
    if rt.payload_kind == "record":
        assert rt.stream is not None
        srt = await streams.runtime(ctx=ctx, name=rt.stream)
        records = []
        for i, c in enumerate(body.candidates):
            if c.record is None:
                raise ValidationError(f"candidates[{i}].record: queue {rt.name!r} takes records")
            records.append(c.record)
        check_rows(
            srt, records, where="candidates[].record", max_string=ctx.settings.max_string_length
        )
    for i, c in enumerate(body.candidates):
        if rt.uncertainty == "client" and c.uncertainty is None:
            raise ValidationError(
                f"candidates[{i}].uncertainty: required (a number in [0, 1]) by a queue whose "
                "uncertainty source is 'client'"
            )
        if rt.payload_kind == "text":
            if c.text is None:
                raise ValidationError(f"candidates[{i}].text: queue {rt.name!r} takes text")
            canon = canonical_text(c.text)
            if not canon:
                raise ValidationError(f"candidates[{i}].text: empty after normalisation")
            payload: dict[str, Any] = {"text": canon}
            raw = canon.encode()
        else:
            assert c.record is not None
            rec = canonical_record(c.record)
            payload = {"record": rec}
            raw = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
        out.append(_Prepared(digest_of(rt.secret, rt.payload_kind, raw), payload, c.uncertainty))
    return out


async def submit(*, ctx: AppContext, name: str, body: CandidatesIn) -> CandidatesOut:
    rt = await runtime(ctx=ctx, name=name)
    limit = ctx.settings.max_batch
    if len(body.candidates) > limit:
        raise PayloadTooLarge(
            f"candidates: batch of {len(body.candidates)} exceeds the limit of {limit}"
        )
    prepared = await _prepare(ctx, rt, body)
    keep = bernoulli_mask(len(prepared), rt.beta)
    kept = [p for p, m in zip(prepared, keep.tolist(), strict=True) if m]
    del prepared  # the dropped candidates end here
    store = store_of(ctx)
    scores: list[float | None] = [p.uncertainty for p in kept]
    if kept and rt.uncertainty == "model":
        model = await _model_uncertainty(ctx, rt, [p.payload["record"] for p in kept])
        field = "scored_by_model" if model is not None else "scored_by_fallback"
        await ctx.redis.hincrby(ctx.keys.queue(rt.name, "stats"), field, len(kept))
        if model is not None:
            scores = list(model)
    sampled = [
        Sampled(
            digest=p.digest[:16].hex(),
            cells=cmm.cells(p.digest, rt.spec),
            uncertainty=FALLBACK_UNCERTAINTY if u is None else float(u),
            task_id="t_" + secrets.token_hex(8),
            payload=orjson.dumps(p.payload),
        )
        for p, u in zip(kept, scores, strict=True)
    ]
    released = await store.apply(
        queue=rt.name,
        k=rt.k,
        width=rt.spec.width,
        depth=rt.spec.depth,
        received=len(body.candidates),
        sampled=sampled,
    )
    if released:
        by_id = {s.task_id: s for s in sampled}
        async with ctx.sessionmaker() as session, session.begin():
            await repository.add_tasks(
                session,
                [
                    AnnotationTask(
                        id=t,
                        queue_id=rt.id,
                        key_hash=by_id[t].digest,
                        payload=orjson.loads(by_id[t].payload),
                        uncertainty=by_id[t].uncertainty,
                    )
                    for t in released
                ],
            )
    return CandidatesOut(received=len(body.candidates))


# --- annotators ------------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _task(task_id: str, payload: bytes, uncertainty: float, expires_ms: int) -> TaskOut:
    body = orjson.loads(payload) if payload else {}
    return TaskOut(
        id=task_id,
        text=body.get("text"),
        record=body.get("record"),
        uncertainty=uncertainty,
        lease_expires_at=_at(expires_ms),
    )


async def next_tasks(*, ctx: AppContext, name: str, owner: str, n: int) -> TasksOut:
    rt = await runtime(ctx=ctx, name=name)
    _, leases = await store_of(ctx).lease(
        queue=rt.name, owner=owner, n=n, now_ms=_now_ms(), ttl_ms=rt.lease_seconds * 1000
    )
    return TasksOut(tasks=[_task(x.id, x.payload, x.uncertainty, x.expires_ms) for x in leases])


def _refusal(status: str, name: str, task_id: str) -> Exception:
    if status == "missing":
        return NotFound(f"task {task_id!r} not found in queue {name!r}")
    if status == "other":
        return Conflict(f"task {task_id!r} is leased by another annotator")
    if status == "expired":
        return Conflict(f"the lease of task {task_id!r} has expired; take it again with /next")
    if status == "labelled":
        return Conflict(f"task {task_id!r} is already labelled")
    return Conflict(f"task {task_id!r}: {status}")


def _status(res: list[Any]) -> str:
    s = res[0]
    return s.decode() if isinstance(s, bytes) else str(s)


async def heartbeat(*, ctx: AppContext, name: str, task_id: str, owner: str) -> LeaseOut:
    rt = await runtime(ctx=ctx, name=name)
    res = await store_of(ctx).act(
        queue=rt.name,
        action="heartbeat",
        task_id=task_id,
        owner=owner,
        now_ms=_now_ms(),
        arg=rt.lease_seconds * 1000,
    )
    if _status(res) != "ok":
        raise _refusal(_status(res), name, task_id)
    return LeaseOut(id=task_id, lease_expires_at=_at(int(res[1])))


async def skip(*, ctx: AppContext, name: str, task_id: str, owner: str) -> SkipOut:
    rt = await runtime(ctx=ctx, name=name)
    res = await store_of(ctx).act(
        queue=rt.name,
        action="skip",
        task_id=task_id,
        owner=owner,
        now_ms=_now_ms(),
        arg=SKIP_MEMORY_SECONDS,
    )
    if _status(res) != "ok":
        raise _refusal(_status(res), name, task_id)
    return SkipOut(id=task_id, skipped=True)


async def label(*, ctx: AppContext, name: str, task_id: str, owner: str, label: str) -> LabelOut:
    """Label a task once. Redis decides who labelled first; the label then goes to SQL (and,
    for a record, to the stream as an observation) in a transaction of its own; a repeat of
    the same label is a replay that also completes an interrupted first attempt."""
    rt = await runtime(ctx=ctx, name=name)
    if label not in rt.labels:
        raise ValidationError(f"label: {label!r} is not one of the queue's labels {rt.labels}")
    store = store_of(ctx)
    res = await store.act(
        queue=rt.name, action="label", task_id=task_id, owner=owner, now_ms=_now_ms(), arg=label
    )
    status = _status(res)
    if status == "dup":
        prev = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
        if prev != label:
            raise Conflict(f"task {task_id!r} is already labelled {prev!r}")
        payload = bytes(res[2])
    elif status == "ok":
        payload = bytes(res[1])
    else:
        raise _refusal(status, name, task_id)
    window = await _commit_label(ctx, rt, task_id, label, owner, payload)
    return LabelOut(id=task_id, label=label, replayed=status == "dup", observation_window=window)


async def _commit_label(
    ctx: AppContext, rt: QueueRuntime, task_id: str, label: str, owner: str, payload: bytes
) -> int | None:
    """``payload`` is empty when a previous attempt finished (the payload left Redis)."""
    window = None
    if payload and rt.payload_kind == "record":
        assert rt.stream is not None
        record = orjson.loads(payload)["record"]
        out, _ = await ingest.ingest(
            ctx=ctx,
            name=rt.stream,
            body=IngestIn(observations=[ObservationIn(id=task_id, features=record, label=label)]),
            idempotency_key=f"annotation:{rt.name}:{task_id}",
        )
        window = out.window
    async with ctx.sessionmaker() as session, session.begin():
        row = await repository.get_task(session, rt.id, task_id)
        if row is None:
            if not payload:
                raise NotFound(f"task {task_id!r} not found in queue {rt.name!r}")
            # released, but the release's SQL write did not happen (a crash in between)
            row = AnnotationTask(
                id=task_id,
                queue_id=rt.id,
                key_hash="unknown:" + task_id,
                payload=orjson.loads(payload),
                uncertainty=FALLBACK_UNCERTAINTY,
            )
            await repository.add_tasks(session, [row])
        if row.label is None:
            row.label, row.labelled_by, row.labelled_at = label, owner, datetime.now(UTC)
            row.observation_window = window
        window = row.observation_window
    if payload:
        await store_of(ctx).forget_payload(queue=rt.name, task_id=task_id)
    return window


async def labels(*, ctx: AppContext, name: str, after: int, limit: int) -> LabelsOut:
    rt = await runtime(ctx=ctx, name=name)
    async with ctx.sessionmaker() as session:
        rows = await repository.labelled(session, rt.id, after=after, limit=limit)
    out = [
        LabelledTask(
            seq=r.seq,
            id=r.id,
            text=r.payload.get("text"),
            record=r.payload.get("record"),
            label=r.label or "",
            uncertainty=r.uncertainty,
            labelled_at=r.labelled_at or r.released_at,
            labelled_by=r.labelled_by or "",
        )
        for r in rows
    ]
    return LabelsOut(labels=out, next_after=out[-1].seq if len(out) == limit else None)


async def stats(*, ctx: AppContext, name: str) -> StatsOut:
    rt = await runtime(ctx=ctx, name=name)
    store = store_of(ctx)
    await store.requeue_expired(queue=rt.name, now_ms=_now_ms())
    s = await store.stats(queue=rt.name)
    counters = await ctx.redis.hmget(
        ctx.keys.queue(rt.name, "stats"), ["scored_by_model", "scored_by_fallback"]
    )
    async with ctx.sessionmaker() as session:
        counts = await repository.label_counts(session, rt.id)
    distinct, released = int(s["distinct"]), int(s["released"])
    return StatsOut(
        queue=rt.name,
        received=s["received"],
        sampled=s["sampled"],
        distinct=distinct,
        tracking=s["tracking"],
        waiting_under_k=max(distinct - released, 0),
        released=released,
        in_pool=s["in_pool"],
        leased=s["leased"],
        labelled=s["labelled"],
        skipped=s["skipped"],
        label_counts=counts,
        uncertainty_histogram=s["histogram"],
        scored_by_model=int(counters[0] or 0),
        scored_by_fallback=int(counters[1] or 0),
    )


# --- privacy ---------------------------------------------------------------------------------

CURVE_EPSILONS = (0.5, 1.0, 2.0, 3.0, 5.0)


def privacy_of(rt: QueueRuntime) -> PrivacyOut:
    d = kanon.delta(k=rt.k, beta=rt.beta, epsilon=rt.epsilon)
    lo = kanon.min_epsilon(beta=rt.beta)
    curve = [
        {"epsilon": e, "delta": kanon.delta(k=rt.k, beta=rt.beta, epsilon=e).delta}
        for e in sorted({lo, *(e for e in CURVE_EPSILONS if e >= lo)})
    ]
    return PrivacyOut(
        queue=rt.name,
        beta=rt.beta,
        k=rt.k,
        epsilon=rt.epsilon,
        delta=d.delta,
        log_delta=d.log_delta,
        min_epsilon=lo,
        curve=curve,
        source=SOURCE,
    )


async def privacy(*, ctx: AppContext, name: str) -> PrivacyOut:
    return privacy_of(await runtime(ctx=ctx, name=name))


async def ledger_parts(*, session: AsyncSession, stream_id: int) -> list[Part]:
    """The (ε, δ) of every record queue linked to a stream, as parts of its privacy ledger:
    a candidate submitted to such a queue is a record of the stream's kind, and its release
    (or not) is (ε, δ)-DP with respect to it."""
    parts = []
    for q in await repository.of_stream(session, stream_id):
        rt = _runtime(q)
        d = kanon.delta(k=rt.k, beta=rt.beta, epsilon=rt.epsilon)
        parts.append(
            Part(
                name=f"annotation_queue:{rt.name}",
                epsilon=rt.epsilon,
                delta=d.delta,
                rho=None,
                parameters={"queue": rt.name, "beta": rt.beta, "k": rt.k},
                source=SOURCE,
            )
        )
    return parts

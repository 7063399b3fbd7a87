"""The k-anonymous active-learning annotation queue (docs/ARCHITECTURE.md, "Annotation queues").

A submitted batch is validated and canonicalised as a whole, and every candidate is made
ready to count (digest, class, release blob, and the placeholder of the same lengths) before
the sampling, so neither an error nor the work done depends on which candidates are kept. Each
is then kept with probability β drawn from the OS CSPRNG; the others are replaced here, in
memory, by their placeholders: their digest and payload are never written to Redis, SQL or a
log. ``queue_candidates.lua`` takes the whole batch, kept candidates and placeholders alike, and
runs the same commands for each with arguments of the same lengths (the coin decides values,
not work), so the response waits on nothing whose duration depends on the sampling. A kept
candidate is counted in its class, in the open **release period** (``release_seconds`` long, at
multiples of it since the Unix epoch): the class is the key, HMAC-SHA256(queue secret,
canonical form), and for client-scored queues the bucket ⌊10u⌋ of the submitted uncertainty u.
A class with k sampled candidates in the period is ready.

Releases are batches (``release_due``, the worker's ``queues_release`` cron): once a period has
ended, its ready classes are released at once, each key once ever (a key ready in several
buckets goes at its highest), with a class-level uncertainty: the bucket's middle, or the
reference model's score of the key at the release. Periods are disjoint data sets, each
released once by a strongly-safe k-anonymisation of its β-sample (Li, Qardaji & Su, Thm 5), so
by parallel composition a candidate keeps the queue's (ε, δ) whatever the other periods hold;
nothing released is tied to the time or the score of the submission that completed a class.

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

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.annotation import sampled_kanon as kanon
from service.core.annotation.sampling import (
    TextTooLong,
    bernoulli_mask,
    canonical_record,
    canonical_text,
)
from service.core.features.runtime import StreamRuntime
from service.db.models import AnnotationQueue
from service.errors import Conflict, NotFound, PayloadTooLarge, Unavailable, ValidationError
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn, ObservationIn
from service.queues import repository
from service.queues.schemas import (
    MAX_TEXT_CHARS,
    RELEASE_SECONDS_DEFAULT,
    CandidatesIn,
    CandidatesOut,
    LabelledTask,
    LabelOut,
    LabelsOut,
    LeaseOut,
    QueueCreate,
    QueueOut,
    SkipOut,
    StatsOut,
    TaskOut,
    TasksOut,
)
from service.reference import service as reference
from service.stores.queues import SKIP_MEMORY_SECONDS, Candidate, Release
from service.streams import service as streams
from service.streams.validation import check_rows

log = logging.getLogger("selectivity.queues")
RUNTIME_TTL_SECONDS = 5.0
FALLBACK_UNCERTAINTY = 0.5
UNCERTAINTY_BUCKETS = 10  # client scores: a class is a key and ⌊10u⌋; released at the middle
SOURCE = (
    "Li, Qardaji & Su 2012 (arXiv 1101.2604), Thm 5: β-sampling followed by suppression of "
    "every class with fewer than k sampled records is (ε, δ)-DP for ε ≥ −ln(1−β)"
)
QUEUE_SOURCE = (
    SOURCE + "; a queue's release periods are disjoint, each released once as such a batch "
    "(parallel composition, McSherry 2009, Thm 4)"
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
    release_seconds: int
    epsilon: float
    accept_delta_above_ceiling: bool
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
        release_seconds=int(c.get("release_seconds", RELEASE_SECONDS_DEFAULT)),
        epsilon=float(c["epsilon"]),
        accept_delta_above_ceiling=bool(c.get("accept_delta_above_ceiling", False)),
        secret=q.secret,
        created_at=q.created_at,
    )


def default_epsilon(beta: float) -> float:
    return max(1.0, kanon.covered_epsilon(beta=beta))


async def _deltas(rts: list[QueueRuntime]) -> list[kanon.KAnonDelta]:
    """Each queue's δ at its (k, β, ε), in a worker thread: a first one can take a tenth of a
    second (β near its minimum, ε near −ln(1−β)); ``kanon.delta`` caches it by its exact
    parameters, which never change for a queue."""

    def compute() -> list[kanon.KAnonDelta]:
        return [kanon.delta(k=rt.k, beta=rt.beta, epsilon=rt.epsilon) for rt in rts]

    return await asyncio.to_thread(compute)


def _out(rt: QueueRuntime, delta: float) -> QueueOut:
    return QueueOut(
        name=rt.name,
        beta=rt.beta,
        k=rt.k,
        labels=rt.labels,
        payload_kind=rt.payload_kind,  # type: ignore[arg-type]
        stream=rt.stream,
        uncertainty=rt.uncertainty,  # type: ignore[arg-type]
        lease_seconds=rt.lease_seconds,
        release_seconds=rt.release_seconds,
        epsilon=rt.epsilon,
        delta=delta,
        accept_delta_above_ceiling=rt.accept_delta_above_ceiling,
        created_at=rt.created_at,
    )


def _ceiling_refusal(
    queue_in: QueueCreate, epsilon: float, delta: float, ceiling: float
) -> ValidationError:
    """The 422 for a queue whose δ exceeds the ceiling, with the smallest k that meets it."""
    try:
        k = kanon.smallest_k(beta=queue_in.beta, epsilon=epsilon, target_delta=ceiling).k
        fix = f"k >= {k} meets it at this beta and epsilon; or lower beta, raise epsilon"
    except kanon.WorkLimit:  # the search for that k is past the calculator's bound
        fix = "raise k or epsilon, or lower beta"
    except ValueError:
        fix = f"no k <= {kanon.K_MAX} meets it at this beta and epsilon; lower beta or raise it"
    return ValidationError(
        f"k: the queue's delta = {delta:.3g} at beta={queue_in.beta}, k={queue_in.k}, "
        f"epsilon={epsilon:.6g} exceeds the ceiling delta <= {ceiling:g} "
        f"(SELECTIVITY_QUEUE_DELTA_CEILING): {fix}; or pass accept_delta_above_ceiling: true "
        "to create it anyway (the ledger and the curator page then say so)"
    )


async def create(
    *, session: AsyncSession, queue_in: QueueCreate, created_by: str, delta_ceiling: float
) -> QueueOut:
    """Create a queue; refuse it (422) when its δ at its ε exceeds ``delta_ceiling`` unless
    ``accept_delta_above_ceiling`` says the curator means it."""
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
    epsilon = kanon.effective_epsilon(
        beta=queue_in.beta, epsilon=queue_in.epsilon or default_epsilon(queue_in.beta)
    )
    d = await asyncio.to_thread(kanon.delta, k=queue_in.k, beta=queue_in.beta, epsilon=epsilon)
    if d.delta > delta_ceiling and not queue_in.accept_delta_above_ceiling:
        raise await asyncio.to_thread(_ceiling_refusal, queue_in, epsilon, d.delta, delta_ceiling)
    config = queue_in.model_dump(exclude={"name"})
    config["labels"] = labels
    config["epsilon"] = epsilon
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
    return _out(_runtime(row), d.delta)


async def get(*, session: AsyncSession, name: str) -> AnnotationQueue:
    row = await repository.get_by_name(session, name)
    if row is None:
        raise NotFound(f"queue {name!r} not found")
    return row


async def runtime(*, ctx: AppContext, name: str) -> QueueRuntime:
    """The queue's configuration, cached per process for a few seconds (queues never change
    after creation)."""
    cache = ctx.caches.queue_runtimes
    hit = cache.get(name)
    now = time.monotonic()
    if hit is not None and now - hit[0] < RUNTIME_TTL_SECONDS:
        return hit[1]
    async with ctx.sessionmaker() as session:
        rt = _runtime(await get(session=session, name=name))
    cache[name] = (now, rt)
    return rt


async def get_out(*, ctx: AppContext, name: str) -> QueueOut:
    rt = await runtime(ctx=ctx, name=name)
    return _out(rt, (await _deltas([rt]))[0].delta)


async def list_out(*, session: AsyncSession) -> list[QueueOut]:
    rts = [_runtime(q) for q in await repository.list_queues(session)]
    return [_out(rt, d.delta) for rt, d in zip(rts, await _deltas(rts), strict=True)]


# --- candidates ------------------------------------------------------------------------------


def digest_of(secret: bytes, kind: str, canonical: bytes) -> bytes:
    """HMAC-SHA256 of the canonical form under the queue's secret (kind-separated)."""
    return hmac.new(secret, kind.encode() + b"\x00" + canonical, hashlib.sha256).digest()


def bucket_of(u: float) -> int:
    """The uncertainty bucket of a client score: ⌊10u⌋, 1.0 in the top bucket."""
    return min(int(u * UNCERTAINTY_BUCKETS), UNCERTAINTY_BUCKETS - 1)


def bucket_middle(bucket: int) -> float:
    return (bucket + 0.5) / UNCERTAINTY_BUCKETS


async def _model_uncertainty(
    ctx: AppContext, rt: QueueRuntime, records: list[dict[str, Any]]
) -> tuple[list[float], int] | None:
    """The reference model's uncertainty of each record as released: 1 − max probability,
    scaled to [0, 1] by 1 − 1/L, given only as the middle of its bucket ⌊10u⌋, with the
    epoch of the model; None when the stream has no reference model (the caller falls back).
    In batches of at most ``max_batch`` records."""
    assert rt.stream is not None
    out: list[float] = []
    epochs: list[int] = []
    step = ctx.settings.max_batch
    for i in range(0, len(records), step):
        try:
            pred = await reference.predict(ctx=ctx, name=rt.stream, rows=records[i : i + step])
        except Unavailable:
            return None
        p = np.asarray(pred.probabilities, dtype=np.float64)
        u = np.clip((1.0 - p.max(axis=1)) / (1.0 - 1.0 / p.shape[1]), 0.0, 1.0)
        # rounded first, so that a score on a bucket's edge in exact arithmetic (0.4 from
        # (1 − 0.8)/(1 − 1/2)) is not moved down a bucket by a rounding error
        out += [bucket_middle(bucket_of(round(float(x), 12))) for x in u]
        epochs.append(pred.model_epoch)
    # a roll between two calls: the whole release is bound to the earliest model's epoch
    return out, min(epochs)


async def _prepare(
    ctx: AppContext, rt: QueueRuntime, body: CandidatesIn
) -> list[tuple[Candidate, Candidate]]:
    """Validate and canonicalise the whole batch, and make every candidate ready to count,
    before the sampling: an error never says anything about which candidates were kept, and
    the work does not depend on it. Each candidate comes as (its placeholder, itself kept):
    the sampling only picks one of the two. Client scores of a model-scored queue are not
    used. The work, proportional to the batch, runs in a worker thread."""
    srt = None
    if rt.payload_kind == "record":
        assert rt.stream is not None
        srt = await streams.runtime(ctx=ctx, name=rt.stream)
    return await asyncio.to_thread(
        _prepare_batch, rt, srt, body, max_string=ctx.settings.max_string_length
    )


def _prepare_batch(
    rt: QueueRuntime, srt: StreamRuntime | None, body: CandidatesIn, *, max_string: int
) -> list[tuple[Candidate, Candidate]]:
    out: list[tuple[Candidate, Candidate]] = []
    if srt is not None:
        records = []
        for i, c in enumerate(body.candidates):
            if c.record is None:
                raise ValidationError(f"candidates[{i}].record: queue {rt.name!r} takes records")
            records.append(c.record)
        check_rows(srt, records, where="candidates[].record", max_string=max_string)
    for i, c in enumerate(body.candidates):
        if rt.uncertainty == "client" and c.uncertainty is None:
            raise ValidationError(
                f"candidates[{i}].uncertainty: required (a number in [0, 1]) by a queue whose "
                "uncertainty source is 'client'"
            )
        if rt.payload_kind == "text":
            if c.text is None:
                raise ValidationError(f"candidates[{i}].text: queue {rt.name!r} takes text")
            try:
                canon = canonical_text(c.text, max_chars=MAX_TEXT_CHARS)
            except TextTooLong:
                raise ValidationError(
                    f"candidates[{i}].text: longer than the limit of {MAX_TEXT_CHARS} "
                    "characters after normalisation (NFKC, case folding: one character can "
                    "become up to 18)"
                ) from None
            if not canon:
                raise ValidationError(f"candidates[{i}].text: empty after normalisation")
            payload: dict[str, Any] = {"text": canon}
            raw = canon.encode()
        else:
            assert c.record is not None
            rec = canonical_record(c.record)
            payload = {"record": rec}
            raw = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
        key = digest_of(rt.secret, rt.payload_kind, raw)[:16].hex()
        bucket = None
        if rt.uncertainty == "client":
            assert c.uncertainty is not None
            bucket = bucket_of(c.uncertainty)
        cls = key if bucket is None else f"{key}:{bucket}"
        blob = orjson.dumps({"key": key, "bucket": bucket, "payload": payload})
        kept = Candidate(kept=True, key=key, cls=cls, blob=blob)
        out.append((kept.placeholder(), kept))
    return out


def period_of(rt: QueueRuntime, now_ms: int) -> int:
    """The release period open at ``now_ms``: periods are ``release_seconds`` long, from the
    Unix epoch."""
    return now_ms // (rt.release_seconds * 1000)


def period_end(rt: QueueRuntime, period: int) -> datetime:
    return _at((period + 1) * rt.release_seconds * 1000)


async def submit(*, ctx: AppContext, name: str, body: CandidatesIn) -> CandidatesOut:
    rt = await runtime(ctx=ctx, name=name)
    limit = ctx.settings.max_batch
    if len(body.candidates) > limit:
        raise PayloadTooLarge(
            f"candidates: batch of {len(body.candidates)} exceeds the limit of {limit}"
        )
    prepared = await _prepare(ctx, rt, body)
    coins = bernoulli_mask(len(prepared), rt.beta)
    # the same operation whatever the coin: pick one of two forms made before the sampling
    batch = [pair[m] for pair, m in zip(prepared, coins.tolist(), strict=True)]
    del prepared  # the dropped candidates end here: only their placeholders go on
    await ctx.stores.queues.add(
        queue=rt.name,
        k=rt.k,
        period=period_of(rt, _now_ms()),
        received=len(body.candidates),
        batch=batch,
    )
    return CandidatesOut(received=len(body.candidates))


# --- releases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scored:
    """How a period's tasks were scored: the stats counter, and the reference model's epoch
    when the model scored them (its scores are then forgotten once that epoch ends)."""

    counter: str | None
    model_epoch: int | None


async def _release_tasks(
    ctx: AppContext, rt: QueueRuntime, blobs: list[bytes]
) -> tuple[list[Release], _Scored]:
    """One task per key of a period's ready classes (the highest bucket of a key ready in
    several), with its class-level uncertainty (a bucket middle), and how they were scored."""
    best: dict[str, dict[str, Any]] = {}
    for b in blobs:
        item = orjson.loads(b)
        prev = best.get(item["key"])
        if prev is None or (item["bucket"] or 0) > (prev["bucket"] or 0):
            best[item["key"]] = item
    items = sorted(best.values(), key=lambda x: x["key"])  # no trace of arrival order
    scored = _Scored(None, None)
    if rt.uncertainty == "model" and items:
        model = await _model_uncertainty(ctx, rt, [x["payload"]["record"] for x in items])
        if model is None:
            us, scored = [FALLBACK_UNCERTAINTY] * len(items), _Scored("scored_by_fallback", None)
        else:
            us, scored = model[0], _Scored("scored_by_model", model[1])
    else:
        us = [bucket_middle(x["bucket"]) for x in items]
    tasks = [
        Release(
            key=x["key"],
            task_id="t_" + secrets.token_hex(8),
            uncertainty=float(u),
            payload=orjson.dumps(x["payload"]),
            model_epoch=scored.model_epoch,
        )
        for x, u in zip(items, us, strict=True)
    ]
    return tasks, scored


@contextmanager
def _sql_errors_without_values(what: str) -> Iterator[None]:
    """A database error's message carries the statement's parameters (payloads, here): it is
    replaced by one naming only its type, and its context is not shown with it."""
    try:
        yield
    except StatementError as e:
        kind = type(e.orig if e.orig is not None else e).__name__
        raise Unavailable(f"{what}: the database refused the write ({kind}); retry") from None


async def _store_tasks(
    ctx: AppContext, rt: QueueRuntime, period: int, tasks: list[Release]
) -> list[Release]:
    """Write a period's tasks to SQL before any of them can be leased, each key once: a task
    is in SQL, committed, before Redis offers it, so a label never finds it missing (and
    never races its release's insert). Returns the tasks under the ids SQL holds (a key
    released before keeps its task id; ``queue_release.lua`` passes it over)."""
    # a model-scored queue's SQL row never holds the model's score (promise 5's note)
    stored_u = FALLBACK_UNCERTAINTY if rt.uncertainty == "model" else None
    with _sql_errors_without_values(f"releasing queue {rt.name!r}"):
        async with ctx.sessionmaker() as session, session.begin():
            await repository.insert_tasks(
                session,
                [
                    {
                        "id": t.task_id,
                        "queue_id": rt.id,
                        "key_hash": t.key,
                        "payload": orjson.loads(t.payload),
                        "uncertainty": t.uncertainty if stored_u is None else stored_u,
                        "released_at": period_end(rt, period),
                    }
                    for t in tasks
                ],
            )
            ids = await repository.task_ids(session, rt.id, [t.key for t in tasks])
    return [replace(t, task_id=ids[t.key]) for t in tasks]


async def forget_model_scores(ctx: AppContext, rt: QueueRuntime) -> int:
    """A model-scored queue's released scores live as long as the model that gave them: the
    scores of tasks released under an earlier epoch's model become the fallback 0.5 (in the
    pool's ranking and in what a lease shows). Returns how many were forgotten."""
    if rt.uncertainty != "model":
        return 0
    assert rt.stream is not None
    current: int | None = None  # a removed stream: forget them all
    async with ctx.sessionmaker() as session:
        with suppress(NotFound):
            current = (await streams.get(session=session, name=rt.stream)).epoch
    return await ctx.stores.queues.forget_scores(
        queue=rt.name, before_epoch=current, fallback=FALLBACK_UNCERTAINTY
    )


async def release_queue(ctx: AppContext, rt: QueueRuntime, *, now_ms: int) -> dict[str, int]:
    """Release every period of the queue that ended before ``now_ms``, oldest first: close it
    (no batch is counted into it any more), write its tasks to SQL, then release them in
    Redis (its ready classes into the pool, its counts deleted). Safe to run twice or
    concurrently: a period is released once (``queue_release.lua``), each key inserted once.
    First, a model-scored queue forgets the scores of models whose epoch has ended."""
    store = ctx.stores.queues
    done = {"periods": 0, "released": 0}
    await forget_model_scores(ctx, rt)
    for period in await store.due_periods(queue=rt.name, before=period_of(rt, now_ms)):
        await store.close(queue=rt.name, period=period)
        blobs = await store.ready(queue=rt.name, period=period)
        tasks, scored = await _release_tasks(ctx, rt, blobs)
        if tasks:
            tasks = await _store_tasks(ctx, rt, period, tasks)
        released = set(await store.release(queue=rt.name, period=period, tasks=tasks))
        done["periods"] += 1
        done["released"] += len(released)
        if released and scored.counter is not None:
            await store.count(queue=rt.name, field=scored.counter, n=len(released))
    return done


async def release_due(ctx: AppContext, *, now_ms: int | None = None) -> dict[str, int]:
    """The ``queues_release`` job: release the ended periods of every queue. One queue's
    failure does not stop the others (it is retried at the next run); it is logged by type
    and place only, never with its message (a database error's carries the rows)."""
    now = _now_ms() if now_ms is None else now_ms
    async with ctx.sessionmaker() as session:
        rows = await repository.list_queues(session)
    out = {"queues": 0, "periods": 0, "released": 0, "failed": 0}
    for row in rows:
        rt = _runtime(row)
        try:
            done = await release_queue(ctx, rt, now_ms=now)
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            log.error(
                "releasing queue %s failed: %s at %s:%s (retried at the next run)",
                rt.name,
                type(e).__name__,
                where.filename.rsplit("/", 1)[-1],
                where.lineno,
            )
            out["failed"] += 1
            continue
        out["queues"] += 1
        out["periods"] += done["periods"]
        out["released"] += done["released"]
    if out["periods"]:
        # the released periods' counts leave the persistence files too (docs/ARCHITECTURE.md,
        # "Annotation queues")
        await ctx.stores.windows.rewrite_aof()
    return out


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
    _, leases = await ctx.stores.queues.lease(
        queue=rt.name, owner=owner, n=n, now_ms=_now_ms(), ttl_ms=rt.lease_seconds * 1000
    )
    return TasksOut(tasks=[_task(x.id, x.payload, x.uncertainty, x.expires_ms) for x in leases])


def _refusal(status: str, name: str, task_id: str) -> Exception:
    """The error of a refused action. A task that is not the caller's (not leased to it, nor
    labelled by it) gets one answer whatever its state: it may not exist, wait in the pool,
    be leased to another or labelled by another, with any label. Only the task's own
    annotator hears that its lease expired or that it labelled it already; no error carries
    a label."""
    if status == "expired":
        return Conflict(f"the lease of task {task_id!r} has expired; take it again with /next")
    if status == "labelled":
        return Conflict(f"task {task_id!r} is already labelled by you; a label is final")
    return NotFound(f"task {task_id!r} is not leased to you in queue {name!r}")


def _status(res: list[Any]) -> str:
    s = res[0]
    return s.decode() if isinstance(s, bytes) else str(s)


async def heartbeat(*, ctx: AppContext, name: str, task_id: str, owner: str) -> LeaseOut:
    rt = await runtime(ctx=ctx, name=name)
    res = await ctx.stores.queues.act(
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
    res = await ctx.stores.queues.act(
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
    """Label a task once, as the holder of its lease. Redis decides who labelled first; the
    label then goes to SQL (and, for a record, to the stream as an observation) in a
    transaction of its own; the labeller's repeat of the same label is a replay that also
    completes an interrupted first attempt. Anyone else gets the 404 of a task that is not
    theirs, whatever the task's state or label (``_refusal``)."""
    rt = await runtime(ctx=ctx, name=name)
    if label not in rt.labels:
        raise ValidationError(f"label: {label!r} is not one of the queue's labels {rt.labels}")
    store = ctx.stores.queues
    res = await store.act(
        queue=rt.name, action="label", task_id=task_id, owner=owner, now_ms=_now_ms(), arg=label
    )
    status = _status(res)
    if status == "dup":
        prev = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
        if prev != label:
            raise _refusal("labelled", name, task_id)
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
            scope=ingest.key_scope(internal="annotation"),
        )
        window = out.window
    with _sql_errors_without_values(f"labelling task {task_id!r}"):
        async with ctx.sessionmaker() as session, session.begin():
            row = await repository.get_task(session, rt.id, task_id)
            if row is None and payload:
                # in Redis but not in SQL: only a release written before tasks went to SQL
                # first could leave one (``_store_tasks``)
                await repository.insert_tasks(
                    session,
                    [
                        {
                            "id": task_id,
                            "queue_id": rt.id,
                            "key_hash": "unknown:" + task_id,
                            "payload": orjson.loads(payload),
                            "uncertainty": FALLBACK_UNCERTAINTY,
                        }
                    ],
                )
                row = await repository.get_task(session, rt.id, task_id)
            if row is None:
                raise _refusal("missing", rt.name, task_id)
            if row.label is None:
                row.label, row.labelled_by, row.labelled_at = label, owner, datetime.now(UTC)
                row.observation_window = window
            window = row.observation_window
    if payload:
        await ctx.stores.queues.forget_payload(queue=rt.name, task_id=task_id)
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
            # a model-scored queue keeps no model score in SQL (``_store_tasks``)
            uncertainty=None if rt.uncertainty == "model" else r.uncertainty,
            labelled_at=r.labelled_at or r.released_at,
            labelled_by=r.labelled_by or "",
        )
        for r in rows
    ]
    return LabelsOut(labels=out, next_after=out[-1].seq if len(out) == limit else None)


async def stats(*, ctx: AppContext, name: str, submitter: bool = True) -> StatsOut:
    """The queue's counters. ``received`` (how many candidates were submitted, and so when) is
    for those who submit them; an annotator sees only what follows from the releases."""
    rt = await runtime(ctx=ctx, name=name)
    store = ctx.stores.queues
    await store.requeue_expired(queue=rt.name, now_ms=_now_ms())
    s = await store.stats(queue=rt.name)
    async with ctx.sessionmaker() as session:
        counts = await repository.label_counts(session, rt.id)
    return StatsOut(
        queue=rt.name,
        received=s["received"] if submitter else None,
        release_seconds=rt.release_seconds,
        next_release_at=period_end(rt, period_of(rt, _now_ms())),
        released=s["released"],
        in_pool=s["in_pool"],
        leased=s["leased"],
        labelled=s["labelled"],
        skipped=s["skipped"],
        label_counts=counts,
        uncertainty_histogram=s["histogram"],
        scored_by_model=s["scored_by_model"],
        scored_by_fallback=s["scored_by_fallback"],
    )

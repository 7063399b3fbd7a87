"""Models never outlive their data (docs/ARCHITECTURE.md, "Models and forced retraining"): the
registry, staleness on roll, retrain events (SSE) and signed webhooks, and the refusal of stale
models past their grace period."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.db.models import Model, Stream, StreamEvent, WebhookDelivery
from service.errors import Conflict, NotFound, RetrainRequired, ValidationError
from service.models import repository
from service.models.schemas import ModelCreate, ModelCreated, ModelOut, ModelStatus
from service.models.webhooks import Allowlist, WebhookRefused, check, pinned
from service.streams import service as streams

log = logging.getLogger("selectivity.models")
STATUS_CACHE_SECONDS = 1.0


def status_of(
    *,
    trained_epoch: int | None,
    stale_since: datetime | None,
    created_at: datetime,
    epoch: int,
    grace_seconds: int,
    now: datetime,
) -> tuple[ModelStatus, datetime | None]:
    """A model is ``current`` when trained at the open epoch. Otherwise it is served for
    ``grace_seconds`` after it fell behind (the roll that left it behind, or its registration
    if it never trained): ``stale`` / ``untrained`` until that deadline, ``refused`` after."""
    if trained_epoch is not None and trained_epoch >= epoch:
        return "current", None
    deadline = (stale_since or created_at) + timedelta(seconds=grace_seconds)
    if now >= deadline:
        return "refused", deadline
    return ("untrained" if trained_epoch is None else "stale"), deadline


def _out(
    model: Model, stream: Stream, now: datetime, cls: type[ModelOut] = ModelOut, **extra: object
) -> ModelOut:
    grace = int(stream.config.get("retrain_grace_seconds", 3600))
    status, deadline = status_of(
        trained_epoch=model.trained_epoch,
        stale_since=model.stale_since,
        created_at=model.created_at,
        epoch=stream.epoch,
        grace_seconds=grace,
        now=now,
    )
    return cls.model_validate(
        {
            "id": model.id,
            "name": model.name,
            "status": status,
            "epoch": stream.epoch,
            "trained_epoch": model.trained_epoch,
            "trained_at": model.trained_at,
            "stale_since": model.stale_since,
            "retrain_deadline": deadline,
            "webhook_url": model.webhook_url,
            "created_at": model.created_at,
            **extra,
        }
    )


async def create(
    *, session: AsyncSession, name: str, model_in: ModelCreate, allow: Allowlist
) -> ModelCreated:
    """Register a model; its webhook URL must reach a public address, or one the operator
    allows (``service.models.webhooks``), else 422."""
    stream = await streams.get(session=session, name=name)
    if await repository.get_by_name(session, stream.id, model_in.name) is not None:
        raise Conflict(f"model {model_in.name!r} already exists on stream {name!r}")
    if model_in.webhook_url is not None:
        try:
            await check(str(model_in.webhook_url), allow)
        except WebhookRefused as exc:
            raise ValidationError(f"webhook_url: refused: {exc}") from None
    secret = model_in.webhook_secret
    if model_in.webhook_url is not None and secret is None:
        secret = secrets.token_urlsafe(32)
    model = await repository.create(
        session,
        Model(
            id="m_" + secrets.token_hex(8),
            stream_id=stream.id,
            name=model_in.name,
            webhook_url=str(model_in.webhook_url) if model_in.webhook_url else None,
            webhook_secret=secret,
        ),
    )
    out = _out(
        model,
        stream,
        datetime.now(UTC),
        ModelCreated,
        webhook_secret=None if model_in.webhook_secret else secret,
    )
    assert isinstance(out, ModelCreated)
    return out


async def _model(session: AsyncSession, name: str, model_id: str) -> tuple[Stream, Model]:
    stream = await streams.get(session=session, name=name)
    model = await repository.get(session, stream.id, model_id)
    if model is None:
        raise NotFound(f"model {model_id!r} not found on stream {name!r}")
    return stream, model


async def get(*, session: AsyncSession, name: str, model_id: str) -> ModelOut:
    stream, model = await _model(session, name, model_id)
    return _out(model, stream, datetime.now(UTC))


async def report_trained(
    *, ctx: AppContext, session: AsyncSession, name: str, model_id: str, epoch: int
) -> ModelOut:
    """Record a training at ``epoch``; a training at the open epoch makes the model current.
    A roll serves its new epoch (the ``served`` pointer, which the train set reads) before its
    commit moves ``stream.epoch``: while it is under way (``stream.roll_target``, checkpointed
    before the pointer moves and read in the same row), its target is no epoch ahead."""
    stream, model = await _model(session, name, model_id)
    if epoch > max(stream.epoch, stream.roll_target or 0):
        raise ValidationError(f"epoch: {epoch} is ahead of the stream's epoch {stream.epoch}")
    now = datetime.now(UTC)
    if model.trained_epoch is None or epoch >= model.trained_epoch:
        model.trained_epoch, model.trained_at = epoch, now
    if model.trained_epoch >= stream.epoch:
        model.stale_since = None
    ctx.caches.model_status.pop(model.id, None)
    return _out(model, stream, now)


async def record_trainset(*, ctx: AppContext, name: str, model_id: str, epoch: int) -> None:
    """Fetching the train set with ``model_id`` records a training at its epoch."""
    async with ctx.sessionmaker() as session, session.begin():
        await report_trained(ctx=ctx, session=session, name=name, model_id=model_id, epoch=epoch)


async def check_serving(*, ctx: AppContext, name: str, model_id: str) -> None:
    """Raise RetrainRequired for a model past its grace period (cached for a second)."""
    cache = ctx.caches.model_status
    hit = cache.get(model_id)
    mono = time.monotonic()
    if hit is None or mono - hit[0] > STATUS_CACHE_SECONDS or hit[1] != name:
        async with ctx.sessionmaker() as session:
            out = await get(session=session, name=name, model_id=model_id)
        hit = (mono, name, out.status, out.epoch)
        cache[model_id] = hit
    if hit[2] == "refused":
        raise RetrainRequired(
            f"model {model_id!r} was trained before epoch {hit[3]} and its grace period is "
            f"over: retrain on the current train set and report it "
            f"(POST /v1/streams/{name}/models/{model_id}/trained)"
        )


async def record_roll(
    *, session: AsyncSession, stream: Stream, epoch: int, now: datetime
) -> list[int]:
    """Inside the roll's own transaction: models left behind become stale, and the roll and
    retrain events are written. Returns the ids of events to deliver by webhook (the roll's
    ``models_notify`` follow-up delivers them: ``notify_roll``)."""
    stale = await repository.mark_stale(session, stream.id, epoch, now)
    grace = int(stream.config.get("retrain_grace_seconds", 3600))
    await repository.add_event(
        session,
        StreamEvent(stream_id=stream.id, kind="roll", data={"stream": stream.name, "epoch": epoch}),
    )
    behind = [m.id for m in await repository.behind(session, stream.id, epoch)]
    if not behind:
        return []
    event = await repository.add_event(
        session,
        StreamEvent(
            stream_id=stream.id,
            kind="retrain_required",
            data={
                "stream": stream.name,
                "epoch": epoch,
                "models": sorted(behind),
                "newly_stale": sorted(stale),
                "deadline": (now + timedelta(seconds=grace)).isoformat(),
            },
        ),
    )
    return [event.id]


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256(secret, timestamp + "." + body) (Stripe-style; the
    timestamp lets receivers refuse replays)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


async def notify_roll(*, ctx: AppContext, stream_id: int, epoch: int) -> dict[str, int]:
    """Deliver the retrain events of the roll to ``epoch`` to the webhooks of the models they
    name: retries with exponential backoff, every attempt recorded. Idempotent: a model that
    acknowledged an event (2xx) is not sent it again, so a rerun after a crash delivers only
    what was not acknowledged (at least once, as webhooks are)."""
    jobs = []
    async with ctx.sessionmaker() as session:
        for event in await repository.roll_events(session, stream_id, epoch, "retrain_required"):
            done = await repository.delivered(session, event.id)
            for mid in event.data.get("models", []):
                model = await session.get(Model, mid)
                if (
                    model is not None
                    and model.webhook_url
                    and model.webhook_secret
                    and model.id not in done
                ):
                    jobs.append(
                        (
                            event.id,
                            event.kind,
                            event.data,
                            model.id,
                            model.webhook_url,
                            model.webhook_secret,
                        )
                    )
    if not jobs:
        return {"delivered": 0, "failed": 0}
    async with httpx.AsyncClient(
        timeout=ctx.settings.webhook_timeout_seconds, follow_redirects=False
    ) as client:
        results = await asyncio.gather(*[_deliver(ctx, client, *job) for job in jobs])
    return {"delivered": sum(results), "failed": len(results) - sum(results)}


async def _deliver(
    ctx: AppContext,
    client: httpx.AsyncClient,
    event_id: int,
    kind: str,
    data: dict,
    model_id: str,
    url: str,
    secret: str,
) -> bool:
    body = orjson.dumps({"event": kind, "event_id": event_id, "model_id": model_id, **data})
    allow = Allowlist.parse(ctx.settings.webhook_allow)
    delay = ctx.settings.webhook_backoff_seconds
    for attempt in range(1, ctx.settings.webhook_attempts + 1):
        ts = str(int(time.time()))
        status: int | None = None
        error: str | None = None
        try:
            # checked at every attempt (DNS may have changed since registration), and sent to
            # the address checked; a redirect is not followed (a 3xx is a failed attempt)
            addresses = await check(url, allow)
        except WebhookRefused as exc:
            await _record(ctx, model_id, event_id, attempt, None, f"refused: {exc}"[:200])
            log.warning("webhook of model %s refused: %s", model_id, exc)
            return False
        headers = {
            "Content-Type": "application/json",
            "X-Selectivity-Event": kind,
            "X-Selectivity-Event-Id": str(event_id),
            "X-Selectivity-Timestamp": ts,
            "X-Selectivity-Signature": signature(secret, ts, body),
        }
        for address in addresses:  # the next one only when one refuses the connection
            target, host, extensions = pinned(url, address)
            try:
                r = await client.post(
                    target, content=body, extensions=extensions, headers={**host, **headers}
                )
                status, error = r.status_code, None
                break
            except httpx.ConnectError as exc:
                error = type(exc).__name__
            except httpx.HTTPError as exc:
                error = type(exc).__name__
                break
        await _record(ctx, model_id, event_id, attempt, status, error)
        if status is not None and 200 <= status < 300:
            return True
        if attempt < ctx.settings.webhook_attempts:
            await asyncio.sleep(delay)
            delay *= 2
    log.warning("webhook of model %s gave up after %d attempts", model_id, attempt)
    return False


async def _record(
    ctx: AppContext,
    model_id: str,
    event_id: int,
    attempt: int,
    status: int | None,
    error: str | None,
) -> None:
    async with ctx.sessionmaker() as session, session.begin():
        await repository.add_delivery(
            session,
            WebhookDelivery(
                model_id=model_id,
                event_id=event_id,
                attempt=attempt,
                status_code=status,
                error=error,
            ),
        )


def _sse(event: StreamEvent) -> bytes:
    return (
        f"id: {event.id}\nevent: {event.kind}\n".encode()
        + b"data: "
        + orjson.dumps(event.data)
        + b"\n\n"
    )


async def events(
    *, ctx: AppContext, name: str, after: int, follow_seconds: float
) -> AsyncIterator[bytes]:
    """Server-sent events after ``after`` (Last-Event-ID), then new ones as they come, for
    ``follow_seconds`` (0: the backlog only). Raises NotFound before streaming anything."""
    async with ctx.sessionmaker() as session:
        stream = await streams.get(session=session, name=name)
    return _events(ctx, stream.id, after, follow_seconds)


async def _events(
    ctx: AppContext, stream_id: int, after: int, follow_seconds: float
) -> AsyncIterator[bytes]:
    """A comment line keeps idle connections alive through proxies."""
    deadline = time.monotonic() + follow_seconds
    last_beat = time.monotonic()
    while True:
        async with ctx.sessionmaker() as session:
            batch = await repository.events_after(session, stream_id, after, limit=500)
        for event in batch:
            after = event.id
            yield _sse(event)
        if len(batch) == 500:
            continue
        if time.monotonic() >= deadline:
            return
        if time.monotonic() - last_beat > 15:
            last_beat = time.monotonic()
            yield b": keep-alive\n\n"
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

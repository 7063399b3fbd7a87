"""Rules of ingest: accept a batch into the open window (docs/ARCHITECTURE.md, "Data path").

Accepting is one Lua script per batch (``ingest.lua``): the window must be open, the
Idempotency-Key new; the rows go to the window's hot stream. Counting them into the window's
tables is a separate job (``service.counting``): the increments were nine tenths of an ingest
request's Redis time when the ingest script applied them (``BENCHMARKS.md``), and summed with
the other batches' by the counter they cost Redis far less."""

from __future__ import annotations

import hashlib
import secrets
import time

import orjson
from sqlalchemy import select

from service.context import AppContext
from service.core.runtime import StreamRuntime
from service.db.models import ColdStoreKey
from service.errors import PayloadTooLarge, Unavailable, ValidationError
from service.ingest.schemas import IngestIn, IngestOut
from service.streams import service as streams
from service.streams.validation import check_rows

MAX_WINDOW_RETRIES = 8
# How long an API process trusts "no cold-store key yet" (a key, once made, is never removed:
# "a key exists" is trusted for the life of the process).
NO_KEY_RECHECK_SECONDS = 1.0
NO_KEY = (
    "no cold-store key: run the key ceremony "
    "(`selectivity admin init-coldstore --shares N --threshold M`)"
)


async def require_coldstore_key(ctx: AppContext) -> None:
    """Fail closed: without a cold-store key nothing can be sealed, so hot data would never be
    deleted (docs/ARCHITECTURE.md, "Threat model and promises", promise 1). Ingest refuses
    batches (503) until a key exists. One SQL look-up per process once a key exists, at most
    one per ``NO_KEY_RECHECK_SECONDS`` before."""
    exists, checked = ctx.caches.coldstore_key
    if exists:
        return
    now = time.monotonic()
    if now - checked >= NO_KEY_RECHECK_SECONDS:
        async with ctx.sessionmaker() as session:
            found = await session.scalar(
                select(ColdStoreKey.id).where(ColdStoreKey.retired_at.is_(None)).limit(1)
            )
        exists = found is not None
        ctx.caches.coldstore_key = (exists, now)
    if not exists:
        raise Unavailable(NO_KEY)


def batch_rows(body: IngestIn) -> list[bytes]:
    """The batch's raw rows as the hot stream stores them (``hotrows`` reads this shape)."""
    return [
        orjson.dumps(
            {
                "id": o.id,
                "f": o.features,
                "y": o.label,
                "t": o.event_time.isoformat() if o.event_time else None,
            }
        )
        for o in body.observations
    ]


def validate(ctx: AppContext, rt: StreamRuntime, body: IngestIn) -> None:
    limit = ctx.settings.max_batch
    if len(body.observations) > limit:
        raise PayloadTooLarge(
            f"observations: batch of {len(body.observations)} exceeds the limit of {limit}"
        )
    bad = sorted({o.label for o in body.observations if o.label not in rt.label_index})
    if bad:
        raise ValidationError(f"unknown label(s) {bad[:10]}; stream {rt.name!r} has {rt.labels}")
    check_rows(
        rt,
        [o.features for o in body.observations],
        where="observations[].features",
        max_string=ctx.settings.max_string_length,
    )
    user_key = rt.config.privacy.user_key
    if user_key is not None:
        missing = [i for i, o in enumerate(body.observations) if o.features.get(user_key) is None]
        if missing:
            raise ValidationError(
                f"observations[{missing[0]}].features.{user_key}: the stream's user key is required"
            )


async def ingest(
    *, ctx: AppContext, name: str, body: IngestIn, idempotency_key: str | None
) -> tuple[IngestOut, bool]:
    """Accept a batch into the open window; returns (response, replayed). A batch whose window
    closes under it is accepted into the next window; a retried batch (same Idempotency-Key)
    is never accepted twice while its window is in the hot period. The counting job
    (``service.counting.service.count_window``) counts accepted rows into the window's tables."""
    rt = await streams.runtime(ctx=ctx, name=name)
    validate(ctx, rt, body)
    await require_coldstore_key(ctx)
    rows = batch_rows(body)
    token = (
        hashlib.sha256(idempotency_key.encode()).hexdigest()
        if idempotency_key
        else "anon-" + secrets.token_hex(16)
    )
    windows = ctx.stores.windows
    store = ctx.stores.ingest
    epochs = ctx.caches.open_epochs
    # The cached open epoch saves a round trip; the script refuses a closed window, and a
    # keyed batch reads the pointer afresh so that its replay check looks at the right windows.
    epoch = (None if idempotency_key else epochs.get(name)) or await windows.epoch(name)
    if epoch is None:
        raise Unavailable(f"stream {name!r} has no open window yet; retry shortly")
    if idempotency_key:
        earlier = list(range(max(1, epoch - rt.config.hot_windows), epoch))
        replay = await store.find_replay(stream=name, windows=earlier, token=token)
        if replay is not None:
            return IngestOut.model_validate_json(replay), True
    ttl = ctx.settings.idempotency_ttl_seconds + rt.config.window_seconds * rt.config.hot_windows
    for _ in range(MAX_WINDOW_RETRIES):
        out = IngestOut(accepted=len(rows), window=epoch)
        status, stored = await store.accept(
            stream=name,
            window=epoch,
            token=token,
            rows=rows,
            response=out.model_dump_json().encode(),
            ttl=ttl,
        )
        if status == "ok":
            epochs[name] = epoch
            return out, False
        if status == "dup":
            assert stored is not None
            return IngestOut.model_validate_json(stored), True
        fresh = await windows.epoch(name)  # closed: the stream rolled under us
        if fresh is None or fresh == epoch:
            raise Unavailable(f"stream {name!r} is rolling; retry shortly")
        epoch = fresh
    raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")

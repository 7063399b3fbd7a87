"""Rules of ingest: accept a batch into the open window (docs/ARCHITECTURE.md, "Data path").

Accepting is one Lua script per batch (``ingest.lua``): the window must be open, the
Idempotency-Key new (or used by the same batch, a retry: answered with the stored response;
a key used by another batch is refused, 422); the rows go to the window's hot stream. A keyed
batch first asks its key's stream-level pointer which window to go to (``idem_claim.lua``):
the open epoch for a new key, else the window its batch went to, so a retry is looked up in
one window however many rolled since. A key is honoured for ``idempotency_ttl_seconds`` after
its first request: its pointer (the window) and its record (keyed token, keyed fingerprint,
response: no row) expire then.
Counting them into the window's tables is a separate job (``service.counting``): the
increments were nine tenths of an ingest request's Redis time when the ingest script applied
them (``BENCHMARKS.md``), and summed with the other batches' by the counter they cost Redis
far less."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import orjson
from sqlalchemy import select

from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.db.models import ColdStoreKey
from service.errors import PayloadTooLarge, TooManyRequests, Unavailable, ValidationError
from service.ingest.schemas import IngestIn, IngestOut
from service.streams import service as streams
from service.streams.validation import check_rows

MAX_WINDOW_RETRIES = 8
# How long an API process trusts "no cold-store key yet" (a key, once made, is never removed:
# "a key exists" is trusted for the life of the process).
NO_KEY_RECHECK_SECONDS = 1.0
REUSED_KEY = "Idempotency-Key reused with a different request body"
KEYS_FULL = (
    "stream {name!r} remembers {cap} Idempotency-Keys (SELECTIVITY_IDEMPOTENCY_MAX_KEYS) for "
    "SELECTIVITY_IDEMPOTENCY_TTL_SECONDS: a new key is refused until older ones expire; "
    "batches without a key, and retries of remembered keys, are accepted"
)
NO_KEY = (
    "no cold-store key: run the key ceremony "
    "(`selectivity admin init-coldstore --shares N --threshold M`)"
)


async def require_coldstore_key(ctx: AppContext) -> None:
    """Fail closed: without a cold-store key nothing can be sealed, so hot data would never be
    deleted (docs/PRIVACY.md, promise 1). Ingest refuses
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


def batch_fingerprint(rows: list[bytes], secret: bytes, token: str = "") -> str:
    """The batch's canonical rows (``batch_rows``: the validated body, re-encoded) and the
    keyed token of its Idempotency-Key (``key_token``) hashed by BLAKE2b keyed with
    ``secret``, 64 hex digits: the same key and body sent again to the stream have the same
    fingerprint, in any window. ``token`` '': the rows alone, as records made before the
    fingerprint was bound to the key hold it (compared with, never written).

    The secret is the stream's hash seed (``stream.hash_seed``), which lives in SQL and in the
    processes' memory, never in Redis. Who reads Redis alone (its AOF, a replica, a copy, an
    account with the Redis URL) cannot recompute the fingerprint of a guessed batch, as they
    could an unkeyed hash of a low-entropy row; who holds the SQL database too must guess the
    Idempotency-Key as well as the batch, and only until the record expires."""
    digest = hashlib.blake2b(key=secret[:64], person=b"selectivity-idm", digest_size=32)
    if token:
        digest.update(b"key:%s:" % token.encode())
    for row in rows:
        digest.update(b"%d:" % len(row))
        digest.update(row)
    return digest.hexdigest()


def key_token(idempotency_key: str, secret: bytes, scope: str = "") -> str:
    """The Idempotency-Key as stored (a field name in Redis): BLAKE2b keyed like the
    fingerprint, so the client's key is not in Redis either.

    ``scope`` is whose key it is (``key_scope``): the same key sent by two producers names two
    batches, so one producer can neither confirm a guess of another's batch by replaying it
    under that producer's key (a replay answers 200 with the first response, another body 422)
    nor make another's batch refused by using its key first. '' is the unscoped token of
    records made before keys were scoped: looked up for their remaining TTL, never written."""
    digest = hashlib.blake2b(key=secret[:64], person=b"selectivity-idk", digest_size=16)
    if scope:
        raw = scope.encode()
        digest.update(b"scope:%d:%s:" % (len(raw), raw))
    digest.update(idempotency_key.encode())
    return digest.hexdigest()


def key_scope(*, actor: str | None = None, internal: str | None = None) -> str:
    """The scope of an Idempotency-Key: ``actor`` the producer's (``Principal.actor``: keys of one
    actor share it, so a retry survives the rotation of its API key), ``internal`` one of the
    service's own writers (the labels of an annotation queue), in a name space no actor reaches."""
    if (actor is None) == (internal is None):
        raise ValueError("key_scope: exactly one of actor and internal")
    return f"actor:{actor}" if actor is not None else f"service:{internal}"


def legacy_fingerprint(rows: list[bytes]) -> str:
    """The SHA-256 fingerprint records written before keyed fingerprints hold: computed only to
    compare with such a record (read, never written)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(b"%d:" % len(row))
        digest.update(row)
    return digest.hexdigest()


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
    *,
    ctx: AppContext,
    name: str,
    body: IngestIn,
    idempotency_key: str | None,
    scope: str = "",
) -> tuple[IngestOut, bool]:
    """Accept a batch into the open window; returns (response, replayed). A batch whose window
    closes under it is accepted into the next window; a retried batch (same Idempotency-Key and
    body) is accepted once and answered with the first response for
    ``idempotency_ttl_seconds`` after the key's first request, whatever the rolls, and a key
    reused with another batch is refused (422, the new rows not accepted). The counting job
    (``service.counting.service.count_window``) counts accepted rows into the window's tables.
    ``scope`` (``key_scope``) is whose Idempotency-Key it is; required with a key."""
    rt = await streams.runtime(ctx=ctx, name=name)
    validate(ctx, rt, body)
    await require_coldstore_key(ctx)
    rows = batch_rows(body)
    out = IngestOut(accepted=len(rows), window=0)
    if idempotency_key is not None and not scope:
        raise ValueError("ingest: an Idempotency-Key needs its scope (key_scope)")
    if rt.parts > 1:
        split = rt.parts_of([o.features for o in body.observations], rows)
        parts = [[r for r, q in zip(rows, split, strict=True) if q == p] for p in range(rt.parts)]
        if idempotency_key is None:
            return await _accept_unkeyed_parts(ctx, name, parts, out), False
        token = key_token(idempotency_key, rt.hash_seed, scope)
        fingerprint = batch_fingerprint(rows, rt.hash_seed, token)
        return await _accept_keyed_parts(ctx, name, parts, token, fingerprint, out)
    if idempotency_key is None:
        return await _accept_unkeyed_parts(ctx, name, [rows], out), False
    store = ctx.stores.ingest
    token = key_token(idempotency_key, rt.hash_seed, scope)
    old = key_token(idempotency_key, rt.hash_seed)
    before: tuple[str, Callable[[], str]] | None = None
    if await store.pointed(stream=name, token=old):
        # first sent before tokens were scoped: on its record for the rest of its TTL
        token = old
    else:  # a record made before pointers and scopes, in a hot window
        before = (old, lambda: batch_fingerprint(rows, rt.hash_seed, old))
    fingerprint = batch_fingerprint(rows, rt.hash_seed, token)
    # records written before keyed fingerprints: looked up, never written
    legacy_token = hashlib.sha256(idempotency_key.encode()).hexdigest()

    def legacy() -> str:
        return legacy_fingerprint(rows)

    def unbound() -> str:  # records made before fingerprints were bound to the key
        return batch_fingerprint(rows, rt.hash_seed)

    ttl = ctx.settings.idempotency_ttl_seconds
    # A batch accepted before keys had a stream-level pointer is found in its window's record,
    # kept while the window is hot: with two or more hot windows, a key without a pointer is
    # looked up in the hot period's earlier windows before its pointer is made (a replay found
    # there makes none, so every retry finds it there).
    look = rt.config.hot_windows >= 2
    cap = ctx.settings.idempotency_max_keys
    status, epoch, delay = await store.claim(
        stream=name, token=token, ttl=ttl, cap=cap, create=not look
    )
    if status == "absent" and epoch is not None:
        replay = await store.find_replay(
            stream=name,
            windows=list(range(max(1, rt.hot_period(epoch)[0]), epoch)),
            token=token,
            legacy_token=legacy_token,
            fingerprint=fingerprint,
            unbound=unbound,
            legacy=legacy,
            unscoped=before,
        )
        if replay is not None:
            return _replayed(*replay)
        status, epoch, delay = await store.claim(stream=name, token=token, ttl=ttl, cap=cap)
    if epoch is None:
        raise Unavailable(f"stream {name!r} has no open window yet; retry shortly")
    if status == "full":
        raise TooManyRequests(KEYS_FULL.format(name=name, cap=cap), retry_after=delay)
    for _ in range(MAX_WINDOW_RETRIES):
        out.window = epoch
        status, stored = await store.accept(
            stream=name,
            window=epoch,
            token=token,
            legacy_token=legacy_token,
            fingerprint=fingerprint,
            unbound=unbound,
            legacy=legacy,
            rows=rows,
            response=out.model_dump_json().encode(),
            ttl=ttl,
            unscoped=before,
        )
        if status == "ok":
            ctx.caches.open_epochs[name] = epoch
            return out, False
        if status in ("dup", "mismatch"):
            return _replayed(status, stored)
        # closed without this key's batch: the key's pointer moves to the open epoch
        status, fresh, delay = await store.claim(
            stream=name, token=token, ttl=ttl, cap=cap, closed=epoch
        )
        if status == "full":
            raise TooManyRequests(KEYS_FULL.format(name=name, cap=cap), retry_after=delay)
        if fresh is None or fresh == epoch:
            raise Unavailable(f"stream {name!r} is rolling; retry shortly")
        epoch = fresh
    raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")


async def _accept_unkeyed_parts(
    ctx: AppContext, name: str, parts: list[list[bytes]], out: IngestOut
) -> IngestOut:
    """A batch without a key (``parts``: its rows by part, one list for a stream of one part):
    each part's rows into that part of the open window, recorded nowhere. The cached open
    epoch saves a round trip; each part's script refuses a closed part, and a roll under the
    batch sends the rest to the next window; ``window`` is the last window a part went to."""
    windows = ctx.stores.windows
    epochs = ctx.caches.open_epochs
    epoch = epochs.get(name) or await windows.epoch(name)
    if epoch is None:
        raise Unavailable(f"stream {name!r} has no open window yet; retry shortly")
    for p, rows in enumerate(parts):
        if not rows:
            continue
        for _ in range(MAX_WINDOW_RETRIES):
            status, _ = await ctx.stores.ingest.accept(
                stream=name,
                window=epoch,
                token=None,
                legacy_token=None,
                fingerprint="0" * 64,  # not stored: no key
                unbound=lambda: "",
                legacy=lambda: "",
                rows=rows,
                response=b"",
                ttl=ctx.settings.idempotency_ttl_seconds,
                part=p,
            )
            if status == "ok":
                break
            fresh = await windows.epoch(name)  # closed: the stream rolled under us
            if fresh is None or fresh == epoch:
                raise Unavailable(f"stream {name!r} is rolling; retry shortly")
            epoch = fresh
        else:
            raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")
    epochs[name] = epoch
    out.window = epoch
    return out


async def _accept_keyed_parts(
    ctx: AppContext,
    name: str,
    parts: list[list[bytes]],
    token: str,
    fingerprint: str,
    out: IngestOut,
) -> tuple[IngestOut, bool]:
    """A keyed batch into a stream of several parts. Parts are separate Redis slots, so no
    script can accept the batch at once: each part p (every one, in order, an empty part
    too) is accepted as a batch of its own, exactly once, under the token ``<token>:<p>``
    (part 0: the key's token) with the whole batch's fingerprint, its own stream-level pointer
    and its own record in that part of its window (``idem_claim.lua``, ``ingest.lua``). Part 0
    goes first and holds the only pointer the key cap counts: a key reused with another batch
    is refused (422) at part 0 before any of the new rows is accepted, since every attempt
    records part 0 first. A retry after a crash between parts finds the parts already
    accepted (replayed from their records) and accepts the rest; a roll between parts sends
    the rest to the next window. ``window`` is the last window a part went to, the same on
    every retry; the batch is a replay when every part was."""
    store = ctx.stores.ingest
    ttl = ctx.settings.idempotency_ttl_seconds
    cap = ctx.settings.idempotency_max_keys
    replays, windows = 0, []
    for p, rows in enumerate(parts):
        tok = token if p == 0 else f"{token}:{p}"
        status, epoch, delay = await store.claim(
            stream=name, token=tok, ttl=ttl, cap=cap, capped=p == 0
        )
        if epoch is None:
            raise Unavailable(f"stream {name!r} has no open window yet; retry shortly")
        if status == "full":
            raise TooManyRequests(KEYS_FULL.format(name=name, cap=cap), retry_after=delay)
        for _ in range(MAX_WINDOW_RETRIES):
            response = IngestOut(accepted=out.accepted, window=epoch)
            status, stored = await store.accept(
                stream=name,
                window=epoch,
                token=tok,
                legacy_token=None,
                fingerprint=fingerprint,
                unbound=lambda: "",
                legacy=lambda: "",
                rows=rows,
                response=response.model_dump_json().encode(),
                ttl=ttl,
                part=p,
            )
            if status == "ok":
                windows.append(epoch)
                break
            if status in ("dup", "mismatch"):
                replayed, _ = _replayed(status, stored)
                windows.append(replayed.window)
                replays += 1
                break
            status, fresh, delay = await store.claim(
                stream=name, token=tok, ttl=ttl, cap=cap, closed=epoch, capped=False
            )
            if fresh is None or fresh == epoch:
                raise Unavailable(f"stream {name!r} is rolling; retry shortly")
            epoch = fresh
        else:
            raise Unavailable(f"stream {name!r} rolled {MAX_WINDOW_RETRIES} times during one batch")
    out.window = max(windows)
    if replays < len(parts):
        ctx.caches.open_epochs[name] = out.window
    return out, replays == len(parts)


def _replayed(status: str, stored: bytes | None) -> tuple[IngestOut, bool]:
    if status == "mismatch" or stored is None:
        raise ValidationError(REUSED_KEY)
    return IngestOut.model_validate_json(stored), True

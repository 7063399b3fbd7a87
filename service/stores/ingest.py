"""Redis side of ingest: which window a keyed batch goes to (idem_claim.lua), accepting a batch
into a window's hot stream (ingest.lua), finding a retried batch's stored response.

A window's keyed batches are one hash (``Keys.idem_window``): field the keyed token of the
batch's Idempotency-Key, value the keyed fingerprint of the key and the batch (64 hex
digits, ``FINGERPRINT_LEN``) followed by the response (``service.ingest.service`` keys both
with the stream's secret; records made before the fingerprint was bound to the key hold the
rows' alone, compared with ``unbound()``). The hash expires ``idempotency_ttl_seconds`` after
its last record. The stream-level pointer of a key (``Keys.idem_pointer``, the same keyed
token) holds the window its batch went to, with the same life counted from the key's first
request: a retry is looked up in one window, however many rolled since. Records written
before keyed fingerprints (``Keys.idem``, one string per batch with a TTL) are read, never
written: a response alone (JSON, starting with ``{``) is taken for a retry, as it was then;
else its first 64 digits are the batch's SHA-256, compared with ``legacy()``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from redis.asyncio import Redis

from service.lua import source, status_of
from service.stores.keys import Keys

FINGERPRINT_LEN = 64
# A stream's pointers are counted in time buckets of ttl / COUNT_BUCKETS seconds; a count sums
# the COUNT_BUCKETS + 1 buckets that may hold a live pointer (at most one bucket's worth of
# expired pointers is still counted).
COUNT_BUCKETS = 16


def _stored(
    value: bytes, fingerprint: str, unbound: Callable[[], str] | None = None
) -> tuple[str, bytes | None]:
    """``('dup', response)`` when ``value`` was stored for this fingerprint (or, made before
    fingerprints were bound to the key, for ``unbound()``; or before fingerprints), else
    ``('mismatch', None)``."""
    if value.startswith(b"{"):
        return "dup", value
    head = value[:FINGERPRINT_LEN]
    if head != fingerprint.encode() and (unbound is None or head != unbound().encode()):
        return "mismatch", None
    return "dup", value[FINGERPRINT_LEN:]


class IngestStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._ingest = redis.register_script(source("ingest"))
        self._claim = redis.register_script(source("idem_claim"))

    async def pointed(self, *, stream: str, token: str) -> bool:
        """Whether a key's pointer exists (a key first sent before keys were scoped)."""
        return bool(await self.r.exists(self.k.idem_pointer(stream, token)))

    async def claim(
        self,
        *,
        stream: str,
        token: str,
        ttl: int,
        cap: int,
        closed: int | None = None,
        create: bool = True,
        capped: bool = True,
    ) -> tuple[str, int | None, int]:
        """The window a batch with this keyed token goes to, and a delay: ``('new', open
        epoch)`` (the first request with the key: the pointer is made, for ``ttl`` seconds;
        ``('absent', open epoch)`` instead when not ``create``), ``('full', open epoch)`` (not
        made: the stream holds ``cap`` pointers; the delay is when the oldest may have gone),
        ``('at', window)`` (the pointer's window), ``('moved', open epoch)`` (``closed``, where
        the pointer was, is closed without the batch: the pointer moved) or ``('none', None)``
        (no open epoch). ``capped`` False: a pointer made is neither counted nor refused for
        the cap (the pointer of a batch's part ≥ 1, whose part 0 was)."""
        size = math.ceil(ttl / COUNT_BUCKETS)
        now = time.time()
        bucket = int(now // size)
        counts = (
            [self.k.idem_count(stream, bucket - i) for i in range(COUNT_BUCKETS + 1)]
            if create and capped
            else []
        )
        res = await self._claim(
            keys=[self.k.idem_pointer(stream, token), self.k.epoch(stream), *counts],
            args=[
                ttl,
                "" if closed is None else str(closed),
                ("1" if capped else "2") if create else "0",
                cap,
                size * (COUNT_BUCKETS + 2),
            ],
        )
        status = status_of(res)
        delay = math.ceil((bucket + 1) * size - now)
        return status, int(res[1]) if len(res) > 1 else None, delay

    async def accept(
        self,
        *,
        stream: str,
        window: int,
        token: str | None,
        legacy_token: str | None,
        fingerprint: str,
        unbound: Callable[[], str],
        legacy: Callable[[], str],
        rows: list[bytes],
        unscoped: tuple[str, Callable[[], str]] | None = None,
        response: bytes,
        ttl: int,
        part: int = 0,
        listed: bool = True,
    ) -> tuple[str, bytes | None]:
        """Append a batch's raw rows to the window's hot stream if the idempotency token
        (None: no key, nothing recorded) is new to the window and the window open:
        ``('ok', None)``, ``('closed', None)`` (the window never took the token),
        ``('dup', stored response)`` (the token was used by a batch of this fingerprint) or
        ``('mismatch', None)`` (by another batch). The record lives ``ttl`` seconds.
        ``unscoped``: the key's token as written before tokens were scoped to their producer
        and the batch's fingerprint under it, to find such a record (read, never written).
        ``part``: the part of the window the rows go to (its meta, records and hot stream);
        ``listed``: the batch also goes whole to the window's list of batches to count
        (``Keys.batches``; False only to write as a version before the list did)."""
        if len(fingerprint) != FINGERPRINT_LEN:
            raise ValueError("fingerprint: 64 hex digits")
        p = part
        keys = [
            self.k.meta(stream, window, p),
            self.k.idem_window(stream, window, p),
            self.k.hot(stream, window, p),
            self.k.idem(stream, window, legacy_token or "-", p),
            self.k.batches(stream, window, p),
            self.k.batch_ids(stream, window, p),
        ]
        old = unscoped[0] if unscoped else ""
        args: list[str | bytes | int] = [
            token or "",
            fingerprint.encode() + response,
            ttl,
            old,
            "1" if listed else "",
            *rows,
        ]
        res = await self._ingest(keys=keys, args=args)
        status = status_of(res)
        if status == "dup":
            return _stored(bytes(res[1]), fingerprint, unbound)
        if status == "unscoped" and unscoped:
            return _stored(bytes(res[1]), unscoped[1](), unbound)
        if status == "legacy":
            return _stored(bytes(res[1]), legacy())
        return status, None

    async def find_replay(
        self,
        *,
        stream: str,
        windows: list[int],
        token: str,
        legacy_token: str,
        fingerprint: str,
        unbound: Callable[[], str],
        legacy: Callable[[], str],
        unscoped: tuple[str, Callable[[], str]] | None = None,
    ) -> tuple[str, bytes | None] | None:
        """A batch with this idempotency token in ``windows`` (records made without the
        stream-level pointer: read, never written): ``('dup', its stored response)`` or
        ``('mismatch', None)`` (another batch's token); None when none. ``unscoped`` as in
        ``accept``."""
        if not windows:
            return None
        pipe = self.r.pipeline(transaction=False)
        for w in windows:
            pipe.hget(self.k.idem_window(stream, w), token)
            pipe.hget(self.k.idem_window(stream, w), unscoped[0] if unscoped else "-")
            pipe.get(self.k.idem(stream, w, legacy_token))
        found = await pipe.execute()
        for keyed, before, old in zip(found[::3], found[1::3], found[2::3], strict=True):
            if keyed is not None:
                return _stored(bytes(keyed), fingerprint, unbound)
            if before is not None and unscoped:
                return _stored(bytes(before), unscoped[1](), unbound)
            if old is not None:
                return _stored(bytes(old), legacy())
        return None

    async def forget_unpointed(self, stream: str, windows: Iterable[int]) -> None:
        """Delete the record hashes of ``windows`` (which left the hot period) that have no
        TTL: made before records expired by themselves, they went with the hot period, and no
        key's pointer leads to them. A hash with a TTL stays until it expires."""
        for w in windows:  # one command per window: each is its own cluster slot
            key = self.k.idem_window(stream, w)
            if await self.r.ttl(key) == -1:
                await self.r.unlink(key)

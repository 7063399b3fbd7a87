"""Redis side of ingest: accepting a batch into the open window's hot stream (ingest.lua),
finding a retried batch's stored response, and forgetting a window's batches.

A window's keyed batches are one hash (``Keys.idem_window``): field the keyed token of the
batch's Idempotency-Key, value its keyed fingerprint (64 hex digits, ``FINGERPRINT_LEN``)
followed by the response (``service.ingest.service`` keys both with the stream's secret).
Records written before keyed fingerprints (``Keys.idem``, one string per batch with a TTL) are
read, never written: a response alone (JSON, starting with ``{``) is taken for a retry, as it
was then; else its first 64 digits are the batch's SHA-256, compared with ``legacy()``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from redis.asyncio import Redis

from service.keys import Keys
from service.lua import source, status_of

FINGERPRINT_LEN = 64


def _stored(value: bytes, fingerprint: str) -> tuple[str, bytes | None]:
    """``('dup', response)`` when ``value`` was stored for this fingerprint (or before
    fingerprints), else ``('mismatch', None)``."""
    if value.startswith(b"{"):
        return "dup", value
    if value[:FINGERPRINT_LEN] != fingerprint.encode():
        return "mismatch", None
    return "dup", value[FINGERPRINT_LEN:]


class IngestStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._ingest = redis.register_script(source("ingest"))

    async def accept(
        self,
        *,
        stream: str,
        window: int,
        token: str | None,
        legacy_token: str | None,
        fingerprint: str,
        legacy: Callable[[], str],
        rows: list[bytes],
        response: bytes,
    ) -> tuple[str, bytes | None]:
        """Append a batch's raw rows to the window's hot stream if the window is open and the
        idempotency token (None: no key, nothing recorded) new: ``('ok', None)``,
        ``('closed', None)``, ``('dup', stored response)`` (the token was used by a batch of
        this fingerprint) or ``('mismatch', None)`` (by another batch)."""
        if len(fingerprint) != FINGERPRINT_LEN:
            raise ValueError("fingerprint: 64 hex digits")
        keys = [
            self.k.meta(stream, window),
            self.k.idem_window(stream, window),
            self.k.hot(stream, window),
            self.k.idem(stream, window, legacy_token or "-"),
        ]
        args: list[str | bytes] = [token or "", fingerprint.encode() + response, *rows]
        res = await self._ingest(keys=keys, args=args)
        status = status_of(res)
        if status == "dup":
            return _stored(bytes(res[1]), fingerprint)
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
        legacy: Callable[[], str],
    ) -> tuple[str, bytes | None] | None:
        """A batch with this idempotency token in earlier windows: ``('dup', its stored
        response)`` or ``('mismatch', None)`` (another batch's token); None when none."""
        if not windows:
            return None
        pipe = self.r.pipeline(transaction=False)
        for w in windows:
            pipe.hget(self.k.idem_window(stream, w), token)
            pipe.get(self.k.idem(stream, w, legacy_token))
        found = await pipe.execute()
        for keyed, old in zip(found[::2], found[1::2], strict=True):
            if keyed is not None:
                return _stored(bytes(keyed), fingerprint)
            if old is not None:
                return _stored(bytes(old), legacy())
        return None

    async def forget(self, stream: str, windows: Iterable[int]) -> None:
        """Delete the record of the keyed batches of ``windows`` (their window left the hot
        period: no retry is looked up there any more)."""
        for w in windows:  # one command per window: each is its own cluster slot
            await self.r.unlink(self.k.idem_window(stream, w))

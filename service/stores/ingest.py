"""Redis side of ingest: accepting a batch into the open window's hot stream (ingest.lua),
and finding a retried batch's stored response.

An idempotency key's value is the batch's fingerprint (64 hex digits, ``FINGERPRINT_LEN``)
followed by the response; a value written before fingerprints existed is the response alone
(JSON, starting with ``{``) and is taken for a retry, as it was then."""

from __future__ import annotations

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
        token: str,
        fingerprint: str,
        rows: list[bytes],
        response: bytes,
        ttl: int,
    ) -> tuple[str, bytes | None]:
        """Append a batch's raw rows to the window's hot stream if the window is open and the
        idempotency token new: ``('ok', None)``, ``('closed', None)``, ``('dup', stored
        response)`` (the token was used by a batch of this fingerprint) or ``('mismatch',
        None)`` (by another batch)."""
        if len(fingerprint) != FINGERPRINT_LEN:
            raise ValueError("fingerprint: 64 hex digits")
        keys = [
            self.k.meta(stream, window),
            self.k.idem(stream, window, token),
            self.k.hot(stream, window),
        ]
        res = await self._ingest(keys=keys, args=[ttl, fingerprint.encode() + response, *rows])
        status = status_of(res)
        if status == "dup":
            return _stored(bytes(res[1]), fingerprint)
        return status, None

    async def find_replay(
        self, *, stream: str, windows: list[int], token: str, fingerprint: str
    ) -> tuple[str, bytes | None] | None:
        """A batch with this idempotency token in earlier windows: ``('dup', its stored
        response)`` or ``('mismatch', None)`` (another batch's token); None when none."""
        if not windows:
            return None
        pipe = self.r.pipeline(transaction=False)
        for w in windows:
            pipe.get(self.k.idem(stream, w, token))
        for found in await pipe.execute():
            if found is not None:
                return _stored(bytes(found), fingerprint)
        return None

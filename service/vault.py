"""What an unlock holds in memory, and only there: the shares submitted for a pending request,
and the reconstructed private key of an open grant (docs/ARCHITECTURE.md,
"Cold store and break-glass unlock").

Neither is ever written to SQL, Redis, files or logs. This is per process: approvals and the
export of one request must reach the same API process (one API replica, or sticky routing for
``/v1/admin/unlock-requests``); a restart drops pending shares (admins resubmit) and closes
grants. A pending share is held at most ``unlock_share_ttl_seconds`` (default 900) after its
submission: a timer on the API process's loop wipes it then, an approval that finds it expired
drops it, and the ``unlock_expire_grants`` job (every 10 s) sweeps what is left.
"Wiping" drops every reference: the private key lives in an OpenSSL object, freed with
it; Python strings (the shares as submitted) cannot be overwritten in place, so the process
should not be swapped to disk (run with swap off or mlock-limited, as for any key holder).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Grant:
    private_key: Any  # X25519PrivateKey
    expires_at: datetime
    timer: Any = None  # the loop's TimerHandle that wipes it at expiry


@dataclass
class Share:
    """One admin's share for a pending request, until ``expires_at``."""

    value: str | None
    expires_at: datetime
    timer: Any = None  # the loop's TimerHandle that wipes it at expiry

    def wipe(self) -> None:
        self.value = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass
class Vault:
    pending: dict[str, dict[str, Share]] = field(default_factory=dict)  # request -> admin
    grants: dict[str, Grant] = field(default_factory=dict)
    # one lock per request with a call waiting on it or inside it (then dropped): every step
    # that reads and changes a request's shares and approvals holds it from its first read to
    # its commit, so concurrent approvals are applied one after the other
    _locks: dict[str, tuple[asyncio.Lock, int]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def lock(self, request_id: str) -> AsyncIterator[None]:
        """Hold request ``request_id``'s lock in this process. Shares live in this process's
        memory only, so this lock (with the SQL row lock where the database has one) is what
        serialises the approvals of one request."""
        lock, users = self._locks.get(request_id, (asyncio.Lock(), 0))
        self._locks[request_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[request_id]
            if users == 1:
                del self._locks[request_id]
            else:
                self._locks[request_id] = (lock, users - 1)

    def drop_share(self, request_id: str, admin: str, share: Share | None = None) -> None:
        """Wipe ``admin``'s share of the request (only if it is still ``share``, when given:
        a timer never removes a later submission)."""
        held = self.pending.get(request_id, {})
        current = held.get(admin)
        if current is None or (share is not None and current is not share):
            return
        del held[admin]
        current.wipe()
        if not held:
            self.pending.pop(request_id, None)

    def drop_expired_shares(self, now: datetime, request_id: str | None = None) -> int:
        """Wipe every pending share (of one request, or of all) whose time is up."""
        dropped = 0
        for rid in [request_id] if request_id is not None else list(self.pending):
            for admin, share in list(self.pending.get(rid, {}).items()):
                if share.expires_at <= now:
                    self.drop_share(rid, admin)
                    dropped += 1
        return dropped

    def clear_pending(self, request_id: str) -> None:
        """Wipe every share held for the request (at its grant, a failed reconstruction, or
        its end)."""
        for share in self.pending.pop(request_id, {}).values():
            share.wipe()

    def wipe(self, request_id: str) -> None:
        self.clear_pending(request_id)
        grant = self.grants.pop(request_id, None)
        if grant is not None:
            grant.private_key = None
            if grant.timer is not None:
                grant.timer.cancel()

    def wipe_all(self) -> None:
        for rid in list(self.pending) + list(self.grants):
            self.wipe(rid)

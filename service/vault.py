"""What an unlock holds in memory, and only there (DESIGN §10): the shares submitted for a
pending request, and the reconstructed private key of an open grant.

Neither is ever written to SQL, Redis, files or logs. This is per process: approvals and the
export of one request must reach the same API process (one API replica, or sticky routing for
``/v1/admin/unlock-requests``); a restart drops pending shares (admins resubmit) and closes
grants. "Wiping" drops every reference: the private key lives in an OpenSSL object, freed with
it; Python strings (the shares as submitted) cannot be overwritten in place, so the process
should not be swapped to disk (run with swap off or mlock-limited, as for any key holder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Grant:
    private_key: Any  # X25519PrivateKey
    expires_at: datetime
    timer: Any = None  # the loop's TimerHandle that wipes it at expiry


@dataclass
class Vault:
    pending: dict[str, dict[str, str]] = field(default_factory=dict)  # request -> admin -> share
    grants: dict[str, Grant] = field(default_factory=dict)

    def wipe(self, request_id: str) -> None:
        self.pending.pop(request_id, None)
        grant = self.grants.pop(request_id, None)
        if grant is not None:
            grant.private_key = None
            if grant.timer is not None:
                grant.timer.cancel()

    def wipe_all(self) -> None:
        for rid in list(self.pending) + list(self.grants):
            self.wipe(rid)

"""The tamper-evident audit log (DESIGN §10): every privileged action, hash-chained.

Entry ``seq`` (dense from 1) has ``hash = SHA-256(prev_hash || canonical JSON of (seq, ts,
actor, action, target, detail))`` with ``prev_hash`` the previous entry's hash (32 zero bytes for
the first). Editing, removing or reordering any entry breaks the chain at that entry, which
``verify`` reports. Removing entries from the end leaves a valid shorter chain: ``verify``
prints the head (seq and hash) so operators can note it outside the database and check it with
``--expect-head`` (a chain anchors only what is recorded elsewhere).

Appends are serialised (a process lock, and on PostgreSQL a transaction-scoped advisory lock)
and run in their own transaction, so a refusal is recorded even though the refused request's
own transaction rolls back. Details never hold raw observations or secrets: only names, ids,
counts, ranges and reasons.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.models import AuditEntry

GENESIS = bytes(32)
_ADVISORY_KEY = 0x5E1EC7A0D17  # any constant: serialises audit appends on PostgreSQL
_locks: dict[int, asyncio.Lock] = {}


def entry_hash(
    prev: bytes, *, seq: int, ts: datetime, actor: str, action: str, target: str, detail: Any
) -> bytes:
    body = orjson.dumps(
        {
            "seq": seq,
            "ts": ts.astimezone(UTC).isoformat(timespec="microseconds"),
            "actor": actor,
            "action": action,
            "target": target,
            "detail": detail,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(prev + body).digest()


async def record(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    actor: str,
    action: str,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> int:
    """Append one entry in its own transaction; returns its seq."""
    lock = _locks.setdefault(id(sessionmaker), asyncio.Lock())
    detail = detail or {}
    async with lock, sessionmaker() as session, session.begin():
        if session.get_bind().dialect.name == "postgresql":
            await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        head = (
            await session.execute(
                select(AuditEntry.seq, AuditEntry.hash).order_by(AuditEntry.seq.desc()).limit(1)
            )
        ).first()
        seq, prev = (head[0] + 1, head[1]) if head else (1, GENESIS)
        ts = datetime.now(UTC)
        h = entry_hash(
            prev, seq=seq, ts=ts, actor=actor, action=action, target=target, detail=detail
        )
        session.add(
            AuditEntry(
                seq=seq,
                ts=ts,
                actor=actor[:64],
                action=action[:64],
                target=target[:200],
                detail=detail,
                prev_hash=prev,
                hash=h,
            )
        )
    return seq


async def page(session: AsyncSession, *, after: int, limit: int) -> list[AuditEntry]:
    rows = await session.scalars(
        select(AuditEntry).where(AuditEntry.seq > after).order_by(AuditEntry.seq).limit(limit)
    )
    return list(rows)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    entries: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None = None
    problem: str | None = None


async def verify(session: AsyncSession, *, batch: int = 1000) -> Verdict:
    """Walk the chain in seq order; the first entry whose seq, link or hash is wrong."""
    prev, expected, n = GENESIS, 1, 0
    after = 0
    while True:
        rows = await page(session, after=after, limit=batch)
        if not rows:
            break
        for e in rows:
            problem = None
            if e.seq != expected:
                problem = f"entry {expected} is missing (next is {e.seq}): removed or reordered"
            elif e.prev_hash != prev:
                problem = (
                    "its link to the previous entry is wrong: "
                    "an entry before it was removed or reordered"
                )
            elif e.hash != entry_hash(
                prev,
                seq=e.seq,
                ts=e.ts,
                actor=e.actor,
                action=e.action,
                target=e.target,
                detail=e.detail,
            ):
                problem = "its content does not match its hash: the entry was edited"
            if problem is not None:
                return Verdict(False, n, expected - 1, prev.hex(), expected, problem)
            prev, expected, n = e.hash, expected + 1, n + 1
            after = e.seq
    return Verdict(True, n, expected - 1, prev.hex())

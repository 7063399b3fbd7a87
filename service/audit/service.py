"""The tamper-evident audit log (docs/ARCHITECTURE.md, "Audit log"): every privileged action,
in a keyed hash chain anchored outside the database.

Entry ``seq`` (dense from 1) has ``hash = HMAC-SHA256(key, prev_hash || canonical JSON of (seq,
ts, actor, action, target, detail, key_version))`` with ``prev_hash`` the previous entry's hash
(32 zero bytes for the first) and ``key`` the audit key, which the database does not hold
(``service.audit.anchor``). Entries written before the key existed (``key_version`` 0) are a
plain ``SHA-256(prev_hash || canonical JSON of (seq, ts, actor, action, target, detail))`` chain
and still verify; the first keyed entry (action ``audit.keyed``) starts the keyed part, and
after it no plain entry is accepted. After each append the head (seq, hash), the first keyed
seq and the key id are written to the anchor file on the cold-store volume.

Against whom: someone who can write the database but has neither the key nor write access to
the cold-store volume (a database admin, a leaked database credential, a restored or edited
backup) cannot edit, remove, reorder or add a keyed entry without ``verify`` naming it (they
cannot compute the HMAC), cannot rewrite keyed entries as plain ones (the switch point is in
the anchor) and cannot cut entries from the end (the anchored head is missing then). Someone
who also holds the key (root on the service's host, the attacker of promise 1) can rewrite
the log and the anchor; only a head noted elsewhere and checked with ``--expect-head SEQ:HASH``
protects the entries up to it against them.

An append whose anchor does not match the log (the anchored head is missing or differs, or
another key wrote it) is still recorded but leaves the anchor as it is, so the evidence stays
until an operator looks (``selectivity audit verify``). An anchor that went missing while the
log is keyed is re-created, and the log says so (``audit.reanchored``).

Appends are serialised (a process lock, ``flock`` beside the anchor, and on PostgreSQL a
transaction-scoped advisory lock) and run in their own transaction, so a refusal is recorded
even though the refused request's own transaction rolls back. Details never hold raw
observations or secrets: only names, ids, counts, ranges and reasons.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.audit.anchor import (
    Anchor,
    AuditSetupError,
    key_id,
    load_key,
    locked,
    read_anchor,
    write_anchor,
)
from service.config import Settings
from service.db.models import AuditEntry

log = logging.getLogger("selectivity.audit")

GENESIS = bytes(32)
PLAIN, KEYED = 0, 1  # key_version: plain SHA-256 (before the key), HMAC-SHA256 under the key
_ADVISORY_KEY = 0x5E1EC7A0D17  # any constant: serialises audit appends on PostgreSQL
_locks: dict[int, asyncio.Lock] = {}

__all__ = ["AuditSetupError", "Verdict", "entry_digest", "page", "record", "verify"]


def entry_digest(
    prev: bytes,
    *,
    key: bytes | None,
    key_version: int,
    seq: int,
    ts: datetime,
    actor: str,
    action: str,
    target: str,
    detail: Any,
) -> bytes:
    """An entry's hash: HMAC-SHA256 under ``key`` (``key_version`` 1, which the digested body
    names, so a keyed entry cannot pass for a plain one), or plain SHA-256 (0, the entries
    written before the key; their body is the original one)."""
    fields: dict[str, Any] = {
        "seq": seq,
        "ts": ts.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor": actor,
        "action": action,
        "target": target,
        "detail": detail,
    }
    if key_version == PLAIN:
        return hashlib.sha256(prev + orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).digest()
    if key_version != KEYED or key is None:
        raise ValueError(f"cannot digest an entry of key_version {key_version}")
    body = orjson.dumps(fields | {"key_version": key_version}, option=orjson.OPT_SORT_KEYS)
    return hmac.new(key, prev + body, hashlib.sha256).digest()


def _settings(session: AsyncSession) -> Settings:
    s = session.info.get("settings")
    if not isinstance(s, Settings):
        raise AuditSetupError(
            "the audit log needs the settings on its sessions: make_sessionmaker(engine, settings)"
        )
    return s


class _Appender:
    """Entries added to one transaction, each chained to the one before."""

    def __init__(self, session: AsyncSession, key: bytes, seq: int, prev: bytes) -> None:
        self.session, self.key, self.seq, self.prev = session, key, seq, prev

    def add(self, *, actor: str, action: str, target: str, detail: dict[str, Any]) -> None:
        self.seq += 1
        ts = datetime.now(UTC)
        h = entry_digest(
            self.prev,
            key=self.key,
            key_version=KEYED,
            seq=self.seq,
            ts=ts,
            actor=actor,
            action=action,
            target=target,
            detail=detail,
        )
        self.session.add(
            AuditEntry(
                seq=self.seq,
                ts=ts,
                actor=actor,
                action=action,
                target=target,
                detail=detail,
                prev_hash=self.prev,
                hash=h,
                key_version=KEYED,
            )
        )
        self.prev = h


async def _anchor_mismatch(
    session: AsyncSession, anchor: Anchor, kid: str, head_seq: int
) -> str | None:
    """Why the log no longer extends the anchored head (``None``: it does)."""
    if anchor.key_id != kid:
        return f"the anchor was written under another audit key (id {anchor.key_id})"
    if head_seq < anchor.seq:
        return f"the log ends at entry {head_seq}, before the anchored entry {anchor.seq}"
    h = await session.scalar(select(AuditEntry.hash).where(AuditEntry.seq == anchor.seq))
    if h != anchor.hash:
        return f"entry {anchor.seq} differs from the anchored one"
    return None


async def record(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    actor: str,
    action: str,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> int:
    """Append one keyed entry in its own transaction, then move the anchor; returns its seq.

    Raises ``AuditSetupError`` when the key or the anchor cannot be read or written (the
    entry is then not recorded, or recorded without its anchor: never silently)."""
    lock = _locks.setdefault(id(sessionmaker), asyncio.Lock())
    detail = detail or {}
    actor, action, target = actor[:64], action[:64], target[:200]  # the stored values
    async with lock, sessionmaker() as session:
        settings = _settings(session)
        key = load_key(settings, create=True)
        if key is None:  # (create=True makes one)
            raise AuditSetupError("no audit key")
        kid = key_id(key)
        path = settings.audit_anchor_file
        async with locked(path):
            anchor = read_anchor(path)
            async with session.begin():
                if session.get_bind().dialect.name == "postgresql":
                    await session.execute(
                        text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY}
                    )
                head = (
                    await session.execute(
                        select(AuditEntry.seq, AuditEntry.hash, AuditEntry.key_version)
                        .order_by(AuditEntry.seq.desc())
                        .limit(1)
                    )
                ).first()
                head_seq, prev, head_version = head if head else (0, GENESIS, PLAIN)
                out = _Appender(session, key, head_seq, prev)
                mismatch = None
                if anchor is not None:
                    keyed_from = anchor.keyed_from
                    mismatch = await _anchor_mismatch(session, anchor, kid, head_seq)
                elif head_version == PLAIN:  # the switch: from here on every entry is keyed
                    keyed_from = head_seq + 1
                    out.add(
                        actor="service",
                        action="audit.keyed",
                        target="audit",
                        detail={"key_id": kid, "plain_entries": head_seq},
                    )
                else:  # keyed entries but no anchor: re-anchor, and say so on the log
                    keyed_from = (
                        await session.scalar(
                            select(func.min(AuditEntry.seq)).where(AuditEntry.key_version != PLAIN)
                        )
                    ) or 1
                    log.error("the audit anchor %s was missing: re-created", path)
                    out.add(
                        actor="service",
                        action="audit.reanchored",
                        target="audit",
                        detail={"reason": "anchor file missing", "head_seq": head_seq},
                    )
                out.add(actor=actor, action=action, target=target, detail=detail)
            if mismatch is None:
                await asyncio.to_thread(
                    write_anchor, path, Anchor(out.seq, out.prev, keyed_from, kid)
                )
            else:
                log.error(
                    "audit entry %d recorded, anchor %s left as it is: %s; "
                    "run `selectivity audit verify`",
                    out.seq,
                    path,
                    mismatch,
                )
    return out.seq


async def page(session: AsyncSession, *, after: int, limit: int) -> list[AuditEntry]:
    rows = await session.scalars(
        select(AuditEntry).where(AuditEntry.seq > after).order_by(AuditEntry.seq).limit(limit)
    )
    return list(rows)


@dataclass(frozen=True)
class Verdict:
    """``ok``: the chain is intact and matches the anchor (and ``expect_head``). Otherwise
    ``problem`` says what is wrong and ``first_bad_seq`` names the first entry it concerns
    (``None`` when no entry can be named, e.g. a missing key). ``head_*`` is the last entry
    whose chain checked out."""

    ok: bool
    entries: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None = None
    problem: str | None = None
    keyed_from: int | None = None  # the first keyed entry of the log
    key_id: str | None = None
    anchor: Anchor | None = None
    anchor_path: str | None = None
    notes: tuple[str, ...] = field(default=())


async def verify(
    session: AsyncSession, *, expect_head: tuple[int, bytes] | None = None, batch: int = 1000
) -> Verdict:
    """Walk the chain in seq order (the first entry whose seq, link, hash or key version is
    wrong), then check it against the anchor and, if given, ``expect_head`` (seq, hash): a
    head noted earlier, which the entry at that seq must still have."""
    settings = _settings(session)
    key = load_key(settings, create=False)
    kid = key_id(key) if key is not None else None
    path = settings.audit_anchor_file
    anchor = read_anchor(path)
    prev, expected, n = GENESIS, 1, 0
    keyed_from: int | None = None
    wanted = {s for s in (anchor.seq if anchor else None, expect_head and expect_head[0]) if s}
    seen: dict[int, bytes] = {}

    def verdict(ok: bool, bad: int | None, problem: str | None, *notes: str) -> Verdict:
        return Verdict(
            ok, n, expected - 1, prev.hex(), bad, problem, keyed_from, kid, anchor, str(path), notes
        )

    if anchor is not None and kid is not None and anchor.key_id != kid:
        return verdict(
            False,
            None,
            f"the audit key (id {kid}) is not the key the log was keyed with (id "
            f"{anchor.key_id}, in the anchor): configure the original key",
        )
    after = 0
    while True:
        rows = await page(session, after=after, limit=batch)
        if not rows:
            break
        for e in rows:
            problem, bad = None, expected
            if e.seq != expected:
                problem = f"entry {expected} is missing (next is {e.seq}): removed or reordered"
            elif e.prev_hash != prev:
                problem = (
                    "its link to the previous entry is wrong: "
                    "an entry before it was removed or reordered"
                )
            elif e.key_version not in (PLAIN, KEYED):
                problem = f"unknown key_version {e.key_version}"
            elif e.key_version == PLAIN and keyed_from is not None:
                problem = (
                    f"a plain SHA-256 entry after the switch to keyed entries at {keyed_from}: "
                    "rewritten without the key"
                )
            elif e.key_version == KEYED and key is None:
                return verdict(
                    False,
                    None,
                    f"entry {e.seq} is keyed but there is no audit key to check it "
                    f"(SELECTIVITY_AUDIT_KEY, or {settings.resolved_audit_key_file})",
                )
            elif not hmac.compare_digest(
                e.hash,
                entry_digest(
                    prev,
                    key=key,
                    key_version=e.key_version,
                    seq=e.seq,
                    ts=e.ts,
                    actor=e.actor,
                    action=e.action,
                    target=e.target,
                    detail=e.detail,
                ),
            ):
                problem = "its content does not match its hash: the entry was edited" + (
                    " (or rewritten without the key)" if e.key_version == KEYED else ""
                )
            if problem is not None:
                return verdict(False, bad, problem)
            if e.key_version == KEYED and keyed_from is None:
                keyed_from = e.seq
            if e.seq in wanted:
                seen[e.seq] = e.hash
            prev, expected, n = e.hash, expected + 1, n + 1
            after = e.seq
    head = expected - 1
    notes: list[str] = []
    if anchor is None:
        if keyed_from is not None:
            return verdict(
                False,
                None,
                f"the anchor {path} is missing, but the log is keyed from entry {keyed_from}",
            )
        notes.append(
            f"no anchor yet ({path}): "
            + (
                f"the {head} entries are plain SHA-256, written before the audit key; "
                if head
                else "the log is empty; "
            )
            + "the next entry starts the keyed chain and writes the anchor"
        )
    else:
        if head < anchor.seq:
            return verdict(
                False,
                head + 1,
                f"the log ends at entry {head} but the anchor records entry {anchor.seq}: "
                "entries were cut from the end (or the database was restored from a backup)",
            )
        if keyed_from != anchor.keyed_from:
            return verdict(
                False,
                min(anchor.keyed_from, keyed_from or anchor.keyed_from),
                f"the anchor records the switch to keyed entries at entry {anchor.keyed_from}, "
                f"the log at {keyed_from}: entries were rewritten as plain SHA-256",
            )
        if seen.get(anchor.seq) != anchor.hash:
            return verdict(
                False, anchor.seq, f"entry {anchor.seq} differs from the anchored one: rewritten"
            )
        if head > anchor.seq:
            notes.append(
                f"{head - anchor.seq} entries after the anchored head (appended since, by a "
                "process that stopped before moving the anchor)"
            )
    if expect_head is not None:
        seq, h = expect_head
        if head < seq:
            return verdict(
                False,
                head + 1,
                f"the log ends at entry {head}, before the expected head {seq}: "
                "entries were cut from the end",
            )
        if not hmac.compare_digest(seen[seq], h):
            return verdict(
                False, seq, f"entry {seq} differs from the head noted ({h.hex()}): rewritten"
            )
    return verdict(True, None, None, *notes)

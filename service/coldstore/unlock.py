"""Break-glass unlock (docs/ARCHITECTURE.md, "Cold store and break-glass unlock"): request → M
approvals with shares → grant → export of the requested range only → expiry or close. Every step
and every refusal goes to the audit log."""

from __future__ import annotations

import asyncio
import io
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.admin.service import Principal
from service.audit import service as audit
from service.coldstore import crypto
from service.coldstore.schemas import (
    ExportFormat,
    UnlockRequestIn,
    UnlockRequestOut,
    UnlockRequestPage,
    UnlockStatus,
)
from service.coldstore.service import ExportItem, active_key, read_segment
from service.context import AppContext
from service.db.models import (
    ApiKey,
    ColdSegment,
    ColdStoreKey,
    Stream,
    UnlockApproval,
    UnlockRequest,
    Window,
)
from service.errors import Conflict, Forbidden, NotFound, ServiceError, Unavailable, ValidationError
from service.streams import repository as streams_repository
from service.vault import Grant, Share


async def _refuse(
    ctx: AppContext, who: Principal, rid: str, err: ServiceError, **extra: str
) -> ServiceError:
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="unlock.refused",
        target=f"unlock:{rid}",
        detail={"status": err.status_code, "reason": err.detail, **extra},
    )
    return err


def _actor(who: Principal) -> str:
    return who.actor or who.key_id


async def _actors(session: AsyncSession, key_ids: list[str]) -> dict[str, str]:
    """The actor of each key (a key not found is an actor of its own, its id)."""
    rows = await session.execute(select(ApiKey.id, ApiKey.actor).where(ApiKey.id.in_(key_ids)))
    found = {kid: actor for kid, actor in rows}
    return {k: found.get(k) or k for k in key_ids}


class SelfApproval(Forbidden):
    """Break glass separates the requester from the approvers: no key of the requester's
    actor approves its request."""


async def _out(
    session: AsyncSession, r: UnlockRequest, note: str | None = None
) -> UnlockRequestOut:
    stream = await session.get(Stream, r.stream_id)
    key = await session.get(ColdStoreKey, r.key_id)
    n = await session.scalar(
        select(func.count()).select_from(UnlockApproval).where(UnlockApproval.request_id == r.id)
    )
    assert stream is not None and key is not None
    return UnlockRequestOut(
        id=r.id,
        stream=stream.name,
        status=r.status,  # type: ignore[arg-type]
        requested_by=r.requested_by,
        requester_actor=(await _actors(session, [r.requested_by]))[r.requested_by],
        justification=r.justification,
        from_window=r.from_epoch,
        to_window=r.to_epoch,
        from_time=r.from_ts,
        to_time=r.to_ts,
        ttl_seconds=r.ttl_seconds,
        key_id=r.key_id,
        threshold=key.threshold,
        approvals=int(n or 0),
        created_at=r.created_at,
        granted_at=r.granted_at,
        expires_at=r.expires_at,
        closed_at=r.closed_at,
        note=note,
    )


async def current_epoch(ctx: AppContext, session: AsyncSession, stream: Stream) -> int:
    """The stream's current (open) window: its hot store's epoch, else its newest SQL window."""
    epoch = await ctx.stores.windows.epoch(stream.name)
    if epoch is None:
        epoch = await session.scalar(
            select(func.max(Window.epoch)).where(Window.stream_id == stream.id)
        )
    return int(epoch or 0)


async def create_request(
    *, ctx: AppContext, who: Principal, body: UnlockRequestIn
) -> UnlockRequestOut:
    """A request for windows beyond the stream's current one (which hold nothing and would
    later open onto data nobody approved) or for a time range ending in the future is
    refused."""
    async with ctx.sessionmaker() as session, session.begin():
        stream = await streams_repository.get_by_name(session, body.stream)  # ready ones
        if stream is None:
            raise NotFound(f"stream {body.stream!r} not found")
        if body.to_window is not None:
            epoch = await current_epoch(ctx, session, stream)
            if body.to_window > epoch:
                field = "from_window" if body.from_window > epoch else "to_window"  # type: ignore[operator]
                raise ValidationError(
                    f"{field}: window {getattr(body, field)} does not exist yet; the stream's "
                    f"current window is {epoch} (request windows 1..{epoch})"
                )
        if body.to_time is not None and body.to_time > datetime.now(UTC) + FUTURE_SKEW:
            raise ValidationError(
                "to_time: is in the future; a request may only cover data that exists (up to now)"
            )
        key = await active_key(session)
        if key is None:
            raise Unavailable("no cold-store key: run `selectivity admin init-coldstore` first")
        r = UnlockRequest(
            id=secrets.token_hex(8),
            stream_id=stream.id,
            requested_by=who.key_id,
            justification=body.justification,
            from_epoch=body.from_window,
            to_epoch=body.to_window,
            from_ts=body.from_time,
            to_ts=body.to_time,
            key_id=key.id,
            ttl_seconds=body.ttl_seconds,
            status="pending",
        )
        session.add(r)
        await session.flush()
        out = await _out(session, r)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="unlock.request",
        target=f"unlock:{r.id}",
        detail={
            "stream": body.stream,
            "windows": [body.from_window, body.to_window],
            "times": [
                body.from_time.isoformat() if body.from_time else None,
                body.to_time.isoformat() if body.to_time else None,
            ],
            "ttl_seconds": body.ttl_seconds,
            # the request's text is the analyst's, and may quote data: it stays with the
            # request (``unlock_request``), the audit log (kept for good) has its length only
            "justification_chars": len(body.justification),
        },
    )
    return out


FUTURE_SKEW = timedelta(minutes=5)  # clock skew allowed on to_time


async def list_requests(
    *,
    ctx: AppContext,
    status: UnlockStatus | None,
    limit: int,
    before: str | None,
    requested_by: str | None = None,
) -> UnlockRequestPage:
    """Newest first; ``before`` is the last id of the previous page. ``closed`` also lists
    expired requests. ``requested_by``: only the requests that key filed."""
    q = select(UnlockRequest)
    if requested_by is not None:
        q = q.where(UnlockRequest.requested_by == requested_by)
    if status == "closed":
        q = q.where(UnlockRequest.status.in_(("closed", "expired")))
    elif status is not None:
        q = q.where(UnlockRequest.status == status)
    async with ctx.sessionmaker() as session:
        if before is not None:
            anchor = await session.get(UnlockRequest, before)
            if anchor is None:
                raise ValidationError(f"before: unlock request {before!r} not found")
            q = q.where(
                (UnlockRequest.created_at < anchor.created_at)
                | ((UnlockRequest.created_at == anchor.created_at) & (UnlockRequest.id < anchor.id))
            )
        found = list(
            await session.scalars(
                q.order_by(UnlockRequest.created_at.desc(), UnlockRequest.id.desc()).limit(
                    limit + 1
                )
            )
        )
        page = [await _out(session, r) for r in found[:limit]]
    return UnlockRequestPage(requests=page, next_before=page[-1].id if len(found) > limit else None)


async def _load(session: AsyncSession, rid: str, *, for_update: bool = False) -> UnlockRequest:
    r = await session.get(UnlockRequest, rid, with_for_update=for_update)
    if r is None:
        raise NotFound(f"unlock request {rid!r} not found")
    return r


async def _expire_if_due(ctx: AppContext, session: AsyncSession, r: UnlockRequest) -> bool:
    if r.status == "granted" and r.expires_at is not None and r.expires_at <= datetime.now(UTC):
        r.status, r.closed_at = "expired", datetime.now(UTC)
        ctx.vault.wipe(r.id)
        return True
    return False


async def _expire_shares(
    ctx: AppContext, session: AsyncSession, r: UnlockRequest, now: datetime
) -> int:
    """A pending request's shares are held ``unlock_share_ttl_seconds`` after submission: older
    approvals are withdrawn in SQL and their shares wiped from this process's memory. Returns
    how many were withdrawn."""
    if r.status != "pending":
        return 0
    ctx.vault.drop_expired_shares(now, r.id)
    cutoff = now - timedelta(seconds=ctx.settings.unlock_share_ttl_seconds)
    old = list(
        await session.scalars(
            select(UnlockApproval.admin_key_id).where(
                UnlockApproval.request_id == r.id, UnlockApproval.created_at <= cutoff
            )
        )
    )
    if old:
        await session.execute(
            delete(UnlockApproval).where(
                UnlockApproval.request_id == r.id, UnlockApproval.admin_key_id.in_(old)
            )
        )
        for admin in old:
            ctx.vault.drop_share(r.id, admin)
    return len(old)


async def _record_expired_shares(ctx: AppContext, rid: str, n: int) -> None:
    if n:
        await audit.record(
            ctx.sessionmaker,
            actor="system",
            action="unlock.shares_expired",
            target=f"unlock:{rid}",
            detail={"approvals_withdrawn": n, "ttl_seconds": ctx.settings.unlock_share_ttl_seconds},
        )


async def get(*, ctx: AppContext, who: Principal, rid: str) -> UnlockRequestOut:
    expired = False
    async with ctx.vault.lock(rid), ctx.sessionmaker() as session, session.begin():
        r = await _load(session, rid, for_update=True)
        if who.role != "admin" and r.requested_by != who.key_id:
            raise Forbidden("only the requesting analyst or an admin may read this request")
        expired = await _expire_if_due(ctx, session, r)
        withdrawn = await _expire_shares(ctx, session, r, datetime.now(UTC))
        await session.flush()
        out = await _out(session, r)
    await _record_expired_shares(ctx, rid, withdrawn)
    if expired:
        await audit.record(
            ctx.sessionmaker, actor="system", action="unlock.expired", target=f"unlock:{rid}"
        )
    return out


async def approve(*, ctx: AppContext, who: Principal, rid: str, share: str) -> UnlockRequestOut:
    """One admin's approval with their share. At the key's threshold of distinct actors the
    key is reconstructed, checked, and the grant opens (once: approvals are applied one at a
    time, under the request's lock in this process and its SQL row lock). No key of the
    requester's actor approves (403)."""
    vault = ctx.vault
    try:
        crypto.check_share(share)
    except crypto.ShareError as exc:
        raise await _refuse(ctx, who, rid, ValidationError(f"share: {exc}")) from None
    async with vault.lock(rid):
        return await _approve(ctx=ctx, who=who, rid=rid, share=share)


async def _approve(*, ctx: AppContext, who: Principal, rid: str, share: str) -> UnlockRequestOut:
    vault = ctx.vault
    note = None
    granted = False
    failure: ServiceError | None = None
    rule: dict[str, str] = {}
    withdrawn = 0
    ttl = ctx.settings.unlock_share_ttl_seconds
    added: Share | None = None
    try:
        async with ctx.sessionmaker() as session, session.begin():
            r = await _load(session, rid, for_update=True)
            now = datetime.now(UTC)
            mine = _actor(who)
            requester = (await _actors(session, [r.requested_by]))[r.requested_by]
            if await _expire_if_due(ctx, session, r) or r.status != "pending":
                failure = Conflict(f"unlock request {rid} is {r.status}; approvals are closed")
            elif who.key_id == r.requested_by:
                failure = SelfApproval(
                    "the requester cannot approve its own request: break glass separates the "
                    "requester from the approvers; other admins must approve it"
                )
                rule = {"rule": "separation_of_duties", "refused": "requester"}
            elif mine == requester:
                failure = SelfApproval(
                    f"this key belongs to actor {mine!r}, who filed this request with another "
                    "key: break glass separates the requester from the approvers; other admins "
                    "must approve it"
                )
                rule = {"rule": "separation_of_duties", "refused": "requester_actor"}
            else:
                key = await session.get(ColdStoreKey, r.key_id)
                assert key is not None
                withdrawn = await _expire_shares(ctx, session, r, now)
                approved = list(
                    await session.scalars(
                        select(UnlockApproval.admin_key_id).where(UnlockApproval.request_id == rid)
                    )
                )
                for admin in [a for a in vault.pending.get(rid, {}) if a not in approved]:
                    vault.drop_share(rid, admin)  # withdrawn by another process (the expiry job)
                held = vault.pending.setdefault(rid, {})
                lost = [a for a in approved if a not in held]
                if lost:  # approvals whose shares this process no longer holds (a restart)
                    await session.execute(
                        delete(UnlockApproval).where(
                            UnlockApproval.request_id == rid, UnlockApproval.admin_key_id.in_(lost)
                        )
                    )
                    note = (
                        f"{len(lost)} earlier approval(s) were lost with a restart "
                        "and must be resubmitted"
                    )
                if withdrawn:
                    note = (note + "; " if note else "") + (
                        f"{withdrawn} earlier approval(s) expired (shares are held {ttl} s) "
                        "and must be resubmitted"
                    )
                index = crypto.check_share(share)[1]
                by_actor = await _actors(session, list(held))
                if who.key_id in held:
                    failure = Conflict("this admin key has already approved this request")
                elif mine in by_actor.values():
                    failure = Conflict(
                        f"actor {mine!r} has already approved this request with another key; "
                        "approvals count once per actor"
                    )
                elif any(crypto.check_share(s.value)[1] == index for s in held.values() if s.value):
                    failure = Conflict("this share was already submitted by another admin")
                else:
                    sh = Share(share, now + timedelta(seconds=ttl))
                    # the share leaves memory at its expiry even if nobody calls
                    sh.timer = asyncio.get_running_loop().call_later(
                        ttl, vault.drop_share, rid, who.key_id, sh
                    )
                    held[who.key_id] = added = sh
                    session.add(
                        UnlockApproval(request_id=rid, admin_key_id=who.key_id, created_at=now)
                    )
                    if len(held) >= key.threshold:
                        try:
                            sk = crypto.combine(
                                [s.value for s in held.values() if s.value],
                                public_key=key.public_key,
                                tag=key.verification_tag,
                            )
                        except crypto.ShareError as exc:
                            # start over: no partial set survives a failed reconstruction
                            vault.clear_pending(rid)
                            await session.execute(
                                delete(UnlockApproval).where(UnlockApproval.request_id == rid)
                            )
                            await session.flush()
                            note = f"reconstruction failed ({exc}); all approvals were reset"
                            failure = ValidationError(
                                f"share: {exc}; the request's approvals were reset, resubmit shares"
                            )
                        else:
                            vault.clear_pending(rid)
                            now = datetime.now(UTC)
                            r.status, r.granted_at = "granted", now
                            r.expires_at = now + timedelta(seconds=r.ttl_seconds)
                            vault.grants[rid] = Grant(sk, r.expires_at)
                            granted = True
            await session.flush()
            out = await _out(session, r, note)
    except BaseException:
        # the transaction did not commit: memory forgets what SQL does not record
        if granted:
            vault.wipe(rid)
        elif added is not None:
            vault.drop_share(rid, who.key_id, added)
        raise
    await _record_expired_shares(ctx, rid, withdrawn)
    if failure is not None:
        raise await _refuse(ctx, who, rid, failure, **rule)
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="unlock.approve",
        target=f"unlock:{rid}",
        detail={"approvals": out.approvals, "threshold": out.threshold},
    )
    if granted:
        await audit.record(
            ctx.sessionmaker,
            actor="system",
            action="unlock.grant",
            target=f"unlock:{rid}",
            detail={"expires_at": out.expires_at.isoformat() if out.expires_at else None},
        )
        # the key leaves memory at expiry even if nobody calls (SQL catches up by the cron job)
        grant = vault.grants.get(rid)
        if grant is not None:
            grant.timer = asyncio.get_running_loop().call_later(out.ttl_seconds, vault.wipe, rid)
    return out


async def expire_grants(*, ctx: AppContext) -> int:
    """Close every grant past its expiry (and wipe any key this process holds for it), and
    withdraw every approval of a pending request older than ``unlock_share_ttl_seconds`` (and
    wipe any such share this process holds: in embedded mode the job runs in the API process;
    elsewhere the API process's own timers wipe them). Returns the grants closed."""
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=ctx.settings.unlock_share_ttl_seconds)
    async with ctx.sessionmaker() as session, session.begin():
        due = list(
            await session.scalars(
                select(UnlockRequest).where(
                    UnlockRequest.status == "granted", UnlockRequest.expires_at <= now
                )
            )
        )
        for r in due:
            r.status, r.closed_at = "expired", now
        stale = list(
            (
                await session.execute(
                    select(UnlockApproval.id, UnlockApproval.request_id)
                    .join(UnlockRequest, UnlockRequest.id == UnlockApproval.request_id)
                    .where(UnlockRequest.status == "pending", UnlockApproval.created_at <= cutoff)
                )
            ).all()
        )
        if stale:
            await session.execute(
                delete(UnlockApproval).where(UnlockApproval.id.in_([a.id for a in stale]))
            )
    vault = ctx.vault
    for rid, grant in list(vault.grants.items()):
        if grant.expires_at <= now:
            vault.wipe(rid)
    vault.drop_expired_shares(now)
    for r in due:
        await audit.record(
            ctx.sessionmaker, actor="system", action="unlock.expired", target=f"unlock:{r.id}"
        )
    withdrawn: dict[str, int] = {}
    for a in stale:
        withdrawn[a.request_id] = withdrawn.get(a.request_id, 0) + 1
    for rid, n in withdrawn.items():
        await _record_expired_shares(ctx, rid, n)
    return len(due)


async def close(*, ctx: AppContext, who: Principal, rid: str) -> UnlockRequestOut:
    async with ctx.vault.lock(rid), ctx.sessionmaker() as session, session.begin():
        r = await _load(session, rid, for_update=True)
        if who.role != "admin" and r.requested_by != who.key_id:
            raise Forbidden("only the requesting analyst or an admin may close this request")
        if r.status in ("pending", "granted"):
            r.status, r.closed_at = "closed", datetime.now(UTC)
        ctx.vault.wipe(rid)
        out = await _out(session, r)
    await audit.record(
        ctx.sessionmaker, actor=who.key_id, action="unlock.close", target=f"unlock:{rid}"
    )
    return out


# -- export -------------------------------------------------------------------------------

ARROW_SCHEMA = pa.schema(
    [
        ("window", pa.int32()),
        ("entry_id", pa.string()),
        ("part", pa.int32()),  # the window's part (entry ids are unique within a part)
        ("observation", pa.string()),  # the observation as ingested, JSON
        ("segment", pa.string()),
        ("error", pa.string()),  # set on rows that report a segment failing its checks
    ]
)


async def export(
    *,
    ctx: AppContext,
    who: Principal,
    rid: str,
    fmt: ExportFormat,
    from_window: int | None,
    to_window: int | None,
    from_time: datetime | None,
    to_time: datetime | None,
) -> AsyncIterator[bytes]:
    """Checks first (raising before any byte is sent), then an async byte stream."""
    try:
        async with ctx.sessionmaker() as session, session.begin():
            r = await _load(session, rid, for_update=True)
            if r.requested_by != who.key_id:
                raise Forbidden("only the analyst who filed the request may export under its grant")
            expired = await _expire_if_due(ctx, session, r)
            grant = ctx.vault.grants.get(rid)
            if expired or r.status != "granted":
                raise Conflict(f"no open grant: the request is {r.status}")
            if grant is None:
                raise Conflict(
                    "this API process does not hold the grant's key (it restarted or another "
                    "replica holds it); approve again"
                )
            lo_w, hi_w, lo_t, hi_t = _range(r, from_window, to_window, from_time, to_time)
            q = select(ColdSegment).where(ColdSegment.stream_id == r.stream_id)
            if lo_w is not None:
                q = q.where(ColdSegment.epoch >= lo_w, ColdSegment.epoch <= hi_w)
            if lo_t is not None:
                q = q.where(ColdSegment.last_ts >= lo_t, ColdSegment.first_ts <= hi_t)
            segments = list(await session.scalars(q.order_by(ColdSegment.epoch, ColdSegment.id)))
            for s in segments:
                session.expunge(s)
            wq = select(
                Window.epoch, Window.state, Window.cold_sealed_at, Window.cold_deleted_at
            ).where(Window.stream_id == r.stream_id)
            if lo_w is not None:
                wq = wq.where(Window.epoch >= lo_w, Window.epoch <= hi_w)
            if lo_t is not None:
                wq = wq.where(
                    Window.opened_at <= hi_t,
                    Window.closed_at.is_(None) | (Window.closed_at >= lo_t),
                )
            windows = list((await session.execute(wq.order_by(Window.epoch))).all())
    except ServiceError as exc:
        if isinstance(exc, NotFound):
            raise
        raise await _refuse(ctx, who, rid, exc) from None
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="unlock.export",
        target=f"unlock:{rid}",
        detail={
            "format": fmt,
            "windows": [lo_w, hi_w],
            "times": [lo_t.isoformat() if lo_t else None, hi_t.isoformat() if hi_t else None],
            "segments": len(segments),
        },
    )
    sealed = [
        w.epoch for w in windows if w.cold_sealed_at is not None and w.cold_deleted_at is None
    ]
    deleted = [w.epoch for w in windows if w.cold_deleted_at is not None]
    not_sealed = [
        {
            "window": w.epoch,
            "state": w.state,
            "note": "not (yet) sealed into the cold store: its rows are not in this export"
            if w.state == "open"
            else "closed but not yet sealed and verified: its rows are not (all) in this export",
        }
        for w in windows
        if w.cold_sealed_at is None
    ]
    manifest = Manifest(sealed, not_sealed, deleted)
    return _stream(ctx, who, rid, grant, segments, fmt, lo_t, hi_t, manifest)


@dataclass
class Manifest:
    """The export's last record: rows per window, counted from the decrypted segments (SQL
    keeps no row count past the hot period), the windows of the range not (yet) sealed, and
    those whose segments the stream's cold retention deleted."""

    sealed: list[int]
    not_sealed: list[dict[str, Any]]
    deleted: list[int] = field(default_factory=list)
    rows: dict[int, int] = field(default_factory=dict)
    failed_segments: int = 0
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        windows = sorted(set(self.sealed) | set(self.rows))
        return {
            "rows_per_window": [{"window": w, "rows": self.rows.get(w, 0)} for w in windows],
            "rows": sum(self.rows.values()),
            "not_sealed": self.not_sealed,
            "deleted_by_retention": self.deleted,
            "failed_segments": self.failed_segments,
            "complete": self.complete,
        }


def _range(
    r: UnlockRequest,
    from_window: int | None,
    to_window: int | None,
    from_time: datetime | None,
    to_time: datetime | None,
) -> tuple[int | None, int | None, datetime | None, datetime | None]:
    """The export's range: the request's, or a part of it; anything outside is refused."""
    if r.from_epoch is not None:
        if from_time is not None or to_time is not None:
            raise ValidationError("this request is by windows: use from_window and to_window")
        assert r.to_epoch is not None
        lo = r.from_epoch if from_window is None else from_window
        hi = r.to_epoch if to_window is None else to_window
        if lo < r.from_epoch or hi > r.to_epoch or lo > hi:
            raise Forbidden(
                f"windows {lo}..{hi} are outside the request's windows {r.from_epoch}..{r.to_epoch}"
            )
        return lo, hi, None, None
    if from_window is not None or to_window is not None:
        raise ValidationError("this request is by time: use from_time and to_time")
    assert r.from_ts is not None and r.to_ts is not None
    lo_t = r.from_ts if from_time is None else from_time
    hi_t = r.to_ts if to_time is None else to_time
    if lo_t.tzinfo is None or hi_t.tzinfo is None:
        raise ValidationError("from_time and to_time need a time zone (e.g. 'Z')")
    if lo_t < r.from_ts or hi_t > r.to_ts or lo_t > hi_t:
        raise Forbidden(
            f"{lo_t.isoformat()}..{hi_t.isoformat()} is outside the request's time range"
        )
    return None, None, lo_t, hi_t


def _in_time(entry_id: str, lo: datetime | None, hi: datetime | None) -> bool:
    if lo is None or hi is None:
        return True
    ts = datetime.fromtimestamp(int(entry_id.split("-")[0]) / 1000, UTC)
    return lo <= ts <= hi


async def _stream(
    ctx: AppContext,
    who: Principal,
    rid: str,
    grant: Grant,
    segments: list[ColdSegment],
    fmt: ExportFormat,
    lo_t: datetime | None,
    hi_t: datetime | None,
    manifest: Manifest,
) -> AsyncIterator[bytes]:
    if fmt == "arrow":
        sink = io.BytesIO()
        writer = pa.ipc.new_stream(sink, ARROW_SCHEMA)
        yield _drain(sink)
    for seg in segments:
        if grant.private_key is None or grant.expires_at <= datetime.now(UTC):
            manifest.complete = False
            break  # the grant ended during the export
        items = await asyncio.to_thread(_read_all, seg, grant.private_key)
        items = [i for i in items if i.error is not None or _in_time(i.entry_id or "", lo_t, hi_t)]
        for i in items:
            if i.error is None:
                manifest.rows[i.window] = manifest.rows.get(i.window, 0) + 1
            else:
                manifest.failed_segments += 1
                await audit.record(
                    ctx.sessionmaker,
                    actor=who.key_id,
                    action="coldstore.segment_failed",
                    target=f"unlock:{rid}",
                    detail={"segment": i.segment, "window": i.window, "reason": i.error},
                )
        if fmt == "ndjson":
            yield b"".join(orjson.dumps(_as_dict(i)) + b"\n" for i in items)
        else:
            cols: dict[str, list[Any]] = {n: [] for n in ARROW_SCHEMA.names}
            for i in items:
                d = _as_dict(i)
                cols["window"].append(i.window)
                cols["entry_id"].append(i.entry_id)
                cols["part"].append(i.part if i.error is None else None)
                cols["observation"].append(
                    orjson.dumps(d["observation"]).decode() if i.row is not None else None
                )
                cols["segment"].append(i.segment)
                cols["error"].append(i.error)
            writer.write_batch(pa.record_batch(cols, schema=ARROW_SCHEMA))
            yield _drain(sink)
    summary = orjson.dumps({"manifest": manifest.as_dict()})
    if fmt == "ndjson":
        yield summary + b"\n"
    else:  # an empty last batch carries the manifest in its custom metadata
        empty = pa.record_batch({n: [] for n in ARROW_SCHEMA.names}, schema=ARROW_SCHEMA)
        writer.write_batch(empty, custom_metadata={b"manifest": summary})
        writer.close()
        yield _drain(sink)


def _read_all(seg: ColdSegment, private_key: Any) -> list[ExportItem]:
    return list(read_segment(seg, private_key))


def _as_dict(i: ExportItem) -> dict[str, Any]:
    if i.error is not None:
        return {"window": i.window, "segment": i.segment, "error": i.error}
    row = i.row or {}
    return {
        "window": i.window,
        "entry_id": i.entry_id,
        **({"part": i.part} if i.part else {}),  # a window of several parts (partitions)
        "observation": {
            "id": row.get("id"),
            "features": row.get("f"),
            "label": row.get("y"),
            "event_time": row.get("t"),
        },
    }


def _drain(buf: io.BytesIO) -> bytes:
    data = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    return data

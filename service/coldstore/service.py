"""The cold store (docs/ARCHITECTURE.md, "Cold store and break-glass unlock"): its keys, the
``seal`` job, and reading segments back.

Sealing moves each window's hot-stream entries, in order, into segment files of at most
``segment_entries`` entries, sealed to the newest active cold-store key. After each segment is
written (atomically) and indexed, the window's ``seal_cursor`` (the last sealed entry id) moves
on in the same transaction as the index row (a window of several parts is sealed part by part,
each segment naming its part; part p ≥ 1's cursor is its last segment's last entry), so a crash
at any line leaves either nothing or a complete, indexed segment; a rerun resumes after the
cursor and removes a file the index does not know. The open window is sealed in full segments
only; once a window is closed (its Redis meta says so and its SQL row has ``closed_at``), the
rest is sealed, every segment of the window is read back and checked against its SHA-256 and the
entry count against the hot stream, and ``cold_sealed_at`` is set: only then may ``expire``
delete the window's hot data.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.audit import service as audit
from service.coldstore import crypto, files
from service.context import AppContext
from service.db.models import ColdSegment, ColdStoreKey, Stream, Window
from service.lifecycle.expire import expire
from service.streams import service as streams
from service.streams.lock import stream_lock

log = logging.getLogger("selectivity.coldstore")

SEGMENT_ENTRIES = 5000
# Windows one run of the retention deletes at most (the seal job runs every scheduler tick: a
# first run over a long history goes on at the next ticks), so one run's work and its audit
# entry stay bounded.
RETENTION_WINDOWS_PER_RUN = 1000


# -- keys ---------------------------------------------------------------------------------


async def active_key(session: AsyncSession) -> ColdStoreKey | None:
    return await session.scalar(
        select(ColdStoreKey)
        .where(ColdStoreKey.retired_at.is_(None))
        .order_by(ColdStoreKey.id.desc())
        .limit(1)
    )


async def init_key(
    *,
    sessionmaker: async_sessionmaker[AsyncSession],
    shares: int,
    threshold: int,
    actor: str,
    rotate: bool = False,
) -> tuple[ColdStoreKey, list[str]]:
    """Create the cold-store key (or, with ``rotate``, a new one: older keys are retired but
    keep opening the segments sealed to them). Returns the row and the shares, shown once."""
    new = crypto.generate_key(shares=shares, threshold=threshold)
    async with sessionmaker() as session, session.begin():
        current = await active_key(session)
        if current is not None and not rotate:
            raise KeyExists(current.id)
        now = datetime.now(UTC)
        if current is not None:
            current.retired_at = now
        row = ColdStoreKey(
            public_key=new.public_key,
            verification_tag=new.verification_tag,
            shares=shares,
            threshold=threshold,
            created_at=now,
        )
        session.add(row)
        await session.flush()
    await audit.record(
        sessionmaker,
        actor=actor,
        action="coldstore.rotate_key" if current is not None else "coldstore.init_key",
        target=f"key:{row.id}",
        detail={"shares": shares, "threshold": threshold},
    )
    return row, new.shares


class KeyExists(Exception):
    def __init__(self, key_id: int) -> None:
        super().__init__(f"a cold-store key already exists (id {key_id}); use rotation")
        self.key_id = key_id


class SharesFileError(Exception):
    """SELECTIVITY_COLDSTORE_SHARES_FILE cannot take a new key's shares (checked before the
    key is made)."""


def check_shares_file(path: Path) -> None:
    """The shares file must be new (it may hold an earlier key's shares: never overwritten)
    and its directory must exist."""
    if path.exists():
        raise SharesFileError(
            f"SELECTIVITY_COLDSTORE_SHARES_FILE {path} already exists; it may hold the shares "
            "of an earlier key: move it away or name a new file"
        )
    if not path.parent.is_dir():
        raise SharesFileError(
            f"SELECTIVITY_COLDSTORE_SHARES_FILE {path}: directory {path.parent} does not exist"
        )


def write_shares_file(path: Path, key_id: int, threshold: int, shares: list[str]) -> None:
    """The shares in a new file (mode 0600 whatever the umask; ``O_EXCL``: never overwrites)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f"# selectivity cold-store key {key_id}: {len(shares)} SLIP-39 shares, any "
            f"{threshold} open the cold store. Give each to a different admin, keep them "
            "OFFLINE, then delete this file.\n"
        )
        for i, share in enumerate(shares, 1):
            f.write(f"share {i}: {share}\n")
        f.flush()
        os.fsync(f.fileno())


def shares_banner(key_id: int, threshold: int, shares: list[str]) -> str:
    """The console banner of embedded mode's first start (as a development server prints its
    unseal key): the only place the shares ever appear."""
    rule = "=" * 78
    lines = [
        rule,
        f"COLD-STORE KEY {key_id} CREATED: {len(shares)} SLIP-39 shares, any {threshold} "
        "open the cold store.",
        "They are shown ONCE, here, and stored nowhere: the service keeps only the public key.",
        "Copy each share now and give it to a different admin, to keep OFFLINE. Anyone",
        f"holding {threshold} can decrypt every sealed observation. Without them, nothing can",
        "be unlocked: there is no recovery.",
        "",
        *(f"share {i}: {share}" for i, share in enumerate(shares, 1)),
        rule,
    ]
    return "\n".join(lines)


# -- sealing ------------------------------------------------------------------------------


@dataclass
class SealStats:
    segments: int = 0
    entries: int = 0
    bytes: int = 0
    windows_sealed: int = 0
    problems: int = 0
    windows_deleted: int = 0  # their segments, by the stream's cold_retention_windows


def _ts(entry_id: bytes) -> datetime:
    return datetime.fromtimestamp(int(entry_id.split(b"-")[0]) / 1000, UTC)


async def seal_stream(
    *, ctx: AppContext, name: str, segment_entries: int = SEGMENT_ENTRIES
) -> SealStats:
    """Seal what can be sealed of one stream, then let ``expire`` delete what left the hot
    period. Safe to run twice and concurrently with ingest; serialised with rolls."""
    stats = SealStats()
    store = ctx.stores.windows
    root = ctx.settings.resolved_coldstore_dir
    async with ctx.sessionmaker() as session:
        key = await active_key(session)
        stream = await session.scalar(select(Stream).where(Stream.name == name))
        if key is None or stream is None:
            return stats
        todo = list(
            await session.scalars(
                select(Window)
                .where(
                    Window.stream_id == stream.id,
                    Window.cold_sealed_at.is_(None),
                    Window.hot_deleted_at.is_(None),
                )
                .order_by(Window.epoch)
            )
        )
        key_id, public_key, stream_id = key.id, key.public_key, stream.id
        stream_parts = stream.config.get("partitions", 1)
        keep = stream.config.get("cold_retention_windows")
    days = ctx.settings.cold_retention_days
    parts = int(stream_parts)
    for w, p in ((w, p) for w in todo for p in range(parts)):
        closed = w.closed_at is not None
        cursor = w.seal_cursor if p == 0 else await _part_cursor(ctx, w, p)
        while True:
            start = f"({cursor}" if cursor else "-"
            entries = await store.hot_range(name, w.epoch, start, "+", segment_entries, p)
            if not entries or (not closed and len(entries) < segment_entries):
                break
            rows = []
            for eid, fields in entries:
                row = fields.get(b"d")
                if row is None:
                    raise RuntimeError(f"hot entry {eid.decode()} has no d field")
                rows.append((eid, row))
            first, last = rows[0][0].decode(), rows[-1][0].decode()
            async with ctx.sessionmaker() as session, session.begin():
                indexed = list(
                    await session.scalars(
                        select(ColdSegment).where(
                            ColdSegment.stream_id == stream_id, ColdSegment.epoch == w.epoch
                        )
                    )
                )
                if any(s.first_id == first and s.part == p for s in indexed):
                    # another sealer got here first
                    cursor = (
                        await session.scalar(select(Window.seal_cursor).where(Window.id == w.id))
                        if p == 0
                        else await _part_cursor(ctx, w, p)
                    )
                    continue
                seq = len(indexed) + 1
                header = {  # first, last and count are sealed inside (crypto.seal)
                    "stream": name,
                    "stream_id": stream_id,
                    "window": w.epoch,
                    "seq": seq,
                    "first": first,
                    "last": last,
                    "count": len(rows),
                    "key_id": key_id,
                    **({"part": p} if p else {}),
                }
                data = await asyncio.to_thread(crypto.seal, header, rows, public_key)
                path = files.segment_path(root, stream_id, w.epoch, seq)
                await asyncio.to_thread(
                    files.remove_unindexed, root, stream_id, w.epoch, {s.path for s in indexed}
                )
                await asyncio.to_thread(files.write_atomic, path, data)
                session.add(
                    ColdSegment(
                        stream_id=stream_id,
                        epoch=w.epoch,
                        part=p,
                        first_id=first,
                        last_id=last,
                        count=len(rows),
                        path=str(path),
                        size=len(data),
                        sha256=hashlib.sha256(data).digest(),
                        key_id=key_id,
                        first_ts=_ts(rows[0][0]),
                        last_ts=_ts(rows[-1][0]),
                    )
                )
                if p == 0:  # part p ≥ 1's cursor: its last segment's last entry
                    row = await session.get(Window, w.id, with_for_update=True)
                    assert row is not None
                    row.seal_cursor = last
            cursor = last
            stats.segments += 1
            stats.entries += len(rows)
            stats.bytes += len(data)
        if closed and p == parts - 1:  # every part sealed: the window's check
            if await _verify_window(ctx=ctx, name=name, stream_id=stream_id, window=w, parts=parts):
                stats.windows_sealed += 1
            else:
                stats.problems += 1
    if stats.windows_sealed:
        rt = await streams.runtime(ctx=ctx, name=name)
        async with stream_lock(ctx, name):
            epoch = await store.epoch(name)
            if epoch is not None:
                await expire(ctx=ctx, rt=rt, epoch=epoch)
    if keep is not None or days is not None:
        stats.windows_deleted = await apply_retention(
            ctx=ctx,
            name=name,
            stream_id=stream_id,
            keep=None if keep is None else int(keep),
            closed_before=None if days is None else datetime.now(UTC) - timedelta(days=days),
        )
    return stats


async def apply_retention(
    *,
    ctx: AppContext,
    name: str,
    stream_id: int,
    keep: int | None,
    closed_before: datetime | None = None,
) -> int:
    """Delete the cold segments of the stream's windows older than ``keep`` windows (the
    stream's ``cold_retention_windows``; the open window is the first, as for
    ``hot_windows``: windows before ``epoch − keep + 1``) or closed before ``closed_before``
    (``SELECTIVITY_COLD_RETENTION_DAYS``), of those whose hot data is gone already
    (``hot_deleted_at``: the cold store holds their only raw copy). Per window, the files go
    first (``files.remove_window``), then the index rows, with ``cold_deleted_at`` set in the
    same transaction: a crash in between leaves rows naming missing files, which the next run
    deletes (an export under a grant meanwhile reports them as failed segments). Rows
    a window's deletion removes hold no raw data (a path, a size, a hash). Returns the windows
    deleted (at most ``RETENTION_WINDOWS_PER_RUN``, the oldest first); each run that deleted
    something is audited (``coldstore.retention``: how many, the first and last window)."""
    epoch = await ctx.stores.windows.epoch(name)
    old = []
    if keep is not None and epoch is not None:
        old.append(Window.epoch < epoch - keep + 1)
    if closed_before is not None:
        old.append(Window.closed_at < closed_before)
    if not old:
        return 0
    root = ctx.settings.resolved_coldstore_dir
    async with ctx.sessionmaker() as session:
        due = list(
            await session.scalars(
                select(Window)
                .where(
                    Window.stream_id == stream_id,
                    or_(*old),
                    Window.hot_deleted_at.is_not(None),
                    Window.cold_deleted_at.is_(None),
                )
                .order_by(Window.epoch)
                .limit(RETENTION_WINDOWS_PER_RUN)
            )
        )
    deleted: list[int] = []
    files_deleted = 0
    for w in due:
        async with ctx.sessionmaker() as session:
            paths = list(
                await session.scalars(
                    select(ColdSegment.path).where(
                        ColdSegment.stream_id == stream_id, ColdSegment.epoch == w.epoch
                    )
                )
            )
        files_deleted += await asyncio.to_thread(
            files.remove_window, root, stream_id, w.epoch, paths
        )
        async with ctx.sessionmaker() as session, session.begin():
            await session.execute(
                delete(ColdSegment).where(
                    ColdSegment.stream_id == stream_id, ColdSegment.epoch == w.epoch
                )
            )
            row = await session.get(Window, w.id, with_for_update=True)
            if row is not None and row.cold_deleted_at is None:
                row.cold_deleted_at = datetime.now(UTC)
        deleted.append(w.epoch)
    if deleted:
        await audit.record(
            ctx.sessionmaker,
            actor="service",
            action="coldstore.retention",
            target=f"stream:{name}",
            detail={
                "windows": len(deleted),
                "first_window": deleted[0],
                "last_window": deleted[-1],
                "files": files_deleted,
                "keep_windows": keep,
                "closed_before": None if closed_before is None else closed_before.isoformat(),
            },
        )
    return len(deleted)


async def _part_cursor(ctx: AppContext, w: Window, p: int) -> str | None:
    """Part ``p``'s seal cursor: the last entry of its last segment (None: none sealed)."""
    async with ctx.sessionmaker() as session:
        return await session.scalar(
            select(ColdSegment.last_id)
            .where(
                ColdSegment.stream_id == w.stream_id,
                ColdSegment.epoch == w.epoch,
                ColdSegment.part == p,
            )
            .order_by(ColdSegment.id.desc())
            .limit(1)
        )


async def _verify_window(
    *, ctx: AppContext, name: str, stream_id: int, window: Window, parts: int = 1
) -> bool:
    """Every segment of a closed window read back against its SHA-256, and the entries they
    hold against the hot streams' lengths (every part's); then ``cold_sealed_at``."""
    store = ctx.stores.windows
    async with ctx.sessionmaker() as session:
        segs = list(
            await session.scalars(
                select(ColdSegment).where(
                    ColdSegment.stream_id == stream_id, ColdSegment.epoch == window.epoch
                )
            )
        )
    total = 0
    for s in segs:
        try:
            data = await asyncio.to_thread(Path(s.path).read_bytes)
        except OSError:
            log.error("segment %s of %s/%d is missing", s.id, name, window.epoch)
            return False
        if hashlib.sha256(data).digest() != s.sha256:
            log.error("segment %s of %s/%d fails its SHA-256", s.id, name, window.epoch)
            return False
        if s.count is None:  # left the hot period: nothing left to check against
            return False
        total += s.count
    hot = await store.hot_length(name, window.epoch, parts=parts)
    if hot != total:
        log.error(
            "window %s/%d: %d entries sealed, %d in the hot stream", name, window.epoch, total, hot
        )
        return False
    async with ctx.sessionmaker() as session, session.begin():
        row = await session.get(Window, window.id, with_for_update=True)
        assert row is not None
        if row.cold_sealed_at is None:
            row.cold_sealed_at = datetime.now(UTC)
    return True


async def seal_all(*, ctx: AppContext) -> dict[str, int]:
    async with ctx.sessionmaker() as session:
        names = list(await session.scalars(select(Stream.name)))
    out = SealStats()
    for name in names:
        try:
            st = await seal_stream(ctx=ctx, name=name)
        except Exception as exc:  # one stream's failure must not stop the others
            log.error("sealing %s failed: %s", name, type(exc).__name__)
            out.problems += 1
            continue
        out.segments += st.segments
        out.entries += st.entries
        out.windows_sealed += st.windows_sealed
        out.problems += st.problems
        out.windows_deleted += st.windows_deleted
    return {
        "segments": out.segments,
        "entries": out.entries,
        "windows_sealed": out.windows_sealed,
        "problems": out.problems,
        "windows_deleted": out.windows_deleted,
    }


# -- reading back (under a grant) ---------------------------------------------------------


@dataclass(frozen=True)
class ExportItem:
    """One decrypted observation, or one segment that failed its checks."""

    window: int
    entry_id: str | None = None  # unique within the window's part
    part: int = 0
    row: dict[str, Any] | None = None
    segment: str | None = None
    error: str | None = None


def read_segment(seg: ColdSegment, private_key: Any) -> Iterator[ExportItem]:
    """Decrypt one indexed segment, checking the file's SHA-256 and that its (authenticated)
    header is the one the index expects; a failure is one error item, never an exception."""

    name = Path(seg.path).name
    try:
        data = Path(seg.path).read_bytes()
    except OSError as exc:
        yield ExportItem(seg.epoch, segment=name, error=f"unreadable: {type(exc).__name__}")
        return
    problems = []
    if hashlib.sha256(data).digest() != seg.sha256:
        problems.append("SHA-256 differs from the index (the file was changed)")
    try:
        header, rows = crypto.open_segment(data, private_key)
    except crypto.SegmentError as exc:
        yield ExportItem(seg.epoch, segment=name, error="; ".join([*problems, str(exc)]))
        return
    expected: dict[str, Any] = {"stream_id": seg.stream_id, "window": seg.epoch}
    if seg.part:
        expected["part"] = seg.part
    if header.get("v") != 1:
        expected["seq"] = files.seq_of(seg.path)
    # the index keeps the row statistics only during the hot period (expire drops them)
    for k, v in (("first", seg.first_id), ("last", seg.last_id), ("count", seg.count)):
        if v is not None:
            expected[k] = v
    wrong = [k for k, v in expected.items() if header.get(k) != v]
    if wrong:
        problems.append(f"header belongs to another segment (differs in {', '.join(wrong)})")
    if problems:
        yield ExportItem(seg.epoch, segment=name, error="; ".join(problems))
        return
    for eid, raw in rows:
        yield ExportItem(seg.epoch, entry_id=eid, row=orjson.loads(raw), part=seg.part)


async def init_embedded_key(ctx: AppContext) -> None:
    """Embedded mode's first start: a 3-share, threshold-2 key. Its shares are never stored
    where the service can read them (docs/PRIVACY.md,
    promise 3): they go to SELECTIVITY_COLDSTORE_SHARES_FILE when the operator names one
    (outside the data dir and the cold store, by ``Settings``; created 0600, never
    overwritten), else they are printed once on the console (stdout, not the log). Neither
    SQL, Redis, the data dir nor the log ever holds one. Raises ``SharesFileError`` (before
    any key is made) when the named file cannot take them."""
    async with ctx.sessionmaker() as session:
        if await active_key(session) is not None:
            return
    dest = ctx.settings.coldstore_shares_file
    if dest is not None:
        check_shares_file(dest)
    try:
        row, shares = await init_key(
            sessionmaker=ctx.sessionmaker, shares=3, threshold=2, actor="system"
        )
    except KeyExists:
        return
    if dest is not None:
        try:
            write_shares_file(dest, row.id, row.threshold, shares)
        except OSError as exc:  # lost shares would lock the cold store for good: print them
            log.error("could not write the shares file: %s", type(exc).__name__)
        else:
            log.warning(
                "created cold-store key %d (3 shares, threshold 2); its shares are in %s "
                "(0600). Give each to a different admin, to keep OFFLINE, then delete the file",
                row.id,
                dest,
            )
            return
    print(shares_banner(row.id, row.threshold, shares), file=sys.stdout, flush=True)
    log.warning(
        "created cold-store key %d (3 shares, threshold 2); its shares were printed above, "
        "once, and are stored nowhere",
        row.id,
    )


async def warn_without_key(ctx: AppContext) -> None:
    async with ctx.sessionmaker() as session:
        if await active_key(session) is None:
            log.warning(
                "no cold-store key: ingest refuses every batch (503) until one exists, since "
                "unsealed hot data could never be deleted. Run the key ceremony: "
                "`selectivity admin init-coldstore --shares N --threshold M`"
            )

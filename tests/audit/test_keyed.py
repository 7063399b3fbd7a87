"""The audit log is tamper-evident against whoever can write the database but holds neither the
audit key nor the cold-store volume (issue 12, item 13): the chain is keyed (HMAC-SHA256) and
its head, switch point and key id are anchored in a file outside the database.

Each test runs on a log of its own (a fresh SQLite file, or a fresh PostgreSQL schema on the
servers backend), and plays the attacker with its own code: plain SHA-256 as the service wrote
it before the key, computed here, not by the service."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from service.audit import anchor as audit_anchor
from service.audit import service as audit
from service.cli.coldstore import parse_head
from service.config import Settings
from service.db.migrate import alembic_config, upgrade
from service.db.models import AuditEntry
from service.db.session import make_engine, make_sessionmaker
from tests.conftest import Backend, pg_schema


@dataclass
class Log:
    settings: Settings
    sessionmaker: async_sessionmaker[AsyncSession]
    engine: AsyncEngine

    async def record(self, n: int, action: str = "test.step") -> list[int]:
        return [
            await audit.record(
                self.sessionmaker, actor="t", action=action, target=str(i), detail={"i": i}
            )
            for i in range(n)
        ]

    async def verify(self, expect_head: tuple[int, bytes] | None = None) -> audit.Verdict:
        async with self.sessionmaker() as s:
            return await audit.verify(s, expect_head=expect_head)

    async def entries(self) -> list[AuditEntry]:
        async with self.sessionmaker() as s:
            return list(await s.scalars(select(AuditEntry).order_by(AuditEntry.seq)))

    @property
    def anchor_file(self) -> Path:
        return self.settings.audit_anchor_file


def fresh_database(backend: Backend, tmp_path: Path, stack: ExitStack) -> str:
    """A database of this test's own (unmigrated): its URL."""
    if backend.settings.database_url:  # the servers backend: a schema of its own
        return stack.enter_context(pg_schema(f"seltest_audit_{secrets.token_hex(4)}"))
    return f"sqlite:///{tmp_path / 'audit.db'}"


@pytest.fixture
async def log(backend: Backend, tmp_path: Path) -> AsyncIterator[Log]:
    with ExitStack() as stack:
        url = fresh_database(backend, tmp_path, stack)
        settings = Settings(data_dir=tmp_path / "data", database_url=url)
        upgrade(url)
        engine = make_engine(url)
        try:
            yield Log(settings, make_sessionmaker(engine, settings), engine)
        finally:
            await engine.dispose()


def plain_sha256(prev: bytes, e: AuditEntry) -> bytes:
    """An entry's hash as the unkeyed chain computes it: what anyone can recompute."""
    body = orjson.dumps(
        {
            "seq": e.seq,
            "ts": e.ts.astimezone(UTC).isoformat(timespec="microseconds"),
            "actor": e.actor,
            "action": e.action,
            "target": e.target,
            "detail": e.detail,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(prev + body).digest()


async def rechain_plain(
    log: Log, from_seq: int, *, edit: dict[int, Any] | None = None, downgrade: bool = False
) -> None:
    """The attacker with database write access: edit details, then recompute the chain from
    ``from_seq`` on with plain SHA-256 (``downgrade``: and mark the entries plain)."""
    async with log.sessionmaker() as s, s.begin():
        rows = list(await s.scalars(select(AuditEntry).order_by(AuditEntry.seq)))
        prev = bytes(32)
        for e in rows:
            if e.seq >= from_seq:
                if edit and e.seq in edit:
                    e.detail = edit[e.seq]
                if downgrade:
                    e.key_version = 0
                e.prev_hash = prev
                e.hash = plain_sha256(prev, e)
            prev = e.hash


async def test_rewriting_an_entry_and_rechaining_with_plain_sha256_is_found(log: Log) -> None:
    seqs = await log.record(5)
    assert (await log.verify()).ok
    await rechain_plain(log, seqs[2], edit={seqs[2]: {"i": 99}})
    v = await log.verify()
    assert not v.ok and v.first_bad_seq == seqs[2] and "edited" in (v.problem or "")


async def test_rewriting_keyed_entries_as_plain_ones_is_found(log: Log) -> None:
    seqs = await log.record(4)
    await rechain_plain(log, seqs[1], edit={seqs[1]: {"i": 99}}, downgrade=True)
    v = await log.verify()
    assert not v.ok and v.first_bad_seq == seqs[1] and "plain" in (v.problem or "")
    # the whole keyed part rewritten as plain: only the anchored switch point tells
    await rechain_plain(log, 1, downgrade=True)
    v = await log.verify()
    assert not v.ok and "rewritten as plain" in (v.problem or "")
    assert v.first_bad_seq == audit_anchor.read_anchor(log.anchor_file).keyed_from  # type: ignore[union-attr]


async def test_a_truncated_log_is_found_against_the_anchor(log: Log) -> None:
    seqs = await log.record(5)
    async with log.sessionmaker() as s, s.begin():
        await s.execute(delete(AuditEntry).where(AuditEntry.seq >= seqs[3]))
    v = await log.verify()
    assert not v.ok and v.first_bad_seq == seqs[3] and "cut from the end" in (v.problem or "")
    # appends after the cut keep the evidence: the anchor does not move onto the new tail
    await log.record(4)
    v = await log.verify()
    assert not v.ok and v.first_bad_seq == seqs[4] and "differs" in (v.problem or "")


async def test_the_expected_head_is_checked_at_its_seq(log: Log) -> None:
    seqs = await log.record(3)
    head = (await log.entries())[-1]
    assert head.seq == seqs[-1]
    assert (await log.verify(expect_head=(head.seq, head.hash))).ok
    await log.record(3)  # the log grew since the head was noted: that entry is still checked
    assert (await log.verify(expect_head=(head.seq, head.hash))).ok
    wrong = bytes.fromhex("00" * 32)
    v = await log.verify(expect_head=(head.seq, wrong))
    assert not v.ok and v.first_bad_seq == head.seq and "noted" in (v.problem or "")
    v = await log.verify(expect_head=(seqs[-1] + 100, head.hash))
    assert not v.ok and "cut from the end" in (v.problem or "")


async def test_legacy_plain_entries_verify_and_become_protected_by_the_switch(log: Log) -> None:
    async with log.sessionmaker() as s, s.begin():  # three entries as the unkeyed service wrote
        prev = bytes(32)
        for seq in (1, 2, 3):
            e = AuditEntry(
                seq=seq,
                ts=datetime.now(UTC),
                actor="old",
                action="stream.create",
                target=f"stream:s{seq}",
                detail={"n": seq},
                prev_hash=prev,
            )
            e.hash = plain_sha256(prev, e)
            s.add(e)
            prev = e.hash
    v = await log.verify()
    assert v.ok and v.entries == 3 and v.keyed_from is None and v.anchor is None
    assert any("no anchor yet" in n for n in v.notes)

    [seq] = await log.record(1)
    entries = await log.entries()
    assert [e.key_version for e in entries] == [0, 0, 0, 1, 1] and seq == 5
    assert entries[3].action == "audit.keyed" and entries[3].detail["plain_entries"] == 3
    v = await log.verify()
    assert v.ok and v.keyed_from == 4 and v.anchor is not None and v.anchor.keyed_from == 4
    assert v.anchor.seq == 5 and v.anchor.hash == entries[4].hash

    # a legacy entry edited and re-chained with plain SHA-256: the first keyed entry's link
    # (under its HMAC) no longer matches
    await rechain_plain(log, 2, edit={2: {"n": 99}})
    v = await log.verify()
    assert not v.ok and v.first_bad_seq == 4


async def test_entries_written_before_the_migration_still_verify(
    backend: Backend, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        url = fresh_database(backend, tmp_path, stack)
        before = ScriptDirectory.from_config(alembic_config(url)).get_revision("c12e01000001")
        assert isinstance(before.down_revision, str)
        upgrade(url, before.down_revision)  # the schema the unkeyed service wrote into
        names = ("seq", "ts", "actor", "action", "target", "detail", "prev_hash", "hash")
        cols = AuditEntry.__table__.c
        old_table = sa.table("audit_log", *(sa.column(n, cols[n].type) for n in names))
        settings = Settings(data_dir=tmp_path / "data", database_url=url)
        engine = make_engine(url)
        try:
            prev, rows = bytes(32), []
            for seq in (1, 2):
                e = AuditEntry(
                    seq=seq,
                    ts=datetime.now(UTC),
                    actor="old",
                    action="admin.create_key",
                    target=f"key:{seq}",
                    detail={"role": "model"},
                    prev_hash=prev,
                )
                e.hash = prev = plain_sha256(prev, e)
                rows.append({n: getattr(e, n) for n in names})
            async with engine.begin() as conn:
                await conn.execute(sa.insert(old_table), rows)
            upgrade(url)
            log = Log(settings, make_sessionmaker(engine, settings), engine)
            v = await log.verify()
            assert v.ok and v.entries == 2 and v.keyed_from is None
            await log.record(1)
            v = await log.verify()
            assert v.ok and v.entries == 4 and v.keyed_from == 3
            assert [e.key_version for e in await log.entries()] == [0, 0, 1, 1]
        finally:
            await engine.dispose()


async def test_key_and_anchor_live_outside_the_database_and_are_private(log: Log) -> None:
    seqs = await log.record(2)
    key_file = log.settings.resolved_audit_key_file
    for p in (key_file, log.anchor_file):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text())
    assert len(key) == 32
    a = audit_anchor.read_anchor(log.anchor_file)
    assert a is not None and a.seq == seqs[-1] and a.key_id == audit_anchor.key_id(key)
    for e in await log.entries():  # the key is in no column
        assert key.hex() not in str(e.detail) and key not in (e.hash, e.prev_hash)


async def test_another_key_cannot_verify_or_extend_the_log(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.record(2)
    other = Settings(
        data_dir=log.settings.data_dir,
        database_url=log.settings.database_url,
        audit_key=secrets.token_hex(32),
    )
    sm = make_sessionmaker(log.engine, other)
    async with sm() as s:
        v = await audit.verify(s)
    assert not v.ok and "not the key the log was keyed with" in (v.problem or "")
    # the attacker's own key over a rewritten entry: still found with the real key
    await audit.record(sm, actor="x", action="test.forged")
    v = await log.verify()
    assert not v.ok and "edited" in (v.problem or "")


async def test_a_deleted_anchor_is_found_then_recorded_on_the_log(log: Log) -> None:
    await log.record(2)
    log.anchor_file.unlink()
    v = await log.verify()
    assert not v.ok and "anchor" in (v.problem or "") and "missing" in (v.problem or "")
    await log.record(1)
    actions = [e.action for e in await log.entries()]
    assert actions[-2:] == ["audit.reanchored", "test.step"]
    assert (await log.verify()).ok


async def test_a_malformed_audit_key_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="SELECTIVITY_AUDIT_KEY must be at least 64 hex"):
        Settings(audit_key="abcd")


@pytest.mark.parametrize("bad", ["36:0000", "abc", "", f"0:{'a' * 64}", f"1:{'a' * 64}:x", "1:"])
def test_a_malformed_expected_head_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--expect-head must be SEQ:HASH"):
        parse_head(bad)
    assert parse_head(f"36:{'Ab' * 32}") == (36, bytes.fromhex("ab" * 32))

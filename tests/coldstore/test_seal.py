"""Sealing: hot entries → verified segments → expire; idempotent, crash-safe; and the canary
test of issue 5: after seal and expire the raw data is nowhere the service can read."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from sqlalchemy import select

from service.coldstore import crypto, files
from service.coldstore import service as coldstore
from service.context import AppContext
from service.db.models import Stream, Window
from tests.coldstore.conftest import Key, rows, sealed_stream, segments
from tests.conftest import Api, Jobs
from tests.helpers import aof_rewritten, redis_dump, sql_dump


async def _windows(ctx: AppContext, name: str) -> dict[int, Window]:
    async with ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        return {w.epoch: w for w in await s.scalars(select(Window).where(Window.stream_id == sid))}


async def test_seal_writes_segments_that_decrypt_to_every_entry_once(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    ctx = api.ctx
    name = await sealed_stream(api, [rows(23, "a"), rows(5, "b")], hot_windows=2)  # epoch 3
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)
    await jobs()  # the selection rounds that read window 1 (expiry waits for them)
    assert stats.entries == 28 and stats.segments == 3 + 1 and stats.windows_sealed == 2
    again = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)
    assert again.entries == 0 and again.segments == 0  # idempotent
    segs = await segments(ctx, name)
    sk = crypto.combine(
        cold_key.shares[:2],
        public_key=(await _pub(ctx, cold_key.id)),
        tag=await _tag(ctx, cold_key.id),
    )
    ids: list[str] = []
    for s in segs:
        data = Path(s.path).read_bytes()
        assert hashlib.sha256(data).digest() == s.sha256 and s.key_id == cold_key.id
        hdr, entries = crypto.open_segment(data, sk)
        # window 1 left the hot period: its index keeps no count or entry range
        index = (s.first_id, s.last_id, s.count) if s.epoch == 2 else (None, None, None)
        assert (hdr["window"], s.first_id, s.last_id, s.count) == (s.epoch, *index)
        assert (hdr["first"], hdr["last"]) == (entries[0][0], entries[-1][0])
        assert hdr["count"] == len(entries)
        ids += [__import__("orjson").loads(r)["id"] for _, r in entries]
    assert ids == [f"a-{i}" for i in range(23)] + [f"b-{i}" for i in range(5)]
    ws = await _windows(ctx, name)
    assert ws[1].cold_sealed_at is not None and ws[2].cold_sealed_at is not None
    # window 1 left the hot period ([2, 3] at epoch 3): expire deleted it; window 2 is hot
    assert ws[1].hot_deleted_at is not None and ws[2].hot_deleted_at is None
    assert await ctx.stores.windows.hot_length(name, 1) == 0
    assert await ctx.stores.windows.hot_length(name, 2) == 5


async def _pub(ctx: AppContext, key_id: int) -> bytes:
    from service.db.models import ColdStoreKey

    async with ctx.sessionmaker() as s:
        return (await s.get(ColdStoreKey, key_id)).public_key  # type: ignore[union-attr]


async def _tag(ctx: AppContext, key_id: int) -> bytes:
    from service.db.models import ColdStoreKey

    async with ctx.sessionmaker() as s:
        return (await s.get(ColdStoreKey, key_id)).verification_tag  # type: ignore[union-attr]


async def test_open_window_is_sealed_in_full_segments_only_and_never_expired(
    api: Api, cold_key: Key
) -> None:
    ctx = api.ctx
    name = await sealed_stream(api, [])
    r = await api.post(
        f"/v1/streams/{name}/observations", "producer", json={"observations": rows(25, "o")}
    )
    assert r.status_code == 202
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)
    assert stats.entries == 20 and stats.windows_sealed == 0
    ws = await _windows(ctx, name)
    assert ws[1].seal_cursor is not None and ws[1].cold_sealed_at is None
    assert await ctx.stores.windows.hot_length(name, 1) == 25


async def test_without_a_seal_the_hot_data_is_kept(api: Api, cold_key: Key) -> None:
    ctx = api.ctx
    name = await sealed_stream(api, [rows(4, "k"), [], []])  # epoch 4: window 1 left the hot period
    assert await ctx.stores.windows.hot_length(name, 1) == 4  # not sealed → not deleted


async def test_a_crash_between_file_and_index_leaves_no_orphan_and_no_double(
    api: Api, cold_key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = api.ctx
    name = await sealed_stream(api, [rows(12, "c")])
    real = files.write_atomic
    calls = {"n": 0}

    def crash_after_second_write(path: Path, data: bytes) -> None:
        real(path, data)
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed after the rename, before the index commit")

    monkeypatch.setattr(files, "write_atomic", crash_after_second_write)
    with pytest.raises(RuntimeError):
        await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=5)
    monkeypatch.setattr(files, "write_atomic", real)
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=5)
    segs = await segments(ctx, name)
    assert sum(s.count for s in segs) == 12 and len(segs) == 3
    on_disk = sorted(str(p) for p in Path(segs[0].path).parent.glob("*.seg"))
    assert on_disk == sorted(s.path for s in segs)  # the unindexed file was removed
    assert stats.windows_sealed == 1


async def test_a_changed_segment_blocks_the_window_seal(api: Api, cold_key: Key) -> None:
    """A segment damaged between its write and the window's verification: the window is not
    marked sealed, so its hot data is never deleted on the strength of a bad copy."""
    ctx = api.ctx
    name = await sealed_stream(api, [])
    await api.post(
        f"/v1/streams/{name}/observations", "producer", json={"observations": rows(10, "d")}
    )
    await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)  # open window: 1 segment
    seg = (await segments(ctx, name))[0]
    data = bytearray(Path(seg.path).read_bytes())
    data[-1] ^= 1
    Path(seg.path).write_bytes(bytes(data))
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)
    assert stats.problems == 1 and stats.windows_sealed == 0
    assert (await _windows(ctx, name))[1].cold_sealed_at is None
    assert await ctx.stores.windows.hot_length(name, 1) == 10


async def test_canary_is_nowhere_after_seal_and_expire(
    api: Api,
    cold_key: Key,
    jobs: Jobs,
    backend,
    caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    ctx = api.ctx
    caplog.set_level(logging.DEBUG)
    canary = "CANARY-" + __import__("secrets").token_hex(8)
    batch = rows(30, "x")
    batch[7]["features"]["user"] = canary
    batch[8]["id"] = canary + "-id"
    name = await sealed_stream(api, [batch, [], []])  # epoch 4: window 1 left the hot period
    found = await redis_dump(ctx)
    assert canary.encode() in found  # the check can see it while it is hot
    redis_dir = backend.settings.data_dir.resolve() / "redis"
    if backend.embedded is not None:  # ... and in the AOF, before the rewrite
        assert any(canary.encode() in p.read_bytes() for p in redis_dir.rglob("*aof*"))
    stats = await coldstore.seal_stream(ctx=ctx, name=name)
    assert stats.windows_sealed >= 1
    await jobs()  # the selection rounds that read window 1 (expiry waits for them)
    assert (await _windows(ctx, name))[1].hot_deleted_at is not None
    assert canary.encode() not in await redis_dump(ctx)
    assert canary.encode() not in await sql_dump(ctx)
    if backend.embedded is not None:  # the embedded Redis persists with an AOF: rewritten
        await aof_rewritten(ctx)
        persisted = [p for p in redis_dir.rglob("*") if p.is_file()]
        assert any("aof" in p.name for p in persisted)
        for p in persisted:
            assert canary.encode() not in p.read_bytes(), p
    cold = [p for p in ctx.settings.resolved_coldstore_dir.rglob("*") if p.is_file()]
    assert cold
    for p in cold:
        assert canary.encode() not in p.read_bytes()
    assert canary not in caplog.text


async def test_aof_rewrites_back_to_back_both_start(ctx: AppContext, backend) -> None:  # type: ignore[no-untyped-def]
    """A rewrite requested while one runs waits for it and then runs (the first may have
    started before the delete it is meant to flush out)."""
    if backend.embedded is None:
        pytest.skip("the shared test Redis runs without persistence")
    store = ctx.stores.windows
    await ctx.redis.set(f"{ctx.keys.prefix}:bulk", b"x" * 5_000_000)
    assert await store.rewrite_aof()
    assert await store.rewrite_aof()
    await aof_rewritten(ctx)
    await ctx.redis.delete(f"{ctx.keys.prefix}:bulk")

"""The cold store's retention: a stream with ``cold_retention_windows`` C keeps the raw rows of
its last C windows (the open one first) in the cold store; the segments of older windows, whose
hot data is gone already, are deleted (files, index rows), the window says when, the deletion
is audited, and an export under a grant names the deleted windows instead of returning them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select, update

from service.coldstore import files
from service.coldstore import service as coldstore
from service.db.models import AuditEntry, Stream, Window
from tests.coldstore.conftest import Key, rows, sealed_stream, segments
from tests.coldstore.test_unlock_edges import _file, _grant
from tests.conftest import Api, Jobs, unique
from tests.helpers import new_stream, stream_body


async def _windows(api: Api, name: str) -> dict[int, Window]:
    async with api.ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        return {w.epoch: w for w in await s.scalars(select(Window).where(Window.stream_id == sid))}


async def _seal(api: Api, name: str, jobs: Jobs) -> int:
    """Seal and expire as the worker's cron would, the roll's follow-ups in between; returns
    the windows whose cold segments were deleted."""
    a = await coldstore.seal_stream(ctx=api.ctx, name=name, segment_entries=4)
    await jobs()
    b = await coldstore.seal_stream(ctx=api.ctx, name=name, segment_entries=4)
    return a.windows_deleted + b.windows_deleted


async def test_windows_past_the_cold_retention_lose_their_segments(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    ctx = api.ctx
    name = await sealed_stream(
        api, [rows(6, f"w{i}") for i in range(1, 6)], hot_windows=1, cold_retention_windows=2
    )  # windows 1..5 closed, 6 open: the cold store keeps 5 (and 6)
    assert await _seal(api, name, jobs) == 4
    ws = await _windows(api, name)
    assert [e for e, w in sorted(ws.items()) if w.cold_deleted_at is not None] == [1, 2, 3, 4]
    assert ws[5].cold_deleted_at is None and ws[5].cold_sealed_at is not None
    segs = await segments(ctx, name)
    assert {s.epoch for s in segs} == {5} and len(segs) == 2  # 6 rows in segments of 4
    root = ctx.settings.resolved_coldstore_dir / str(segs[0].stream_id)
    assert sorted(p.name for p in root.iterdir()) == ["5"]  # the windows' directories too
    async with ctx.sessionmaker() as s:
        entries = list(
            await s.scalars(select(AuditEntry).where(AuditEntry.action == "coldstore.retention"))
        )
    mine = [e.detail for e in entries if e.target == f"stream:{name}"]
    assert sum(d["windows"] for d in mine) == 4
    assert (mine[0]["first_window"], mine[-1]["last_window"]) == (1, 4)
    # the listing shows it
    listed = (await api.get(f"/v1/streams/{name}/windows", "admin")).json()["windows"]
    assert {w["epoch"] for w in listed if w["cold_deleted_at"]} == {1, 2, 3, 4}

    # one roll later, window 5 goes too (once its hot data is gone); nothing is deleted twice
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    assert await _seal(api, name, jobs) == 1
    assert {s.epoch for s in await segments(ctx, name)} == set()
    assert await _seal(api, name, jobs) == 0


async def test_a_deletion_cut_short_after_the_files_is_finished_by_the_next_run(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    """A crash between the files and the index rows: the rows name missing files; the next
    run deletes them and marks the window."""
    ctx = api.ctx
    name = await sealed_stream(
        api, [rows(5, "a"), rows(5, "b"), rows(5, "c")], hot_windows=1, cold_retention_windows=2
    )  # windows 1..3 closed, 4 open: window 1 and 2 are due
    await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=4)
    await jobs()
    async with ctx.sessionmaker() as s:
        stream_id = await s.scalar(select(Stream.id).where(Stream.name == name))
        stream = await s.get(Stream, stream_id)
        assert stream is not None
    # the first run's file step alone, for window 1, as if the process died right after it
    w1 = [s.path for s in await segments(ctx, name) if s.epoch == 1]
    assert w1 and all(Path(p).exists() for p in w1)
    root = ctx.settings.resolved_coldstore_dir
    assert files.remove_window(root, int(stream_id), 1, w1) == len(w1)
    assert not any(Path(p).exists() for p in w1)
    assert {s.epoch for s in await segments(ctx, name)} >= {1}  # the rows still name them
    deleted = await coldstore.apply_retention(ctx=ctx, name=name, stream_id=int(stream_id), keep=2)
    assert deleted == 2
    assert {s.epoch for s in await segments(ctx, name)} == {3}
    ws = await _windows(api, name)
    assert ws[1].cold_deleted_at is not None and ws[2].cold_deleted_at is not None


async def test_one_run_deletes_a_bounded_number_of_windows(
    api: Api, cold_key: Key, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = await sealed_stream(
        api, [rows(3, f"w{i}") for i in range(1, 6)], hot_windows=1, cold_retention_windows=1
    )  # windows 1..5 closed, 6 open: all five are due
    monkeypatch.setattr(coldstore, "RETENTION_WINDOWS_PER_RUN", 2)
    deleted = [(await coldstore.seal_stream(ctx=api.ctx, name=name)).windows_deleted]
    await jobs()
    while deleted[-1] or len(deleted) < 2:
        deleted.append((await coldstore.seal_stream(ctx=api.ctx, name=name)).windows_deleted)
    assert sum(deleted) == 5 and max(deleted) == 2, deleted
    assert {s.epoch for s in await segments(api.ctx, name)} == set()


async def test_without_a_cold_retention_nothing_is_deleted(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    name = await sealed_stream(api, [rows(5, f"w{i}") for i in range(1, 5)], hot_windows=1)
    assert await _seal(api, name, jobs) == 0
    assert {s.epoch for s in await segments(api.ctx, name)} == {1, 2, 3, 4}
    assert all(w.cold_deleted_at is None for w in (await _windows(api, name)).values())


async def test_the_operators_cap_in_days_deletes_windows_closed_before_it(
    api: Api, cold_key: Key, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SELECTIVITY_COLD_RETENTION_DAYS applies to every stream, one without a retention of
    its own too: a window closed more than that many days ago loses its segments."""
    ctx = api.ctx
    name = await sealed_stream(api, [rows(5, f"w{i}") for i in range(1, 4)], hot_windows=1)
    async with ctx.sessionmaker() as s, s.begin():
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        await s.execute(
            update(Window)
            .where(Window.stream_id == sid, Window.epoch == 1)
            .values(closed_at=datetime.now(UTC) - timedelta(days=8))
        )
    assert await _seal(api, name, jobs) == 0  # no cap: kept
    monkeypatch.setattr(ctx.settings, "cold_retention_days", 7.0)
    assert await _seal(api, name, jobs) == 1
    assert {s.epoch for s in await segments(ctx, name)} == {2, 3}
    assert (await _windows(api, name))[1].cold_deleted_at is not None


async def test_a_cold_retention_shorter_than_the_hot_period_is_refused(api: Api) -> None:
    body = stream_body(unique("cold"), hot_windows=3, cold_retention_windows=2)
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422, r.text
    assert "cold_retention_windows" in r.text and "hot_windows = 3" in r.text
    body["cold_retention_windows"] = 0
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 422 and "cold_retention_windows" in r.text


async def test_an_export_names_the_windows_the_retention_deleted(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    name = await sealed_stream(
        api, [rows(5, "a"), rows(6, "b"), rows(7, "c")], hot_windows=1, cold_retention_windows=2
    )  # windows 1..3 closed, 4 open: 1 and 2 are deleted, 3 kept
    assert await _seal(api, name, jobs) == 2
    rid = await _file(api, name, 1, 3)
    await _grant(api, rid, cold_key)
    r = await api.get(f"/v1/admin/unlock-requests/{rid}/export", "analyst")
    assert r.status_code == 200
    lines = [orjson.loads(x) for x in r.content.splitlines()]
    manifest = lines[-1]["manifest"]
    assert [x["observation"]["id"][:1] for x in lines[:-1]] == ["c"] * 7
    assert manifest["rows_per_window"] == [{"window": 3, "rows": 7}]
    assert manifest["deleted_by_retention"] == [1, 2]
    assert manifest["failed_segments"] == 0 and manifest["complete"]


async def test_the_ledger_lists_the_cold_store_its_retention_and_open_grants(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    """A privacy officer reads in the stream's ledger that its raw rows are kept sealed, how
    long, and which grants are open (an admin all of them; an analyst only their own)."""
    name = await sealed_stream(
        api, [rows(5, "a"), rows(5, "b")], hot_windows=1, cold_retention_windows=3
    )
    await _seal(api, name, jobs)

    async def entry(role: str) -> dict:
        r = await api.get(f"/v1/streams/{name}/privacy", role=role)
        assert r.status_code == 200, r.text
        (e,) = [x for x in r.json()["releases"] if x["kind"] == "cold-store export"]
        return dict(e)

    e = await entry("admin")
    assert e["dp"] is False and e["epsilon"] is None and e["to"] == ["analyst"]
    assert "3 windows old (cold_retention_windows)" in e["lifetime"] and e["items"] == []
    rid = await _file(api, name, 1, 2)
    await _grant(api, rid, cold_key)
    (item,) = (await entry("admin"))["items"]
    assert item["id"] == rid and item["windows"] == [1, 2] and item["yours"] is False
    assert item["expires_at"].endswith("Z") and item["created_at"].endswith("Z")
    (own,) = (await entry("analyst"))["items"]
    assert own["id"] == rid and own["yours"] is True
    await api.add_keys(other="analyst")
    assert (await entry("other"))["items"] == []
    plain = await new_stream(api, "coldplain")
    r = await api.get(f"/v1/streams/{plain}/privacy", role="admin")
    (kept,) = [x for x in r.json()["releases"] if x["kind"] == "cold-store export"]
    assert kept["lifetime"].startswith("kept for good")

"""Issue 12 item 2 for the cold store: a segment's row count, first/last entry ids and exact
times are exact per-window statistics; none outlives the window's hot period, in SQL or in the
segment file's clear header. The unlock export counts rows by decrypting."""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import orjson
from sqlalchemy import create_engine, select, text

from service.coldstore import crypto, files
from service.coldstore import service as coldstore
from service.db.migrate import upgrade
from service.db.models import ColdStoreKey, Stream, Window
from service.db.session import sync_url
from tests.coldstore.conftest import Key, rows, sealed_stream, segments
from tests.conftest import DATABASE_URL, Api, Backend, Jobs, pg_schema


def _naive(t: datetime | None) -> datetime | None:
    return None if t is None else t.replace(tzinfo=None)


async def test_no_segment_statistic_outlives_the_hot_period(
    api: Api, cold_key: Key, jobs: Jobs
) -> None:
    ctx = api.ctx
    name = await sealed_stream(api, [rows(23, "a"), rows(5, "b")], hot_windows=2)  # epoch 3
    stats = await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)
    await jobs()
    await coldstore.seal_stream(ctx=ctx, name=name, segment_entries=10)  # expire after rounds
    assert stats.windows_sealed == 2
    async with ctx.sessionmaker() as s:
        sid = await s.scalar(select(Stream.id).where(Stream.name == name))
        ws = {w.epoch: w for w in await s.scalars(select(Window).where(Window.stream_id == sid))}
    assert ws[1].hot_deleted_at is not None and ws[2].hot_deleted_at is None
    segs = await segments(ctx, name)
    gone = [x for x in segs if x.epoch == 1]
    hot = [x for x in segs if x.epoch == 2]
    assert len(gone) == 3 and len(hot) == 1
    for seg in gone:  # nothing exact about window 1's rows is left in SQL
        assert (seg.count, seg.first_id, seg.last_id) == (None, None, None)
        assert _naive(seg.first_ts) == _naive(ws[1].opened_at)  # coarse, window-aligned
        assert _naive(seg.last_ts) == _naive(ws[1].closed_at)
    assert ws[1].seal_cursor is None
    assert hot[0].count == 5 and hot[0].first_id is not None  # still hot: kept
    for seg in segs:  # no file header carries a count or an entry range, nor its name
        header, _, _ = crypto.split(Path(seg.path).read_bytes())
        assert header["v"] == 2
        assert not {"count", "first", "last", "size"} & set(header)
        assert Path(seg.path).name == f"{files.seq_of(seg.path):06d}.seg"
        assert not any(ch == "-" for ch in Path(seg.path).name)


async def test_a_header_with_a_count_cannot_be_swapped_in(api: Api, cold_key: Key) -> None:
    """The row statistics inside the encryption are authenticated with the rows: two segments
    of one window with their clear headers swapped both fail."""
    name = await sealed_stream(api, [rows(12, "w")])
    await coldstore.seal_stream(ctx=api.ctx, name=name, segment_entries=5)
    a, b = (await segments(api.ctx, name))[:2]
    da, db = Path(a.path).read_bytes(), Path(b.path).read_bytes()
    _, ha, body_a = crypto.split(da)
    _, hb, body_b = crypto.split(db)
    assert ha != hb  # their seq differs
    sk = crypto.combine(
        cold_key.shares[:2],
        public_key=await _pub(api, cold_key.id),
        tag=await _tag(api, cold_key.id),
    )
    swapped = crypto.MAGIC + len(hb).to_bytes(4, "big") + hb + body_a
    try:
        crypto.open_segment(swapped, sk)
    except crypto.SegmentError as exc:
        assert "authentication failed" in str(exc)
    else:
        raise AssertionError("a swapped header opened")
    header, entries = crypto.open_segment(da, sk)
    assert header["count"] == len(entries) == 5
    assert [orjson.loads(r)["id"] for _, r in entries] == [f"w-{i}" for i in range(5)]


async def _pub(api: Api, key_id: int) -> bytes:
    async with api.ctx.sessionmaker() as s:
        return (await s.get(ColdStoreKey, key_id)).public_key  # type: ignore[union-attr]


async def _tag(api: Api, key_id: int) -> bytes:
    async with api.ctx.sessionmaker() as s:
        return (await s.get(ColdStoreKey, key_id)).verification_tag  # type: ignore[union-attr]


def test_version_1_segments_still_open() -> None:
    """Segments written before the format bump (count and entry range in the clear header,
    a bare compressed body) are still read."""
    key = crypto.generate_key(shares=1, threshold=1)
    sk = crypto.combine(key.shares, public_key=key.public_key, tag=key.verification_tag)
    entries = [(b"1-0", b'{"id": "x"}'), (b"2-0", b'{"id": "y"}')]
    plain = crypto.encode_rows(entries)
    hdr = crypto.header_bytes(
        {
            "stream": "s",
            "stream_id": 1,
            "window": 1,
            "first": "1-0",
            "last": "2-0",
            "count": 2,
            "key_id": 1,
            "v": 1,
            "codec": "zstd",
            "size": len(plain),
        }
    )
    sealed = crypto.SUITE.encrypt(
        crypto._ZSTD.compress(plain, asbytes=True),
        crypto.public_key_of(key.public_key),
        info=crypto.INFO_PREFIX + hdr,
    )
    data = crypto.MAGIC + len(hdr).to_bytes(4, "big") + hdr + sealed
    header, rows_ = crypto.open_segment(data, sk)
    assert header["count"] == 2 and rows_ == [("1-0", b'{"id": "x"}'), ("2-0", b'{"id": "y"}')]


def test_the_migration_drops_the_statistics_of_windows_already_gone(
    backend: Backend, tmp_path: Path
) -> None:
    """Revision c12f01000001 does to windows that left the hot period before it what expire
    does now; segments of hot windows keep theirs."""
    with ExitStack() as stack:
        if backend.name == "servers" and DATABASE_URL:
            url = stack.enter_context(pg_schema(f"seltest_seg_{secrets.token_hex(4)}"))
        else:
            url = f"sqlite:///{tmp_path / 'm.db'}"
        engine = create_engine(sync_url(url))
        stack.callback(engine.dispose)
        upgrade(url, "c12e01000001")
        t0 = datetime(2026, 1, 1, 0, 0)
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO stream (id, name, config, hash_seed, epoch, epoch_started_at, "
                    "created_at) VALUES (1, 's', '{}', :b, 3, :t, :t)"
                ),
                {"t": t0, "b": b"s" * 32},
            )
            c.execute(
                text(
                    "INSERT INTO coldstore_key (id, public_key, verification_tag, shares, "
                    "threshold, created_at) VALUES (1, :b, :b, 1, 1, :t)"
                ),
                {"b": b"x" * 32, "t": t0},
            )
            for epoch, deleted in ((1, t0), (2, None)):
                c.execute(
                    text(
                        "INSERT INTO stream_window (stream_id, epoch, state, opened_at, "
                        "closed_at, hot_deleted_at, seal_cursor) "
                        "VALUES (1, :e, 'hot', :o, :c, :d, '9-9')"
                    ),
                    {"e": epoch, "o": t0, "c": datetime(2026, 1, 2), "d": deleted},
                )
                c.execute(
                    text(
                        "INSERT INTO cold_segment (stream_id, epoch, first_id, last_id, count, "
                        "path, size, sha256, key_id, first_ts, last_ts, created_at) VALUES "
                        "(1, :e, '5-0', '9-9', 17, 'p', 1, :h, 1, :f, :l, :f)"
                    ),
                    {"e": epoch, "h": b"h" * 32, "f": datetime(2026, 1, 1, 3), "l": t0},
                )
        upgrade(url)
        with engine.connect() as c:
            segs = c.execute(
                text(
                    "SELECT epoch, count, first_id, last_id, first_ts, last_ts FROM cold_segment "
                    "ORDER BY epoch"
                )
            ).all()
            cursors = c.execute(
                text("SELECT seal_cursor FROM stream_window ORDER BY epoch")
            ).scalars()
            assert list(cursors) == [None, "9-9"]
        (e1, *gone), (e2, *kept) = segs
        assert gone[:3] == [None, None, None]
        assert [_naive(_dt(x)) for x in gone[3:]] == [t0, datetime(2026, 1, 2)]
        assert kept[:3] == [17, "5-0", "9-9"]


def _dt(v: object) -> datetime:
    return v if isinstance(v, datetime) else datetime.fromisoformat(str(v))

"""Embedded mode's first start makes a cold-store key whose shares the service can never read
back (docs/PRIVACY.md, promise 3; issue 12 item 5): they are
printed once on the console, or written to a file the operator names outside the data dir and
the cold store; nothing under the data dir, in SQL or in the log holds one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from service.coldstore import crypto
from service.coldstore import service as coldstore
from service.config import Settings
from service.context import AppContext
from service.db.models import Base
from tests.conftest import Backend, fresh_context


def _shares(out: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("share ")]


async def _sql_text(ctx: AppContext) -> str:
    out = []
    async with ctx.sessionmaker() as s:
        for t in Base.metadata.sorted_tables:
            for row in (await s.execute(text(f'SELECT * FROM "{t.name}"'))).all():
                out += [v.hex() if isinstance(v, bytes) else str(v) for v in row]
    return "|".join(out)


async def _assert_the_key_opens_with(ctx: AppContext, shares: list[str]) -> None:
    async with ctx.sessionmaker() as s:
        key = await coldstore.active_key(s)
    assert key is not None and (key.shares, key.threshold) == (3, 2)
    for pair in (shares[:2], shares[1:]):  # any two rebuild the key the service seals to
        crypto.combine(pair, public_key=key.public_key, tag=key.verification_tag)


def _assert_stored_nowhere(data_dir: Path, shares: list[str], *texts: str) -> None:
    blobs = [p.read_bytes() for p in data_dir.rglob("*") if p.is_file()]
    assert blobs  # the SQLite database, at least, on the embedded backend; admin.key ...
    for share in shares:
        words = share.encode()
        assert not any(words in b for b in blobs)
        assert all(share not in t for t in texts)
    assert not (data_dir / "coldstore-shares").exists()


async def test_first_start_prints_the_shares_once_and_stores_them_nowhere(
    backend: Backend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    data = tmp_path / "data"
    async with fresh_context(backend, data) as ctx:
        await coldstore.init_embedded_key(ctx)
        out = capsys.readouterr().out
        shares = _shares(out)
        assert len(shares) == 3 and "shown ONCE" in out and "OFFLINE" in out
        assert all(out.count(s) == 1 for s in shares)
        await _assert_the_key_opens_with(ctx, shares)
        _assert_stored_nowhere(data, shares, caplog.text, await _sql_text(ctx))
        await coldstore.init_embedded_key(ctx)  # a later start: the key exists, nothing shown
        assert capsys.readouterr().out == ""


async def test_a_shares_file_outside_the_data_dir_takes_them_instead(
    backend: Backend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    dest = tmp_path / "offline" / "shares.txt"
    dest.parent.mkdir()
    data = tmp_path / "data"
    async with fresh_context(backend, data, coldstore_shares_file=dest) as ctx:
        await coldstore.init_embedded_key(ctx)
        shares = _shares(dest.read_text())
        assert len(shares) == 3 and dest.stat().st_mode & 0o777 == 0o600
        await _assert_the_key_opens_with(ctx, shares)
        out = capsys.readouterr().out
        _assert_stored_nowhere(data, shares, out, caplog.text, await _sql_text(ctx))
        assert str(dest) in caplog.text
    # another first start (a new database) never overwrites the file: it refuses before
    # making a key, so the earlier shares survive
    before = dest.read_bytes()
    async with fresh_context(backend, tmp_path / "data2", coldstore_shares_file=dest) as ctx:
        with pytest.raises(coldstore.SharesFileError, match="already exists"):
            await coldstore.init_embedded_key(ctx)
        async with ctx.sessionmaker() as s:
            assert await coldstore.active_key(s) is None
    assert dest.read_bytes() == before


def test_a_shares_file_the_service_could_read_is_refused(tmp_path: Path) -> None:
    data, cold = tmp_path / "data", tmp_path / "cold"
    for where, path in (
        ("the data dir", data / "shares.txt"),
        ("the data dir", data / "sub" / ".." / "x" / "shares.txt"),
        ("the data dir", tmp_path / "data" / "." / "shares.txt"),
        ("the cold store", cold / "shares.txt"),
    ):
        with pytest.raises(ValidationError) as err:
            Settings(data_dir=data, coldstore_dir=cold, coldstore_shares_file=path)
        msg = str(err.value)
        assert "SELECTIVITY_COLDSTORE_SHARES_FILE" in msg and f"outside {where}" in msg
    ok = Settings(data_dir=data, coldstore_dir=cold, coldstore_shares_file=tmp_path / "s.txt")
    assert ok.coldstore_shares_file == tmp_path / "s.txt"

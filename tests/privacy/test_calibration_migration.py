"""Revision c26a01000001: streams created before the max(c, 2) calibration keep the rule their
noise was drawn with ("c"), so the ledger reports what that noise gives; new streams get
"max_c_2"."""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import orjson
from sqlalchemy import create_engine, text

from service.core.streamconfig import PrivacyIn
from service.db.migrate import upgrade
from service.db.session import sync_url
from tests.conftest import DATABASE_URL, Backend, pg_schema


def test_streams_created_before_keep_the_calibration_their_noise_has(
    backend: Backend, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        if backend.name == "servers" and DATABASE_URL:
            url = stack.enter_context(pg_schema(f"seltest_cal_{secrets.token_hex(4)}"))
        else:
            url = f"sqlite:///{tmp_path / 'm.db'}"
        engine = create_engine(sync_url(url))
        stack.callback(engine.dispose)
        upgrade(url, "c18a01000001")
        keyed = {"privacy": {"user_key": "u", "max_contributions_per_window": 1}}
        said = {"privacy": {"table_calibration": "max_c_2"}}
        with engine.begin() as c:
            for sid, config in ((1, keyed), (2, {}), (3, said)):
                c.execute(
                    text(
                        "INSERT INTO stream (id, name, config, hash_seed, epoch, "
                        "epoch_started_at, created_at) VALUES (:i, :n, :c, :b, 1, :t, :t)"
                    ),
                    {
                        "i": sid,
                        "n": f"s{sid}",
                        "c": orjson.dumps(config).decode(),
                        "b": b"s" * 32,
                        "t": datetime(2026, 1, 1),
                    },
                )
        upgrade(url, "c26a01000001")
        with engine.connect() as c:
            got = {
                i: orjson.loads(cfg) if isinstance(cfg, str | bytes) else cfg
                for i, cfg in c.execute(text("SELECT id, config FROM stream ORDER BY id")).all()
            }
        assert got[1] == {"privacy": {**keyed["privacy"], "table_calibration": "c"}}
        assert got[2] == {"privacy": {"table_calibration": "c"}}
        assert got[3] == said  # said explicitly: kept
        assert PrivacyIn().table_calibration == "max_c_2"

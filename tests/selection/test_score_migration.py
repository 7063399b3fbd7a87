"""Revision c18a01000001: streams created before the "aic" selection score keep the plug-in
score they were created with; new streams get "aic"."""

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
from tests.conftest import DATABASE_URL, Api, Backend, pg_schema
from tests.helpers import stream_body


def test_streams_created_before_keep_the_plug_in_score(backend: Backend, tmp_path: Path) -> None:
    with ExitStack() as stack:
        if backend.name == "servers" and DATABASE_URL:
            url = stack.enter_context(pg_schema(f"seltest_sel_{secrets.token_hex(4)}"))
        else:
            url = f"sqlite:///{tmp_path / 'm.db'}"
        engine = create_engine(sync_url(url))
        stack.callback(engine.dispose)
        upgrade(url, "c12f01000001")
        t0 = datetime(2026, 1, 1)
        old = {"features": ["a"], "privacy": {"epsilon": 1.0, "selection_epsilon": 1.0}}
        with engine.begin() as c:
            for sid, config in ((1, old), (2, {}), (3, {"privacy": {"selection_score": "aic"}})):
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
                        "t": t0,
                    },
                )
        upgrade(url, "c18a01000001")  # this migration alone (later ones add their own fields)
        with engine.connect() as c:
            got = {
                i: orjson.loads(cfg) if isinstance(cfg, str | bytes) else cfg
                for i, cfg in c.execute(text("SELECT id, config FROM stream ORDER BY id")).all()
            }
        assert got[1] == {**old, "privacy": {**old["privacy"], "selection_score": "mi"}}
        assert got[2] == {"privacy": {"selection_score": "mi"}}
        assert got[3] == {"privacy": {"selection_score": "aic"}}  # said explicitly: kept


async def test_a_new_stream_scores_with_aic(api: Api) -> None:
    assert PrivacyIn().selection_score == "aic"
    body = stream_body(f"sel_{secrets.token_hex(4)}")
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    r = await api.get(f"/v1/streams/{body['name']}")
    assert r.json()["privacy"]["selection_score"] == "aic"

"""A roll's follow-up killed mid-run with its worker (``kill -9``) is run again by the next
worker within seconds, completes, and its effect happens once (issue 11: a selection round)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from service import resources
from service.coldstore import service as coldstore
from service.config import Settings
from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, FollowUp, StreamEvent
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn
from service.jobs import queue_name
from service.lifecycle import followups
from service.lifecycle import roll as lifecycle_roll
from service.lifecycle import streams as lifecycle_streams
from service.stores.keys import Keys
from tests.conftest import unique
from tests.workers.test_runner import RESUME_SECONDS, _wait, _Workers

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


def _xor_rows(n: int) -> list[dict]:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2, (n, 3))
    return [
        {"features": {"a": f"a{r[0]}", "b": f"b{r[1]}", "c": f"c{r[2]}"}, "label": str(r[0] ^ r[1])}
        for r in x.tolist()
    ]


@pytest.mark.slow
async def test_a_selection_round_killed_with_its_worker_completes_once(
    workers: _Workers, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=Path(workers.env["SELECTIVITY_DATA_DIR"]),
        redis_url=workers.env["SELECTIVITY_REDIS_URL"],
        redis_prefix=workers.prefix,
        embedded_worker=False,
    )
    assert queue_name(Keys(workers.prefix)) == workers.queue
    ctx = await resources.build(settings)
    name = unique("resume")
    try:
        await coldstore.init_key(sessionmaker=ctx.sessionmaker, shares=2, threshold=2, actor="test")
        body = {
            "name": name,
            "features": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "labels": ["0", "1"],
            "hot_windows": 1,
            "sketch": {"width": 256, "depth": 2},
            "max_tables": 5,
            "privacy": {"mechanism": "none", "epsilon_selection": 50.0},
        }
        await lifecycle_streams.create(ctx=ctx, stream_in=StreamCreate.model_validate(body))
        batch = IngestIn.model_validate({"observations": _xor_rows(1500)})
        await ingest.ingest(ctx=ctx, name=name, body=batch, idempotency_key=None)
        assert await lifecycle_roll.roll(ctx=ctx, name=name) == 2  # enqueues the follow-ups
        job = f"saq:job:{workers.queue}:{workers.queue}:" + followups.job_key(
            "selection_round", name, 2
        )

        def status() -> str | None:
            raw = workers.redis.get(job)
            return json.loads(raw)["status"] if raw else None

        first = workers.start(hang=("selection_round",))
        _wait("the round active", lambda: status() == "active", workers)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert status() == "active"  # what the dead worker left
        second = workers.start()
        started = time.monotonic()
        while status() != "complete":
            assert second.poll() is None, workers.output()
            assert time.monotonic() - started < RESUME_SECONDS, workers.output()
            time.sleep(0.1)
        print(f"\nselection round completed {time.monotonic() - started:.1f} s after the restart")
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)

        async with ctx.sessionmaker() as session:
            tables = (await session.execute(select(CountTable.name, CountTable.reason))).all()
            rounds = (
                await session.execute(
                    select(FollowUp).where(FollowUp.kind == "selection_round", FollowUp.epoch == 2)
                )
            ).scalar_one()
            events = (
                await session.execute(
                    select(StreamEvent).where(StreamEvent.kind == "tables_selected")
                )
            ).all()
        assert len([t for t, reason in tables if reason == "selected"]) == 1  # added once
        assert rounds.done_at is not None and rounds.attempts == 1
        assert len(events) == 1
        # a rerun after it is done changes nothing
        assert (await followups.run(ctx, kind="selection_round", name=name, epoch=2)) == (
            rounds.result
        )
    finally:
        await resources.close(ctx)

"""A roll killed for real (SIGKILL, in another process, at a durable step) is completed by the
next roll without double effects; the dead process's roll lock frees itself within
``roll_lock_seconds`` (it is renewed only while its holder lives)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api, Backend
from tests.helpers import column, featurize, ingest, new_stream, obs

pytestmark = pytest.mark.slow  # a child process per roll, killed with SIGKILL

CHILD = r"""
import asyncio, os, signal, sys
from service import resources
from service.config import Settings
from service.lifecycle import roll as lifecycle_roll
from service.windows import service as windows

async def main(name, kill_at):
    s = Settings.model_validate_json(os.environ["SEL_TEST_SETTINGS"])
    ctx = await resources.build(s, embedded=None)

    def step(at):
        if at == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    await lifecycle_roll.roll(ctx=ctx, name=name, step=step)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("kill_at", ["opened", "closed", "counted", "aggregated", "committed"])
async def test_a_roll_killed_by_sigkill_is_completed_once(
    api: Api, backend: Backend, kill_at: str
) -> None:
    name = await new_stream(api, "win")
    ctx = api.ctx
    await ingest(api, name, [obs("alice", "x", 20, "1")] * 2)
    settings = backend.settings.model_copy(update={"roll_lock_seconds": 2.0})
    if backend.embedded is not None:  # the child reaches the same embedded server
        settings = settings.model_copy(update={"redis_url": f"unix://{backend.embedded.socket}"})
    env = {**os.environ, "SEL_TEST_SETTINGS": settings.model_dump_json()}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, name, kill_at], env=env, capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    # the dead child's lock is still there, and lapses within roll_lock_seconds
    lock_key = ctx.keys.lock(name, "roll")
    assert await ctx.redis.exists(lock_key)
    started = time.monotonic()
    ctx.settings = ctx.settings.model_copy(update={"roll_lock_seconds": 2.0})
    assert await lifecycle_roll.roll(ctx=ctx, name=name, only_if_due=True) == 2
    assert time.monotonic() - started < 30
    assert await ctx.stores.windows.epoch(name) == 2 and await ctx.stores.windows.served(name) == 2
    out = await featurize(api, name, [{"user": "alice", "item": "x", "age": 20}])
    assert column(out, "user:count:1")[0] == 2.0  # counted once
    r = await api.get(f"/v1/streams/{name}/windows", role="model")
    assert {w["epoch"]: w["state"] for w in r.json()["windows"]} == {1: "counted", 2: "open"}
    assert await lifecycle_roll.roll(ctx=ctx, name=name) == 3

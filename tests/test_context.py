"""AppContext.run_cpu: CPU work in the process pool survives a worker that dies."""

from __future__ import annotations

import concurrent.futures.process
import os

import pytest

from service.context import AppContext, make_process_pool


def _die() -> None:
    os._exit(1)  # what a native crash (a segfault in a library) does to the worker


def _square(x: int) -> int:
    return x * x


@pytest.mark.slow  # a process pool whose worker process dies
async def test_a_crashed_worker_breaks_one_job_not_the_next(ctx: AppContext) -> None:
    ctx.executor = make_process_pool()
    try:
        assert await ctx.run_cpu(_square, 3) == 9
        with pytest.raises(concurrent.futures.process.BrokenProcessPool):
            await ctx.run_cpu(_die)
        assert await ctx.run_cpu(_square, 4) == 16  # a fresh pool took over
    finally:
        ctx.executor.shutdown(wait=True)
        ctx.executor = None

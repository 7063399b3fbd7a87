"""The sweep split into jobs, run by worker processes (two at a time by default: the service's
Python work is single-threaded, so two processes keep both cores busy)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import multiprocessing
import time
from dataclasses import dataclass

import pandas as pd

from bench import lgbm, movielens
from bench.accuracy import baselines, core_arm, http_arm
from bench.accuracy.plan import Eval, Privacy, Setup, Sketching, make_plan
from bench.report import Clock


@dataclass(frozen=True)
class Job:
    kind: str  # "raw" | "http" | "core" | "ablation"
    shares: tuple[float, ...]
    configs: tuple[Privacy, ...] = ()
    draws: int = 1


def jobs(setup: Setup, *, http: bool, core: bool) -> list[Job]:
    """The slowest first (the 1 % share replays the most windows)."""
    out: list[Job] = []
    if http:
        configs = tuple(setup.configs())
        out += [Job("http", (s,), configs, setup.http_draws_eps1) for s in sorted(setup.shares)]
    if core:
        configs = (Privacy("none"), *(Privacy("laplace", e) for e in setup.core_epsilons))
        out += [Job("core", (s,), configs, setup.core_draws) for s in setup.core_shares]
        if setup.ablation_share is not None:
            laplace = (Privacy("laplace", 1.0),)
            out.append(Job("ablation", (setup.ablation_share,), laplace, setup.ablation_draws))
    out.append(Job("raw", setup.shares))
    return out


# Per worker process: the data set and the core arm's counts are built once and reused by
# every job the process runs (memoised by their arguments, not configured).
@functools.cache
def _data() -> pd.DataFrame:
    return movielens.load()


@functools.cache
def _core(sketching: Sketching, training: lgbm.Training) -> core_arm.CoreArm:
    return core_arm.CoreArm(_data(), sketching, training)


def run_job(
    job: Job,
    cut_shares: tuple[float, ...],
    clock: Clock,
    sketching: Sketching,
    training: lgbm.Training,
) -> list[Eval]:
    df = _data()
    plan = make_plan(len(df), cut_shares)
    if job.kind == "raw":
        return baselines.raw_evals(df, plan, job.shares, clock, training)
    if job.kind == "http":
        replay = http_arm.Replay.of(df, plan, sketching, training)
        sweep = http_arm.sweep(replay, job.shares, job.configs, clock, draws_eps1=job.draws)
        return asyncio.run(sweep)
    core = _core(sketching, training)
    if job.kind == "core":
        return core_arm.sweep(core, plan, job.shares, job.configs, clock, draws=job.draws)
    return core_arm.ablation(core, plan, job.shares[0], job.configs[0], clock, draws=job.draws)


def run(
    setup: Setup,
    todo: list[Job],
    *,
    workers: int,
    training: lgbm.Training = lgbm.DEFAULT,
) -> tuple[pd.DataFrame, float]:
    """Every job's per-cut results, and the wall time of the whole run."""
    clock = Clock(time.perf_counter())
    evals: list[Eval] = []
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        n = len(todo)
        for found in pool.map(
            run_job,
            todo,
            [setup.cut_shares] * n,
            [clock] * n,
            [setup.sketching] * n,
            [training] * n,
        ):
            evals += found
    elapsed = time.perf_counter() - clock.t0
    frame = pd.DataFrame([e.__dict__ for e in evals])
    frame["elapsed"] = elapsed
    return frame, elapsed

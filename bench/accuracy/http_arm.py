"""(b, c) Count features through the service's HTTP API, in process (``bench.harness``).

One stream per (share, privacy) configuration, replayed from the start in time order with a
forced roll between windows; ``retention_windows`` covers the whole replay, so the count period
is every rating before the hot window. At each cut the model trains on ``GET /trainset`` (the
open window, Arrow) and is tested on the next ratings featurized by ``POST /featurize`` before
they are ingested (same epoch, same count period as the train set)."""

from __future__ import annotations

import asyncio
import math
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench import lgbm, movielens
from bench.accuracy.plan import Eval, Plan, Privacy, Sketching
from bench.harness import InProcess

META = ("id", "event_time", "window", "label")


@dataclass(frozen=True)
class Replay:
    """What every stream of a sweep shares: the data in both shapes, the plan, the operating
    point and the model training."""

    df: pd.DataFrame
    obs: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    plan: Plan
    sketching: Sketching
    training: lgbm.Training

    @classmethod
    def of(
        cls, df: pd.DataFrame, plan: Plan, sketching: Sketching, training: lgbm.Training
    ) -> Replay:
        obs, rows = sketching.observations(df), sketching.feature_rows(df)
        return cls(df, obs, rows, plan, sketching, training)


async def replay(
    svc: InProcess, rp: Replay, share: float, privacy: Privacy, draw: int = 0
) -> list[Eval]:
    w = rp.plan.window(share)
    cut_at = rp.plan.cut_windows(share)
    last = max(cut_at)
    name = f"acc-{secrets.token_hex(4)}"
    body = rp.sketching.stream_body(name, privacy, retention=last + 1)
    r = await svc.call("POST", "/streams", "admin", 201, json=body)
    expected = rp.sketching.noise(privacy).scale
    if not math.isclose(r.json()["noise_scale"], expected, rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"noise_scale {r.json()['noise_scale']} != core's {expected}")
    batch = svc.settings.max_batch
    out: list[Eval] = []
    for k in range(1, last + 1):
        lo_k, hi_k = (k - 1) * w, k * w
        for lo in range(lo_k, hi_k, batch):
            part = rp.obs[lo : min(lo + batch, hi_k)]
            url = f"/streams/{name}/observations"
            r = await svc.call("POST", url, "producer", 202, json={"observations": part})
            if r.json() != {"accepted": len(part), "window": k}:
                raise RuntimeError(f"ingest into window {k}: {r.json()}")
        if k in cut_at:
            found = await evaluate(svc, rp, name, share, privacy, cut_at[k], k)
            found.draw = draw
            out.append(found)
        if k < last:
            r = await svc.call("POST", f"/streams/{name}/roll", "admin")
            if r.json() != {"epoch": k + 1}:
                raise RuntimeError(f"roll after window {k}: {r.json()}")
            await svc.settle(name)
    await svc.forget(name)
    return out


async def evaluate(
    svc: InProcess, rp: Replay, name: str, share: float, privacy: Privacy, cut: int, epoch: int
) -> Eval:
    w = rp.plan.window(share)
    r = await svc.call("GET", f"/streams/{name}/trainset", "model")
    if r.headers["X-Selectivity-Epoch"] != str(epoch):
        raise RuntimeError(f"train set of epoch {r.headers['X-Selectivity-Epoch']} != {epoch}")
    table = pa.ipc.open_stream(r.content).read_all()
    columns = [c for c in table.column_names if c not in META]
    train = table.to_pandas()
    hot = rp.df.iloc[cut - w : cut]
    if len(train) != w or set(train["id"]) != set(hot["id"]):
        raise RuntimeError(f"train set of epoch {epoch} is not the hot window's {w} rows")
    train = train.set_index("id").loc[hot["id"]]  # time order (early stopping uses its tail)
    x_train = np.ascontiguousarray(train[columns].to_numpy(), dtype=np.float64)
    y_train = (train["label"] == "1").to_numpy(dtype=np.float64)

    t = rp.plan.test(cut)
    test_rows = rp.rows[t]
    parts = []
    step = svc.settings.max_batch
    for lo in range(0, len(test_rows), step):
        url = f"/streams/{name}/featurize"
        r = await svc.call("POST", url, "model", json={"rows": test_rows[lo : lo + step]})
        out = r.json()
        if out["epoch"] != epoch or out["columns"] != columns:
            raise RuntimeError("featurize answered another epoch or other columns")
        parts.append(np.asarray(out["rows"], dtype=np.float64))
    x_test = np.vstack(parts)
    p, rounds = await asyncio.to_thread(lgbm.fit_predict, x_train, y_train, x_test, rp.training)
    yt = movielens.labels01(rp.df)[t]
    return Eval(
        "http",
        share,
        privacy.label,
        cut,
        lgbm.log_loss(yt, p),
        lgbm.auc(yt, p),
        rounds,
        backoff_movie=backoff(x_test, columns, "movie_id"),
        backoff_user=backoff(x_test, columns, "user_id"),
    )


def backoff(x: np.ndarray, columns: list[str], feature: str) -> float:
    """Share of rows whose ``feature`` table backs off (NaN without that table)."""
    name = f"{feature}:backoff"
    return float(x[:, columns.index(name)].mean()) if name in columns else math.nan


async def sweep(
    rp: Replay,
    shares: Sequence[float],
    configs: Sequence[Privacy],
    say: Callable[[str], None],
    *,
    concurrency: int = 2,
    draws_eps1: int = 1,
) -> list[Eval]:
    """Every (share, privacy) configuration is its own stream, replayed from the start (the
    ε = 1 ones ``draws_eps1`` times, each a fresh stream, so a fresh noise draw);
    ``concurrency`` streams at a time share the app (one waits on Redis or on the noise
    thread while another parses JSON)."""
    out: list[Eval] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(svc: InProcess, share: float, privacy: Privacy, draw: int) -> None:
        async with gate:
            started = time.perf_counter()
            evals = await replay(svc, rp, share, privacy, draw)
        out.extend(evals)
        say(
            f"http       share {share:>4.0%} {privacy.label:<26} draw {draw + 1}: "
            f"log-loss {statistics.mean(e.log_loss for e in evals):.4f} "
            f"AUC {statistics.mean(e.auc for e in evals):.4f} "
            f"movie back-off {statistics.mean(e.backoff_movie for e in evals):.0%} "
            f"({time.perf_counter() - started:.1f}s)"
        )

    async with InProcess() as svc:
        await asyncio.gather(
            *(
                one(svc, s, p, d)
                for s in shares
                for p in configs
                for d in range(draws_eps1 if p.epsilon == 1.0 else 1)
            )
        )
    return out

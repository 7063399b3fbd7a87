"""``selectivity bench accuracy --drift --confirm-http``: one configuration of the drift
evaluation through the service's HTTP API (``bench.accuracy.http_arm``, in process), against
the in-process arm (``bench.accuracy.drift_arm``) on the same rows: MovieLens 100K, 10 %
windows, hot window the 80-90 % one (h = 1), count period the eight windows before it,
laplace ε = 1, sketch 16384 × 3, ``max_tables`` = features + 1; test rows the 1,000 ratings after
the hot window (the HTTP arm's test rows), featurized with the same tables as the train set.
Each arm takes ``draws`` independent noise draws (a fresh stream each over HTTP); the two
should agree within their spreads."""

from __future__ import annotations

import asyncio
import statistics

import numpy as np

from bench import lgbm, movielens
from bench.accuracy import http_arm
from bench.accuracy.drift import TRAINING, _arm
from bench.accuracy.plan import Privacy, Sketching, make_plan
from bench.report import Clock, Table


def core_draws(draws: int, test_rows: int) -> list[tuple[float, float]]:
    arm = _arm("movielens", None)
    s = arm.stream
    k, e = 8, 9
    train, test = s.rows(k, e), slice(s.bounds[e], s.bounds[e] + test_rows)
    exact = arm.exact(k)
    out = []
    for _ in range(draws):
        noise = arm.draw([k], n_windows=k)
        cells = [c + n for c, n in zip(exact, noise.tables[k], strict=True)]
        prior = arm.noisy_prior(noise, range(k)).sum(axis=0)
        x_tr, x_te = arm.columns(arm.runtime(1), cells, prior, k, [train, test])
        p, _ = lgbm.fit_predict(x_tr, s.y[train], x_te, TRAINING)
        out.append((lgbm.log_loss(s.y[test], p), lgbm.auc(s.y[test], p)))
    return out


def confirm(draws: int = 3) -> Table:
    clock = Clock()
    df = movielens.load()
    plan = make_plan(len(df), (0.9,))
    sketching = Sketching()
    replay = http_arm.Replay.of(df, plan, sketching, TRAINING)
    privacy = Privacy("laplace", 1.0)
    evals = asyncio.run(http_arm.sweep(replay, [0.10], [privacy], clock, draws_eps1=draws))
    http = [(e.log_loss, e.auc) for e in evals]
    core = core_draws(draws, plan.test_rows)
    clock(f"http {http}; core {core}")

    def row(name: str, found: list[tuple[float, float]]) -> list[object]:
        ll, auc = np.array(found).T
        sd = (statistics.stdev(ll), statistics.stdev(auc)) if len(ll) > 1 else (np.nan, np.nan)
        return [
            name,
            len(found),
            f"{ll.mean():.4f} ± {sd[0]:.4f}",
            f"{auc.mean():.4f} ± {sd[1]:.4f}",
        ]

    return Table(
        ["arm", "draws", "log-loss", "AUC"],
        [row("HTTP (bench.harness)", http), row("in process (drift_arm)", core)],
        "MovieLens, hot window 80-90 %, next 1,000 ratings, ε = 1: HTTP against in process",
    )

"""Accuracy of count featurization on MovieLens 100K (issue 3): ``selectivity bench accuracy``.

What is compared, on the same test rows (label ``rating >= 4``; features user, movie, genres,
age, gender, occupation, zip3; ratings in time order):

(a) **baseline**: LightGBM with native categorical features on *every* raw rating before the
    cut. Also reported: the same model on the raw hot window only, and the label prior.
(b) **count features, no noise**, through the service (HTTP, in-process app over an embedded
    Redis and SQLite in a temp dir, as the tests build it): one stream per configuration,
    ``hot_windows = 1`` (the train set is the open window), windows of ``share`` of the data
    (1, 2, 5, 10 %), ratings replayed in time order with a forced roll between windows,
    ``retention_windows`` large enough that the count period is *everything before the hot
    window* (Pyramid also keeps all history in its counts). At each cut the model trains on
    ``GET /trainset`` (Arrow) and is tested on the next rows featurized with ``POST /featurize``
    before they are ingested (same epoch, same count period as the train set).
(c) the same under DP: ``laplace`` with ε per window, and ``gaussian`` with the matching ρ =
    ε²/2 (an ε-DP mechanism is ε²/2-zCDP, Bun & Steinke 2016 Prop. 1.4; so a gaussian row
    has the same zCDP bound as the laplace row of its ε, but a weaker pure-DP one).
(d) **count-median vs count-min** under the same noise, in-process on the pure core
    (``service.core``), *not* via HTTP: the same per-window tables built both ways (signed
    increments and the median estimator; unsigned +1 increments and the min estimator), the
    same noise draws added to both, the same featurization, training and test rows.

Cuts: the stream is cut at 50, 60, 70, 80 and 90 % of the ratings; every window share divides
them, so at a cut the hot window is the ``share`` of the data just before it, and the test rows
are the next 1 % of the ratings (the next window for the 1 % share, its first rows for the
others): every configuration and the baseline are scored on exactly the same 5 × 1,000 rows.
Figures are means over the cuts of the per-cut log-loss and AUC; ratios are to the baseline's
mean log-loss.

Every model is LightGBM with the same parameters (``LGB_PARAMS``); the number of rounds is
chosen by early stopping on the last 20 % (in time) of the model's training rows, then the model
is refit on all of them with that many rounds; predictions are averaged over three seeds.

Noise draws: the ε = 1 HTTP configurations are replayed 3 times (fresh streams, so fresh
noise); (d) takes 3 draws per configuration; a per-table ablation (noise on one table at a time,
10 % share, ε = 1) shows which tables carry the DP cost.

Operating point: ``--features`` (which features get a count table, so ``max_tables``),
``--depth`` and ``--width`` change the sketch (Δ1 = T·depth); ``--shares``, ``--epsilons``,
``--mechanisms`` and ``--gaussian-delta`` restrict or change what is run (e.g. ``--depth 1
--features user_id,movie_id,genres,zip3 --epsilons 1 --mechanisms none,laplace --skip-core``).
Such a run prints its report; it appends to BENCHMARKS.md only with ``--append``.

Runtime: about 10 minutes on 2 cores (``--quick``: under 2). The work is split into jobs (one
per share for HTTP, one per share for (d), the ablation, the raw baselines) run by two worker
processes. Per-cut results go to ``bench/plots/accuracy.csv``; ``--from-csv`` re-makes the
report from them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import math
import multiprocessing
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import lightgbm as lgb
import numpy as np
import pandas as pd
import pyarrow as pa
from sklearn.metrics import log_loss as _sk_log_loss
from sklearn.metrics import roc_auc_score

from bench import movielens
from bench.report import BENCHMARKS, ROOT, append_section, markdown_table, plot_path
from service import resources
from service.admin import service as keys_service
from service.app import create_app
from service.config import Settings
from service.core.featurize import (
    FeatureSpec,
    assemble,
    backoff_threshold,
    derived_columns,
    prior_probabilities,
    row_keys,
)
from service.core.noise import (
    discrete_gaussian_variance,
    discrete_laplace_variance,
    sample_noise,
    zcdp_to_approx_dp,
)
from service.core.sketch import (
    SketchSpec,
    aggregate_increments,
    estimate,
    estimate_count_min,
    hash_keys,
)
from service.db.migrate import upgrade

N_CUTS_FULL = (0.5, 0.6, 0.7, 0.8, 0.9)
SHARES_FULL = (0.01, 0.02, 0.05, 0.10)
EPSILONS_FULL = (0.1, 0.5, 1.0, 5.0)
TEST_SHARE = 0.01
# 7 feature tables + the prior table = max_tables 8 (no room for selected groups: the tables,
# and so the columns, are the same at every epoch). Δ1 = T·depth = 24, Δ2 = sqrt(24).
# The operating point (``--features``, ``--width``, ``--depth``) can change these; they are set
# once per process by ``configure`` (in the main process and in every worker).
WIDTH, DEPTH = 16384, 3
FEATURES: tuple[str, ...] = tuple(movielens.FEATURES)
MAX_TABLES = len(FEATURES) + 1
WEIGHTS: dict[str, float] = {}  # the budget split (--table-weights); "prior": the prior table's


def weights_body() -> dict[str, Any]:
    """The stream's ``privacy`` fields of the budget split (none: every table weighs 1)."""
    if not WEIGHTS:
        return {}
    return {
        "table_weights": {f: w for f, w in WEIGHTS.items() if f != "prior"},
        "prior_weight": WEIGHTS.get("prior", 1.0),
    }


@dataclass(frozen=True)
class Sketching:
    """The stream owner's operating point: which features get a count table (and so
    ``max_tables`` = features + the prior table), the sketch width and depth. Δ1 = T·depth."""

    features: tuple[str, ...] = tuple(movielens.FEATURES)
    width: int = WIDTH
    depth: int = DEPTH
    # privacy.table_weights (and "prior": privacy.prior_weight): the budget split across tables
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def max_tables(self) -> int:
        return len(self.features) + 1

    @property
    def default(self) -> bool:
        return self == Sketching()


def configure(sketching: Sketching) -> None:
    """Make ``sketching`` this process's operating point (the module constants above)."""
    global WIDTH, DEPTH, FEATURES, MAX_TABLES, WEIGHTS
    WIDTH, DEPTH = sketching.width, sketching.depth
    WEIGHTS = dict(sketching.weights)
    FEATURES = tuple(sketching.features)
    MAX_TABLES = sketching.max_tables


FEATURE_WORDS = {
    "user_id": "user",
    "movie_id": "movie",
    "genres": "genres",
    "age": "age (bucketed)",
    "gender": "gender",
    "occupation": "occupation",
    "zip3": "zip3",
}


def features_text(features: Sequence[str] | None = None) -> str:
    return ", ".join(FEATURE_WORDS[f] for f in (FEATURES if features is None else features))


def stream_features() -> list[dict[str, Any]]:
    """The stream's features: MovieLens's, restricted to the operating point's."""
    return [f for f in movielens.stream_features() if f["name"] in FEATURES]


def feature_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for ``featurize`` with the operating point's features only (the service refuses
    unknown features)."""
    rows = movielens.feature_rows(df)
    if tuple(movielens.FEATURES) == FEATURES:
        return rows
    return [{f: r[f] for f in FEATURES} for r in rows]


def observations(df: pd.DataFrame) -> list[dict[str, Any]]:
    obs = movielens.observations(df)
    if tuple(movielens.FEATURES) == FEATURES:
        return obs
    for o in obs:
        o["features"] = {f: o["features"][f] for f in FEATURES}
    return obs


@functools.cache
def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """The largest ρ whose ρ-zCDP implies (ε, δ)-DP (``zcdp_to_approx_dp`` is increasing in ρ;
    bisection, rounded down so that the guarantee holds)."""
    lo, hi = 1e-12, max(epsilon, 1.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        if zcdp_to_approx_dp(rho=mid, delta=delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


LGB_PARAMS: dict[str, Any] = {
    "objective": "binary",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
    "deterministic": True,
    "force_col_wise": True,
    # One thread: the benchmark keeps both cores busy with two worker processes (and a model
    # trains while other streams ingest); with 2 OpenMP threads on a busy 2-core machine the
    # spinning threads made every fit 10-20× slower.
    "num_threads": 1,
    "verbose": -1,
}
MAX_ROUNDS = 1000
PATIENCE = 50
VALID_SHARE = 0.2
SEEDS = (7, 8, 9)
CORE_SEED = b"bench-accuracy-core"

Say = Callable[[str], None]


# ------------------------------------------------------------------------------------------
# privacy configurations
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Privacy:
    mechanism: str  # "none" | "laplace" | "gaussian"
    epsilon: float | None = None  # laplace: ε; gaussian: the ε whose ρ = ε²/2
    depth: int | None = None  # sketch depth (Δ1 = T·depth); None: the run's (DEPTH)
    # gaussian only: None for ρ = ε²/2 (the laplace row's zCDP bound); a δ for the largest ρ
    # that is (ε, δ)-DP (the laplace row's ε, with a δ)
    delta: float | None = None

    @property
    def sketch_depth(self) -> int:
        return DEPTH if self.depth is None else self.depth

    @property
    def rho(self) -> float | None:
        if self.mechanism != "gaussian":
            return None
        if self.delta is not None:
            return rho_for_approx_dp(self.epsilon, self.delta)  # type: ignore[arg-type]
        return self.epsilon**2 / 2  # type: ignore[operator]

    @property
    def label(self) -> str:
        if self.mechanism == "none":
            text = "no noise"
        elif self.mechanism == "laplace":
            text = f"laplace ε={self.epsilon:g}"
        else:
            text = (
                f"gaussian ρ={self.rho:g} (ε={self.epsilon:g})"
                if self.delta is None
                else f"gaussian ρ={self.rho:.4g} ((ε={self.epsilon:g}, δ={self.delta:g})-DP)"
            )
        return text if self.sketch_depth == DEPTH else f"{text}, depth {self.sketch_depth}"

    @property
    def body(self) -> dict[str, Any]:
        if self.mechanism == "none":
            return {"mechanism": "none"}
        if self.mechanism == "laplace":
            return {"mechanism": "laplace", "epsilon": self.epsilon}
        return {"mechanism": "gaussian", "rho": self.rho}

    @property
    def scale(self) -> float:
        """Per-cell, per-window noise: Laplace b = Δ1/ε, Gaussian σ = Δ2/sqrt(2ρ)."""
        t_depth = MAX_TABLES * self.sketch_depth
        if self.mechanism == "laplace":
            return t_depth / self.epsilon  # type: ignore[operator]
        if self.mechanism == "gaussian":
            return math.sqrt(t_depth) / math.sqrt(2 * self.rho)  # type: ignore[operator]
        return 0.0

    @property
    def variance(self) -> float:

        if self.mechanism == "laplace":
            return discrete_laplace_variance(scale=self.scale)
        if self.mechanism == "gaussian":
            return discrete_gaussian_variance(sigma=self.scale)
        return 0.0


def privacies(
    epsilons: Sequence[float],
    mechanisms: Sequence[str] = ("none", "laplace", "gaussian"),
    gaussian_delta: float | None = None,
) -> list[Privacy]:
    """The sweep: no noise, laplace ε, gaussian ρ = ε²/2 (or the (ε, δ)-DP ρ with a δ),
    restricted to ``mechanisms``."""
    out = [Privacy("none")] if "none" in mechanisms else []
    if "laplace" in mechanisms:
        out += [Privacy("laplace", e) for e in epsilons]
    if "gaussian" in mechanisms:
        out += [Privacy("gaussian", e, delta=gaussian_delta) for e in epsilons]
    return out


# ------------------------------------------------------------------------------------------
# models and metrics
# ------------------------------------------------------------------------------------------


@dataclass
class Eval:
    method: str  # baseline | prior | raw-hot | http | core-median | core-min
    share: float | None
    privacy: str | None
    cut: int
    log_loss: float
    auc: float
    rounds: int = 0
    backoff_movie: float = math.nan  # test rows whose movie_id table backs off
    backoff_user: float = math.nan
    est_bias: float = math.nan  # core only: mean (estimate − exact count), movie table, test rows
    est_rmse: float = math.nan  # core only: RMS of (estimate − exact count), idem
    draw: int = 0  # core only: which independent noise draw


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    return float(_sk_log_loss(y, np.clip(p, 1e-15, 1 - 1e-15), labels=[0.0, 1.0]))


def auc(y: np.ndarray, p: np.ndarray) -> float:
    return float(roc_auc_score(y, p))


def fit_predict(x_train: Any, y_train: np.ndarray, x_test: Any) -> tuple[np.ndarray, int]:
    """LightGBM with LGB_PARAMS, averaged over SEEDS: for each seed, the rounds are chosen by
    early stopping on the last VALID_SHARE of the (time-ordered) training rows, then the model
    is refit on all of them; the prediction is the mean of the seeds' (which halves the
    run-to-run spread of the figures). Pandas ``category`` columns are native categorical
    features. Returns the predictions and the mean number of rounds."""
    n = len(y_train)
    n_fit = n - max(int(n * VALID_SHARE), 1)

    def rows(x: Any, sl: slice) -> Any:
        return x.iloc[sl] if isinstance(x, pd.DataFrame) else x[sl]

    preds, rounds = [], []
    for seed in SEEDS:
        params = {**LGB_PARAMS, "seed": seed}
        fit = lgb.Dataset(rows(x_train, slice(0, n_fit)), y_train[:n_fit], free_raw_data=False)
        valid = lgb.Dataset(rows(x_train, slice(n_fit, n)), y_train[n_fit:], reference=fit)
        probe = lgb.train(
            params,
            fit,
            num_boost_round=MAX_ROUNDS,
            valid_sets=[valid],
            callbacks=[lgb.early_stopping(PATIENCE, verbose=False)],
        )
        rounds.append(max(int(probe.best_iteration or MAX_ROUNDS), 1))
        model = lgb.train(params, lgb.Dataset(x_train, y_train), num_boost_round=rounds[-1])
        preds.append(np.asarray(model.predict(x_test), dtype=np.float64))
    return np.mean(preds, axis=0), round(statistics.mean(rounds))


def _positional(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64)


# ------------------------------------------------------------------------------------------
# the plan: cuts and windows
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    n: int
    cuts: tuple[int, ...]  # row index of every cut
    test_rows: int

    def window(self, share: float) -> int:
        w = round(share * self.n)
        bad = [c for c in self.cuts if c % w]
        if bad:
            raise SystemExit(f"window of {w} rows ({share:.0%}) does not divide the cuts {bad}")
        return w

    def test(self, cut: int) -> slice:
        return slice(cut, cut + self.test_rows)


def make_plan(n: int, cut_shares: Sequence[float]) -> Plan:
    return Plan(n, tuple(round(c * n) for c in cut_shares), round(TEST_SHARE * n))


# ------------------------------------------------------------------------------------------
# (a) the raw baselines
# ------------------------------------------------------------------------------------------


def raw_evals(df: pd.DataFrame, plan: Plan, shares: Sequence[float], say: Say) -> list[Eval]:
    raw = movielens.raw_frame(df)
    y = movielens.labels01(df)
    out: list[Eval] = []
    for cut in plan.cuts:
        t = plan.test(cut)
        started = time.perf_counter()
        p, rounds = fit_predict(raw.iloc[:cut], y[:cut], raw.iloc[t])
        out.append(Eval("baseline", None, None, cut, log_loss(y[t], p), auc(y[t], p), rounds))
        prior = np.full(len(p), y[:cut].mean())
        out.append(Eval("prior", None, None, cut, log_loss(y[t], prior), 0.5))
        say(
            f"baseline   cut {cut:>6}: log-loss {out[-2].log_loss:.4f} AUC {out[-2].auc:.4f} "
            f"({rounds} rounds, {time.perf_counter() - started:.1f}s)"
        )
        for share in shares:
            w = plan.window(share)
            hot = slice(cut - w, cut)
            p, rounds = fit_predict(raw.iloc[hot], y[hot], raw.iloc[t])
            out.append(Eval("raw-hot", share, None, cut, log_loss(y[t], p), auc(y[t], p), rounds))
    return out


# ------------------------------------------------------------------------------------------
# (b, c) through the service
# ------------------------------------------------------------------------------------------

META = ["id", "event_time", "window", "label"]


class Service:
    """The app in-process (httpx ASGITransport) over an embedded Redis and SQLite in a temp
    dir, with admin, producer and model keys: as ``tests/conftest.py`` builds it."""

    async def __aenter__(self) -> Service:
        self._tmp = tempfile.TemporaryDirectory(prefix="selectivity-accuracy-")
        self.settings = Settings(
            env="development",
            data_dir=Path(self._tmp.name),
            redis_url=None,
            database_url=None,
            redis_prefix="bench",
            embedded_worker=False,
            max_batch=10_000,
        )
        upgrade(self.settings.resolved_database_url)
        self.embedded = resources.EmbeddedRedis(self.settings)
        self.ctx = await resources.build(self.settings, embedded=self.embedded)
        self.keys: dict[str, str] = {}
        async with self.ctx.sessionmaker() as session, session.begin():
            for role in ("admin", "producer", "model"):
                self.keys[role] = (await keys_service.create(session=session, role=role)).key
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(ctx=self.ctx)),
            base_url="http://bench",
            timeout=None,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await resources.close(self.ctx)
        self.embedded.close()
        self._tmp.cleanup()

    async def call(self, method: str, url: str, role: str, status: int = 200, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.keys[role]}"}
        r = await self.client.request(method, f"/v1{url}", headers=headers, **kw)
        if r.status_code != status:
            raise RuntimeError(f"{method} {url}: {r.status_code} {r.text[:500]}")
        return r

    async def settle(self) -> None:
        """Wait for the background preparation a forced roll starts (the next window's noise)."""
        await asyncio.gather(*list(self.ctx.caches.get("background", ())))

    async def forget(self, name: str) -> None:
        """Free the stream's Redis memory once its configuration is measured (the service has
        no stream deletion yet; the benchmark owns this Redis)."""
        prefix = self.settings.redis_prefix
        for pattern in (f"{prefix}:{{{name}}}:*", f"{prefix}:{{{name}:*"):
            batch = [k async for k in self.ctx.redis.scan_iter(match=pattern, count=1000)]
            for lo in range(0, len(batch), 1000):
                await self.ctx.redis.delete(*batch[lo : lo + 1000])


async def replay(
    svc: Service,
    df: pd.DataFrame,
    obs: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    plan: Plan,
    share: float,
    privacy: Privacy,
    draw: int = 0,
) -> list[Eval]:
    w = plan.window(share)
    cut_at = {cut // w: cut for cut in plan.cuts}
    last = max(cut_at)
    y = movielens.labels01(df)
    name = f"acc-{secrets.token_hex(4)}"
    body = {
        "name": name,
        "features": stream_features(),
        "labels": ["0", "1"],
        "window_seconds": 366 * 86400,  # no scheduled roll: only the forced ones below
        "hot_windows": 1,
        "retention_windows": last + 1,  # the count period is all history
        "privacy": {**privacy.body, **weights_body()},
        "sketch": {"width": WIDTH, "depth": privacy.sketch_depth},
        "max_tables": MAX_TABLES,
    }
    r = await svc.call("POST", "/streams", "admin", 201, json=body)
    scale = r.json()["noise_scale"]
    if not math.isclose(scale, privacy.scale, rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"noise_scale {scale} != expected {privacy.scale}")
    batch = svc.settings.max_batch
    out: list[Eval] = []
    for k in range(1, last + 1):
        lo_k, hi_k = (k - 1) * w, k * w
        for lo in range(lo_k, hi_k, batch):
            part = obs[lo : min(lo + batch, hi_k)]
            r = await svc.call(
                "POST",
                f"/streams/{name}/observations",
                "producer",
                202,
                json={"observations": part},
            )
            if r.json() != {"accepted": len(part), "window": k}:
                raise RuntimeError(f"ingest into window {k}: {r.json()}")
        if k in cut_at:
            found = await _evaluate(svc, name, df, rows, y, plan, share, privacy, cut_at[k], k)
            found.draw = draw
            out.append(found)
        if k < last:
            r = await svc.call("POST", f"/streams/{name}/roll", "admin")
            if r.json() != {"epoch": k + 1}:
                raise RuntimeError(f"roll after window {k}: {r.json()}")
            await svc.settle()
    await svc.forget(name)
    return out


async def _evaluate(
    svc: Service,
    name: str,
    df: pd.DataFrame,
    rows: list[dict[str, Any]],
    y: np.ndarray,
    plan: Plan,
    share: float,
    privacy: Privacy,
    cut: int,
    epoch: int,
) -> Eval:
    w = plan.window(share)
    r = await svc.call("GET", f"/streams/{name}/trainset", "model")
    if r.headers["X-Selectivity-Epoch"] != str(epoch):
        raise RuntimeError(f"train set of epoch {r.headers['X-Selectivity-Epoch']} != {epoch}")
    table = pa.ipc.open_stream(r.content).read_all()
    columns = [c for c in table.column_names if c not in META]
    train = table.to_pandas()
    hot = df.iloc[cut - w : cut]
    if len(train) != w or set(train["id"]) != set(hot["id"]):
        raise RuntimeError(f"train set of epoch {epoch} is not the hot window's {w} rows")
    train = train.set_index("id").loc[hot["id"]]  # time order (early stopping uses its tail)
    x_train = _positional(train[columns].to_numpy())
    y_train = (train["label"] == "1").to_numpy(dtype=np.float64)

    t = plan.test(cut)
    parts = []
    test_rows = rows[t]
    for lo in range(0, len(test_rows), svc.settings.max_batch):
        r = await svc.call(
            "POST",
            f"/streams/{name}/featurize",
            "model",
            json={"rows": test_rows[lo : lo + svc.settings.max_batch]},
        )
        out = r.json()
        if out["epoch"] != epoch or out["columns"] != columns:
            raise RuntimeError("featurize answered another epoch or other columns")
        parts.append(np.asarray(out["rows"], dtype=np.float64))
    x_test = np.vstack(parts)
    p, rounds = await asyncio.to_thread(fit_predict, x_train, y_train, x_test)
    yt = y[t]
    return Eval(
        "http",
        share,
        privacy.label,
        cut,
        log_loss(yt, p),
        auc(yt, p),
        rounds,
        backoff_movie=_backoff(x_test, columns, "movie_id"),
        backoff_user=_backoff(x_test, columns, "user_id"),
    )


def _backoff(x: np.ndarray, columns: list[str], feature: str) -> float:
    """Share of rows whose ``feature`` table backs off (NaN without that table)."""
    name = f"{feature}:backoff"
    return float(x[:, columns.index(name)].mean()) if name in columns else math.nan


async def http_sweep(
    df: pd.DataFrame,
    plan: Plan,
    shares: Sequence[float],
    configs: Sequence[Privacy],
    say: Say,
    concurrency: int = 2,
    draws_eps1: int = 1,
) -> list[Eval]:
    """Every (share, privacy) configuration is its own stream, replayed from the start (the
    ε = 1 ones ``draws_eps1`` times, each a fresh stream, so a fresh noise draw);
    ``concurrency`` streams at a time share the app (one waits on Redis or on the noise
    thread while another parses JSON)."""
    obs = observations(df)
    rows = feature_rows(df)
    out: list[Eval] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(svc: Service, share: float, privacy: Privacy, draw: int) -> None:
        async with gate:
            started = time.perf_counter()
            evals = await replay(svc, df, obs, rows, plan, share, privacy, draw)
        out.extend(evals)
        say(
            f"http       share {share:>4.0%} {privacy.label:<26} draw {draw + 1}: "
            f"log-loss {statistics.mean(e.log_loss for e in evals):.4f} "
            f"AUC {statistics.mean(e.auc for e in evals):.4f} "
            f"movie back-off {statistics.mean(e.backoff_movie for e in evals):.0%} "
            f"({time.perf_counter() - started:.1f}s)"
        )

    async with Service() as svc:
        await asyncio.gather(
            *(
                one(svc, s, p, d)
                for s in shares
                for p in configs
                for d in range(draws_eps1 if p.epsilon == 1.0 else 1)
            )
        )
    return out


# ------------------------------------------------------------------------------------------
# (d) count-median vs count-min on the core
# ------------------------------------------------------------------------------------------


class Core:
    """Count tables of the MovieLens stream built in-process with the pure core modules, as
    the service builds them: per-window tables = noise + increments; the count-period
    aggregate at a cut = (increments of every rating before the hot window) + (the noise of
    every window before it), which is the sum of the per-window tables since sketches are
    linear. ``kind`` "median" is the service's signed count-median sketch; "min" a count-min
    sketch (unsigned +1 increments, min estimator) for comparison."""

    def __init__(self, df: pd.DataFrame) -> None:

        self.features = [
            FeatureSpec(f["name"], f["kind"], tuple(f.get("buckets") or ()))
            for f in stream_features()
        ]
        self.names = [f.name for f in self.features]
        self.values = row_keys(feature_rows(df), self.features)
        self.y = movielens.labels01(df)
        self.labels = self.y.astype(np.int64)
        self.movies = df["movie_id"].to_numpy()
        self._sketches: dict[int, tuple[SketchSpec, dict[str, tuple[np.ndarray, np.ndarray]]]] = {}
        self._increments: dict[tuple[int, str, int], dict[str, np.ndarray]] = {}

    def sketch(self, depth: int) -> tuple[SketchSpec, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """The SketchSpec and every row's (buckets, signs), per table, for a sketch depth."""

        if depth not in self._sketches:
            spec = SketchSpec(width=WIDTH, depth=depth, n_labels=2)
            self._sketches[depth] = (
                spec,
                {
                    n: hash_keys(self.values[n], seed=CORE_SEED, table=n, spec=spec)
                    for n in self.names
                },
            )
        return self._sketches[depth]

    def increments(self, upto: int, kind: str, depth: int) -> dict[str, np.ndarray]:
        """Cells of every table after the first ``upto`` ratings, without noise."""

        key = (upto, kind, depth)
        if key not in self._increments:
            spec, hashed = self.sketch(depth)
            out = {}
            for n in self.names:
                buckets, signs = hashed[n]
                s = signs[:upto] if kind == "median" else np.ones_like(signs[:upto])
                idx, deltas = aggregate_increments(self.labels[:upto], buckets[:upto], s, spec)
                cells = np.zeros(spec.cells, np.int64)
                cells[idx] += deltas
                out[n] = cells
            self._increments[key] = out
        return self._increments[key]

    def featurize(
        self,
        agg: dict[str, np.ndarray],
        prior: np.ndarray,
        thresholds: dict[str, float],
        sl: slice,
        kind: str,
        depth: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The service's columns for rows ``sl``, and the raw movie_id estimates (n, 2)."""

        spec, hashed = self.sketch(depth)
        per_table = []
        movie_est = np.empty(0)
        for n in self.names:
            buckets, signs = hashed[n]
            if kind == "median":
                est = estimate(agg[n], buckets[sl], signs[sl], spec)
            else:
                est = estimate_count_min(agg[n], buckets[sl], spec)
            if n == "movie_id":
                movie_est = est
            per_table.append(derived_columns(est, prior=prior, alpha=1.0, threshold=thresholds[n]))
        return assemble(per_table, [], sl.stop - sl.start), movie_est

    def exact_movie_counts(self, counted: int, sl: slice) -> np.ndarray:
        """Exact count of each row's movie per label over the first ``counted`` ratings."""
        frame = pd.DataFrame({"m": self.movies[:counted], "y": self.labels[:counted]})
        table = frame.groupby(["m", "y"]).size().unstack(fill_value=0).reindex(columns=[0, 1])
        return table.reindex(self.movies[sl]).fillna(0).to_numpy(dtype=np.float64)

    def run(
        self,
        plan: Plan,
        share: float,
        privacy: Privacy,
        *,
        draw: int = 0,
        kinds: Sequence[str] = ("median", "min"),
        noisy: Sequence[str] | None = None,
        method: str | None = None,
    ) -> list[Eval]:
        """One noise draw of a configuration at every cut. ``noisy``: the tables that get
        noise (default all, the prior table included); the others are exact and never back
        off (for the per-table ablation)."""

        spec, _ = self.sketch(privacy.sketch_depth)
        noisy_set = set(self.names) | {"prior"} if noisy is None else set(noisy)
        w = plan.window(share)
        cut_at = {cut // w: cut for cut in plan.cuts}
        n_tables = len(self.names)
        noise = np.zeros(n_tables * spec.cells, np.int64)
        prior_noise = np.zeros(2, np.int64)
        found: list[Eval] = []
        for k in range(1, max(cut_at) + 1):
            if k >= 2 and privacy.mechanism != "none":  # window k-1 is now counted
                fresh = sample_noise(
                    mechanism=privacy.mechanism,  # type: ignore[arg-type]
                    scale=privacy.scale,
                    size=n_tables * spec.cells + 2,
                )
                noise += fresh[:-2]
                prior_noise += fresh[-2:]
            if k not in cut_at:
                continue
            cut = cut_at[k]
            counted = cut - w  # the ratings of windows 1 .. k-1
            threshold = backoff_threshold(
                noise_variance=privacy.variance, n_windows=k - 1, n_labels=2, sigmas=1.0
            )
            thresholds = {n: threshold if n in noisy_set else 0.0 for n in self.names}
            prior_counts = np.bincount(self.labels[:counted], minlength=2)
            if "prior" in noisy_set:
                prior_counts = prior_counts + prior_noise
            prior = prior_probabilities(prior_counts)
            hot, t = slice(cut - w, cut), plan.test(cut)
            exact = self.exact_movie_counts(counted, t)
            for kind in kinds:
                inc = self.increments(counted, kind, privacy.sketch_depth)
                agg = {
                    n: inc[n] + noise[i * spec.cells : (i + 1) * spec.cells]
                    if n in noisy_set
                    else inc[n]
                    for i, n in enumerate(self.names)
                }
                depth = privacy.sketch_depth
                x_train, _ = self.featurize(agg, prior, thresholds, hot, kind, depth)
                x_test, movie_est = self.featurize(agg, prior, thresholds, t, kind, depth)
                err = movie_est - exact if len(movie_est) else np.full(1, math.nan)
                p, rounds = fit_predict(x_train, self.y[hot], x_test)
                movie = self.names.index("movie_id") if "movie_id" in self.names else -1
                found.append(
                    Eval(
                        method or f"core-{kind}",
                        share,
                        privacy.label,
                        cut,
                        log_loss(self.y[t], p),
                        auc(self.y[t], p),
                        rounds,
                        backoff_movie=float(x_test[:, 6 * movie + 5].mean())
                        if movie >= 0
                        else math.nan,
                        est_bias=float(err.mean()),
                        est_rmse=float(np.sqrt((err**2).mean())),
                        draw=draw,
                    )
                )
        return found


def core_sweep(
    core: Core,
    plan: Plan,
    shares: Sequence[float],
    configs: Sequence[Privacy],
    say: Say,
    draws: int = 1,
) -> list[Eval]:
    """(d): both sketches, the same noise draws, ``draws`` draws per noisy configuration."""
    out: list[Eval] = []
    for share in shares:
        for privacy in configs:
            for draw in range(draws if privacy.mechanism != "none" else 1):
                started = time.perf_counter()
                found = core.run(plan, share, privacy, draw=draw)
                out += found
                med = [e.log_loss for e in found if e.method == "core-median"]
                cmin = [e.log_loss for e in found if e.method == "core-min"]
                say(
                    f"core       share {share:>4.0%} {privacy.label:<26} draw {draw + 1}: "
                    f"log-loss count-median {statistics.mean(med):.4f} "
                    f"count-min {statistics.mean(cmin):.4f} "
                    f"({time.perf_counter() - started:.1f}s)"
                )
    return out


def ablation(
    core: Core, plan: Plan, share: float, privacy: Privacy, say: Say, draws: int = 1
) -> list[Eval]:
    """Where the DP cost comes from: noise on one table at a time (the others, and the prior
    table, exact), count-median only."""
    out: list[Eval] = []
    for name in core.names:
        started = time.perf_counter()
        found: list[Eval] = []
        for draw in range(draws):
            found += core.run(
                plan,
                share,
                privacy,
                draw=draw,
                kinds=("median",),
                noisy=[name],
                method=f"ablation:{name}",
            )
        out += found
        say(
            f"ablation   share {share:>4.0%} {privacy.label} on {name:<10} only: log-loss "
            f"{statistics.mean(e.log_loss for e in found):.4f} "
            f"({time.perf_counter() - started:.1f}s)"
        )
    return out


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    shares: tuple[float, ...]
    epsilons: tuple[float, ...]
    cut_shares: tuple[float, ...]
    core_shares: tuple[float, ...]
    core_epsilons: tuple[float, ...]
    core_draws: int
    ablation_share: float | None
    ablation_draws: int
    http_draws_eps1: int
    quick: bool
    mechanisms: tuple[str, ...] = ("none", "laplace", "gaussian")
    gaussian_delta: float | None = None  # gaussian rows: ρ for (ε, δ)-DP instead of ε²/2
    sketching: Sketching = Sketching()

    def privacy(self, mechanism: str, epsilon: float | None = None) -> Privacy:
        delta = self.gaussian_delta if mechanism == "gaussian" else None
        return Privacy(mechanism, epsilon, delta=delta)

    def configs(self) -> list[Privacy]:
        return privacies(self.epsilons, self.mechanisms, self.gaussian_delta)


QUICK = Setup((0.02, 0.10), (1.0,), (0.7, 0.9), (0.10,), (1.0,), 2, None, 0, 1, True)
# (d) at ε ∈ {1, 5} (at ε ≤ 0.5 both sketches sit near the label prior), 3 noise draws each;
# the per-table ablation at 10 %, ε = 1, 2 draws; the ε = 1 HTTP rows 3 draws (fresh streams).
FULL = Setup(SHARES_FULL, EPSILONS_FULL, N_CUTS_FULL, SHARES_FULL, (1.0, 5.0), 3, 0.10, 2, 3, False)


def _pct(share: float) -> str:
    return f"{share * 100:g} %"


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """Means over the cuts (and over the noise draws of the core runs) per (method, share,
    privacy), the ratio to the baseline's log-loss, and ``ratio_sd``: the standard deviation
    of the ratio across noise draws (NaN with a single draw)."""
    f = frame.copy()
    f["share"] = f["share"].fillna(0.0)
    f["privacy"] = f["privacy"].fillna("")
    for col in ("backoff_movie", "backoff_user", "est_bias", "est_rmse"):
        if col not in f:
            f[col] = math.nan
    if "draw" not in f:
        f["draw"] = 0
    keys = ["method", "share", "privacy"]
    cols = ["log_loss", "auc", "rounds", "backoff_movie", "backoff_user", "est_bias", "est_rmse"]
    per_draw = f.groupby([*keys, "draw"], sort=False)[cols].mean().reset_index()
    g = per_draw.groupby(keys, sort=False)[cols].mean().reset_index()
    g["draws"] = per_draw.groupby(keys, sort=False)["draw"].nunique().to_numpy()
    base = g.loc[g["method"] == "baseline", "log_loss"].iloc[0]
    g["ratio"] = g["log_loss"] / base
    sd = per_draw.groupby(keys, sort=False)["log_loss"].std().to_numpy()
    g["ratio_sd"] = sd / base
    return g


def _get(g: pd.DataFrame, method: str, share: float = 0.0, privacy: str = "") -> pd.Series | None:
    hit = g[(g["method"] == method) & np.isclose(g["share"], share) & (g["privacy"] == privacy)]
    return None if hit.empty else hit.iloc[0]


def signal_vs_noise(
    df: pd.DataFrame, plan: Plan, share: float, privacy: Privacy
) -> tuple[int, float, float, float, float]:
    """At the last cut: (windows in the count period, count-period noise s.d. per cell and
    label, back-off threshold, median exact count of a test row's movie in the count period
    (both labels), share of test rows whose movie has fewer exact ratings than the
    threshold)."""

    cut = max(plan.cuts)
    w = plan.window(share)
    windows = cut // w - 1
    sd = math.sqrt(privacy.variance * windows)
    thr = backoff_threshold(
        noise_variance=privacy.variance, n_windows=windows, n_labels=2, sigmas=1.0
    )
    counts = df["movie_id"].iloc[: cut - w].value_counts()
    test = df["movie_id"].iloc[plan.test(cut)].map(counts).fillna(0).to_numpy()
    return windows, sd, thr, float(np.median(test)), float((test < thr).mean())


def novelty(df: pd.DataFrame, plan: Plan, share: float) -> tuple[float, float]:
    """Mean over the cuts of the share of test rows whose user has no rating in the count
    period (what count features know), and no rating before the cut at all (what the
    baseline knows)."""
    users = df["user_id"].to_numpy()
    w = plan.window(share)
    in_counts, before = [], []
    for cut in plan.cuts:
        test = users[plan.test(cut)]
        in_counts.append(float((~np.isin(test, users[: cut - w])).mean()))
        before.append(float((~np.isin(test, users[:cut])).mean()))
    return statistics.mean(in_counts), statistics.mean(before)


def plots(g: pd.DataFrame, setup: Setup, tag: str) -> tuple[Path, Path | None]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = list(setup.shares)
    xs = [s * 100 for s in shares]
    colors = plt.get_cmap("viridis")(np.linspace(0.05, 0.85, len(setup.epsilons)))
    mechs = [m for m in ("laplace", "gaussian") if m in setup.mechanisms] or ["laplace"]
    fig, axes = plt.subplots(
        2, len(mechs), figsize=(5.5 * len(mechs), 8), sharex=True, sharey="row"
    )
    axes = np.asarray(axes).reshape(2, len(mechs))
    base = _get(g, "baseline")
    assert base is not None
    for col, mech in enumerate(mechs):
        for row, metric in enumerate(("ratio", "auc")):
            ax = axes[row][col]

            def line(
                method: str, privacy: str, metric: str = metric, ax: Any = ax, **kw: Any
            ) -> None:
                ys = [_get(g, method, s, privacy) for s in shares]
                if all(v is not None for v in ys):
                    ax.plot(xs, [v[metric] for v in ys], marker="o", **kw)  # type: ignore[index]

            line("http", "no noise", color="black", lw=2, label="count features, no noise")
            for eps, c in sorted(zip(setup.epsilons, colors, strict=True), reverse=True):
                pr = setup.privacy(mech, eps)
                name = f"ε = {eps:g}" if mech == "laplace" else f"ρ = {pr.rho:.3g} (ε = {eps:g})"
                line("http", pr.label, color=c, label=name)
            line("raw-hot", "", color="grey", ls="--", label="raw hot window only (categorical)")
            if metric == "ratio":
                ax.axhline(1.0, color="tab:red", lw=1, label="baseline (all raw data)")
                ax.axhspan(1.0, 1.05, color="tab:red", alpha=0.08, label="within 5 % of baseline")
                prior = _get(g, "prior")
                if prior is not None:
                    ax.axhline(prior["ratio"], color="grey", ls=":", label="label prior")
                per = (
                    "ε per window"
                    if mech == "laplace"
                    else "ρ = ε²/2 per window"
                    if setup.gaussian_delta is None
                    else f"ρ for (ε, δ = {setup.gaussian_delta:g})-DP per window"
                )
                point = "" if setup.sketching.default else f" (depth {DEPTH}, T = {MAX_TABLES})"
                ax.set_title(f"{mech}: {per}{point}")
                if col == 0:
                    ax.set_ylabel("test log-loss / baseline log-loss")
            else:
                ax.axhline(base["auc"], color="tab:red", lw=1, label="baseline (all raw data)")
                if col == 0:
                    ax.set_ylabel("test AUC")
                ax.set_xlabel("exposure: hot window, % of all ratings (log scale)")
            ax.set_xscale("log")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
            if row == 1:
                handles, names = axes[0][col].get_legend_handles_labels()
                ax.legend(
                    handles,
                    names,
                    fontsize=8,
                    loc="upper center",
                    bbox_to_anchor=(0.5, -0.2),
                    ncol=2,
                )
    title = "MovieLens 100K, rating ≥ 4: LightGBM on count features through the service"
    if not setup.sketching.default:
        title += f"\n(count tables: {features_text()}; width {WIDTH}, depth {DEPTH})"
    fig.suptitle(
        f"{title}, mean of {len(setup.cut_shares)} cuts" + (" (quick run)" if setup.quick else ""),
        fontsize=10,
    )
    fig.tight_layout()
    first = _out_path(setup, tag, "_logloss")
    fig.savefig(first, dpi=110, bbox_inches="tight")
    plt.close(fig)

    core = g[g["method"].isin(["core-median", "core-min"])]
    if core.empty:
        return first, None
    cshares = sorted(core["share"].unique())
    configs = [Privacy("none").label] + [
        Privacy("laplace", e).label for e in sorted(setup.core_epsilons, reverse=True)
    ]
    fig, axes = plt.subplots(1, len(cshares), figsize=(3.2 * len(cshares) + 1, 4), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, share in zip(axes, cshares, strict=True):
        pos = np.arange(len(configs))
        for k, (method, name, color) in enumerate(
            (("core-median", "count-median", "tab:blue"), ("core-min", "count-min", "tab:orange"))
        ):
            vals = [_get(g, method, share, c) for c in configs]
            hs = [v["ratio"] if v is not None else np.nan for v in vals]
            err = [v["ratio_sd"] if v is not None else np.nan for v in vals]
            ax.bar(
                pos + (k - 0.5) * 0.38,
                hs,
                width=0.38,
                color=color,
                label=name,
                yerr=np.nan_to_num(err),
                capsize=3,
            )
        ax.axhline(1.0, color="tab:red", lw=1)
        ax.set_xticks(pos, [c.replace("laplace ", "") for c in configs], rotation=30, fontsize=8)
        ax.set_title(f"hot window {_pct(share)}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        lo = np.nanmin(core["ratio"])
        ax.set_ylim(min(0.95, lo - 0.02), None)
    axes[0].set_ylabel("test log-loss / baseline log-loss")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "count-median vs count-min tables under the same Laplace noise (core, in-process; "
        f"mean of {setup.core_draws} noise draws, bars ± 1 s.d.)",
        fontsize=10,
    )
    fig.tight_layout()
    second = _out_path(setup, tag, "_sketches")
    fig.savefig(second, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return first, second


OUT: Path | None = None  # ``--out``: path prefix of the CSV and the plots (default bench/plots)


def _out_path(setup: Setup, tag: str, suffix: str) -> Path:
    if OUT is None:
        return plot_path(f"accuracy{tag}{suffix}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    return OUT.parent / f"{OUT.name}{suffix}.png"


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def report(
    frame: pd.DataFrame, df: pd.DataFrame, setup: Setup, elapsed: float
) -> tuple[str, list[str]]:
    """The BENCHMARKS.md section and the headline lines."""
    plan = make_plan(len(df), setup.cut_shares)
    g = summarise(frame)
    base = _get(g, "baseline")
    prior = _get(g, "prior")
    assert base is not None and prior is not None
    tag = "_quick" if setup.quick else ""
    fig1, fig2 = plots(g, setup, tag)
    y = movielens.labels01(df)
    cut_list = ", ".join(f"{c:g}" for c in (100 * np.array(setup.cut_shares)))
    out: list[str] = []
    w = out.append

    w(
        f"MovieLens 100K ({len(df):,} ratings, {y.mean():.1%} positive), label `rating >= 4`, "
        f"features {features_text(movielens.FEATURES)}, replayed in time order"
        + (
            ""
            if tuple(movielens.FEATURES) == FEATURES
            else f" (count tables for {features_text()} only; the raw baselines use all of them)"
        )
        + f". The stream is cut at {cut_list} % of the ratings; at each cut every "
        f"model is tested on the next {plan.test_rows:,} ratings (the same "
        f"{len(plan.cuts)} × {plan.test_rows:,} rows for every configuration) and the figures "
        f"are means over the cuts. Total runtime {elapsed / 60:.1f} min."
    )
    w("")
    w(
        "- **(a) baseline**: LightGBM with native categorical features on *every* raw rating "
        "before the cut (exposure = the cut: "
        f"{min(setup.cut_shares):.0%}-{max(setup.cut_shares):.0%} of the data)."
    )
    w(
        "- **(b) count features**, through the service's HTTP API (in-process app, embedded "
        "Redis, SQLite): one stream per configuration, `hot_windows = 1`, windows of 1, 2, 5 "
        "or 10 % of the ratings with a forced roll between windows, `retention_windows` "
        "larger than the stream so the **count period is every rating before the hot window** "
        "(as in Pyramid, which keeps all history in its counts). The model trains on "
        "`GET /trainset` (the open window, Arrow) and is tested on the next ratings "
        "featurized by `POST /featurize` before they are ingested. Exposure = the hot window's "
        "share of all ratings."
    )
    w(
        f"- **(c) DP**: `laplace` with ε ∈ {{{', '.join(f'{e:g}' for e in setup.epsilons)}}} "
        "per window, and `gaussian` with the matching **ρ = ε²/2** (an ε-DP mechanism is "
        "ε²/2-zCDP, Bun & Steinke 2016 Prop. 1.4: the gaussian row has the laplace row's zCDP "
        "bound, not its pure-DP one; as (ε′, δ = 1e-9)-DP: "
        + ", ".join(
            f"ρ = {e * e / 2:g} → ε′ = {_approx_eps(e * e / 2):.2g}" for e in setup.epsilons
        )
        + ")."
        if setup.gaussian_delta is None
        else f"- **(c) DP**: `laplace` with ε ∈ {{{', '.join(f'{e:g}' for e in setup.epsilons)}}} "
        f"per window, and `gaussian` with the largest ρ that is (ε, δ = {setup.gaussian_delta:g})"
        "-DP (CKS 2020 conversion): "
        + ", ".join(
            f"ε = {e:g} → ρ = {setup.privacy('gaussian', e).rho:.4g}" for e in setup.epsilons
        )
        + f" (mechanisms run: {', '.join(setup.mechanisms)})."
    )
    w(
        f"- Sketch: width {WIDTH}, depth {DEPTH}, `max_tables` = {MAX_TABLES} ({len(FEATURES)} "
        f"features + the prior table), so Δ1 = T·depth = {MAX_TABLES * DEPTH}, "
        f"Δ2 = √{MAX_TABLES * DEPTH}: "
        f"per cell and window Laplace b = {MAX_TABLES * DEPTH}/ε, Gaussian σ = "
        f"√{MAX_TABLES * DEPTH}/√(2ρ) = {math.sqrt(MAX_TABLES * DEPTH):.2f}/ε. "
        "Featurization defaults (α = 1, back-off at 1 s.d. of the summed noise × √L)."
    )
    w(
        "- **(d) count-median vs count-min** runs **in-process on the core modules** "
        "(`service.core.sketch`, `noise`, `featurize`), not via HTTP: the same per-window "
        "tables built both ways (signed increments + median estimator; unsigned +1 "
        "increments + min estimator), the **same noise draws** added to both, the same "
        f"featurization, training and test rows; {setup.core_draws} noise draws per "
        "configuration."
    )
    params = ", ".join(f"{k}={v}" for k, v in LGB_PARAMS.items() if k != "verbose")
    w(
        f"- LightGBM, the same for every model: {params}; rounds by early stopping "
        f"(patience {PATIENCE}, at most {MAX_ROUNDS}) on the last {VALID_SHARE:.0%} (in time) "
        f"of the model's training rows, then a refit on all of them; predictions averaged "
        f"over seeds {', '.join(map(str, SEEDS))}."
    )
    w("")
    w("### References")
    w("")
    rows: list[list[object]] = [
        [
            "(a) baseline: LightGBM, raw categorical",
            "all ratings before the cut",
            f"{min(setup.cut_shares):.0%}-{max(setup.cut_shares):.0%}",
            f"{base['log_loss']:.4f}",
            "1",
            f"{base['auc']:.4f}",
        ],
        [
            "label prior of the training rows",
            "",
            "",
            f"{prior['log_loss']:.4f}",
            f"{prior['ratio']:.3f}",
            "0.5",
        ],
    ]
    for share in setup.shares:
        r = _get(g, "raw-hot", share)
        if r is not None:
            rows.append(
                [
                    "LightGBM, raw categorical, hot window only",
                    "the hot window's raw ratings",
                    _pct(share),
                    f"{r['log_loss']:.4f}",
                    f"{r['ratio']:.3f}",
                    f"{r['auc']:.4f}",
                ]
            )
    w(markdown_table(["model", "trained on", "exposure", "log-loss", "÷ baseline", "AUC"], rows))

    http = g[g["method"] == "http"]
    if not http.empty:
        configs = setup.configs()
        w("")
        w("### (b, c) Count features through the service")
        w("")
        w(
            "Test log-loss ÷ the baseline's (AUC in brackets; baseline AUC "
            f"{base['auc']:.4f}), by hot-window share of the data"
            + (
                f"; the ε = 1 rows are the mean of {setup.http_draws_eps1} replays (fresh streams, "
                "so fresh noise) ± the s.d. across them, the others one replay"
                if setup.http_draws_eps1 > 1
                else ""
            )
            + ":"
        )
        w("")
        rows = []
        for pr in configs:
            cells: list[object] = [pr.label]
            for share in setup.shares:
                r = _get(g, "http", share, pr.label)
                cells.append("" if r is None else f"{_pm(r)} ({r['auc']:.3f})")
            rows.append(cells)
        w(markdown_table(["count features"] + [_pct(s) for s in setup.shares], rows))
        w("")
        w(f"![log-loss ratio and AUC vs exposure]({_rel(fig1)})")
        w("")
        w(
            f"Where the DP cost comes from, at the {max(setup.cut_shares):.0%} cut: the "
            "count period sums the noise of every window before the hot window, so its s.d. "
            "per cell and label is √(windows × per-window variance); the back-off threshold is "
            "that × √2; the signal is how often the test rows' movies were rated in the count "
            "period (exact, both labels together). Measured: share of test rows whose "
            "movie_id table backs off (mean over the cuts)."
        )
        w("")
        rows = []
        for share in setup.shares:
            for pr in configs:
                if pr.mechanism == "none" or pr.epsilon not in (1.0, max(setup.epsilons)):
                    continue
                windows, sd, thr, med, below = signal_vs_noise(df, plan, share, pr)
                r = _get(g, "http", share, pr.label)
                rows.append(
                    [
                        _pct(share),
                        pr.label,
                        windows,
                        f"{math.sqrt(pr.variance):.3g}",
                        f"{sd:.0f}",
                        f"{thr:.0f}",
                        f"{med:.0f}",
                        f"{below:.0%}",
                        "" if r is None else f"{r['backoff_movie']:.0%}",
                    ]
                )
        w(
            markdown_table(
                [
                    "hot window",
                    "noise",
                    "count windows",
                    "s.d./window",
                    "s.d. summed",
                    "back-off threshold",
                    "median movie count",
                    "movies below",
                    "measured back-off",
                ],
                rows,
            )
        )

    core = g[g["method"].isin(["core-median", "core-min"])]
    if not core.empty:
        w("")
        w("### (d) Count-median vs count-min under the same noise (core, in-process)")
        w("")
        rows = []
        for share in sorted(core["share"].unique()):
            for pr in [Privacy("none")] + [
                Privacy("laplace", e) for e in sorted(setup.core_epsilons, reverse=True)
            ]:
                med = _get(g, "core-median", share, pr.label)
                cmin = _get(g, "core-min", share, pr.label)
                ht = _get(g, "http", share, pr.label)
                if med is None or cmin is None:
                    continue
                rows.append(
                    [
                        _pct(share),
                        pr.label,
                        _pm(med),
                        _pm(cmin),
                        f"{cmin['log_loss'] - med['log_loss']:+.4f}",
                        f"{med['auc']:.3f} / {cmin['auc']:.3f}",
                        f"{med['backoff_movie']:.0%} / {cmin['backoff_movie']:.0%}",
                        f"{med['est_bias']:+.0f} / {cmin['est_bias']:+.0f}",
                        f"{med['est_rmse']:.0f} / {cmin['est_rmse']:.0f}",
                        "" if ht is None else f"{ht['ratio']:.3f}",
                    ]
                )
        w(
            markdown_table(
                [
                    "hot window",
                    "noise",
                    "count-median ÷ baseline",
                    "count-min ÷ baseline",
                    "Δ log-loss (min − median)",
                    "AUC median / min",
                    "movie back-off median / min",
                    "movie-count error, mean: median / min",
                    "movie-count error, RMS: median / min",
                    "HTTP run (count-median, other noise draw)",
                ],
                rows,
            )
        )
        if fig2 is not None:
            w("")
            w(f"![count-median vs count-min]({_rel(fig2)})")

    abl = g[g["method"].str.startswith("ablation:")]
    if not abl.empty:
        share = float(abl["share"].iloc[0])
        lap = Privacy("laplace", 1.0)
        clean = _get(g, "core-median", share, "no noise")
        every = _get(g, "core-median", share, lap.label)
        w("")
        w(
            f"Which table's noise costs the most (core, count-median, {_pct(share)} hot window, "
            f"laplace ε = 1 noise on one table only, every other table and the prior exact, "
            f"mean of {int(abl['draws'].max())} draws):"
        )
        w("")
        rows = []
        ref = float("nan") if clean is None else float(clean["log_loss"])
        if clean is not None:
            rows.append(["none (no noise)", f"{clean['ratio']:.3f}", "+0.0%"])
        for _, r in abl.sort_values("log_loss", ascending=False).iterrows():
            rows.append(
                [
                    f"{r['method'].split(':', 1)[1]} only",
                    f"{r['ratio']:.3f}",
                    f"{r['log_loss'] / ref - 1:+.1%}",
                ]
            )
        if every is not None:
            rows.append(
                [
                    "every table and the prior",
                    f"{every['ratio']:.3f}",
                    f"{every['log_loss'] / ref - 1:+.1%}",
                ]
            )
        w(markdown_table(["noise on", "log-loss ÷ baseline", "log-loss vs no noise"], rows))

    verdicts, headlines = judge(g, frame, setup, base)
    w("")
    w("### Against Pyramid's published claims")
    w("")
    out += verdicts
    w("")
    w("### Reading the figures")
    w("")
    out += reading(g, df, plan, setup)
    return "\n".join(out), headlines


def reading(g: pd.DataFrame, df: pd.DataFrame, plan: Plan, setup: Setup) -> list[str]:
    """The explanation, with this run's numbers."""
    out: list[str] = []
    shares = list(setup.shares)
    small, large = min(shares), max(shares)
    none = Privacy("none")

    def r(method: str, share: float, pr: Privacy | None = None, key: str = "ratio") -> float:
        return _val(g, key, method, share, "" if pr is None else pr.label)

    new_small, unseen_small = novelty(df, plan, small)
    new_large, unseen_large = novelty(df, plan, large)
    out.append(
        "- **Without noise.** Count features make the hot window a far better model than its "
        f"raw rows alone (×{r('http', small, none):.3f} against ×{r('raw-hot', small):.3f} at "
        f"{_pct(small)}, ×{r('http', large, none):.3f} against ×{r('raw-hot', large):.3f} at "
        f"{_pct(large)}): the counts summarise all earlier history as per-key label rates, an "
        "encoding of 943 users and 1,682 movies that serves LightGBM well. What they cannot "
        "carry is the newest users. MovieLens users rate in bursts, so "
        f"{new_small:.0%} ({_pct(small)} window) to {new_large:.0%} ({_pct(large)} window) of "
        "the test rows come from a user with no rating in the count period, against "
        f"{unseen_small:.0%} with no rating before the cut at all: the rest are users whose "
        "only history is in the hot window. The baseline learns from those ratings; count "
        "features never see them (the hot window is not counted, by design, so that a row's "
        "own label never reaches its features), and the model trained on the hot window "
        f"cannot learn per-user effects either. The smallest window also has only "
        f"{plan.window(small):,} training rows."
    )
    if 1.0 in setup.epsilons and "laplace" in setup.mechanisms:
        lap, gau = Privacy("laplace", 1.0), setup.privacy("gaussian", 1.0)
        w_small = plan.cuts[-1] // plan.window(small) - 1
        w_large = plan.cuts[-1] // plan.window(large) - 1
        sd = math.sqrt(lap.variance)
        _, _, _, med_movie, below_large = signal_vs_noise(df, plan, large, lap)
        _, _, _, med_small, below_small = signal_vs_noise(df, plan, small, lap)
        abl = g[g["method"].str.startswith("ablation:")]
        abl_text = ""
        if not abl.empty:
            clean = r("core-median", float(abl["share"].iloc[0]), none, "log_loss")
            top = abl.sort_values("log_loss", ascending=False).head(2)
            abl_text = (
                " The per-table ablation locates the cost: noise on "
                + " and on ".join(
                    f"{m.split(':', 1)[1]} alone costs {v / clean - 1:+.1%}"
                    for m, v in zip(top["method"], top["log_loss"], strict=True)
                )
                + " (many keys with a few dozen to a hundred ratings each); the coarse tables "
                "(gender, age, occupation) have counts in the thousands and do not notice it."
            )
        out.append(
            f"- **What the DP cost is made of.** At ε = 1 every cell of every window gets "
            f"discrete Laplace noise of scale b = T·depth/ε = {MAX_TABLES * DEPTH} (s.d. "
            f"{sd:.0f}), because one rating touches T·depth = {MAX_TABLES * DEPTH} cells. "
            "The count period sums every window's table, so its noise s.d. grows as "
            f"√windows: at the {max(setup.cut_shares):.0%} cut that is {w_small} windows "
            f"(s.d. {sd * math.sqrt(w_small):.0f}) with {_pct(small)} windows and {w_large} "
            f"(s.d. {sd * math.sqrt(w_large):.0f}) with {_pct(large)} windows, against a "
            f"median of {med_small:.0f} and {med_movie:.0f} ratings (both labels) for a test "
            "row's movie: "
            f"{below_small:.0%} ({_pct(small)}) and {below_large:.0%} ({_pct(large)}) of the "
            "test rows' movies have fewer ratings than the back-off threshold, and the model "
            "falls back on the coarser tables. Smaller hot windows make it worse: more "
            "windows, so more summed noise, for the same counts." + abl_text
        )
        lap5 = Privacy("laplace", 5.0)
        stand_in = (
            "the ε = 5 row is what ε = 1 would give on a stream with 5× as many ratings per "
            f"window (laplace ε = 5: ×{r('http', small, lap5):.3f} at {_pct(small)}, "
            f"×{r('http', large, lap5):.3f} at {_pct(large)})"
            if 5.0 in setup.epsilons
            else "a larger ε reads as a larger stream"
        )
        out.append(
            "- **Why Pyramid's ≈ 2 % does not carry over.** The noise per cell is fixed by "
            "ε, T and depth; the counts grow with the data. Multiplying the ratings per window "
            "by m multiplies every count by m under the same noise, which is the same as "
            f"multiplying ε by m here: {stand_in}. Pyramid's evaluation used data sets of "
            "tens of millions of observations, where each key has orders of magnitude more "
            "counts than in MovieLens 100K under the same noise. On 100K ratings, ε = 1 per "
            "window is a strong guarantee that costs real accuracy; this benchmark cannot "
            "measure the large-stream regime."
        )
    if 1.0 in setup.epsilons and {"laplace", "gaussian"} <= set(setup.mechanisms):
        out.append(
            "- **Gaussian at the matching ρ = ε²/2** has σ = √(T·depth)/ε = "
            f"{math.sqrt(gau.variance):.1f} per cell and window instead of Laplace's s.d. "
            f"{sd:.0f}: a rating touches {MAX_TABLES * DEPTH} cells, and the L2 sensitivity "
            "grows as the square root of that, the L1 sensitivity linearly. It recovers much "
            f"of the loss (×{r('http', small, gau):.3f} at {_pct(small)}, "
            f"×{r('http', large, gau):.3f} at {_pct(large)}), but ρ = 0.5 is a weaker promise "
            f"than ε = 1: as (ε′, δ)-DP with δ = 1e-9 it is ε′ = {_approx_eps(0.5):.1f}."
            if setup.gaussian_delta is None
            else "- **Gaussian at the same (ε = 1, δ = "
            f"{setup.gaussian_delta:g})**: ρ = {gau.rho:.4g}, σ = {math.sqrt(gau.variance):.1f} "
            f"per cell and window against Laplace's s.d. {sd:.1f}: "
            f"×{r('http', small, gau):.3f} at {_pct(small)}, ×{r('http', large, gau):.3f} at "
            f"{_pct(large)}."
        )
    med = g[(g["method"] == "core-median") & (g["privacy"] != none.label)]
    if not med.empty:
        rows = []
        for _, m in med.iterrows():
            c = _get(g, "core-min", m["share"], m["privacy"])
            if c is not None:
                rows.append((m, c))
        bias_med = statistics.mean(float(m["est_bias"]) for m, _ in rows)
        bias_min = statistics.mean(float(c["est_bias"]) for _, c in rows)
        rmse_med = statistics.mean(float(m["est_rmse"]) for m, _ in rows)
        rmse_min = statistics.mean(float(c["est_rmse"]) for _, c in rows)
        sds = [float(m["ratio_sd"]) for m, _ in rows if not math.isnan(m["ratio_sd"])]
        bo_med = statistics.mean(float(m["backoff_movie"]) for m, _ in rows)
        bo_min = statistics.mean(float(c["backoff_movie"]) for _, c in rows)
        out.append(
            "- **Count-median vs count-min.** Under zero-mean noise the min of the depth rows "
            "picks the most negative noise draw: on the movie table count-min's estimates are "
            f"off by {bias_min:+.0f} ratings on average (count-median {bias_med:+.0f}), RMS "
            f"error {rmse_min:.0f} against {rmse_med:.0f} (means over the noisy configurations "
            f"of (d)). Clamped at 0, count-min's movies back off for {bo_min:.0%} of the test "
            f"rows (count-median {bo_med:.0%}). The log-loss gap is much smaller than the "
            "estimate gap: the trees only need the order of the counts, which a near-uniform "
            "downward shift keeps, and the back-off falls back on the same coarse tables either "
            "way. Pyramid's argument holds for the estimates (count-median unbiased, with the "
            "smaller error), not measurably for the model's loss on this data."
        )
        if sds:
            out.append(
                f"- **Noise-draw spread.** One draw of the noise moves the mean log-loss over "
                f"the cuts by about ±{statistics.mean(sds):.1%} of the baseline (s.d. across "
                f"the core's {setup.core_draws} draws, count-median, laplace); the noisy HTTP "
                "rows other than ε = 1 are a single draw each, so differences of a percent or "
                "two between them are within that spread. Without noise the spread comes "
                "from the model alone: the HTTP and core runs of the same no-noise "
                "configuration (different hash seeds) differ by "
                + ", ".join(
                    f"{abs(r('http', s, none) - r('core-median', s, none)):.3f} at {_pct(s)}"
                    for s in setup.core_shares
                    if not math.isnan(r("core-median", s, none))
                )
                + "."
            )
    return out


def _approx_eps(rho: float) -> float:

    return zcdp_to_approx_dp(rho=rho, delta=1e-9)


def _val(g: pd.DataFrame, key: str, method: str, share: float, privacy: str) -> float:
    r = _get(g, method, share, privacy)
    return math.nan if r is None else float(r[key])


def _pm(r: pd.Series) -> str:
    """The ratio in bold, ± its s.d. across noise draws when there are several."""
    sd = "" if math.isnan(r["ratio_sd"]) else f" ± {r['ratio_sd']:.3f}"
    return f"**{r['ratio']:.3f}**{sd}"


def judge(
    g: pd.DataFrame, frame: pd.DataFrame, setup: Setup, base: pd.Series
) -> tuple[list[str], list[str]]:
    """Verdicts on the claims and the headline lines, from the numbers."""
    out: list[str] = []
    heads: list[str] = []
    shares = list(setup.shares)
    small, large = min(shares), max(shares)

    def ratio(share: float, pr: Privacy) -> float:
        return _val(g, "ratio", "http", share, pr.label)

    def fmt(share: float, pr: Privacy) -> str:
        return f"×{ratio(share, pr):.3f} at {_pct(share)}"

    none = Privacy("none")
    if not math.isnan(ratio(small, none)):
        verdict = "holds" if ratio(small, none) <= 1.05 else "does not hold"
        out.append(
            f"- *Count features within about 3-5 % of the baseline's loss with under 1 % of the "
            f"data*: **{verdict}** at {_pct(small)} exposure (the smallest measured): log-loss "
            f"{fmt(small, none)}, {', '.join(fmt(s, none) for s in shares if s != small)}."
        )
        heads.append(
            f"- Accuracy (MovieLens 100K): count features, no noise, log-loss vs LightGBM on all "
            f"raw data: {fmt(small, none)} exposure, {fmt(large, none)} (Pyramid: within 3-5 % "
            f"under 1 %: {'met' if ratio(small, none) <= 1.05 else 'not met'} at {_pct(small)})"
        )
    if 1.0 not in setup.epsilons:
        return out, heads
    lap, gau = Privacy("laplace", 1.0), setup.privacy("gaussian", 1.0)
    cost = {
        s: _val(g, "log_loss", "http", s, lap.label) / _val(g, "log_loss", "http", s, none.label)
        - 1
        for s in shares
    }
    ok = [s for s in shares if cost[s] <= 0.025]
    verdict = "holds" if len(ok) == len(shares) else ("holds in part" if ok else "does not hold")
    out.append(
        f"- *DP at ε = 1 costs at most about 2 % more loss*: **{verdict}** (laplace, ε = 1 per "
        f"window, depth {DEPTH}; loss increase over no noise at the same exposure: "
        + "; ".join(f"{_pct(s)} {cost[s]:+.1%}" for s in shares)
        + ")."
    )
    under = [s for s in shares if s < 0.10]

    def target(pr: Privacy) -> tuple[str, str]:
        vals = {s: ratio(s, pr) for s in under if not math.isnan(ratio(s, pr))}
        if not vals:
            return "not measured", ""
        best = min(vals, key=vals.__getitem__)
        return ("met" if vals[best] <= 1.05 else "not met"), fmt(best, pr)

    parts = []
    target_verdicts = []
    gau_name = "ρ = 0.5" if gau.delta is None else f"ρ = {gau.rho:.4g} ((1, {gau.delta:g})-DP)"
    point = "" if setup.sketching.default else f", T = {MAX_TABLES}, width {WIDTH}"
    for pr, name in (
        (lap, f"laplace (depth {DEPTH}{point})"),
        (gau, f"gaussian {gau_name} (depth {DEPTH}{point})"),
    ):
        verdict, best = target(pr)
        target_verdicts.append(verdict)
        parts.append(f"{name} **{verdict}**" + (f" (best {best})" if best else ""))
    out.append(
        "- *Target: count features at ε = 1 within 5 % of the baseline log-loss with the hot "
        "window under 10 % of the data*: " + "; ".join(parts) + "."
    )
    heads.append(
        f"- Accuracy under DP, ε = 1 per window, log-loss vs the baseline: laplace "
        f"{fmt(small, lap)} … {fmt(large, lap)}, gaussian ρ = 0.5 {fmt(small, gau)} … "
        f"{fmt(large, gau)} (target ≤ 1.05× under 10 % exposure: laplace "
        f"{target_verdicts[0]}, gaussian {target_verdicts[1]})"
    )
    # (d): paired per noise draw (the same draw feeds both sketches)
    core = frame[frame["method"].isin(["core-median", "core-min"])].copy()
    core = core[core["privacy"] != none.label]
    if not core.empty:
        core["draw"] = core.get("draw", 0)
        pair = (
            core.groupby(["share", "privacy", "draw", "method"])["log_loss"]
            .mean()
            .unstack("method")
            .dropna()
        )
        deltas = (pair["core-min"] / pair["core-median"] - 1).to_numpy()
        by_config = pair.groupby(level=["share", "privacy"]).mean()
        config_deltas = (by_config["core-min"] / by_config["core-median"] - 1).to_numpy()
        wins = int((config_deltas > 0).sum())
        n = len(config_deltas)
        mean = float(deltas.mean())
        se = float(deltas.std(ddof=1) / math.sqrt(len(deltas))) if len(deltas) > 1 else math.nan
        if not math.isnan(se) and mean > 2 * se:
            verdict = "holds"
            summary = "count-median is better beyond the noise-draw spread"
        elif not math.isnan(se) and mean < -2 * se:
            verdict = "does not hold (count-min is better)"
            summary = "count-min is better beyond the noise-draw spread"
        else:
            verdict = "not measurable here"
            summary = "a tie within the noise-draw spread"
        se_text = "" if math.isnan(se) else f" ± {se:.1%} (s.e.)"
        out.append(
            f"- *Count-median beats count-min under noise*: **{verdict}**: over "
            f"{len(deltas)} paired noise draws ({n} configurations of shares × ε, "
            f"{setup.core_draws} draws each) count-min's log-loss is {mean:+.1%}{se_text} "
            f"relative to count-median, {summary}; count-median is lower in "
            f"{int((deltas > 0).sum())} of {len(deltas)} draws and in {wins} of {n} "
            f"configurations (per configuration from {config_deltas.min():+.1%} to "
            f"{config_deltas.max():+.1%}). The estimates themselves differ a lot (see the "
            "error columns and below); the models barely do."
        )
        heads.append(
            f"- Accuracy, count-min vs count-median under the same noise: log-loss "
            f"{mean:+.1%}{se_text} over {len(deltas)} paired draws ({summary})"
        )
    return out, heads


HEADLINE_PREFIXES = ("- Accuracy",)
PLACEHOLDER = "(filled in as the benchmarks of issue 3 land)"


def update_headlines(lines: list[str]) -> None:
    """Replace this benchmark's lines in BENCHMARKS.md's "Headline figures" list (others'
    lines are kept; the placeholder goes once there is a figure)."""
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    marker = "## Headline figures"
    if marker not in text:
        text = text.rstrip("\n") + f"\n\n{marker}\n\n"
    head, rest = text.split(marker, 1)
    nxt = rest.find("\n## ")
    body, tail = (rest, "") if nxt < 0 else (rest[:nxt], rest[nxt:])
    kept = [
        ln
        for ln in body.strip("\n").splitlines()
        if ln.strip() != PLACEHOLDER and not ln.startswith(HEADLINE_PREFIXES)
    ]
    # continuation lines of our own bullets are not used (one line per bullet)
    new_body = "\n".join([*(ln for ln in kept if ln.strip()), *lines])
    BENCHMARKS.write_text(f"{head}{marker}\n\n{new_body}\n{tail}")


@dataclass(frozen=True)
class Job:
    """One piece of the sweep, run in a worker process (two at a time: the service's Python
    work is single-threaded, so two processes keep both cores busy)."""

    kind: str  # "raw" | "http" | "core" | "ablation"
    shares: tuple[float, ...]
    configs: tuple[Privacy, ...] = ()
    draws: int = 1


@functools.cache
def _data() -> pd.DataFrame:
    return movielens.load()


@functools.cache
def _core() -> Core:
    return Core(_data())


def run_job(
    job: Job, cut_shares: tuple[float, ...], t0: float, sketching: Sketching = Sketching()
) -> list[Eval]:
    configure(sketching)

    def say(line: str) -> None:
        print(f"[{time.time() - t0:6.0f}s] {line}", flush=True)

    df = _data()
    plan = make_plan(len(df), cut_shares)
    if job.kind == "raw":
        return raw_evals(df, plan, job.shares, say)
    if job.kind == "http":
        return asyncio.run(http_sweep(df, plan, job.shares, job.configs, say, draws_eps1=job.draws))
    if job.kind == "core":
        return core_sweep(_core(), plan, job.shares, job.configs, say, draws=job.draws)
    return ablation(_core(), plan, job.shares[0], job.configs[0], say, draws=job.draws)


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
            out.append(
                Job(
                    "ablation",
                    (setup.ablation_share,),
                    (Privacy("laplace", 1.0),),
                    setup.ablation_draws,
                )
            )
    out.append(Job("raw", setup.shares))
    return out


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _customise(
    setup: Setup, args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[Setup, bool]:
    """Apply the operating-point and restriction options; True when any differs from the
    default run."""
    import dataclasses

    features = tuple(movielens.FEATURES)
    if args.features is not None:
        unknown = sorted(set(args.features) - set(movielens.FEATURES))
        if unknown or not args.features:
            parser.error(f"--features: unknown {unknown}; choose from {movielens.FEATURES}")
        # the canonical order, so that the columns come in the same order as in a default run
        features = tuple(f for f in movielens.FEATURES if f in args.features)
    if args.width < 2 or args.width & (args.width - 1):
        parser.error(f"--width must be a power of two, got {args.width}")
    if args.depth < 1:
        parser.error(f"--depth must be at least 1, got {args.depth}")
    weights: dict[str, float] = {}
    for item in args.table_weights or []:
        feature, _, value = item.partition("=")
        try:
            weights[feature] = float(value)
        except ValueError:
            parser.error(f"--table-weights: {item!r} is not FEATURE=WEIGHT")
        if feature != "prior" and feature not in features:
            parser.error(f"--table-weights: {feature!r} has no table; choose from {features}")
    changes: dict[str, Any] = {
        "sketching": Sketching(features, args.width, args.depth, tuple(sorted(weights.items())))
    }
    if args.shares is not None:
        try:
            shares = tuple(sorted({float(x) / 100 for x in args.shares}))
        except ValueError:
            parser.error(f"--shares: not numbers: {args.shares}")
        bad = [s for s in shares if not any(math.isclose(s, f) for f in SHARES_FULL)]
        if bad or not shares:
            parser.error(f"--shares: choose from {[round(s * 100) for s in SHARES_FULL]}")
        changes["shares"] = shares
        changes["core_shares"] = tuple(s for s in setup.core_shares if s in shares)
        if setup.ablation_share not in shares:
            changes["ablation_share"] = None
    if args.epsilons is not None:
        try:
            eps = tuple(sorted({float(x) for x in args.epsilons}))
        except ValueError:
            parser.error(f"--epsilons: not numbers: {args.epsilons}")
        if not eps or min(eps) <= 0:
            parser.error("--epsilons must be positive")
        changes["epsilons"] = eps
        changes["core_epsilons"] = tuple(e for e in setup.core_epsilons if e in eps)
        if 1.0 not in eps:
            changes["ablation_share"] = None
    if args.mechanisms is not None:
        mechs = tuple(m for m in ("none", "laplace", "gaussian") if m in args.mechanisms)
        unknown = sorted(set(args.mechanisms) - {"none", "laplace", "gaussian"})
        if unknown or not mechs:
            parser.error(f"--mechanisms: unknown {unknown}; choose from none, laplace, gaussian")
        changes["mechanisms"] = mechs
    if args.gaussian_delta is not None:
        if not 0 < args.gaussian_delta < 1:
            parser.error("--gaussian-delta must be in (0, 1)")
        changes["gaussian_delta"] = args.gaussian_delta
    new = dataclasses.replace(setup, **changes)
    return new, new != setup


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="selectivity bench accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sweep (shares 2 and 10 %%, ε = 1, cuts 70 and 90 %%); "
        "prints, appends to BENCHMARKS.md only with --append",
    )
    p.add_argument("--append", action="store_true", help="append a --quick run too")
    p.add_argument("--no-append", action="store_true", help="print only")
    p.add_argument("--skip-core", action="store_true", help="leave out (d) and the ablation")
    p.add_argument("--skip-http", action="store_true", help="leave out (b) and (c)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument(
        "--from-csv", type=Path, help="re-make the report from a saved run's per-cut results"
    )
    point = p.add_argument_group(
        "operating point and restrictions",
        "Any of these but --out makes a non-default run: it prints its report and\n"
        "appends to BENCHMARKS.md only with --append (never touching the headline\n"
        "figures). With --from-csv, pass the same options as the run.",
    )
    point.add_argument(
        "--features",
        type=_csv_list,
        default=None,
        metavar="F1,F2,...",
        help="features that get a count table (default all: "
        f"{','.join(movielens.FEATURES)}); max_tables = their number + 1 (the prior "
        "table), so fewer features mean a smaller Δ1 = T·depth. The raw baselines always use "
        "every feature",
    )
    point.add_argument(
        "--depth",
        type=int,
        default=DEPTH,
        help=f"sketch depth (default {DEPTH}); depth 1 is a plain hashed count table",
    )
    point.add_argument(
        "--width", type=int, default=WIDTH, help=f"sketch width, a power of two (default {WIDTH})"
    )
    point.add_argument(
        "--table-weights",
        type=_csv_list,
        default=None,
        metavar="F=W,...",
        help="the budget split: each listed table's weight (privacy.table_weights; 'prior' "
        "for the prior table), every other table 1; table s gets ε·w_s/Σw",
    )
    point.add_argument(
        "--shares",
        type=_csv_list,
        default=None,
        metavar="PCT,...",
        help="hot-window shares in %% of the ratings, from 1, 2, 5, 10 (default all; --quick: "
        "2, 10)",
    )
    point.add_argument(
        "--epsilons",
        type=_csv_list,
        default=None,
        metavar="E,...",
        help="ε per window (default 0.1, 0.5, 1, 5; --quick: 1); the ε = 1 HTTP rows are "
        "replayed several times (fresh noise)",
    )
    point.add_argument(
        "--mechanisms",
        type=_csv_list,
        default=None,
        metavar="M,...",
        help="from none, laplace, gaussian (default all three; keep none as the reference)",
    )
    point.add_argument(
        "--gaussian-delta",
        type=float,
        default=None,
        metavar="DELTA",
        help="gaussian rows at the largest ρ that is (ε, DELTA)-DP, i.e. the laplace row's ε "
        "with a δ (default: ρ = ε²/2, the laplace row's zCDP bound)",
    )
    point.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="path prefix of the per-cut CSV and the plots (PREFIX.csv, PREFIX_logloss.png, "
        "...; default bench/plots/accuracy[_quick])",
    )
    args = p.parse_args(argv)
    if not movielens.available():
        raise SystemExit(f"MovieLens 100K not found under {movielens.DATA}")
    setup = QUICK if args.quick else FULL
    setup, custom = _customise(setup, args, p)
    configure(setup.sketching)
    global OUT
    OUT = args.out
    df = _data()
    plan = make_plan(len(df), setup.cut_shares)
    csv = (
        plot_path(f"accuracy{'_quick' if setup.quick else ''}").with_suffix(".csv")
        if OUT is None
        else OUT.parent / f"{OUT.name}.csv"
    )
    if args.from_csv:
        frame = pd.read_csv(args.from_csv)
    else:
        t0 = time.time()
        todo = jobs(setup, http=not args.skip_http, core=not args.skip_core)
        print(
            f"MovieLens 100K: {len(df)} ratings, cuts {list(plan.cuts)}, {plan.test_rows} test "
            f"rows per cut; {len(todo)} jobs on {args.workers} worker processes",
            flush=True,
        )
        evals: list[Eval] = []
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
            n = len(todo)
            for found in pool.map(
                run_job, todo, [setup.cut_shares] * n, [t0] * n, [setup.sketching] * n
            ):
                evals += found
        elapsed = time.time() - t0
        print(f"done in {elapsed:.0f}s; per-cut results in {_rel(csv)}", flush=True)
        frame = pd.DataFrame([e.__dict__ for e in evals])
        frame["elapsed"] = elapsed
        csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv, index=False)
    elapsed = float(frame["elapsed"].iloc[0])
    body, headlines = report(frame, df, setup, elapsed)
    append = not args.no_append and (args.append or not (setup.quick or custom))
    title = "Accuracy: count featurization on MovieLens 100K" + (" (quick)" if setup.quick else "")
    if not setup.sketching.default:
        title += f" (depth {DEPTH}, width {WIDTH}, T = {MAX_TABLES})"
    command = " ".join(["selectivity bench accuracy", *(argv if argv is not None else [])])
    if argv is None:
        import sys

        command = " ".join(["selectivity bench accuracy", *sys.argv[1:]])
    if append:
        append_section(title, body, command=command)
        if not (setup.quick or custom):
            update_headlines(headlines)
    else:
        print(f"\n## {title}\n\n{body}\n\nHeadline lines:\n" + "\n".join(headlines))

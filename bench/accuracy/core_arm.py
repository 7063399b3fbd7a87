"""(d) Count-median vs count-min under the same noise, in process on ``service.core``.

The count tables of the MovieLens stream are built as the service builds them, with its own
code: the stream configuration validated by the service's model (``StreamCreate``), the runtime
(``StreamRuntime``: feature specs, sketch spec, noise of every table from
``service.core.dp.budget``),
the features encoded (``encode_column``), the increments counted (``count_increments``, what the
counting job applies), the noise drawn per window and table (``sample_noise`` at the table's
``noise.scale_for``), and the columns derived as ``featurize`` derives them (``estimate``,
back-off thresholds from ``noise.variance_for``, ``derived_columns``, ``assemble``). Sketches
are linear, so the count-period aggregate at a cut is the increments of every rating before the
hot window plus the noise of every window before it. ``kind`` "median" is the service's signed
count-median sketch; "min" a count-min sketch over the same cells (unsigned +1 increments,
``grouped_increments``; the min estimator ``estimate_count_min``) under the same noise draws."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from bench import lgbm, movielens
from bench.accuracy.plan import Eval, Plan, Privacy, Sketching
from service.core.dp.noise import sample_noise
from service.core.features.columns import (
    Encoded,
    assemble,
    backoff_threshold,
    column_names,
    derived_columns,
    encode_column,
    prior_probabilities,
    table_name,
)
from service.core.features.counting import count_increments
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.sketch import KeyHasher, estimate, estimate_count_min, grouped_increments

SEED = b"bench-accuracy-core"  # the sketches' hash seed (a stream's is random)
Tables = tuple[list[np.ndarray], np.ndarray]  # every table's cells, and the prior table's
Rows = slice | np.ndarray  # rows of the arm's arrays: a slice, or their positions


class CoreArm:
    """The MovieLens stream's count tables for one operating point, on ``service.core``: the
    features encoded and hashed once, the noiseless increments of a prefix memoised, the noise
    drawn afresh by every ``run``."""

    def __init__(self, df: pd.DataFrame, sketching: Sketching, training: lgbm.Training) -> None:
        self.sketching = sketching
        self.training = training
        tables = tuple(
            TableRef(i + 1, table_name([f]), (f,), 1) for i, f in enumerate(sketching.features)
        )
        self._runtimes: dict[Privacy, StreamRuntime] = {}
        self._tables = tables
        rt = self.runtime(Privacy("none"))
        rows = movielens.feature_rows(df)
        self.encoded = {f.name: encode_column([r[f.name] for r in rows], f) for f in rt.features}
        self.y = movielens.labels01(df)
        self.labels = self.y.astype(np.int64)
        self.movies = df["movie_id"].to_numpy()
        keys = [(t.name, self.encoded[t.features[0]].keys) for t in tables]
        buckets, signs = KeyHasher(seed=SEED, spec=rt.spec).hash_many(keys)
        bounds = np.cumsum([0, *(len(k) for _, k in keys)])
        self.hashes = [
            (buckets[lo:hi], signs[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        columns = column_names([t.name for t in tables], rt.labels, [])
        has_movie = "movie_id" in rt.feature_names
        self.movie_backoff = columns.index("movie_id:backoff") if has_movie else -1
        self._increments: dict[tuple[int, str], Tables] = {}

    def runtime(self, privacy: Privacy) -> StreamRuntime:
        """The stream as the service would run it under ``privacy``."""
        if privacy not in self._runtimes:
            cfg = self.sketching.stream_config(privacy)
            self._runtimes[privacy] = StreamRuntime(1, "core", cfg, SEED, self._tables)
        return self._runtimes[privacy]

    def increments(self, upto: int, kind: str) -> Tables:
        """The cells of every table after the first ``upto`` ratings, without noise."""
        key = (upto, kind)
        if key not in self._increments:
            rt = self.runtime(Privacy("none"))
            spec, labels = rt.spec, self.labels[:upto]
            tables: list[np.ndarray] = []
            if kind == "median":
                encoded = {f: Encoded(e.codes[:upto], e.keys) for f, e in self.encoded.items()}
                inc = count_increments(rt, rt.tables, encoded, labels)
                for i in range(inc.n_tables):
                    size = spec.cells if i < len(rt.tables) else spec.n_labels
                    tables.append(np.zeros(size, np.int64))
                    lo, hi = inc.bounds[i], inc.bounds[i + 1]
                    tables[i][inc.cells[lo:hi]] += inc.deltas[lo:hi]
                prior = tables.pop()
            else:
                for t, (buckets, signs) in zip(rt.tables, self.hashes, strict=True):
                    codes = self.encoded[t.features[0]].codes[:upto]
                    unsigned = np.ones_like(signs)
                    idx, deltas = grouped_increments(labels, codes, buckets, unsigned, spec)
                    cells = np.zeros(spec.cells, np.int64)
                    cells[idx] += deltas
                    tables.append(cells)
                prior = np.bincount(labels, minlength=spec.n_labels).astype(np.int64)
            self._increments[key] = (tables, prior)
        return self._increments[key]

    def featurize(
        self, rt: StreamRuntime, agg: Tables, thresholds: list[float], sl: Rows, kind: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """The service's columns for rows ``sl``, and the raw movie_id estimates (n, 2)."""
        tables, prior_counts = agg
        prior = prior_probabilities(prior_counts)
        per_table = []
        movie_est = np.empty(0)
        for t, cells, (buckets, signs), thr in zip(
            rt.tables, tables, self.hashes, thresholds, strict=True
        ):
            if kind == "median":
                by_key = estimate(cells, buckets, signs, rt.spec)
            else:
                by_key = estimate_count_min(cells, buckets, rt.spec)
            est = by_key[self.encoded[t.features[0]].codes[sl]]
            if t.name == "movie_id":
                movie_est = est
            alpha = rt.config.featurize.alpha
            per_table.append(derived_columns(est, prior=prior, alpha=alpha, threshold=thr))
        return assemble(per_table, [], len(self.y[sl])), movie_est

    def rows(self, sl: slice) -> Rows:
        """Where the stream's rows ``sl`` are held (here: every row, in order)."""
        return sl

    def train_rows(self, hot: slice) -> Rows:
        """The rows of hot window ``hot`` a model trains on (here: all of them)."""
        return hot

    def exact_movie_counts(self, counted: int, sl: Rows) -> np.ndarray:
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
        rt = self.runtime(privacy)
        spec, cfg = rt.spec, rt.config
        names = [t.name for t in rt.tables]
        noisy_set = {*names, "prior"} if noisy is None else set(noisy)
        w = plan.window(share)
        cut_at = plan.cut_windows(share)
        noise = [np.zeros(spec.cells, np.int64) for _ in names]
        prior_noise = np.zeros(spec.n_labels, np.int64)
        found: list[Eval] = []
        for k in range(1, max(cut_at) + 1):
            if k >= 2 and privacy.mechanism != "none":  # window k-1 is now counted
                for i, t in enumerate(rt.tables):
                    noise[i] += self._draw(rt, rt.weight_of(t), spec.cells)
                prior_noise += self._draw(rt, rt.prior_weight, spec.n_labels)
            if k not in cut_at:
                continue
            cut = cut_at[k]
            counted = cut - w  # the ratings of windows 1 .. k-1
            thresholds = [
                backoff_threshold(
                    noise_variance=rt.noise.variance_for(rt.weight_of(t)),
                    n_windows=k - 1,
                    n_labels=spec.n_labels,
                    sigmas=cfg.featurize.backoff_sigmas,
                )
                if t.name in noisy_set
                else 0.0
                for t in rt.tables
            ]
            hot, test = self.train_rows(slice(cut - w, cut)), self.rows(plan.test(cut))
            exact = self.exact_movie_counts(counted, test)
            for kind in kinds:
                inc, prior = self.increments(counted, kind)
                agg = (
                    [
                        c + n if name in noisy_set else c
                        for c, n, name in zip(inc, noise, names, strict=True)
                    ],
                    prior + prior_noise if "prior" in noisy_set else prior,
                )
                x_train, _ = self.featurize(rt, agg, thresholds, hot, kind)
                x_test, movie_est = self.featurize(rt, agg, thresholds, test, kind)
                err = movie_est - exact if len(movie_est) else np.full(1, math.nan)
                p, rounds = lgbm.fit_predict(x_train, self.y[hot], x_test, self.training)
                back = self.movie_backoff
                found.append(
                    Eval(
                        method or f"core-{kind}",
                        share,
                        privacy.label,
                        cut,
                        lgbm.log_loss(self.y[test], p),
                        lgbm.auc(self.y[test], p),
                        rounds,
                        backoff_movie=float(x_test[:, back].mean()) if back >= 0 else math.nan,
                        est_bias=float(err.mean()),
                        est_rmse=float(np.sqrt((err**2).mean())),
                        draw=draw,
                    )
                )
        return found

    @staticmethod
    def _draw(rt: StreamRuntime, weight: float, size: int) -> np.ndarray:
        """One window's noise for a table of ``weight`` (the service's CSPRNG sampler)."""
        scale = rt.noise.scale_for(weight)
        return sample_noise(mechanism=rt.noise.mechanism, scale=scale, size=size)  # type: ignore[arg-type]


def sweep(
    core: CoreArm,
    plan: Plan,
    shares: Sequence[float],
    configs: Sequence[Privacy],
    say: Callable[[str], None],
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
    core: CoreArm,
    plan: Plan,
    share: float,
    privacy: Privacy,
    say: Callable[[str], None],
    draws: int = 1,
) -> list[Eval]:
    """Where the DP cost comes from: noise on one table at a time (the others, and the prior
    table, exact), count-median only."""
    out: list[Eval] = []
    for t in core.runtime(privacy).tables:
        started = time.perf_counter()
        found: list[Eval] = []
        for draw in range(draws):
            found += core.run(
                plan,
                share,
                privacy,
                draw=draw,
                kinds=("median",),
                noisy=[t.name],
                method=f"ablation:{t.name}",
            )
        out += found
        say(
            f"ablation   share {share:>4.0%} {privacy.label} on {t.name:<10} only: log-loss "
            f"{statistics.mean(e.log_loss for e in found):.4f} "
            f"({time.perf_counter() - started:.1f}s)"
        )
    return out

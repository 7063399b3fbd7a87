"""A MovieLens-calibrated stream simulator for the regime question of issue 18: at what stream
size do count features at ε = 1 come within 3 % of a full-data baseline at ≤ 1 % exposure, and
DP cost ≤ 2 % over no noise?

Calibration (``fit``, on MovieLens 100K):

- **keys and their attributes**: the real 943 users (age, gender, occupation, zip3) and 1,682
  movies (genres); the movies do not grow with the stream, so ×k is k times the observations
  per movie, genre and user attribute per window (the quantity the DP noise competes with:
  noise per cell is fixed by ε, counts grow with the stream); per user, see below;
- **user popularity and arrival pattern**: the real ratings in time order; at scale ×k each real
  rating becomes k consecutive events at the same place in the stream: by default
  (``grow="users"``) one by each of k copies of its user (a copy has its own id and the real
  user's attributes and label effect: k times the users, each with a real user's activity and
  sessions, as larger MovieLens releases have ~140 ratings per user like 100K's ~106), or
  (``grow="events"``) all by the real user (k times every user's activity); the first event
  has the real movie, the k − 1 others a movie drawn from those rated within the same block of
  ``BLOCK`` real ratings (movie popularity as it drifts over time: a movie released late is
  rated late);
- **per-key label rates**: ``P(y = 1 | u, m) = σ(c + a_u + b_m)``, an L2-regularised logistic
  regression on user and movie one-hot features fitted to all 100,000 real labels
  (scikit-learn ``LogisticRegression``, ``C`` chosen by the held-out log-loss of the last 20 %),
  so every user's and movie's label rate is MovieLens's up to shrinkage; no other interaction
  unless asked for:
- **pair effects** (optional, off by default: ``bench.accuracy.pair_effects.add``): log-odds
  terms ``δ[genres(m), level(u)]`` for a movie's genre combination × a user attribute (age
  bucket, gender, occupation), MovieLens's residual interactions after the user and movie
  effects, shrunk by an empirical-Bayes estimate of their variance; with them a pair table
  (``genres`` + ``age`` …) carries signal that no single-feature table has.

What it does not model: interactions beyond user + movie (the real data has some: the
simulated labels are "cleaner"; see pair effects above), repeated (user, movie) pairs are
allowed at ×k > 1, and the timestamps (the benchmark windows by count, not time).
``tests/bench/accuracy/test_simulator.py`` compares it with the real data at ×1.

The simulated frame has ``bench.movielens.load``'s columns, so ``bench.accuracy.core_arm`` runs
on it unchanged (through :class:`ColumnArm`, which encodes columns without building one dict
per row: 10M rows at ×100). The benchmarks draw the same stream as integer codes, chunk by chunk
(``bench.accuracy.sim_stream``: 100M events at ×1000 do not fit as a frame)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import sparse
from sklearn.linear_model import LogisticRegression

from bench import lgbm, movielens
from bench.accuracy.core_arm import SEED, CoreArm
from bench.accuracy.plan import Privacy, Sketching
from service.core.features.columns import column_names, encode_column, table_name
from service.core.features.runtime import TableRef
from service.core.tables.sketch import KeyHasher

BLOCK = 1000  # real ratings per block from which a scaled-up event's movie is drawn
C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0)
USER_COLUMNS = ("age", "gender", "occupation", "zip3")


@dataclass(frozen=True)
class PairEffect:
    """A log-odds term ``effect[movie_level[m], user_level[u]]`` for movie code ``m`` and user
    code ``u``: an interaction between a movie attribute and a user attribute (the levels are
    the keys their tables count: genre combination, age bucket …)."""

    movie_column: str
    user_column: str
    movie_level: np.ndarray  # by movie code
    user_level: np.ndarray  # by user code
    effect: np.ndarray  # (movie levels, user levels)
    tau: float  # the estimated standard deviation of the interaction (log-odds)

    def __call__(self, users: np.ndarray, movies: np.ndarray) -> np.ndarray:
        return self.effect[self.movie_level[movies], self.user_level[users]]


@dataclass(frozen=True)
class Calibration:
    """What ``simulate`` draws from: the real sequence of (user, movie) codes in time order, the
    per-user and per-movie attribute tables, and the label model's log-odds terms."""

    users: np.ndarray  # (n,) user code of every real rating, time order
    movies: np.ndarray  # (n,) movie code
    user_table: pd.DataFrame  # by user code: user_id, age, gender, occupation, zip3
    movie_table: pd.DataFrame  # by movie code: movie_id, genres
    intercept: float
    user_effect: np.ndarray  # a_u by user code
    movie_effect: np.ndarray  # b_m by movie code
    c: float  # the chosen L2 strength (1/λ)
    holdout_log_loss: float  # of the chosen model on the last 20 % (fitted on the first 80 %)
    pairs: tuple[PairEffect, ...] = ()  # none by default (``pair_effects.add``)

    def log_odds(self, users: np.ndarray, movies: np.ndarray) -> np.ndarray:
        z = self.intercept + self.user_effect[users] + self.movie_effect[movies]
        for pair in self.pairs:
            z = z + pair(users, movies)
        return z

    def probability(self, users: np.ndarray, movies: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.log_odds(users, movies)))


def _one_hot(
    users: np.ndarray, movies: np.ndarray, n_users: int, n_movies: int
) -> sparse.csr_matrix:
    n = len(users)
    rows = np.repeat(np.arange(n), 2)
    cols = np.column_stack([users, n_users + movies]).reshape(-1)
    return sparse.csr_matrix((np.ones(2 * n), (rows, cols)), shape=(n, n_users + n_movies))


def fit(df: pd.DataFrame) -> Calibration:
    """Calibrate on the real ratings ``df`` (``bench.movielens.load()``, time order)."""
    users_cat = pd.Categorical(df["user_id"])
    movies_cat = pd.Categorical(df["movie_id"])
    users = users_cat.codes.astype(np.int64)
    movies = movies_cat.codes.astype(np.int64)
    n_users, n_movies = len(users_cat.categories), len(movies_cat.categories)
    y = movielens.labels01(df)
    x = _one_hot(users, movies, n_users, n_movies)
    split = int(0.8 * len(df))
    best: tuple[float, float] | None = None
    for c in C_GRID:
        model = LogisticRegression(C=c, max_iter=2000)
        model.fit(x[:split], y[:split])
        p = model.predict_proba(x[split:])[:, 1]
        loss = lgbm.log_loss(y[split:], p)
        if best is None or loss < best[1]:
            best = (c, loss)
    assert best is not None
    model = LogisticRegression(C=best[0], max_iter=2000).fit(x, y)
    coef = model.coef_.reshape(-1)
    first_user = df.groupby(users)[["user_id", *USER_COLUMNS]].first()
    first_movie = df.groupby(movies)[["movie_id", "genres"]].first()
    return Calibration(
        users=users,
        movies=movies,
        user_table=first_user.reset_index(drop=True),
        movie_table=first_movie.reset_index(drop=True),
        intercept=float(model.intercept_[0]),
        user_effect=coef[:n_users],
        movie_effect=coef[n_users:],
        c=best[0],
        holdout_log_loss=best[1],
    )


GROWTHS = ("users", "events")


def simulate(
    cal: Calibration, scale: int, seed: int, *, grow: str = "users", real_pairs: bool = True
) -> pd.DataFrame:
    """A stream of ``scale`` × the real ratings, in ``bench.movielens.load``'s columns, plus
    ``p_true`` (the label model's probability: the Bayes-optimal prediction).

    Event j of real rating i (j = 0 … scale − 1) comes right after event j − 1. Its user is,
    with ``grow="users"``, the j-th copy of rating i's user (the copy's own id, the real user's
    attributes and label effect: k times the users, each as active as a real one, as in larger
    MovieLens releases), with ``grow="events"`` rating i's user itself (k times the activity
    of every real user). Its movie is rating i's for j = 0 when ``real_pairs``, else drawn
    uniformly from the movies of the real ratings in i's block of ``BLOCK``. The label is
    Bernoulli(p_true) from the seeded generator."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    if grow not in GROWTHS:
        raise ValueError(f"grow must be one of {GROWTHS}, got {grow!r}")
    rng = np.random.default_rng(seed)
    n = len(cal.users)
    users = np.repeat(cal.users, scale)  # the real user of every event
    copy = np.tile(np.arange(scale), n) if grow == "users" else np.zeros(n * scale, np.int64)
    block_of = np.repeat(np.arange(n) // BLOCK, scale)
    starts = block_of * BLOCK
    sizes = np.minimum(BLOCK, n - starts)
    pick = starts + (rng.random(n * scale) * sizes).astype(np.int64)
    movies = cal.movies[pick]
    if real_pairs:
        movies[::scale] = cal.movies
    p = cal.probability(users, movies)
    label = rng.random(n * scale) < p
    ut, mt = cal.user_table, cal.movie_table
    user_ids = ut["user_id"].to_numpy(dtype=object)[users]
    if grow == "users" and scale > 1:  # copy j > 0 of user u is "u~j"
        tagged = copy > 0
        user_ids[tagged] = user_ids[tagged] + "~" + copy[tagged].astype(str).astype(object)
    out = pd.DataFrame(
        {
            "id": np.arange(n * scale).astype(str),
            "event_time": "",
            "user_id": user_ids,
            "movie_id": mt["movie_id"].to_numpy()[movies],
            "genres": mt["genres"].to_numpy()[movies],
            "age": ut["age"].to_numpy()[users],
            "gender": ut["gender"].to_numpy()[users],
            "occupation": ut["occupation"].to_numpy()[users],
            "zip3": ut["zip3"].to_numpy()[users],
            "label": np.where(label, "1", "0"),
            "p_true": p,
        }
    )
    return out


def bayes_log_loss(df: pd.DataFrame, rows: slice) -> float:
    """The log-loss of the true probabilities on ``rows``: no model can do better on average."""
    y = movielens.labels01(df.iloc[rows])
    return lgbm.log_loss(y, df["p_true"].to_numpy()[rows])


class ColumnArm(CoreArm):
    """``CoreArm`` on a large frame: the same tables, hashing and featurization, but every
    feature encoded from its column (``encode_column`` on the column's values) instead of from
    one dict per row (which ``CoreArm`` builds, too much memory at 10M rows)."""

    def __init__(
        self, df: pd.DataFrame, sketching: Sketching, training: lgbm.Training
    ) -> None:  # mirrors CoreArm.__init__ but for the rows
        self.sketching = sketching
        self.training = training
        tables = tuple(
            TableRef(i + 1, table_name([f]), (f,), 1) for i, f in enumerate(sketching.features)
        )
        self._runtimes = {}
        self._tables = tables
        rt = self.runtime(Privacy("none"))
        self.encoded = {
            f.name: encode_column(
                df[f.name].to_numpy() if f.name == "age" else df[f.name].tolist(), f
            )
            for f in rt.features
        }
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
        self._increments = {}


def relative(x: float, base: float) -> float:
    return x / base if base > 0 and math.isfinite(base) else math.nan

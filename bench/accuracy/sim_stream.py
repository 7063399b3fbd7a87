"""The simulator's stream as integer codes, counted chunk by chunk (issue 18 at ×1000: 100M
events). ``simulator.simulate`` builds the whole stream as a frame of Python strings (about 10 GB
at ×100, beyond the machine at ×1000); this module draws the same events and counts them into
the same tables without it:

- **the same events**: ``simulate`` draws every event's movie pick, then every event's label,
  from one seeded PCG64 generator (one 64-bit draw per uniform). ``events(lo, hi)`` draws events
  ``lo .. hi − 1`` alone by advancing a copy of the generator to their draws (``PCG64.advance``),
  so any chunking gives ``simulate``'s users, movies, labels and true probabilities exactly;
- **the same tables**: sketches are linear, so the count period's tables are the sums of every
  chunk's increments (``service.core.tables.sketch.grouped_increments`` per table on the chunk's key
  codes, with each key hashed once for the whole stream by the service's ``KeyHasher``); the
  tables after the count periods the benchmark reads are copied as the pass reaches them;
- **only the rows the models need** are kept (the test rows, the hot windows, the baseline's
  last ``BASELINE_CAP`` events before a cut) as codes, not strings; a hot window longer than
  ``train_cap`` rows trains on every s-th of its rows (s = ⌈rows ÷ cap⌉: 1,000,000 of the 10M
  of a 10 % window at ×1000; no change up to ×100, where the largest window is 1M rows).

Every key the keys tables list occurs in the stream (with ``real_pairs`` every real rating's
user and movie occur at its first event, and every copy of its user in the others), so the
baseline's categories, the sorted values of the whole stream as ``movielens.raw_frame`` makes
them, are the sorted keys. ``tests/bench/accuracy/test_sim_stream.py`` checks all of this
against ``simulate`` and ``ColumnArm`` at small scales."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench import lgbm, movielens
from bench.accuracy.core_arm import SEED, CoreArm, Rows, Tables
from bench.accuracy.plan import Plan, Privacy, Sketching
from bench.accuracy.simulator import BLOCK, GROWTHS, Calibration
from service.core.features.columns import Encoded, column_names, encode_column, table_name
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.tables.sketch import KeyHasher, grouped_increments

CHUNK = 2_000_000  # events generated and counted at a time (about 150 MB of arrays)
USER_FEATURES = ("age", "gender", "occupation", "zip3")


def uniforms(seed: int, offset: int, size: int) -> np.ndarray:
    """Draws ``offset .. offset + size − 1`` of ``np.random.default_rng(seed).random``."""
    bits = np.random.PCG64(seed)
    bits.advance(offset)
    return np.random.Generator(bits).random(size)


@dataclass(frozen=True)
class Events:
    """A run of events as codes: the real user (the calibration's code), the copy of it
    (``grow="users"``; 0 otherwise), the movie, the label (0/1) and its true probability."""

    user: np.ndarray
    copy: np.ndarray
    movie: np.ndarray
    label: np.ndarray
    p_true: np.ndarray

    def take(self, idx: Rows) -> Events:
        return Events(*(a[idx] for a in self.fields()))

    def fields(self) -> tuple[np.ndarray, ...]:
        return self.user, self.copy, self.movie, self.label, self.p_true

    @staticmethod
    def concat(parts: Sequence[Events]) -> Events:
        return Events(*(np.concatenate(a) for a in zip(*(p.fields() for p in parts), strict=True)))


def events(
    cal: Calibration,
    scale: int,
    seed: int,
    lo: int,
    hi: int,
    *,
    grow: str = "users",
    real_pairs: bool = True,
) -> Events:
    """Events ``lo .. hi − 1`` of ``simulator.simulate(cal, scale, seed, grow=grow,
    real_pairs=real_pairs)``, drawn alone (see the module docstring)."""
    if grow not in GROWTHS:
        raise ValueError(f"grow must be one of {GROWTHS}, got {grow!r}")
    n = len(cal.users)
    total = n * scale
    if not 0 <= lo <= hi <= total:
        raise ValueError(f"events {lo}..{hi} outside the stream of {total}")
    e = np.arange(lo, hi, dtype=np.int64)
    real, j = np.divmod(e, scale)
    users = cal.users[real]
    starts = (real // BLOCK) * BLOCK
    sizes = np.minimum(BLOCK, n - starts)
    pick = starts + (uniforms(seed, lo, hi - lo) * sizes).astype(np.int64)
    movies = cal.movies[pick]
    if real_pairs:
        first = j == 0
        movies[first] = cal.movies[real[first]]
    p = cal.probability(users, movies)
    label = uniforms(seed, total + lo, hi - lo) < p
    copy = j.astype(np.int32) if grow == "users" else np.zeros(hi - lo, np.int32)
    return Events(users.astype(np.int16), copy, movies.astype(np.int16), label.astype(np.int8), p)


class Keys:
    """Every feature's canonical keys over the whole stream (``encode_column`` of its distinct
    values: the service's canonical bytes) and each event's code into them."""

    def __init__(self, cal: Calibration, scale: int, grow: str, rt: StreamRuntime) -> None:
        self.copies = scale if grow == "users" else 1
        ut, mt = cal.user_table, cal.movie_table
        self.specs = {f.name: f for f in rt.features}
        self.encoded: dict[str, Encoded] = {}  # by user, user copy or movie code
        for name, spec in self.specs.items():
            if name == "user_id":  # copy j of user u is "u~j" (simulate's ids), code u·k + j
                values: list[object] = [
                    u if j == 0 else f"{u}~{j}"
                    for u in ut["user_id"].tolist()
                    for j in range(self.copies)
                ]
            elif name in USER_FEATURES:
                values = ut[name].to_numpy() if name == "age" else ut[name].tolist()  # type: ignore[assignment]
            else:
                values = mt[name].tolist()
            enc = encode_column(values, spec)
            if name == "user_id" and not np.array_equal(enc.codes, np.arange(len(values))):
                raise ValueError("user ids are not distinct")
            self.encoded[name] = enc
        self.user_age = ut["age"].to_numpy(dtype=np.float64)

    def codes(self, name: str, ev: Events) -> np.ndarray:
        """The events' codes into ``self.encoded[name].keys``."""
        if name == "user_id":
            return ev.user.astype(np.int64) * self.copies + ev.copy
        by = ev.user if name in USER_FEATURES else ev.movie
        return self.encoded[name].codes[by]

    def raw_frame(self, ev: Events) -> pd.DataFrame:
        """``movielens.raw_frame`` of the events within the whole stream (categories: every
        value of the stream, sorted)."""
        out = pd.DataFrame(index=pd.RangeIndex(len(ev.user)))
        for f in movielens.FEATURES:
            if f == "age":
                out[f] = self.user_age[ev.user]
                continue
            values = np.array([k.decode() for k in self.encoded[f].keys], dtype=object)
            order = np.argsort(values, kind="stable")
            rank = np.empty(len(values), np.int64)
            rank[order] = np.arange(len(values))
            out[f] = pd.Categorical.from_codes(rank[self.codes(f, ev)], values[order])
        return out


class StreamArm(CoreArm):
    """``CoreArm`` on the chunked stream: the tables after each count period ``plan`` and
    ``shares`` need, and the kept rows (see the module docstring), counted in one pass.
    ``baseline``: also keep the last ``BASELINE_CAP`` events before every cut."""

    def __init__(
        self,
        cal: Calibration,
        scale: int,
        seed: int,
        plan: Plan,
        shares: Sequence[float],
        sketching: Sketching,
        training: lgbm.Training,
        *,
        grow: str = "users",
        kinds: Sequence[str] = ("median",),
        baseline_cap: int = 0,
        train_cap: int = 1_000_000,
        chunk: int = CHUNK,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.sketching = sketching
        self.training = training
        self._tables = tuple(
            TableRef(i + 1, table_name([f]), (f,), 1) for i, f in enumerate(sketching.features)
        )
        self._runtimes: dict[Privacy, StreamRuntime] = {}
        rt = self.runtime(Privacy("none"))
        self.keys = Keys(cal, scale, grow, rt)
        self.train_cap = train_cap
        spec = rt.spec
        groups = [(t.name, self.keys.encoded[t.features[0]].keys) for t in rt.tables]
        buckets, signs = KeyHasher(seed=SEED, spec=spec).hash_many(groups)
        bounds = np.cumsum([0, *(len(k) for _, k in groups)])
        self.hashes = [
            (buckets[lo:hi], signs[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        columns = column_names([t.name for t in rt.tables], rt.labels, [])
        has_movie = "movie_id" in rt.feature_names
        self.movie_backoff = columns.index("movie_id:backoff") if has_movie else -1
        # what the pass must produce: the tables at every count period's end, the kept rows
        counted = sorted({cut - plan.window(s) for s in shares for cut in plan.cuts})
        keep = []
        for cut in plan.cuts:
            keep.append(np.arange(cut, cut + plan.test_rows))
            if baseline_cap:
                keep.append(np.arange(max(0, cut - baseline_cap), cut))
            for s in shares:
                keep.append(self.train_events(slice(cut - plan.window(s), cut)))
        self.kept = np.unique(np.concatenate(keep))
        end = plan.cuts[-1] + plan.test_rows
        stops = sorted({*range(0, end, chunk), *counted, end} - {0})
        cells = {kind: [np.zeros(spec.cells, np.int64) for _ in rt.tables] for kind in kinds}
        prior = np.zeros(spec.n_labels, np.int64)
        n_movies = len(cal.movie_table)
        movie_counts = np.zeros(n_movies * spec.n_labels, np.int64)
        self._increments: dict[tuple[int, str], Tables] = {}
        self._exact: dict[int, np.ndarray] = {}
        parts: list[Events] = []
        lo = 0
        for hi in stops:
            ev = events(cal, scale, seed, lo, hi, grow=grow)
            labels = ev.label.astype(np.int64)
            for kind in kinds:
                for t, (b, sg), table in zip(rt.tables, self.hashes, cells[kind], strict=True):
                    codes = self.keys.codes(t.features[0], ev)
                    signed = sg if kind == "median" else np.ones_like(sg)
                    idx, deltas = grouped_increments(labels, codes, b, signed, spec)
                    table[idx] += deltas
            prior += np.bincount(labels, minlength=spec.n_labels)
            movie_counts += np.bincount(
                ev.movie.astype(np.int64) * spec.n_labels + labels, minlength=movie_counts.size
            )
            a, z = np.searchsorted(self.kept, [lo, hi])
            parts.append(ev.take(self.kept[a:z] - lo))
            if hi in counted:
                for kind in kinds:
                    self._increments[(hi, kind)] = ([c.copy() for c in cells[kind]], prior.copy())
                self._exact[hi] = movie_counts.reshape(n_movies, spec.n_labels).copy()
            if hi // (10 * chunk) != lo // (10 * chunk) or hi == end:
                say(f"×{scale} {grow}: counted {hi:,} of {end:,} events")
            lo = hi
        self.rows_held = Events.concat(parts)
        self.encoded = {
            name: Encoded(self.keys.codes(name, self.rows_held), enc.keys)
            for name, enc in self.keys.encoded.items()
        }
        self.labels = self.rows_held.label.astype(np.int64)
        self.y = self.labels.astype(np.float64)
        self.movie_codes = self.rows_held.movie.astype(np.int64)

    def train_events(self, hot: slice) -> np.ndarray:
        """The events of hot window ``hot`` a model trains on (every s-th above the cap)."""
        step = max(1, math.ceil((hot.stop - hot.start) / self.train_cap))
        return np.arange(hot.start, hot.stop, step)

    def rows(self, sl: slice) -> Rows:
        a, z = np.searchsorted(self.kept, [sl.start, sl.stop])
        if z - a != sl.stop - sl.start:
            raise KeyError(f"rows {sl.start}..{sl.stop} were not kept")
        return slice(int(a), int(z))

    def train_rows(self, hot: slice) -> Rows:
        want = self.train_events(hot)
        pos = np.searchsorted(self.kept, want)
        if not np.array_equal(self.kept[np.minimum(pos, len(self.kept) - 1)], want):
            raise KeyError(f"hot rows {hot.start}..{hot.stop} were not kept")
        return pos

    def increments(self, upto: int, kind: str) -> Tables:
        return self._increments[(upto, kind)]

    def exact_movie_counts(self, counted: int, sl: Rows) -> np.ndarray:
        return self._exact[counted][self.movie_codes[sl]].astype(np.float64)

    def raw(self, sl: slice) -> tuple[pd.DataFrame, np.ndarray]:
        """The baseline's raw features and labels of the stream's rows ``sl``."""
        rows = self.rows(sl)
        return self.keys.raw_frame(self.rows_held.take(rows)), self.y[rows]

    def bayes_log_loss(self, sl: slice) -> float:
        rows = self.rows(sl)
        return lgbm.log_loss(self.y[rows], self.rows_held.p_true[rows])

"""``selectivity bench accuracy --drift``: count featurization across drift, split by split.

Each stream (``bench.accuracy.drift_streams``: MovieLens 100K in time order, 10 % windows;
ACS employment MA 2015-2018, quarter-year windows, year boundaries the drift splits and the
splits within a year the control) is cut into successive splits: test window E, hot period the
h windows before it (h = 1 by default, also 2 and 3), count period every window before the hot
period. Per split, at ε = 1 (laplace, the service's default mechanism), with ``--draws`` fresh
noise draws (default 3):

* **prior**: the label rate of the window just before the test window (the same reference for
  every h, so that shares compare across h);
* **raw**: LightGBM with native categorical features on every raw row before the test window;
* **counts**: LightGBM on the train set, the hot period's rows featurized with the count
  period's noisy tables (``bench.accuracy.drift_arm``: the service's own counting, noise and
  featurization, in process), the test window featurized with the same tables (a model
  trained at the end of the hot period, served for the next window);

and the figures: log-loss, the share of the raw model's gain kept (LL_prior − LL_counts) /
(LL_prior − LL_raw); the same after an **oracle** intercept recalibration of each model (one
offset refitted on the test window's labels: it measures ranking and shape apart from the
base rate; the prior's recalibrated log-loss is the test window's label entropy); AUC and the
AUC lift kept (AUC_counts − 0.5) / (AUC_raw − 0.5).

Base rate (what the service knows of the label rate's history: every window's noisy prior
table, as released, noise from the prior table's share of the budget), compared on the same
splits: (a) nothing; (b) the client shifts the model's logit by logit(target) − logit(hot
rate), target = the recency-weighted noisy prior rate over the count period's windows and the
hot windows (exponential weights, half-life H windows; H = ∞: every window alike); (c) class
reweighting of the train rows to that target (the label-shift correction of Saerens, Latinne
& Decaestecker 2002 applied at training: positive rows weigh target / hot rate, negative ones
(1 − target) / (1 − hot rate)); (d) the noisy prior rates as columns (the previous window's
rate and the H = 2 recency-weighted rate of the windows before the row's; needs ≥ 2 hot
windows to vary). Shrinkage: the empirical-Bayes columns (``featurize.shrinkage``) against
today's (h = 1), and every feature's raw hot-window value as a model feature
(``passthrough``; every h). As a reference, **raw-hot**: LightGBM on the hot period's raw
rows alone (no counts).

Operating points (``--depth``, ``--width``, ``--features``: the features that get a count
table, ``--weights F=W,...,prior=W``: ``privacy.table_weights`` and ``prior_weight``, ``--hot``:
the hot period lengths) set the tables as the service would (``drift_arm.Point``; a custom one
is printed, not written). ``--points`` compares ``movielens_points`` on MovieLens (today's, depth
1, fewer tables, weights favouring user_id and movie_id, and what ``selectivity privacy plan``
proposes for the stream's rate and cardinalities), h = 1 and 3, count columns and count columns
+ every feature's raw hot values; its records go to ``bench/results/accuracy_drift_points.csv``
and its tables into the section (re-made from the saved full run; about 5 minutes on 2 cores
with 5 draws).

LightGBM as ``bench.lgbm`` trains it, but one seed per model (the spread comes from the noise
draws; three seeds on 200,000 ACS rows took 86 s a fit here) and learning rate 0.1 (0.05
there; count models on one ACS quarter ran to the 1,000-round cap), every model alike.
Runtime: about 10 minutes on 2 cores (``--quick``, MovieLens only, one split, 2 draws:
under 2). Per-record results go to
``bench/results/accuracy_drift.csv``, the per-split table to
``bench/results/accuracy_drift_splits.csv``; the section of BENCHMARKS.md is written unless
``--quick`` or ``--no-append``."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import lgbm
from bench.accuracy import drift_arm, drift_streams
from bench.accuracy.drift_arm import DEFAULT_POINT, DriftArm, Point, shrinkage_module
from bench.accuracy.drift_streams import DriftStream
from bench.report import ROOT, Clock

RESULTS = ROOT / "bench" / "results"
HTTP_CSV = RESULTS / "accuracy_drift_http.csv"
POINTS_CSV = RESULTS / "accuracy_drift_points.csv"
HALF_LIVES = (1.0, 2.0, 4.0, math.inf)  # (b): the recency weights' half-life, in windows
REWEIGHT_HALF_LIFE = 2.0  # (c) and (d)'s recency-weighted column
# bench.lgbm's training with one seed and learning rate 0.1 (0.05 there): every model alike;
# count models on one ACS quarter ran to the 1000-round cap at 0.05
TRAINING = dataclasses.replace(
    lgbm.DEFAULT,
    params=tuple((k, 0.1 if k == "learning_rate" else v) for k, v in lgbm.PARAMS),
    seeds=(7,),
)


@dataclass(frozen=True)
class Setup:
    streams: tuple[str, ...] = drift_streams.NAMES
    splits: tuple[tuple[str, tuple[int, ...] | None], ...] = ()  # per stream; None: its default
    hots: tuple[int, ...] = (1, 2, 3)
    draws: int = 3
    quick: bool = False
    point: Point = DEFAULT_POINT  # the count tables' operating point
    points: tuple[Point, ...] = ()  # --points: these, count columns and raw values only

    def splits_of(self, stream: str) -> tuple[int, ...] | None:
        return dict(self.splits).get(stream)


QUICK = Setup(
    streams=("movielens",), splits=(("movielens", (9,)),), hots=(1, 2), draws=2, quick=True
)
FULL = Setup()


def logit(p: Any) -> Any:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-z))


def oracle_offset(y: np.ndarray, p: np.ndarray) -> float:
    """The intercept offset δ minimising the log-loss of sigmoid(logit(p) + δ) on (y, p)
    (Newton's method on a convex function of one variable)."""
    z, delta = logit(p), 0.0
    for _ in range(50):
        q = sigmoid(z + delta)
        g, h = float(np.mean(q - y)), float(np.mean(q * (1 - q)))
        step = g / max(h, 1e-12)
        delta -= step
        if abs(step) < 1e-10:
            break
    return delta


def recalibrated(y: np.ndarray, p: np.ndarray) -> float:
    """The oracle: log-loss after refitting an intercept offset on the test window itself."""
    return lgbm.log_loss(y, sigmoid(logit(p) + oracle_offset(y, p)))


def recency_rate(counts: np.ndarray, half_life: float) -> float:
    """The recency-weighted label rate of windows' noisy prior counts (n_windows, 2), the last
    window newest: Σ w·max(c1, 0) / Σ w·(max(c0, 0) + max(c1, 0)), w = 2^(−age/half-life)."""
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    age = np.arange(len(c))[::-1]
    w = np.ones(len(c)) if math.isinf(half_life) else 0.5 ** (age / half_life)
    total = float((w * c.sum(axis=1)).sum())
    return float((w * c[:, 1]).sum() / total) if total > 0 else 0.5


def shifted(p: np.ndarray, target: float, base: float) -> np.ndarray:
    """(b): the logit shifted by logit(target) − logit(base)."""
    return sigmoid(logit(p) + logit(target) - logit(base))


def half_life_text(h: float) -> str:
    return "∞" if math.isinf(h) else f"{h:g}"


@functools.cache
def _stream(name: str, splits: tuple[int, ...] | None) -> DriftStream:
    return drift_streams.load(name, splits)


@functools.cache
def _arm(name: str, splits: tuple[int, ...] | None, point: Point = DEFAULT_POINT) -> DriftArm:
    return DriftArm(_stream(name, splits), point=point)


def _score(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    return {"ll": lgbm.log_loss(y, p), "auc": lgbm.auc(y, p), "ll_oracle": recalibrated(y, p)}


def evaluate_split(
    name: str, splits: tuple[int, ...] | None, test_window: int, setup: Setup, clock: Clock
) -> list[dict[str, Any]]:
    """``evaluate`` (``evaluate_points`` with ``setup.points``) on a named stream (loaded and
    counted once per worker process)."""
    if setup.points:
        arms = [_arm(name, splits, pt) for pt in setup.points]
        return evaluate_points(arms, test_window, setup, clock)
    return evaluate(_arm(name, splits, setup.point), test_window, setup, clock)


def evaluate(arm: DriftArm, test_window: int, setup: Setup, clock: Clock) -> list[dict[str, Any]]:
    """Every model of one split: the prior and raw models once, the count models per hot
    period length and noise draw, with the base-rate and shrinkage variants."""
    records, add = _references(arm.stream, test_window, setup, clock)
    s, name, e = arm.stream, arm.stream.name, test_window
    test = s.window(e)
    yt = s.y[test]
    hots = [h for h in setup.hots if e - h >= 1]
    eb = shrinkage_module() is not None
    exact = {h: arm.exact(e - h) for h in hots}
    for draw in range(setup.draws):
        started = time.perf_counter()
        noise = arm.draw([e - h for h in hots], n_windows=e)
        released = arm.noisy_prior(noise, range(e))  # every window's prior table before E
        for h in hots:
            k = e - h  # counted windows 0 .. k-1; hot windows k .. e-1
            train = s.rows(k, e)
            y_train = s.y[train]
            base = float(y_train.mean())
            cells = [c + n for c, n in zip(exact[h], noise.tables[k], strict=True)]
            prior_counts = released[:k].sum(axis=0)

            def fit(
                x_tr: Any, x_te: Any, weight: np.ndarray | None = None, y: np.ndarray = y_train
            ) -> tuple[np.ndarray, int]:
                return lgbm.fit_predict(x_tr, y, x_te, TRAINING, weight=weight)

            rt = arm.runtime(h)
            x_tr, x_te = arm.columns(rt, cells, prior_counts, k, [train, test])
            p, rounds = fit(x_tr, x_te)
            add("counts", "columns", h, draw, p, rounds=rounds, base=base)
            for hl in HALF_LIVES:
                target = recency_rate(released, hl)
                add(
                    "counts",
                    f"shift H={half_life_text(hl)}",
                    h,
                    draw,
                    shifted(p, target, base),
                    target=target,
                    base=base,
                )
            if h == 1:
                target = recency_rate(released, REWEIGHT_HALF_LIFE)
                w = np.where(y_train == 1, target / base, (1 - target) / (1 - base))
                p_w, rounds = fit(x_tr, x_te, w)
                variant = f"reweight H={half_life_text(REWEIGHT_HALF_LIFE)}"
                add("counts", variant, h, draw, p_w, rounds=rounds, target=target, base=base)
            pt_tr, pt_te = arm.passthrough(train, test)
            p_pt, rounds = fit(with_columns(x_tr, pt_tr), with_columns(x_te, pt_te))
            add("counts", "passthrough", h, draw, p_pt, rounds=rounds, base=base)
            if h == 1 and eb:
                rt_eb = arm.runtime(h, "empirical_bayes")
                e_tr, e_te = arm.columns(rt_eb, cells, prior_counts, k, [train, test])
                p_eb, rounds = fit(e_tr, e_te)
                add("counts", "empirical Bayes", h, draw, p_eb, rounds=rounds, base=base)
                eb_tr = with_columns(e_tr, pt_tr)
                eb_te = with_columns(e_te, pt_te)
                p_ebp, rounds = fit(eb_tr, eb_te)
                add(
                    "counts",
                    "empirical Bayes + passthrough",
                    h,
                    draw,
                    p_ebp,
                    rounds=rounds,
                    base=base,
                )
            if h == 2:
                c_tr = prior_columns(s, released, range(k, e), len(y_train))
                c_te = prior_columns(s, released, [e], len(yt))
                p_d, rounds = fit(np.hstack([x_tr, c_tr]), np.hstack([x_te, c_te]))
                add("counts", "prior columns", h, draw, p_d, rounds=rounds, base=base)
        clock(
            f"{name} split {s.window_names[e]}: draw {draw + 1}/{setup.draws} "
            f"({time.perf_counter() - started:.0f}s)"
        )
    return records


def evaluate_points(
    arms: Sequence[DriftArm], test_window: int, setup: Setup, clock: Clock
) -> list[dict[str, Any]]:
    """One split at each arm's operating point (``point`` column: its label): the prior, raw
    and raw-hot references once, then per hot period length and noise draw the count columns
    and the count columns + every feature's raw hot-period values."""
    s, e = arms[0].stream, test_window
    records, add = _references(s, e, setup, clock)
    test = s.window(e)
    hots = [h for h in setup.hots if e - h >= 1]
    for arm in arms:
        started = time.perf_counter()
        label = arm.point.label
        exact = {h: arm.exact(e - h) for h in hots}
        for draw in range(setup.draws):
            noise = arm.draw([e - h for h in hots], n_windows=e)
            released = arm.noisy_prior(noise, range(e))
            for h in hots:
                k = e - h
                train = s.rows(k, e)
                y_train = s.y[train]
                cells = [c + n for c, n in zip(exact[h], noise.tables[k], strict=True)]
                rt = arm.runtime(h)
                x_tr, x_te = arm.columns(rt, cells, released[:k].sum(axis=0), k, [train, test])
                p, rounds = lgbm.fit_predict(x_tr, y_train, x_te, TRAINING)
                add("counts", "columns", h, draw, p, rounds=rounds, point=label)
                pt_tr, pt_te = arm.passthrough(train, test)
                p_pt, rounds = lgbm.fit_predict(
                    with_columns(x_tr, pt_tr), y_train, with_columns(x_te, pt_te), TRAINING
                )
                add("counts", "passthrough", h, draw, p_pt, rounds=rounds, point=label)
        clock(
            f"{s.name} split {s.window_names[e]}: {label}, {setup.draws} draws "
            f"({time.perf_counter() - started:.0f}s)"
        )
    return records


Add = Callable[..., None]  # a split's record adder (model, variant, hot, draw, p, **extra)


def _references(
    s: DriftStream, e: int, setup: Setup, clock: Clock
) -> tuple[list[dict[str, Any]], Add]:
    """A split's records list and adder, with the prior, raw and raw-hot models added."""
    name = s.name
    test = s.window(e)
    yt = s.y[test]
    hot_rate = s.rate(s.window(e - 1))
    split = {
        "stream": name,
        "split": e,
        "window": s.window_names[e],
        "kind": s.kinds[e],
        "hot_rate": hot_rate,
        "test_rate": float(yt.mean()),
        "test_rows": len(yt),
    }
    records: list[dict[str, Any]] = []

    def add(model: str, variant: str, hot: int, draw: int, p: np.ndarray, **extra: Any) -> None:
        records.append(
            {**split, "model": model, "variant": variant, "hot": hot, "draw": draw}
            | _score(yt, p)
            | extra
        )

    started = time.perf_counter()
    add("prior", "", 0, -1, np.full(len(yt), hot_rate))
    raw = s.raw_frame
    p_raw, rounds = lgbm.fit_predict(
        raw.iloc[: test.start], s.y[: test.start], raw.iloc[test], TRAINING
    )
    add("raw", "", 0, -1, p_raw, rounds=rounds)
    clock(
        f"{name} split {s.window_names[e]}: raw {test.start} rows, {rounds} rounds "
        f"({time.perf_counter() - started:.0f}s)"
    )
    for h in [h for h in setup.hots if e - h >= 1]:  # the hot period's raw rows alone
        hot_rows = s.rows(e - h, e)
        p_hot, rounds = lgbm.fit_predict(
            raw.iloc[hot_rows], s.y[hot_rows], raw.iloc[test], TRAINING
        )
        add("raw-hot", "raw hot period only", h, -1, p_hot, rounds=rounds)
    return records, add


def with_columns(x: np.ndarray, extra: pd.DataFrame) -> pd.DataFrame:
    """Count columns (``c0`` …) and the passed-through raw values beside them."""
    counts = pd.DataFrame(x, columns=[f"c{i}" for i in range(x.shape[1])])
    return pd.concat([counts, extra.reset_index(drop=True)], axis=1)


def prior_columns(
    s: DriftStream, released: np.ndarray, windows: Sequence[int], n_rows: int
) -> np.ndarray:
    """(d): per row of ``windows`` (in order), the noisy prior rate of the window before its
    own and the recency-weighted rate of all windows before its own."""
    blocks = []
    for j in windows:
        n = s.bounds[j + 1] - s.bounds[j]
        lag = recency_rate(released[j - 1 : j], 1.0)
        ew = recency_rate(released[:j], REWEIGHT_HALF_LIFE)
        blocks.append(np.tile([lag, ew], (n, 1)))
    out = np.vstack(blocks)
    assert len(out) == n_rows
    return out


SPARSE = ("user_id", "movie_id")  # MovieLens's sparse keys (943 users, 1,682 movies)
POINT_HOTS = (1, 3)


def planner_point(s: DriftStream, hot: int = 3) -> tuple[Point, Any]:
    """What ``selectivity privacy plan`` proposes for the stream's rate (rows per window) and
    cardinalities (numeric features: their buckets + 1), at most ε = 1, ``hot`` hot windows and
    the windows the stream has (exposure hot / windows): its sketch and weights, at ε = 1."""
    from service.core.dp.plan import PlanRequest, make_plan

    n_windows = len(s.bounds) - 1
    cards = {
        f["name"]: len(f["buckets"]) + 1
        if f.get("kind") == "numeric"
        else len(pd.unique(s.values[f["name"]]))
        for f in s.features
    }
    req = PlanRequest.model_validate(
        {
            "observations_per_window": round(len(s.y) / n_windows),
            "cardinalities": cards,
            "max_epsilon": 1.0,
            "hot_windows": hot,
            "max_exposure": hot / n_windows,
        }
    )
    plan = make_plan(req)
    point = Point(
        label=f"planner's: 7 tables, {plan.width} × {plan.depth}, its weights "
        f"(it proposes ε = {plan.epsilon:g})",
        width=plan.width,
        depth=plan.depth,
        weights=tuple(plan.table_weights.items()),
        prior_weight=plan.prior_weight,
    )
    return point, plan


def movielens_points() -> tuple[Point, ...]:
    """The operating points ``--points`` compares on MovieLens at ε = 1 (today's first)."""
    s = _stream("movielens", None)
    others = [f["name"] for f in s.features if f["name"] not in SPARSE]
    light = tuple((f, 0.05) for f in others)
    planned = planner_point(s)[0]
    return (
        DEFAULT_POINT,
        Point(label="7 tables, 16384 × 1", depth=1),
        Point(label="user_id, movie_id, 16384 × 3", features=SPARSE),
        Point(label="user_id, movie_id, 16384 × 1", depth=1, features=SPARSE),
        Point(
            label="user_id, movie_id, 16384 × 1, prior weight 0.05",
            depth=1,
            features=SPARSE,
            prior_weight=0.05,
        ),
        Point(
            label="movie_id, 16384 × 1, prior weight 0.05",
            depth=1,
            features=("movie_id",),
            prior_weight=0.05,
        ),
        Point(
            label="user_id, movie_id, genres, 16384 × 1",
            depth=1,
            features=(*SPARSE, "genres"),
        ),
        Point(
            label="7 tables, 16384 × 1, weights 1 (user_id, movie_id), 0.05 (the rest, prior)",
            depth=1,
            weights=light,
            prior_weight=0.05,
        ),
        Point(
            label="7 tables, 16384 × 1, weights 1 (movie_id), 0.01 (the rest), prior 0.05",
            depth=1,
            weights=tuple((f["name"], 0.01) for f in s.features if f["name"] != "movie_id"),
            prior_weight=0.05,
        ),
        planned,
        dataclasses.replace(
            planned, label="planner's weights, 16384 × 1", width=drift_arm.WIDTH, depth=1
        ),
    )


def run(setup: Setup, *, workers: int) -> tuple[pd.DataFrame, float]:
    """Every split of every stream, one job each, on ``workers`` processes (the streams'
    largest splits first)."""
    clock = Clock()
    jobs = []
    for name in setup.streams:
        splits = setup.splits_of(name)
        s = _stream(name, splits)
        jobs += [(name, splits, e) for e in s.splits]
    jobs.sort(key=lambda j: -_stream(j[0], j[1]).bounds[j[2]])
    records: list[dict[str, Any]] = []
    if workers <= 1:
        for name, splits, e in jobs:
            records += evaluate_split(name, splits, e, setup, clock)
    else:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = [
                pool.submit(evaluate_split, name, splits, e, setup, clock)
                for name, splits, e in jobs
            ]
            for f in futures:
                records += f.result()
    return pd.DataFrame(records), time.perf_counter() - clock.t0


def _splits(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, rest = text.partition("=")
    try:
        return name, tuple(int(x) for x in rest.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--splits: {text!r} is not STREAM=W1,W2,...") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N1,N2,...") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers of at least 1")
    return out


def _weights(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for item in text.split(","):
        name, _, w = item.partition("=")
        try:
            out.append((name.strip(), float(w)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--weights: {item!r} is not FEATURE=WEIGHT") from None
    return tuple(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="selectivity bench accuracy --drift",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="MovieLens, one split, h 1-2, 2 draws")
    p.add_argument("--no-append", action="store_true", help="print, do not write BENCHMARKS.md")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--draws", type=int, default=None, help="noise draws per split (default 3)")
    p.add_argument("--streams", default=None, help=f"comma-separated, of {drift_streams.NAMES}")
    p.add_argument(
        "--splits",
        type=_splits,
        action="append",
        default=None,
        metavar="STREAM=W1,W2",
        help="test windows (0-based) of a stream",
    )
    p.add_argument("--hot", type=_ints, default=None, help="hot period lengths, e.g. 1,2,3")
    p.add_argument("--depth", type=int, default=None, help="sketch depth (default 3)")
    p.add_argument("--width", type=int, default=None, help="sketch width (default 16384)")
    p.add_argument(
        "--features",
        default=None,
        help="comma-separated: the features that get a count table (default every one); the "
        "raw hot values are every feature's",
    )
    p.add_argument(
        "--weights",
        type=_weights,
        default=None,
        metavar="F=W,...",
        help="privacy.table_weights (prior=W: the prior table's prior_weight)",
    )
    p.add_argument(
        "--points",
        action="store_true",
        help="compare the operating points of movielens_points (MovieLens, h 1 and 3, count "
        "columns and + raw values); the table goes to bench/results/accuracy_drift_points.csv "
        "and into the section",
    )
    p.add_argument("--from-csv", type=Path, help="re-make the report from a saved run")
    p.add_argument(
        "--confirm-http",
        action="store_true",
        help="only: one configuration over HTTP against the in-process arm "
        "(bench.accuracy.drift_http); its table goes to bench/results/accuracy_drift_http.csv "
        "and into the next report",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the CSVs and the plot go (default bench/results/ and bench/plots/)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    from bench.accuracy import drift_report

    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    args = p.parse_args(argv)
    setup = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.draws is not None:
        if args.draws < 1:
            p.error("--draws must be at least 1")
        changes["draws"] = args.draws
    if args.streams is not None:
        names = tuple(n.strip() for n in args.streams.split(",") if n.strip())
        bad = [n for n in names if n not in drift_streams.NAMES]
        if bad or not names:
            p.error(f"--streams: unknown {bad}; choose from {', '.join(drift_streams.NAMES)}")
        changes["streams"] = names
    if args.splits:
        changes["splits"] = tuple(args.splits)
    if args.hot is not None:
        changes["hots"] = args.hot
    point = point_of(args, p)
    if point != DEFAULT_POINT:
        changes["point"] = point
    if args.points:
        changes |= {"points": movielens_points(), "streams": ("movielens",)}
        changes.setdefault("hots", POINT_HOTS)
    setup = dataclasses.replace(setup, **changes)
    custom = bool(changes)
    if args.confirm_http:
        from bench import report
        from bench.accuracy import drift_http

        table = drift_http.confirm(setup.draws)
        RESULTS.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(table.rows, columns=list(table.header)).to_csv(HTTP_CSV, index=False)
        print(report.body([table]))
        return
    if args.points:
        points_main(args, setup, argv)
        return
    csv = (args.out_dir or RESULTS) / f"accuracy_drift{'_quick' if setup.quick else ''}.csv"
    if args.from_csv:
        frame = pd.read_csv(args.from_csv)
    else:
        frame, elapsed = run(setup, workers=args.workers)
        csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv, index=False)
        print(f"done in {elapsed:.0f}s; records in {csv}", flush=True)
    command = " ".join(["selectivity bench accuracy --drift", *argv])
    write = not (args.no_append or setup.quick or custom or args.out_dir)
    drift_report.write(frame, command=command, write=write, quick=setup.quick, out_dir=args.out_dir)


def point_of(args: argparse.Namespace, p: argparse.ArgumentParser) -> Point:
    """The operating point --depth, --width, --features and --weights ask for."""
    changes: dict[str, Any] = {}
    if args.depth is not None:
        changes["depth"] = args.depth
    if args.width is not None:
        changes["width"] = args.width
    if args.features is not None:
        changes["features"] = tuple(f.strip() for f in args.features.split(",") if f.strip())
    if args.weights is not None:
        weights = dict(args.weights)
        if "prior" in weights:
            changes["prior_weight"] = weights.pop("prior")
        changes["weights"] = tuple(weights.items())
    if not changes:
        return DEFAULT_POINT
    point = dataclasses.replace(DEFAULT_POINT, label="custom", **changes)
    try:  # the service's validation (StreamCreate) on every stream asked for
        for name in args.streams.split(",") if args.streams else drift_streams.NAMES:
            DriftArm(_stream(name.strip(), None), point=point).runtime(1)
    except ValueError as exc:
        p.error(f"operating point: {str(exc).splitlines()[0][:300]}")
    return point


def points_main(args: argparse.Namespace, setup: Setup, argv: list[str]) -> None:
    """--points: run (or --from-csv re-read) the comparison, save it, and re-make the section
    from the saved full run (bench/results/accuracy_drift.csv) with the comparison in it."""
    from bench.accuracy import drift_report

    out = (args.out_dir or RESULTS) / POINTS_CSV.name
    if args.from_csv:
        frame = pd.read_csv(args.from_csv)
    else:
        frame, elapsed = run(setup, workers=args.workers)
        frame["command"] = " ".join(["selectivity bench accuracy --drift", *argv])
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out, index=False)
        print(f"done in {elapsed:.0f}s; records in {out}", flush=True)
    command = str(frame["command"].iloc[0]) if "command" in frame else drift_report.POINTS_COMMAND
    command = command.replace(" --no-append", "")  # the run's, not the report's
    print(report_points(frame, command))
    main_csv = RESULTS / "accuracy_drift.csv"
    if args.no_append or args.out_dir or not main_csv.exists():
        return
    drift_report.write(
        pd.read_csv(main_csv),
        command=drift_report.saved_command(),
        write=True,
        quick=False,
        points=(frame, command),
    )


def report_points(frame: pd.DataFrame, command: str) -> str:
    from bench import report
    from bench.accuracy import drift_report

    return report.body(drift_report.points_tables(frame, command))

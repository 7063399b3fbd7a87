"""DP count-table selection on ACS employment (``bench.streams.acs``): which pair tables pay,
and does the service's selection find them?

``selectivity bench selection-acs [--quick] [--draws 3] [--out F]``.

**Stream.** ACS employment, Massachusetts 2015–2018 (277,677 rows, 16 categorical features,
label ``employed``), in 16 windows: each survey year cut into 4 equal chunks in the file's
order ("quarters": within a year the order carries no time). Window ``k`` of year ``y`` is
``4·(y − 2015) + k``. Split ``h → h + 1``: the model trains on hot window ``h`` (one window,
``hot_windows`` 1), is tested on window ``h + 1``, its count tables hold windows ``1 … h − 1``.
Splits ``8 → 9`` (2016 Q4 → 2017 Q1, a year boundary), ``10 → 11``, ``12 → 13``.

**Tables**, built with the service's own code on ``service.core`` (as ``core_arm.CoreArm``,
whose ``_draw`` samples the noise): the stream configuration validated by ``StreamCreate``
(16 categorical features, ``max_tables`` = 16 + 1 + 4 free slots, the default, sketch 16384 × 3),
``StreamRuntime``'s noise per table (``service.core.dp.budget``), group keys as the counter
builds them (``combine_codes``), hashing (``KeyHasher``), increments (``grouped_increments``),
estimates (``estimate``), back-off thresholds (``backoff_threshold``, with the windows each
table was counted in) and columns (``derived_columns``, ``assemble``). Laplace ε = 1 per window.
A group counted from window ``f`` holds windows ``f … h − 1`` with their noise.

**1. Oracle** (no noise): per split, log-loss of LightGBM (``bench.lgbm``, one seed, learning rate
0.1) with the 16
single-feature tables, and with each of the 120 pair tables added (counted from window 1); the
gain in % of the log-loss without, mean over splits. ``--quick``: every 8th row, one split,
the pairs of 6 features.

**2. Selection as the service runs it**: ``service.core.dp.selection.select_round`` (the
CSPRNG Gumbel mechanism, "aic" score, one group per round) at the rolls to epochs 2 … 5
(``selection_rounds`` = the 4 free slots), each round reading the hot period that just ended
(window e − 1), the groups picked before it being tables; the rules (``Rule`` of
``bench.accuracy.selection_sim``): ``default`` (ε_sel = 1, threshold 0, margin 3,
``min_records`` 100,000), and the variants in ``ARMS``. Per noise draw (``--draws``), each arm's
picks are counted (a) as the service counts them today, from window e + 2 (window e + 1 may be
prepared already), and (b) from the window the round read, e − 1 (``held``: its raw rows are
still held when the round runs); log-loss ÷ that of the same draw's tables without groups
(``without``: the same 21 slots; ``off``: selection off with 17 slots, ``max_tables`` =
features + 1, what a stream without free slots gets).

**Counting a pick from the hot windows already held: the privacy argument.** Per window the
tables' budget is split over the ``max_tables`` slots (``service.core.dp.budget``: ε_s =
ε·w_s/W, Σ_s ε_s = ε over all T slots, a free slot's share kept in W whether it is filled or
not while selection is on). Counting a group picked at the roll to e in a window w < e + 2 adds
to window w one table with fresh noise at a free slot's ε_s: window w then has at most T
tables, its tables compose to at most ε (basic composition, adaptive: which group is counted
is the output of the ε_sel-DP round, charged on its own), and the ledger's per-window charge is
unchanged. What must hold, and what a service change must test: a window never holds more
tables than its T slots (a group counted in a window already holding T − 1 tables besides the
prior would exceed them), the ledger's per-window figures stay exact (no extra charge, no
missing one), and the back-filled table's noise is drawn at the slot's scale once per window.
This benchmark measures what that timing would gain; the service still counts from e + 2.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench import lgbm
from bench.accuracy.core_arm import SEED, CoreArm
from bench.accuracy.selection_sim import Rule
from bench.report import ROOT, Clock, Table, write_section
from bench.streams import acs
from service.core.dp.selection import score_candidates, select_round
from service.core.features.columns import (
    Encoded,
    assemble,
    backoff_threshold,
    combine_codes,
    derived_columns,
    encode_column,
    prior_probabilities,
    table_name,
)
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import PrivacyIn, StreamCreate
from service.core.tables.sketch import KeyHasher, estimate, grouped_increments

Group = tuple[str, ...]
WINDOWS_PER_YEAR = 4
SPLITS = (8, 10, 12)  # hot window h -> test window h + 1
FREE_SLOTS = 4  # the default: max_tables = features + 5
ROUND_EPOCHS = range(2, 2 + FREE_SLOTS)  # selection_rounds = the free slots
HOT_WINDOWS = 1
EPSILON = 1.0
EPSILON_SELECTION = 1.0
DEFAULT_MIN_RECORDS = PrivacyIn.model_fields["min_records"].default
# one seed and learning rate 0.1 (bench.lgbm's 0.05 halved the rounds' cost): 3 × 121 fits
TRAINING = lgbm.Training(
    params=tuple((k, 0.1 if k == "learning_rate" else v) for k, v in lgbm.PARAMS), seeds=(7,)
)
RESULTS = ROOT / "bench" / "results"
PLACEBO = "copy:"  # the oracle's placebo rows: a single table counted twice
QUICK_FEATURES = ("AGEP", "SCHL", "MAR", "RELP", "DIS", "SEX")


@dataclass(frozen=True)
class Arm:
    """A selection rule and the stream's public selection settings."""

    rule: Rule
    min_records: int = DEFAULT_MIN_RECORDS
    score: str = "aic"
    epsilon: float = EPSILON_SELECTION


ARMS = {
    "default": Arm(Rule(0.0)),
    "n17k": Arm(Rule(0.0), min_records=17_000),  # min_records near the hot period's size
    "n17k-m0": Arm(Rule(0.0, 0.0), min_records=17_000),
}


def window_starts(years: np.ndarray) -> np.ndarray:
    """Row where each window starts, and the end: ``starts[k − 1]:starts[k]`` is window k."""
    out = []
    for y in np.unique(years):
        lo, hi = np.flatnonzero(years == y)[[0, -1]]
        out += [lo + (hi + 1 - lo) * q // WINDOWS_PER_YEAR for q in range(WINDOWS_PER_YEAR)]
    return np.array([*out, len(years)], dtype=np.int64)


@dataclass
class AcsTables:
    """The ACS stream's count tables on ``service.core`` (module docstring): codes and hashes
    per table memoised, counts of a window range computed on demand, noise drawn per window."""

    features: dict[str, np.ndarray]
    y: np.ndarray
    starts: np.ndarray
    epsilon: float = EPSILON
    _enc: dict[Group, Encoded] = field(default_factory=dict)
    _hash: dict[Group, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _cells: dict[tuple[Group, int, int], np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names = tuple(self.features)
        self.labels = self.y.astype(np.int64)
        self.rt = self.runtime(len(self.names) + 1 + FREE_SLOTS, "laplace")
        self.exact = self.runtime(len(self.names) + 1 + FREE_SLOTS, "none")
        self.spec = self.rt.spec
        for spec in self.rt.features:
            self._enc[(spec.name,)] = encode_column(self.features[spec.name].tolist(), spec)

    def runtime(self, max_tables: int, mechanism: str) -> StreamRuntime:
        privacy: dict[str, Any] = {"mechanism": mechanism}
        if mechanism == "laplace":
            privacy["epsilon"] = self.epsilon
        body = {
            "name": "acs",
            "features": [{"name": f, "kind": "categorical"} for f in self.names],
            "labels": ["0", "1"],
            "hot_windows": HOT_WINDOWS,
            "window_seconds": 91 * 86400,
            "retention_windows": 16,
            "sketch": {"width": 16384, "depth": 3},
            "max_tables": max_tables,
            "privacy": privacy,
        }
        cfg = StreamCreate.model_validate(body)
        tables = tuple(TableRef(i + 1, f, (f,), 1) for i, f in enumerate(self.names))
        return StreamRuntime(1, "acs", cfg, SEED, tables)

    def encoded(self, group: Group) -> Encoded:
        if group not in self._enc:
            self._enc[group] = combine_codes([self._enc[(f,)] for f in group])
        return self._enc[group]

    def hashes(self, group: Group) -> tuple[np.ndarray, np.ndarray]:
        if group not in self._hash:
            keys = [(table_name(list(group)), self.encoded(group).keys)]
            self._hash[group] = KeyHasher(seed=SEED, spec=self.spec).hash_many(keys)
        return self._hash[group]

    def rows(self, first: int, last: int) -> slice:
        """The rows of windows ``first … last`` (1-based, inclusive)."""
        return slice(int(self.starts[first - 1]), int(self.starts[last]))

    def cells(self, group: Group, first: int, last: int) -> np.ndarray:
        """Exact cells of ``group``'s table over windows ``first … last``; single features'
        memoised."""
        key = (group, first, last)
        if key in self._cells:
            return self._cells[key]
        out = np.zeros(self.spec.cells, np.int64)
        if last >= first:
            sl = self.rows(first, last)
            buckets, signs = self.hashes(group)
            codes = self.encoded(group).codes[sl]
            idx, deltas = grouped_increments(self.labels[sl], codes, buckets, signs, self.spec)
            out[idx] += deltas
        if len(group) == 1:
            self._cells[key] = out
        return out

    def noise(self, rt: StreamRuntime, windows: int, size: int) -> np.ndarray:
        """The sum of ``windows`` windows' noise of one table of weight 1."""
        total = np.zeros(size, np.int64)
        if rt.noise.mechanism != "none":
            for _ in range(windows):
                total += CoreArm._draw(rt, 1.0, size)
        return total


@dataclass
class Draw:
    """One noise draw of every table at every split; single features' and the prior's shared
    by the arms of a draw (common random numbers), a group's drawn per (group, first window)."""

    tables: AcsTables
    rt: StreamRuntime
    _noise: dict[tuple[Group, int, int], np.ndarray] = field(default_factory=dict)

    def noise(self, group: Group, first: int, last: int) -> np.ndarray:
        key = (group, first, last)
        if key not in self._noise:
            size = self.tables.spec.n_labels if group == ("(prior)",) else self.tables.spec.cells
            self._noise[key] = self.tables.noise(self.rt, max(last - first + 1, 0), size)
        return self._noise[key]

    def evaluate(self, h: int, groups: Sequence[tuple[Group, int]]) -> tuple[float, float]:
        """Log-loss and AUC on window h + 1 of LightGBM trained on window h, the count tables
        holding windows 1 … h − 1: the single features, the prior, and each ``(group, first)``
        counted from window ``first`` (left out when ``first > h − 1``)."""
        t, rt, last = self.tables, self.rt, h - 1
        cfg = rt.config
        train, test = t.rows(h, h), t.rows(h + 1, h + 1)
        prior = np.bincount(t.labels[t.rows(1, last)], minlength=2) + self.noise(
            ("(prior)",), 1, last
        )
        prior_p = prior_probabilities(prior)
        visible = [((f,), 1) for f in t.names] + [(g, f) for g, f in groups if f <= last]
        blocks: dict[str, list[Any]] = {"train": [], "test": []}
        for group, first in visible:
            agg = t.cells(group, first, last) + self.noise(group, first, last)
            buckets, signs = t.hashes(group)
            by_key = estimate(agg, buckets, signs, t.spec)
            thr = backoff_threshold(
                noise_variance=rt.noise.variance_for(1.0),
                n_windows=last - first + 1,
                n_labels=2,
                sigmas=cfg.featurize.backoff_sigmas,
            )
            codes = t.encoded(group).codes
            for part, sl in (("train", train), ("test", test)):
                blocks[part].append(
                    derived_columns(
                        by_key[codes[sl]], prior=prior_p, alpha=cfg.featurize.alpha, threshold=thr
                    )
                )
        x_train = assemble(blocks["train"], [], train.stop - train.start)
        x_test = assemble(blocks["test"], [], test.stop - test.start)
        p, _ = lgbm.fit_predict(x_train, t.y[train], x_test, TRAINING)
        return lgbm.log_loss(t.y[test], p), lgbm.auc(t.y[test], p)


def rounds(t: AcsTables, arm: Arm) -> list[tuple[Group, int]]:
    """The groups the service's rounds pick (module docstring), each with its round's epoch."""
    tables: list[Group] = [(f,) for f in t.names]
    picked: list[tuple[Group, int]] = []
    for epoch in ROUND_EPOCHS:
        sl = t.rows(max(epoch - HOT_WINDOWS, 1), epoch - 1)
        got = select_round(
            columns={f: t.encoded((f,)).codes[sl] for f in t.names},
            labels=t.labels[sl],
            n_labels=2,
            tables=tables,
            max_tables=len(t.names) + 1 + FREE_SLOTS,
            groups_per_round=1,
            epsilon=arm.epsilon,
            min_records=arm.min_records,
            score=arm.score,
            threshold=arm.rule.threshold,
            margin=arm.rule.margin,
        )
        tables += [c.group for c in got]
        picked += [(c.group, epoch) for c in got]
    return picked


def exact_scores(t: AcsTables, epoch: int, arm: Arm) -> list[tuple[Group, float]]:
    """The first round's exact padded scores, best first (public data: a diagnosis the service
    never releases), to set beside the mechanism's noise scale and ⊥'s score."""
    sl = t.rows(max(epoch - HOT_WINDOWS, 1), epoch - 1)
    n = sl.stop - sl.start
    cands = score_candidates(
        columns={f: t.encoded((f,)).codes[sl] for f in t.names},
        labels=t.labels[sl],
        n_labels=2,
        tables=[(f,) for f in t.names],
        score=arm.score,
    )
    w = n / (n + arm.min_records)
    return sorted(((c.group, w * c.gain) for c in cands), key=lambda x: -x[1])


def interaction_score(a: np.ndarray, b: np.ndarray, y: np.ndarray, n_labels: int = 2) -> float:
    """What a pair table adds to a model that has both single tables: the per-record log-
    likelihood gain of ``P(Y | A, B)`` over the no-three-way-interaction log-linear model
    ``[AB][AY][BY]`` (fitted by iterative proportional fitting), less Akaike's penalty for the
    interaction's free parameters ``(L − 1)(K_AB − K_A − K_B + 1)``, ``K`` occupied cells. A
    diagnosis on public data only: its sensitivity is not derived, the service does not use it."""
    a = np.unique(a, return_inverse=True)[1].reshape(-1)
    b = np.unique(b, return_inverse=True)[1].reshape(-1)
    ka, kb, n = int(a.max()) + 1, int(b.max()) + 1, len(y)
    c = np.bincount((a * kb + b) * n_labels + y, minlength=ka * kb * n_labels)
    c = c.reshape(ka, kb, n_labels).astype(np.float64)
    m = np.full_like(c, n / c.size)
    for _ in range(200):
        previous = m.copy()
        for axis in (2, 1, 0):
            target, now = c.sum(axis, keepdims=True), m.sum(axis, keepdims=True)
            m *= np.divide(target, now, out=np.zeros_like(target), where=now > 0)
        if np.abs(m - previous).max() < 1e-6:
            break
    nz = c > 0
    gain = float((c[nz] * np.log(c[nz] / m[nz])).sum()) / n
    k_ab = int((c.sum(2) > 0).sum())
    k_a, k_b = int((c.sum((1, 2)) > 0).sum()), int((c.sum((0, 2)) > 0).sum())
    return gain - (n_labels - 1) * (k_ab - k_a - k_b + 1) / n


def score_agreement(
    t: AcsTables, ranked: list[tuple[str, float, list[float]]], windows: tuple[int, int]
) -> list[list[object]]:
    """Per score, on the rows of ``windows`` (first, last): Spearman's ρ with the oracle's mean
    gain over the pairs, and the oracle rank of the score's best three pairs."""
    from scipy.stats import spearmanr

    sl = t.rows(*windows)
    y = t.labels[sl]
    cols = {f: t.encoded((f,)).codes[sl] for f in t.names}
    singles = [(f,) for f in t.names]
    found: dict[str, dict[str, float]] = {}
    for score in ("aic", "mi"):
        cands = score_candidates(columns=cols, labels=y, n_labels=2, tables=singles, score=score)
        found[score] = {"+".join(c.group): c.gain for c in cands}
    found["interaction (diagnosis)"] = {
        "+".join(g): interaction_score(cols[g[0]], cols[g[1]], y)
        for g in itertools.combinations(sorted(t.names), 2)
    }
    rank = {_norm(p): i + 1 for i, (p, _, _) in enumerate(ranked)}
    gain = {_norm(p): g for p, g, _ in ranked}
    out: list[list[object]] = []
    for score, by in found.items():
        pairs = sorted(by, key=lambda q: -by[q])
        rho = spearmanr([by[q] for q in pairs], [gain[_norm(q)] for q in pairs]).statistic
        best = ", ".join(f"{q} (#{rank[_norm(q)]})" for q in pairs[:3])
        out.append([score, f"{rho:+.2f}", best])
    return out


def _norm(pair: str) -> str:
    return "+".join(sorted(pair.split("+")))


def load(quick: bool) -> AcsTables:
    s = acs.load()
    step = 8 if quick else 1
    feats = {k: v[::step] for k, v in s.features.items()}
    if quick:
        feats = {k: feats[k] for k in QUICK_FEATURES}
    year = s.year[::step]
    return AcsTables(feats, s.label[::step].astype(np.int8), window_starts(year))


def oracle(t: AcsTables, splits: Sequence[int], say: Clock) -> list[dict[str, Any]]:
    """Part 1: every pair's log-loss gain, no noise, per split."""
    rows: list[dict[str, Any]] = []
    d = Draw(t, t.exact)
    for h in splits:
        base, base_auc = d.evaluate(h, [])
        rows.append({"split": h, "pair": "", "log_loss": base, "auc": base_auc, "gain_pct": 0.0})
        t0 = time.perf_counter()
        for f in t.names:  # placebos: a second copy of a single table adds no information
            ll, auc = d.evaluate(h, [((f,), 1)])
            rows.append(
                {
                    "split": h,
                    "pair": f"{PLACEBO}{f}",
                    "log_loss": ll,
                    "auc": auc,
                    "gain_pct": 100 * (base - ll) / base,
                }
            )
        for pair in itertools.combinations(t.names, 2):
            ll, auc = d.evaluate(h, [(pair, 1)])
            rows.append(
                {
                    "split": h,
                    "pair": "+".join(pair),
                    "log_loss": ll,
                    "auc": auc,
                    "gain_pct": 100 * (base - ll) / base,
                }
            )
        say(f"oracle split {h}->{h + 1}: without {base:.4f} ({time.perf_counter() - t0:.0f} s)")
    return rows


def per_split(rows: list[dict[str, Any]], splits: Sequence[int]) -> list[list[object]]:
    """Per split: the log-loss without pairs, the pairs' gains (best, median, how many ≥ 1 %)
    and the placebos' (min … max): what adding a table does by itself to the model."""
    out: list[list[object]] = []
    for h in splits:
        mine = [r for r in rows if r["split"] == h and r["pair"]]
        pairs = [r for r in mine if not r["pair"].startswith(PLACEBO)]
        placebo = [r["gain_pct"] for r in mine if r["pair"].startswith(PLACEBO)]
        best = max(pairs, key=lambda r: r["gain_pct"])
        base = next(r["log_loss"] for r in rows if r["split"] == h and not r["pair"])
        top = max(placebo, default=-math.inf)
        out.append(
            [
                f"{h} → {h + 1}",
                f"{base:.4f}",
                f"{best['pair']} {best['gain_pct']:+.2f} %",
                f"{statistics.median(r['gain_pct'] for r in pairs):+.2f} %",
                sum(r["gain_pct"] >= 1 for r in pairs),
                sum(r["gain_pct"] >= max(1.0, top + 1.0) for r in pairs),
                f"{min(placebo):+.2f} … {max(placebo):+.2f} % (median "
                f"{statistics.median(placebo):+.2f})"
                if placebo
                else "—",
            ]
        )
    return out


def ranking(rows: list[dict[str, Any]]) -> list[tuple[str, float, list[float]]]:
    """Pairs by mean gain over splits, best first: (pair, mean %, per split %)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["pair"] and not r["pair"].startswith(PLACEBO):
            by.setdefault(r["pair"], []).append(r["gain_pct"])
    return sorted(((p, statistics.fmean(g), g) for p, g in by.items()), key=lambda x: -x[1])


def selection(
    t: AcsTables,
    splits: Sequence[int],
    draws: int,
    arms: dict[str, Arm],
    top: Sequence[Group],
    say: Clock,
) -> list[dict[str, Any]]:
    """Part 2 and the timing of item 3: per draw, each arm's picks counted from e + 2 and from
    e − 1, against ``without`` (same slots) and ``off`` (17 slots); ``top``: the oracle's best
    pairs counted from window 1 under the same noise (what a perfect pick would give)."""
    rows: list[dict[str, Any]] = []
    off_rt = t.runtime(len(t.names) + 1, "laplace")
    for draw in range(draws):
        d, d_off = Draw(t, t.rt), Draw(t, off_rt)
        picks = {name: rounds(t, arm) for name, arm in arms.items()}
        say(f"draw {draw + 1}: picks " + "; ".join(f"{a}: {_picks(p)}" for a, p in picks.items()))
        for h in splits:
            base, base_auc = d.evaluate(h, [])

            def add(
                arm: str,
                timing: str,
                ll: float,
                auc: float,
                groups: str,
                draw: int = draw,
                h: int = h,
                base: float = base,
            ) -> None:
                rows.append(
                    {
                        "draw": draw,
                        "split": h,
                        "arm": arm,
                        "timing": timing,
                        "groups": groups,
                        "log_loss": ll,
                        "auc": auc,
                        "ratio": ll / base,
                    }
                )

            add("without", "", base, base_auc, "")
            add("off", "", *d_off.evaluate(h, []), "")
            if top:
                fixed = [(g, 1) for g in top]
                add("oracle top", "window 1", *d.evaluate(h, fixed), _picks([(g, 0) for g in top]))
            for arm, got in picks.items():
                later = [(g, e + 2) for g, e in got]
                held = [(g, max(e - HOT_WINDOWS, 1)) for g, e in got]
                visible = _picks([(g, e) for g, e in got if e + 2 <= h - 1])
                if not got:
                    add(arm, "e+2", base, base_auc, "")
                    add(arm, "held", base, base_auc, "")
                    continue
                add(arm, "e+2", *d.evaluate(h, later), visible)
                add(arm, "held", *d.evaluate(h, held), _picks(got))
            say(
                f"draw {draw + 1} split {h}->{h + 1}: "
                + ", ".join(
                    f"{r['arm']}{'/' + r['timing'] if r['timing'] else ''} {r['ratio']:.4f}"
                    for r in rows
                    if r["draw"] == draw and r["split"] == h
                )
            )
    return rows


def _picks(got: Sequence[tuple[Group, int]]) -> str:
    return ", ".join("+".join(g) + (f" (e{e})" if e else "") for g, e in got) or "(none)"


def _mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return f"{statistics.fmean(values):.4f}"
    se = statistics.stdev(values) / math.sqrt(len(values))
    return f"{statistics.fmean(values):.4f} ± {se:.4f}"


def _read_csv(path: Path) -> list[dict[str, Any]]:
    def value(v: str) -> Any:
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    with path.open() as f:
        return [{k: v if k in ("pair", "groups") else value(v) for k, v in r.items()} for r in
                csv.DictReader(f)]  # fmt: skip


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench selection-acs", description=__doc__)
    p.add_argument("--quick", action="store_true", help="every 8th row, 6 features, one split")
    p.add_argument("--draws", type=int, default=3, help="noise draws of selection and tables")
    p.add_argument("--top", type=int, default=1, help="the oracle's best pairs as a fixed arm")
    p.add_argument("--out", type=Path, help="write the section here instead of BENCHMARKS.md")
    p.add_argument(
        "--from-csv",
        action="store_true",
        help="report the CSVs of an earlier run (beside --out, else in bench/results)",
    )
    args = p.parse_args(argv)
    if not 1 <= args.draws <= 20 or not 0 <= args.top <= FREE_SLOTS:
        p.error(f"--draws must be in [1, 20] and --top in [0, {FREE_SLOTS}]")
    say = Clock()
    t0 = time.perf_counter()
    t = load(args.quick)
    splits = SPLITS[:1] if args.quick else SPLITS
    say(f"ACS: {len(t.y):,} rows, {len(t.names)} features, windows of ~{t.starts[1]:,} rows")
    results = RESULTS if args.out is None else args.out.parent
    tag = "selection_acs" + ("_quick" if args.quick else "")
    if args.from_csv:
        orc = _read_csv(results / f"{tag}_oracle.csv")
        sel = _read_csv(results / f"{tag}_selection.csv")
        args.draws = len({r["draw"] for r in sel})
    else:
        orc = oracle(t, splits, say)
        _write_csv(results / f"{tag}_oracle.csv", orc)
    ranked = ranking(orc)
    if not args.from_csv:
        top = [tuple(p.split("+")) for p, _, _ in ranked[: args.top]]
        sel = selection(t, splits, args.draws, ARMS, top, say)
        _write_csv(results / f"{tag}_selection.csv", sel)
    scores = exact_scores(t, ROUND_EPOCHS[0], ARMS["default"])
    agreement = score_agreement(t, ranked, (1, ROUND_EPOCHS[-1] - HOT_WINDOWS))
    minutes = (time.perf_counter() - t0) / 60
    parts = report(t, splits, orc, ranked, sel, scores, agreement, args, minutes, tag)
    command = "selectivity bench selection-acs" + (" --quick" if args.quick else "")
    command += f" --draws {args.draws}" + (f" --top {args.top}" if args.top != 1 else "")
    command += " --from-csv" if args.from_csv else ""
    title = "DP count-table selection (ACS employment)"
    if args.out is None:
        write_section(title, parts, command=command, key="selection-acs")
    else:
        write_section(title, parts, command=command, key="selection-acs", path=args.out)


def report(
    t: AcsTables,
    splits: Sequence[int],
    orc: list[dict[str, Any]],
    ranked: list[tuple[str, float, list[float]]],
    sel: list[dict[str, Any]],
    scores: list[tuple[Group, float]],
    agreement: list[list[object]],
    args: argparse.Namespace,
    minutes: float,
    tag: str,
) -> list[Table]:
    base = {r["split"]: r["log_loss"] for r in orc if not r["pair"]}
    split_names = ", ".join(f"{h} → {h + 1}" for h in splits)
    setup = Table(
        ["setup", ""],
        [
            [
                "stream",
                f"ACS employment MA 2015-2018, {len(t.y):,} rows"
                + (" (every 8th row, 6 features)" if args.quick else "")
                + f", {len(t.names)} features, 16 windows (a year in 4 chunks); splits "
                f"(hot → test) {split_names}; count tables hold the windows before the hot one",
            ],
            [
                "tables",
                f"service.core: laplace ε = {EPSILON} per window, sketch 16384 × 3, max_tables = "
                f"features + 5 ({FREE_SLOTS} free slots; 'off': features + 1, no selection); "
                "LightGBM (bench.lgbm, one seed, learning rate 0.1)",
            ],
            [
                "selection",
                f"select_round, aic, 1 group per round, rounds at the rolls to epochs 2 … "
                f"{ROUND_EPOCHS[-1]} reading window e − 1; ε_sel = {EPSILON_SELECTION} per "
                "round; arms: "
                + "; ".join(
                    f"{n}: threshold {a.rule.threshold}, margin {a.rule.margin}, "
                    f"min_records {a.min_records:,}"
                    for n, a in ARMS.items()
                ),
            ],
            ["CSV", f"bench/results/{tag}_oracle.csv, bench/results/{tag}_selection.csv"],
            [
                "runtime",
                "(this report: read from the CSVs of an earlier run of the same command)"
                if args.from_csv
                else f"{minutes:.1f} min",
            ],
        ],
    )
    oracle_rows = [
        [i + 1, pair, f"{mean:+.2f} %", " ".join(f"{g:+.2f}" for g in per)]
        for i, (pair, mean, per) in enumerate(ranked[:8])
    ]
    oracle_rows.append(
        [
            "",
            f"without ({len(t.names)} single tables)",
            "",
            " ".join(f"{base[h]:.4f}" for h in splits),
        ]
    )
    split_tab = Table(
        [
            "split",
            "log-loss without",
            "best pair",
            "median pair",
            "pairs ≥ 1 %",
            "pairs ≥ 1 % and 1 point above the best placebo",
            "placebo: a single table twice",
        ],  # fmt: skip
        per_split(orc, splits),
        "1. Oracle per split, no noise: log-loss gain of one more table",
    )
    oracle_tab = Table(
        ["rank", "pair added", "log-loss gain, mean over splits", "per split (%)"],
        oracle_rows,
        f"Oracle, no noise: the best of {len(ranked)} pair tables, mean over splits",
    )
    keys = sorted({(r["arm"], r["timing"]) for r in sel}, key=lambda k: _order(k[0], k[1]))
    sel_rows = []
    for arm, timing in keys:
        mine = [r for r in sel if r["arm"] == arm and r["timing"] == timing]
        per_draw = [
            statistics.fmean(r["ratio"] for r in mine if r["draw"] == d)
            for d in sorted({r["draw"] for r in mine})
        ]
        sel_rows.append(
            [
                arm,
                timing or "—",
                _mean_se(per_draw),
                f"{100 * (1 - statistics.fmean(per_draw)):+.2f} %",
                statistics.fmean(r["auc"] for r in mine),
            ]
        )
    sel_tab = Table(
        [
            "arm",
            "counted from",
            "log-loss ÷ without, mean over splits ± s.e. over draws",
            "gain",
            "AUC",
        ],  # fmt: skip
        sel_rows,
        f"2. Selection under noise, {args.draws} draws",
    )
    picks = Table(
        ["draw", *ARMS],
        [
            [
                d + 1,
                *(
                    _ranked_picks(
                        next(
                            (
                                r["groups"]
                                for r in sel
                                if r["draw"] == d and r["arm"] == a and r["timing"] == "held"
                            ),
                            "",
                        ),
                        ranked,
                    )
                    for a in ARMS
                ),
            ]
            for d in range(args.draws)
        ],
        "Picks (round epoch, #oracle rank of the pair)",
    )
    arm = ARMS["default"]
    beta = 2 * _sensitivity(arm) / arm.epsilon
    m = len(scores)
    diag = Table(
        ["first round (window 1), exact", "value"],
        [
            [
                "best candidates' padded aic scores (min_records 100,000)",
                ", ".join(f"{'+'.join(g)} {s:.2e}" for g, s in scores[:3]),
            ],
            ["noise scale β (ε_sel 1, 1 pick)", f"{beta:.2e}"],
            [f"⊥'s score τ + β·(margin + log m), m = {m}", f"{beta * (3 + math.log(m)):.2e}"],
        ],  # fmt: skip
        "What a round weighs",
    )
    agree = Table(
        [
            "score (windows 1 … 4, the rows the rounds read)",
            "Spearman ρ with the oracle's gain",
            "its best three pairs (#oracle rank)",
        ],  # fmt: skip
        agreement,
        "Which score ranks the pairs as the oracle does",
    )
    return [setup, split_tab, oracle_tab, sel_tab, picks, diag, agree]


def _ranked_picks(groups: str, ranked: list[tuple[str, float, list[float]]]) -> str:
    """``A+B (e2), C+D (e3)`` with each pair's oracle rank: ``A+B (e2, #5), …``."""
    if not groups or groups == "(none)":
        return "(none)"
    rank = {_norm(p): i + 1 for i, (p, _, _) in enumerate(ranked)}
    out = []
    for item in groups.split(", "):
        pair, _, epoch = item.partition(" (")
        out.append(f"{pair} ({epoch.rstrip(')')}, #{rank.get(_norm(pair), '?')})")
    return ", ".join(out)


def _sensitivity(arm: Arm) -> float:
    from service.core.dp.selection import score_sensitivity

    return score_sensitivity(score=arm.score, n=arm.min_records, n_labels=2)


def _order(arm: str, timing: str) -> tuple[int, str, str]:
    first = {"without": 0, "off": 1, "oracle top": 2}
    return (first.get(arm, 3), arm, timing)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

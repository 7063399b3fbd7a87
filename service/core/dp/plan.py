"""Planning a stream's budget (issue 18, part 3): from the expected observations per window, the
key cardinality of every feature and a target loss, propose ε, the window size (the hot
period, the only raw data a model is trained on), the sketch's width and depth and the split of
the per-window budget across tables, with the predicted loss and why.

The rule is a signal-to-noise criterion per table, calibrated on the regime measurements of the
MovieLens-calibrated simulator (BENCHMARKS.md "Regime" and "Planning a stream's budget";
``bench/accuracy/plan_fit.py`` refits the constants and checks them).

**Signal and noise per table.** A window of g·N observations (N expected per window of the
given ``window_seconds``, the window made g times longer), H hot windows (the train set, kept
raw) and m = R counted windows, R = ceil(H/E) − H for the largest exposure E = H/(H + R) allowed
(docs/ARCHITECTURE.md "Streams, windows and periods"). A table of
cardinality K over L labels holds, per key and label, on average

    n_t = m·g·N / (K·L)                                    (signal: the expected count)

and every window adds independent noise to every cell; with the table's budget share
ε_t = ε·w_t/W (``service.core.dp.budget``) the Laplace scale is b_t = k·depth/ε_t (k the
observations of a user the noise is calibrated to: max(c, 2) with a user key, c as given
without), so m windows summed give a noise s.d. of b_t·sqrt(2m). The table's signal-to-noise
ratio is

    SNR_t = n_t / (b_t·sqrt(2m)) = sqrt(m)·g·N·ε_t / (K·L·k·depth·sqrt(2)).

**DP cost.** The log-loss at ε over the same features without noise, minus 1, is modelled as

    δ = KAPPA · S^(−POWER),   S = geometric mean over the feature tables of min(SNR_t, SNR_CAP)

(a table with SNR above SNR_CAP = 10, noise s.d. under a tenth of the mean count, counts as
noiseless); no plan is proposed with S below S_MIN = 1, the low end of the fitted range.
**Without noise**, count features against the full-data baseline (LightGBM on raw features,
bench/accuracy/regime.py) are modelled as a function of the hot window's size alone:

    r₀ = NN_A − NN_B·log10(H·g·N).

The predicted loss ratio is r₀·(1 + δ). Constants: least squares (δ in log–log, r₀ linear in
log10 of the hot rows) on the four "more users" measurements at ×1 and ×10 MovieLens 100K
(1 % and 10 % hot windows, H = 1, laplace ε = 1, sketch 16384 × 3, 7 tables; regime section
of BENCHMARKS.md). Held out, ×100 "more users": DP cost 1.011 measured vs 1.015 predicted (1 % hot),
1.011 vs 1.012 (10 %); proposals checked at ×30 met their targets within the noise (DP cost
1.015 for 1.020 predicted; 1.033 ± 0.025 of the baseline for 1.029); at ×3 the rule is about
1.3 points optimistic (DP cost 1.043 measured, 1.029 predicted). The rule does **not** fit
the "more events" streams (the same keys, more activity each: measured DP cost 1.037 at ×10
and ×100, predicted 1.020 and 1.008): a mean count per key over-states the signal when the
rows a model is asked about are mostly new keys.

**The proposal.** The split maximises S for a given ε: water-filling of Σ log min(SNR_t, CAP)
under Σ ε_t = ε — a table that would pass SNR_CAP with an equal share gets just enough to reach
it (ε_t = CAP/a_t with SNR_t = a_t·ε_t), the others share the rest equally; the prior table
(one key) is always such a table. The window is the smallest g (of a geometric ladder) for which
some ε ≤ ``max_epsilon`` meets every target; at that g, ε is the smallest that does (bisection,
S increases with ε). The sketch: depth as given (default 3, as fitted), width the smallest
power of two with K_max / width ≤ ``collisions`` (default 1: the expected number of other
keys sharing a key's bucket in a row; the regime runs had up to 5.8 at ×100, 94,300 users in
16,384 buckets, with a DP cost of 1.011; at most 2^24 and what keeps a window's tables
within MAX_CELLS cells; the count sketch's error from collisions grows with it, Charikar, Chen
& Farach-Colton 2002).
One contribution per user per window (``c``) as given; ``user_key`` makes k = max(c, 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, model_validator

from service.core.streamconfig import FEATURE_PATTERN, Strict

KAPPA = 0.0874
POWER = 1.066
SNR_CAP = 10.0
S_MIN = 1.0  # the fitted range's low end (S = 0.99 at ×1, 1 % hot): never proposed below
NN_A = 1.1192
NN_B = 0.0270
FITTED_ON = "×1 and ×10 MovieLens 100K, more users (simulator), depth 3, 2 labels"

MAX_WINDOW_SECONDS = 366 * 86400
MAX_RETENTION = 10_000
MIN_EPSILON = 1e-3
MAX_CELLS = 1 << 26  # cells of a window's tables together (int32: 256 MiB)
LADDER = tuple(sorted({round(1.25**i) for i in range(0, 80)}))  # window multipliers g


class PlanRequest(Strict):
    observations_per_window: int = Field(ge=1, le=10**12)
    cardinalities: dict[
        Annotated[str, Field(pattern=FEATURE_PATTERN)], Annotated[int, Field(ge=1, le=10**9)]
    ] = Field(min_length=1, max_length=64, description="feature name → distinct keys expected")
    labels: int = Field(default=2, ge=2, le=64)
    target_loss: float | None = Field(
        default=None, gt=1.0, le=2.0, description="log-loss ÷ the full-data baseline; 1.03"
    )
    target_dp_cost: float | None = Field(
        default=None, gt=1.0, le=2.0, description="log-loss at ε ÷ without noise; e.g. 1.02"
    )
    max_exposure: float = Field(
        default=0.01, ge=1.0 / MAX_RETENTION, le=0.5, description="hot windows ÷ retained"
    )
    max_epsilon: float = Field(default=1.0, ge=0.01, le=100)
    window_seconds: int = Field(default=86400, ge=1, le=MAX_WINDOW_SECONDS)
    hot_windows: int = Field(
        default=2, ge=1, le=100, description="H: the train set is the H newest windows"
    )
    depth: int = Field(default=3, ge=1, le=16)
    collisions: float = Field(
        default=1.0, ge=0.001, le=10, description="keys per bucket (K_max / width) allowed"
    )
    max_contributions_per_window: int = Field(default=1, ge=1, le=10_000)
    user_key: bool = Field(
        default=False,
        description=(
            "the stream will declare a user key: its tables are calibrated to max(c, 2) "
            "observations of a user (service.core.dp.budget), c = max_contributions_per_window"
        ),
    )

    @property
    def calibration(self) -> int:
        """k of ``service.core.dp.budget``: max(c, 2) with a user key, else c (as given)."""
        c = self.max_contributions_per_window
        return max(c, 2) if self.user_key else c

    @model_validator(mode="after")
    def _target(self) -> PlanRequest:
        if self.target_loss is None and self.target_dp_cost is None:
            self.target_loss = 1.03
        return self


@dataclass(frozen=True)
class TablePlan:
    table: str
    cardinality: int
    weight: float  # w_t, the mean over all tables (the prior's included) is 1
    epsilon: float  # ε_t
    expected_count: float  # n_t per key and label over the count period
    noise_sd: float  # b_t·sqrt(2m) over the count period
    snr: float


@dataclass(frozen=True)
class Plan:
    feasible: bool
    epsilon: float
    window_multiplier: int
    window_seconds: int
    hot_windows: int
    retention_windows: int
    exposure: float
    width: int
    depth: int
    tables: list[TablePlan]
    predicted_dp_cost: float
    predicted_loss: float  # ÷ the full-data baseline
    why: list[str] = field(default_factory=list)

    @property
    def table_weights(self) -> dict[str, float]:
        return {t.table: t.weight for t in self.tables if t.table != "(prior)"}

    @property
    def prior_weight(self) -> float:
        return next(t.weight for t in self.tables if t.table == "(prior)")

    def stream_body(self, name: str, labels: list[str] | None = None) -> dict[str, Any]:
        """A ``POST /v1/streams`` body with this plan (every feature categorical, no slots for
        selected groups: ``max_tables`` = features + the prior table)."""
        return {
            "name": name,
            "features": [{"name": t.table} for t in self.tables if t.table != "(prior)"],
            "labels": labels or ["0", "1"],
            "window_seconds": self.window_seconds,
            "hot_windows": self.hot_windows,
            "retention_windows": self.retention_windows,
            "privacy": {
                "mechanism": "laplace",
                "epsilon": self.epsilon,
                "table_weights": self.table_weights,
                "prior_weight": self.prior_weight,
            },
            "sketch": {"width": self.width, "depth": self.depth},
            "max_tables": len(self.tables),
        }

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "tables"}
        out["tables"] = [t.__dict__ for t in self.tables]
        return out


def dp_cost(s: float) -> float:
    """1 + δ, δ = KAPPA·S^(−POWER)."""
    return 1.0 + KAPPA * s ** (-POWER)


def no_noise_loss(hot_rows: float) -> float:
    """r₀ = NN_A − NN_B·log10(hot rows): count features without noise ÷ the baseline."""
    return NN_A - NN_B * math.log10(hot_rows)


def split(a: dict[str, float], epsilon: float) -> dict[str, float]:
    """ε_t maximising Σ log min(a_t·ε_t, SNR_CAP) under Σ ε_t = ε (water-filling); ``a``: SNR
    per unit of ε of every table, the prior's (key ``"(prior)"``) included; the prior table is
    always given just enough for SNR_CAP (its single key is never the limit)."""
    capped = {"(prior)"} & set(a)
    while True:
        free = [t for t in a if t not in capped]
        rest = epsilon - sum(SNR_CAP / a[t] for t in capped)
        if not free or rest <= 0:
            break
        share = rest / len(free)
        over = [t for t in free if a[t] * share >= SNR_CAP]
        if not over:
            break
        capped.update(over)
    out = {t: SNR_CAP / a[t] for t in capped}
    free = [t for t in a if t not in capped]
    rest = epsilon - sum(out.values())
    if rest <= 0:  # not even the capped tables' needs: none reaches the cap, split equally
        return {t: epsilon / len(a) for t in a}
    if free:
        out |= {t: rest / len(free) for t in free}
    else:  # every table past the cap: the leftover in proportion
        total = sum(out.values())
        out = {t: e * epsilon / total for t, e in out.items()}
    return out


def _evaluate(req: PlanRequest, g: int, epsilon: float, m: int) -> tuple[float, list[TablePlan]]:
    """S and the per-table figures at window multiplier g, ε and m counted windows."""
    rows = g * req.observations_per_window  # per window
    per = math.sqrt(m) * rows / (req.labels * req.calibration * req.depth)
    cards = dict(req.cardinalities) | {"(prior)": 1}
    a = {t: per / (k * math.sqrt(2.0)) for t, k in cards.items()}
    eps = split(a, epsilon)
    n_tables = len(cards)
    tables = []
    for t, k in cards.items():
        e = eps[t]
        b = req.calibration * req.depth / e if e > 0 else math.inf
        tables.append(
            TablePlan(
                table=t,
                cardinality=k,
                weight=n_tables * e / epsilon,
                epsilon=e,
                expected_count=m * rows / (k * req.labels),
                noise_sd=b * math.sqrt(2.0 * m),
                snr=a[t] * e,
            )
        )
    logs = [math.log(max(min(t.snr, SNR_CAP), 1e-12)) for t in tables if t.table != "(prior)"]
    return math.exp(sum(logs) / len(logs)), tables


def _meets(req: PlanRequest, g: int, epsilon: float, m: int) -> bool:
    s = _evaluate(req, g, epsilon, m)[0]
    return s >= S_MIN and dp_cost(s) <= _allowed(req, g)


def _allowed(req: PlanRequest, g: int) -> float:
    """The largest 1 + δ the targets allow at window multiplier g."""
    limit = req.target_dp_cost if req.target_dp_cost is not None else math.inf
    if req.target_loss is not None:
        hot_rows = req.hot_windows * g * req.observations_per_window
        limit = min(limit, req.target_loss / no_noise_loss(hot_rows))
    return limit


def make_plan(req: PlanRequest) -> Plan:
    """The proposal (module docstring)."""
    h = req.hot_windows
    retention = max(1, min(MAX_RETENTION, math.ceil(h / req.max_exposure - 1e-9) - h))
    m = retention
    largest = max(req.cardinalities.values())
    wanted = 1 << max(10, math.ceil(math.log2(largest / req.collisions)))
    cells = (len(req.cardinalities) + 1) * req.labels * req.depth  # cells per bucket column
    room = 1 << max(1, math.floor(math.log2(MAX_CELLS / cells)))
    width = min(wanted, 1 << 24, room)
    ladder = [g for g in LADDER if g * req.window_seconds <= MAX_WINDOW_SECONDS] or [1]
    choice: tuple[int, float] | None = None
    for g in ladder:
        if not _meets(req, g, req.max_epsilon, m):
            continue
        lo, hi = MIN_EPSILON, req.max_epsilon
        if _meets(req, g, lo, m):
            hi = lo
        for _ in range(60):
            if hi / lo < 1.001:
                break
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if _meets(req, g, mid, m) else (mid, hi)
        choice = (g, _round_up(hi, req.max_epsilon))
        break
    feasible = choice is not None
    g, epsilon = choice if choice is not None else (ladder[-1], req.max_epsilon)
    s, tables = _evaluate(req, g, epsilon, m)
    dp = dp_cost(s)
    rows = g * req.observations_per_window
    loss = no_noise_loss(h * rows) * dp
    why = [
        f"window: {g} × {req.window_seconds} s ≈ {rows:,} observations; {h} hot (the train "
        f"set, {h * rows:,} rows) and {retention} counted (exposure {h / (h + retention):.2%})",
        f"predicted: log-loss ÷ no noise {dp:.3f}, ÷ full-data baseline {loss:.3f} "
        f"(without noise {no_noise_loss(h * rows):.3f})",
        f"rule: DP cost 1 + {KAPPA}·S^-{POWER}, S = geometric mean of min(SNR, {SNR_CAP:g}) "
        f"= {s:.2f}; fitted on {FITTED_ON}",
        f"sketch: width {width} = smallest power of two ≥ {largest:,} keys / {req.collisions:g} "
        f"collisions per bucket, depth {req.depth}"
        if width == wanted
        else f"sketch: width {width}, capped (wanted {wanted}) so that a window's tables hold "
        f"≤ {MAX_CELLS:,} cells ({4 * MAX_CELLS >> 20} MiB): {largest / width:.2g} keys per "
        f"bucket, depth {req.depth}",
    ]
    for t in tables:
        why.append(
            f"  {t.table}: {t.cardinality:,} keys, {t.expected_count:,.1f} per key and label, "
            f"noise s.d. {t.noise_sd:,.1f}, SNR {t.snr:.2f}, ε_t {t.epsilon:.4g} "
            f"(weight {t.weight:.3g})"
        )
    if not feasible:
        why.insert(
            0,
            f"not feasible: even a {g}× window at ε = {req.max_epsilon:g} predicts "
            f"{loss:.3f} of the baseline ({dp:.3f} of no noise); raise max_epsilon or "
            "max_exposure, or loosen the target",
        )
    if min(t.weight for t in tables) < 0.001 or max(t.weight for t in tables) > 1000:
        tables = [
            TablePlan(**(t.__dict__ | {"weight": min(1000.0, max(0.001, t.weight))}))
            for t in tables
        ]
    return Plan(
        feasible=feasible,
        epsilon=epsilon,
        window_multiplier=g,
        window_seconds=g * req.window_seconds,
        hot_windows=h,
        retention_windows=retention,
        exposure=h / (h + retention),
        width=width,
        depth=req.depth,
        tables=tables,
        predicted_dp_cost=dp,
        predicted_loss=loss,
        why=why,
    )


def _round_up(x: float, cap: float) -> float:
    """x rounded up to two significant figures (never above ``cap``)."""
    digits = 1 - math.floor(math.log10(x))
    return min(cap, math.ceil(x * 10**digits - 1e-9) / 10**digits)

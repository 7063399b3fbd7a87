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

**The hot period** (H, ``hot_windows``) is chosen for each window size g, not taken as given
(``hot_windows`` overrides it). More hot windows give the model more rows (r₀ falls with
log10 of them) and, at the same exposure E, more counted windows (R = ceil(H/E) − H); on
MovieLens 100K at ε = 1 the count columns keep 27 %, 32 % and 47 % of the raw model's gain
with 1, 2 and 3 hot windows (BENCHMARKS.md, "Accuracy across drift"). Their cost is raw
data held: H·g·N rows over H·g·``window_seconds`` seconds,
the hot period being the only raw data the service keeps outside the cold store. So

    H = min(H_budget, max(H_rows, HOT_PREFERRED)),  at least 1,

with H_rows = ceil(MIN_HOT_ROWS / (g·N)) the fewest windows holding the loss model's minimum of
hot rows (MIN_HOT_ROWS = 1,000, the smallest hot period it was fitted on: 1 % of ×1 MovieLens
100K), HOT_PREFERRED = 3 (the most windows the evidence above covers) and H_budget the most
windows within the exposure budget: H·g·``window_seconds`` ≤ ``max_hot_seconds`` (default 7
days, or one ``window_seconds`` if that is longer) and H/(H + MAX_RETENTION) ≤ E. Only
windows g with g·``window_seconds`` ≤ ``max_hot_seconds`` are considered (one hot window must
fit). The proposal shows the cost: raw rows held, hours of raw data held and their share of
the retained windows (E).

**Slots for selected groups.** None unless selection is asked for (``epsilon_selection`` > 0:
``selection_slots``, default 4, as the service's default ``max_tables``). S slots at weight 1
beside the n = features + 1 tables of mean weight 1 take S/(n + S) of ε, 1/(n + S) each, so the
tables are planned with ε·n/(n + S) and every table's Laplace scale is (n + S)/n times what it
would be at the same ε without them (``service.core.dp.budget.slot_cost``); the proposal also
gives the ε that would meet the target at the same window without the slots. Each selection
round costs ``epsilon_selection`` on the ledger on top (an observation is read by min(H, S)
rounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, model_validator

from service.core.dp.budget import slot_cost
from service.core.streamconfig import FEATURE_PATTERN, MAX_PARTITIONS, MAX_WINDOW_CELLS, Strict

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
MIN_HOT_ROWS = 1_000  # the smallest hot period the loss model was fitted on (1 % of ×1 ML 100K)
HOT_PREFERRED = 3  # hot windows the offline evidence supports (module docstring)
MAX_HOT_WINDOWS = 100
DEFAULT_SLOTS = 4  # the service's default slots for selected groups with selection on
DEFAULT_HOT_SECONDS = 7 * 86400  # raw data held at most, unless said (or one window is longer)
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
    hot_windows: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HOT_WINDOWS,
        description=(
            "H: the train set is the H newest windows; default: chosen from the rate "
            "(enough hot rows for the model, up to 3 windows, within max_hot_seconds)"
        ),
    )
    max_hot_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HOT_WINDOWS * MAX_WINDOW_SECONDS,
        description=(
            "the longest the hot period (the raw rows kept) may span, in seconds; bounds the "
            "chosen hot_windows and the window (not an overriding hot_windows); default 7 "
            "days, or one window_seconds if that is longer"
        ),
    )
    epsilon_selection: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="the stream's selection budget per round; 0 (default): no selection, no slot",
    )
    selection_slots: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description=(
            "table slots reserved for selected groups; default 4 with epsilon_selection > 0, "
            "else 0 (a slot only selection fills costs every table budget)"
        ),
    )
    peak_rows_per_second: float | None = Field(
        default=None,
        gt=0,
        le=10**9,
        description=(
            "the stream's peak ingest rate; the plan proposes `partitions` for it "
            "(PART_ROWS_PER_SECOND a part, scaled by the features); default: the mean rate of "
            "observations_per_window"
        ),
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

    @property
    def hot_seconds(self) -> int:
        """The raw-data budget: ``max_hot_seconds``, by default 7 days or one window."""
        if self.max_hot_seconds is not None:
            return self.max_hot_seconds
        return max(DEFAULT_HOT_SECONDS, self.window_seconds)

    @property
    def slots(self) -> int:
        """S: the slots for selected groups the plan reserves."""
        if self.selection_slots is not None:
            return self.selection_slots
        return DEFAULT_SLOTS if self.epsilon_selection > 0 else 0

    @model_validator(mode="after")
    def _target(self) -> PlanRequest:
        if self.target_loss is None and self.target_dp_cost is None:
            self.target_loss = 1.03
        if self.selection_slots and self.epsilon_selection <= 0:
            raise ValueError(
                f"selection_slots: {self.selection_slots} slots need epsilon_selection > 0: "
                "only selection fills a slot, and an unfilled one still takes its share of ε "
                "(the service refuses such a stream)"
            )
        if self.selection_slots == 0 and self.epsilon_selection > 0:
            raise ValueError(
                "selection_slots: 0 slots leave selection nothing to fill; give "
                "epsilon_selection 0 or at least one slot"
            )
        if self.hot_windows is None and self.hot_seconds < self.window_seconds:
            raise ValueError(
                f"max_hot_seconds: {self.max_hot_seconds} is less than window_seconds = "
                f"{self.window_seconds}: not even one window of raw rows fits"
            )
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
    raw_rows_held: int = 0  # H·g·N: the hot period's rows
    raw_hours_held: float = 0.0  # H·g·window_seconds / 3600
    selection_slots: int = 0  # S
    epsilon_selection: float = 0.0
    slot_share: float = 0.0  # each slot's share of the per-window budget, 1/(n + S)
    slot_noise_factor: float = 1.0  # every table's Laplace scale ÷ the same ε without the slots
    epsilon_without_slots: float | None = None  # what meets the target without them
    partitions: int = 1  # parts a window is split into for the peak rate
    why: list[str] = field(default_factory=list)

    @property
    def table_weights(self) -> dict[str, float]:
        return {t.table: t.weight for t in self.tables if t.table != "(prior)"}

    @property
    def prior_weight(self) -> float:
        return next(t.weight for t in self.tables if t.table == "(prior)")

    def stream_body(self, name: str, labels: list[str] | None = None) -> dict[str, Any]:
        """A ``POST /v1/streams`` body with this plan (every feature categorical; ``max_tables``
        = features + the prior table + the slots for selected groups, with
        ``epsilon_selection`` when there are any)."""
        privacy: dict[str, Any] = {
            "mechanism": "laplace",
            "epsilon": self.epsilon,
            "table_weights": self.table_weights,
            "prior_weight": self.prior_weight,
        }
        if self.selection_slots:
            privacy["epsilon_selection"] = self.epsilon_selection
        return {
            "name": name,
            "features": [{"name": t.table} for t in self.tables if t.table != "(prior)"],
            "labels": labels or ["0", "1"],
            "window_seconds": self.window_seconds,
            "hot_windows": self.hot_windows,
            "retention_windows": self.retention_windows,
            "privacy": privacy,
            "sketch": {"width": self.width, "depth": self.depth},
            "max_tables": len(self.tables) + self.selection_slots,
            **({"partitions": self.partitions} if self.partitions > 1 else {}),
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
    """S and the per-table figures at window multiplier g, ε and m counted windows; the tables
    share ε·n/(n + S) (the slots for selected groups take the rest, module docstring) and their
    weights have mean 1, as the slots'."""
    rows = g * req.observations_per_window  # per window
    per = math.sqrt(m) * rows / (req.labels * req.calibration * req.depth)
    cards = dict(req.cardinalities) | {"(prior)": 1}
    a = {t: per / (k * math.sqrt(2.0)) for t, k in cards.items()}
    n_tables = len(cards)
    budget = epsilon * n_tables / (n_tables + req.slots)
    eps = split(a, budget)
    tables = []
    for t, k in cards.items():
        e = eps[t]
        b = req.calibration * req.depth / e if e > 0 else math.inf
        tables.append(
            TablePlan(
                table=t,
                cardinality=k,
                weight=n_tables * e / budget,
                epsilon=e,
                expected_count=m * rows / (k * req.labels),
                noise_sd=b * math.sqrt(2.0 * m),
                snr=a[t] * e,
            )
        )
    logs = [math.log(max(min(t.snr, SNR_CAP), 1e-12)) for t in tables if t.table != "(prior)"]
    return math.exp(sum(logs) / len(logs)), tables


def _meets(req: PlanRequest, g: int, h: int, epsilon: float, m: int) -> bool:
    s = _evaluate(req, g, epsilon, m)[0]
    return s >= S_MIN and dp_cost(s) <= _allowed(req, g, h)


def _allowed(req: PlanRequest, g: int, h: int) -> float:
    """The largest 1 + δ the targets allow at window multiplier g with h hot windows."""
    limit = req.target_dp_cost if req.target_dp_cost is not None else math.inf
    if req.target_loss is not None:
        hot_rows = h * g * req.observations_per_window
        limit = min(limit, req.target_loss / no_noise_loss(hot_rows))
    return limit


def hot_windows_for(req: PlanRequest, g: int) -> tuple[int, str]:
    """H at window multiplier g and why (module docstring, "The hot period"): the override if
    given, else min(H_budget, max(H_rows, HOT_PREFERRED)), at least 1."""
    if req.hot_windows is not None:
        return req.hot_windows, "as given (hot_windows)"
    rows = g * req.observations_per_window
    seconds = g * req.window_seconds
    by_rows = math.ceil(MIN_HOT_ROWS / rows)
    by_time = req.hot_seconds // seconds
    e = req.max_exposure
    by_exposure = math.floor(e * MAX_RETENTION / (1.0 - e) + 1e-9)
    budget = max(1, min(by_time, by_exposure, MAX_HOT_WINDOWS))
    h = max(1, min(budget, max(by_rows, HOT_PREFERRED)))
    want = max(by_rows, HOT_PREFERRED)
    if h == want:
        reason = (
            f"{HOT_PREFERRED} preferred (2–3 hot windows kept more of the raw model's gain "
            f"than 1 on a real stream)"
            if by_rows <= HOT_PREFERRED
            else f"{by_rows} windows to hold the model's minimum of {MIN_HOT_ROWS:,} hot rows"
        )
    else:
        reason = (
            f"{want} wanted, {h} within the exposure budget (max_hot_seconds "
            f"{req.hot_seconds:,} s, exposure ≤ {e:g} with ≤ {MAX_RETENTION:,} windows kept)"
        )
    return h, reason


def _retention(req: PlanRequest, h: int) -> int:
    """R = ceil(H/E) − H counted windows, within 1 … MAX_RETENTION."""
    return max(1, min(MAX_RETENTION, math.ceil(h / req.max_exposure - 1e-9) - h))


# Rows a second one part of a stream takes, with headroom: one counting job counts a row of
# the 39-feature click log in ~32 µs of one core (~31,000 rows/s; BENCHMARKS.md, "Scale: one
# stream across workers, partitions and Redis masters"), taken at ~60 %; a stream of more
# features gets proportionally fewer rows a part, one of fewer is not assumed faster (the
# per-row costs apart from the features were not measured apart; docs/ARCHITECTURE.md,
# "Scaling out").
PART_ROWS_PER_SECOND = 20_000
PART_FEATURES = 39


def partitions_for(req: PlanRequest) -> tuple[int, float]:
    """The parts a stream needs for its peak rate, and that rate (rows/s)."""
    rate = req.peak_rows_per_second or req.observations_per_window / req.window_seconds
    return max(1, min(MAX_PARTITIONS, math.ceil(rate / part_rows_per_second(req)))), rate


def part_rows_per_second(req: PlanRequest) -> float:
    """The rows a second the plan gives one part of the stream (``PART_ROWS_PER_SECOND``)."""
    return PART_ROWS_PER_SECOND * min(1.0, PART_FEATURES / len(req.cardinalities))


def make_plan(req: PlanRequest) -> Plan:
    """The proposal (module docstring)."""
    largest = max(req.cardinalities.values())
    wanted = 1 << max(10, math.ceil(math.log2(largest / req.collisions)))
    n_tables = len(req.cardinalities) + 1
    cells = (n_tables + req.slots) * req.labels * req.depth  # cells per bucket column
    room = 1 << max(1, math.floor(math.log2(MAX_CELLS / cells)))
    width = min(wanted, 1 << 24, room)
    longest = MAX_WINDOW_SECONDS
    if req.hot_windows is None:  # one hot window must fit the raw-data budget
        longest = min(longest, req.hot_seconds)
    ladder = [g for g in LADDER if g * req.window_seconds <= longest] or [1]
    choice: tuple[int, float] | None = None
    for g in ladder:
        found = _smallest_epsilon(req, g)
        if found is not None:
            choice = (g, found)
            break
    feasible = choice is not None
    g, epsilon = choice if choice is not None else (ladder[-1], req.max_epsilon)
    h, hot_reason = hot_windows_for(req, g)
    retention = m = _retention(req, h)
    s, tables = _evaluate(req, g, epsilon, m)
    dp = dp_cost(s)
    rows = g * req.observations_per_window
    loss = no_noise_loss(h * rows) * dp
    raw_hours = h * g * req.window_seconds / 3600
    why = [
        f"window: {g} × {req.window_seconds} s ≈ {rows:,} observations; {h} hot (the train "
        f"set, {h * rows:,} rows) and {retention} counted (exposure {h / (h + retention):.2%})",
        f"hot period: {h} window{'s' if h > 1 else ''}: {hot_reason}",
        f"exposure cost: {h * rows:,} raw rows held, {raw_hours:,.4g} hours of raw data, "
        f"{h / (h + retention):.2%} of the retained windows",
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
    parts, rate = partitions_for(req)
    window_cells = width * req.depth * req.labels * (n_tables + req.slots)
    fits = max(1, MAX_WINDOW_CELLS // window_cells)
    if parts > fits:
        why.append(
            f"partitions capped at {fits} from {parts}: each part holds the window's "
            f"{window_cells:,} cells, and a window is at most {MAX_WINDOW_CELLS:,}"
        )
        parts = fits
    why.append(
        f"partitions: {parts} ({rate:,.4g} rows/s at peak; a part is counted by one job on one "
        f"core, ~{part_rows_per_second(req):,.0f} rows/s with headroom at "
        f"{len(req.cardinalities)} features)"
        + ("" if parts == 1 else f"; each part holds a copy of the window's tables (× {parts})")
    )
    slots = req.slots
    cost = slot_cost(float(n_tables), slots)
    without: float | None = None
    if slots:
        alone = req.model_copy(update={"selection_slots": 0, "epsilon_selection": 0.0})
        without = _smallest_epsilon(alone, g)
        reads = min(h, slots)
        why.append(
            f"slots for selected groups: {slots}, each {cost['share']:.2%} of ε "
            f"(ε {epsilon * cost['share']:.4g}); together they raise every table's noise "
            f"×{cost['laplace']:.3g} at this ε; without them this window "
            + (f"meets the target at ε = {without:g}" if without is not None else "does not either")
            + f"; selection rounds cost {req.epsilon_selection:g} each on the ledger, "
            f"{reads} of them read an observation"
        )
    else:
        why.append(
            "slots for selected groups: none (selection off: an unused slot would take a "
            "share of ε from every table); ask with epsilon_selection"
        )
    if not feasible:
        why.insert(
            0,
            f"not feasible: even a {g}× window at ε = {req.max_epsilon:g} predicts "
            f"{loss:.3f} of the baseline ({dp:.3f} of no noise); raise max_epsilon, "
            "max_exposure or max_hot_seconds, or loosen the target",
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
        raw_rows_held=h * rows,
        raw_hours_held=raw_hours,
        selection_slots=slots,
        epsilon_selection=req.epsilon_selection if slots else 0.0,
        slot_share=cost["share"] if slots else 0.0,
        slot_noise_factor=cost["laplace"],
        epsilon_without_slots=without,
        partitions=parts,
        why=why,
    )


def _smallest_epsilon(req: PlanRequest, g: int) -> float | None:
    """The smallest ε ≤ ``max_epsilon`` (bisection, rounded up to two figures) for which window
    multiplier g, with its hot period, meets the targets; None if even ``max_epsilon`` does
    not."""
    h = hot_windows_for(req, g)[0]
    m = _retention(req, h)
    if not _meets(req, g, h, req.max_epsilon, m):
        return None
    lo, hi = MIN_EPSILON, req.max_epsilon
    if _meets(req, g, h, lo, m):
        hi = lo
    for _ in range(60):
        if hi / lo < 1.001:
            break
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if _meets(req, g, h, mid, m) else (mid, hi)
    return _round_up(hi, req.max_epsilon)


def _round_up(x: float, cap: float) -> float:
    """x rounded up to two significant figures (never above ``cap``)."""
    digits = 1 - math.floor(math.log10(x))
    return min(cap, math.ceil(x * 10**digits - 1e-9) / 10**digits)

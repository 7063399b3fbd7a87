"""A stream's configuration: the body that creates it, every field validated, defaults
documented here and in docs/USING.md's stream settings. Pure (pydantic only): the runtime, the
budget split and the featurizer are computed from it."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
FEATURE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"

# A feature value in a row. Integers are kept exact in [-2^63, 2^64-1]; ingest, featurize,
# predict and queue candidates refuse larger ones by reading the raw body
# (service.streams.validation.check_integers: the JSON parser has made them floats by then),
# and the bound here documents the range in the OpenAPI document.
ExactInt = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
Scalar = str | ExactInt | float | bool | None

StreamName = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case, 1-64 chars")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeatureIn(Strict):
    name: str = Field(pattern=FEATURE_PATTERN)
    kind: Literal["categorical", "numeric"] = "categorical"
    buckets: list[float] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="numeric only: strictly increasing bucket edges",
    )
    passthrough: bool = Field(
        default=False,
        description=(
            "also emit the row's raw value as a model feature '<name>:value': a numeric "
            "feature's as a number, a categorical feature's as its string form (null when "
            "missing), in featurize and the train set alike. A hot row's raw value, read by "
            "'model' keys during the hot period (docs/PRIVACY.md); never privacy.user_key"
        ),
    )
    of: str | None = Field(
        default=None,
        pattern=FEATURE_PATTERN,
        description=(
            "the feature this one is an attribute of, when a value of that one determines this "
            "one's (a user's age is 'of' user_id, a movie's genres 'of' movie_id): selection "
            "then never offers a group whose counts a table already holds, coarser (public: "
            "the names only)"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> FeatureIn:
        if self.kind == "numeric":
            if not self.buckets:
                raise ValueError(f"numeric feature {self.name!r} needs 'buckets' (bucket edges)")
            if any(not math.isfinite(b) for b in self.buckets):
                raise ValueError(f"buckets of {self.name!r} must be finite numbers")
            if any(b >= a for b, a in zip(self.buckets, self.buckets[1:], strict=False)):
                raise ValueError(f"buckets of {self.name!r} must be strictly increasing")
        else:
            if self.buckets is not None:
                raise ValueError(f"categorical feature {self.name!r} takes no 'buckets'")
        return self


class PrivacyIn(Strict):
    mechanism: Literal["laplace", "gaussian", "none"] = Field(
        default="laplace",
        description="'none' (no noise, no guarantee) is refused in production",
    )
    # Lower bounds: the smallest budget whose noise can stay under the 1e7 cell limit
    # (service.lifecycle.streams.MAX_NOISE_SCALE) at the least sensitivity (Δ1 = 2: one table
    # and the prior, depth 1; Δ2 = √2): b = Δ1/ε ≤ 1e7 needs ε ≥ 2e-7, σ = Δ2/√(2ρ) ≤ 1e7
    # needs ρ ≥ 1e-14. Smaller values are refused here, before any arithmetic on them
    # (5e-324 made the scale inf, 1e-300 divided by zero).
    epsilon: float | None = Field(
        default=None, ge=1e-7, le=100, description="laplace: default 1.0; at least 1e-7"
    )
    rho: float | None = Field(
        default=None, ge=1e-14, le=100, description="gaussian: default 0.5; at least 1e-14"
    )
    delta: float = Field(default=1e-9, gt=0, lt=1, description="δ for reporting ρ-zCDP as (ε, δ)")
    epsilon_selection: float = Field(
        default=0.0, ge=0, le=100, description="budget of each count-table selection round; 0: off"
    )
    groups_per_round: int = Field(default=1, ge=1, le=16)
    selection_score: Literal["aic", "mi"] = Field(
        default="aic",
        description=(
            "selection: how candidate groups are scored; 'aic': mutual-information gain minus "
            "Akaike's penalty (L−1)(new cells)/n, which does not reward near-unique groups; "
            "'mi': the plug-in gain (service.core.dp.selection)"
        ),
    )
    selection_threshold: float | None = Field(
        default=0.0,
        ge=-64,
        le=64,
        description=(
            "selection: the threshold τ of the public outcome 'add no table' in each round's "
            "exponential mechanism (as many outcomes of score τ as there are candidates), in "
            "the scores' units (nats per record of the hot period plus min_records "
            "placeholders; scores lie in [-(labels-1), log(labels)]); a round stops at its "
            "first such pick, at least half the time when no candidate scores above τ. 0: "
            "Akaike's criterion's own boundary (service.core.dp.selection); null: every round "
            "fills its picks"
        ),
    )
    selection_margin: float = Field(
        default=3.0,
        ge=0,
        le=32,
        description=(
            "selection: how many noise scales β of the round's exponential mechanism a "
            "candidate must beat selection_threshold by: 'add no table' scores τ + β·(margin + "
            "log m), so a round in which no candidate scores above τ picks a table with "
            "probability at most 1/(1 + e^margin) (4.7 % at 3; 50 % at 0); public, no "
            "privacy cost (service.core.dp.selection, 'The margin')"
        ),
    )
    selection_rounds: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description=(
            "selection: the public schedule, rounds run at the rolls to epochs 2 … "
            "selection_rounds + 1 while a table slot is free; each is charged by the ledger "
            "whether it picks tables or nothing. Default: the free slots (max_tables − "
            "features − 1)"
        ),
    )
    min_records: int = Field(
        default=100_000,
        ge=1,
        le=1_000_000_000,
        description=(
            "selection: the public record count a round is calibrated to, never the hot "
            "period's own count (scores of the hot period plus this many placeholder records; "
            "sensitivity that of this many records, service.core.dp.selection); best near or "
            "above the usual hot-period size"
        ),
    )
    user_key: str | None = Field(default=None, pattern=FEATURE_PATTERN)
    max_contributions_per_window: int = Field(default=1, ge=1, le=10_000)
    table_calibration: Literal["max_c_2", "c"] = Field(
        default="max_c_2",
        description=(
            "user-keyed streams: how many of a user's observations per window the count "
            "tables' noise is calibrated to (service.core.dp.budget). 'max_c_2': max(c, 2), c = "
            "max_contributions_per_window: removing one observation can let the user's next "
            "one be counted in its place (a swap of two), so one observation is within ε and "
            "one user within ε per window. 'c': the rule of streams created before it (their "
            "stored configuration records it): one user within ε per window, one observation "
            "within 2ε/c, which the ledger reports. No effect without a user key"
        ),
    )
    table_weights: dict[str, Annotated[float, Field(ge=0.001, le=1000)]] = Field(
        default_factory=dict,
        max_length=256,
        description=(
            "feature name → the share of the per-window budget its table gets, relative to 1 "
            "(every other table's weight, each selected group's and each unused slot's); the "
            "budget is split in proportion, so a table that counts a few large classes can "
            "give most of its share to sparse ones"
        ),
    )
    prior_weight: float = Field(default=1.0, ge=0.001, le=1000, description="the prior table's")

    @model_validator(mode="after")
    def _defaults(self) -> PrivacyIn:
        if self.mechanism == "laplace":
            if self.rho is not None:
                raise ValueError("'rho' belongs to the gaussian mechanism; laplace takes 'epsilon'")
            self.epsilon = 1.0 if self.epsilon is None else self.epsilon
        elif self.mechanism == "gaussian":
            if self.epsilon is not None:
                raise ValueError("'epsilon' belongs to the laplace mechanism; gaussian takes 'rho'")
            self.rho = 0.5 if self.rho is None else self.rho
        elif self.epsilon is not None or self.rho is not None:
            raise ValueError("mechanism 'none' takes neither 'epsilon' nor 'rho'")
        return self


class SketchIn(Strict):
    width: int = Field(default=16384, ge=2, le=1 << 24, description="a power of two")
    depth: int = Field(default=5, ge=1, le=16)

    @field_validator("width")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"width must be a power of two, got {v}")
        return v


class FeaturizeSettings(Strict):
    alpha: float = Field(default=1.0, ge=0, le=1e6, description="prior pseudo-count")
    backoff_sigmas: float = Field(default=1.0, ge=0, le=100)
    shrinkage: Literal["pseudo_count", "empirical_bayes"] = Field(
        default="pseudo_count",
        description=(
            "what the '<t>:p:<l>' and '<t>:logodds:<l>' columns hold: 'pseudo_count', the "
            "counts smoothed by alpha prior pseudo-counts and the prior's below the back-off "
            "threshold; 'empirical_bayes', each value's log-odds (per label, one against the "
            "rest) shrunk toward the prior's by its noisy total and the known noise variance "
            "(service.core.features.shrinkage); post-processing of the noisy tables, no "
            "privacy cost"
        ),
    )
    eb_variance: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "empirical_bayes: τ², the variance of the values' true log-odds around the "
            "prior's, for every table and label; null: estimated per table and label from "
            "the table's noisy cells once per epoch"
        ),
    )


# Memory bounds: a table is one Redis string of int32 cells (Redis strings hold at most 512 MiB),
# and a window's tables together are kept at most 1 GiB (BENCHMARKS.md: memory per window is
# cells × 4 B).
MAX_TABLE_CELLS = 1 << 27
MAX_WINDOW_CELLS = 1 << 28
# Table slots a stream reserves for selected groups by default when selection is on (none when
# it is off: an unused slot would only dilute the budget of the tables that exist).
SELECTION_SLOTS = 4
# Parts a window may be split into (``StreamCreate.partitions``): each holds a copy of the
# window's tables until expiry folds them into one (memory per window grows with them while its
# raw rows are in Redis; MAX_WINDOW_CELLS bounds the product).
MAX_PARTITIONS = 64


class StreamCreate(Strict):
    name: StreamName
    features: list[FeatureIn] = Field(min_length=1, max_length=256)
    labels: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=2, max_length=64
    )
    window_seconds: int = Field(default=86400, ge=1, le=366 * 86400)
    hot_windows: int = Field(default=2, ge=1, le=1000)
    retention_windows: int = Field(default=30, ge=1, le=10_000)
    cold_retention_windows: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description=(
            "how long the cold store keeps a window's raw rows, in windows counted as "
            "hot_windows counts them (the open window is the first): once a window is older, "
            "its sealed segments are deleted (the only copy of its raw rows left by then; "
            "checked by the seal job, so within one scheduler tick of the roll). At least "
            "hot_windows. null: kept, unless the operator's SELECTIVITY_COLD_RETENTION_DAYS "
            "deletes them (docs/ARCHITECTURE.md, 'Cold store and break-glass unlock')"
        ),
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=MAX_PARTITIONS,
        description=(
            "how many parts each window is split into (fixed at creation): each part has its "
            "own Redis hash tag, hot rows, counting checkpoint and exact tables, and is counted "
            "by its own job, so one stream's ingest and counting spread over worker processes "
            "and Redis masters; a row goes to the part of a keyed hash of its user key "
            "(privacy.user_key), else of the row. The window's noise is drawn once, whatever "
            "the parts. Sizing: one part per ~20,000 rows/s of peak ingest, no more than the "
            "worker processes that count the stream (docs/ARCHITECTURE.md, 'Scaling out')"
        ),
    )
    privacy: PrivacyIn = Field(default_factory=PrivacyIn)
    sketch: SketchIn = Field(default_factory=SketchIn)
    max_tables: int | None = Field(
        default=None,
        ge=2,
        le=1024,
        description=(
            "the table slots the noise is calibrated to (fixed at creation). Default: one per "
            "feature + the prior table, and 4 more for selected groups when "
            "privacy.epsilon_selection > 0. More than features + 1 with selection off is "
            "refused: only selection fills a slot, and every slot takes its share of the "
            "per-window budget"
        ),
    )
    featurize: FeaturizeSettings = Field(default_factory=FeaturizeSettings)
    retrain_grace_seconds: int = Field(
        default=3600,
        ge=0,
        le=30 * 86400,
        description="after a roll, how long a model trained before it is still served",
    )
    releasable: list[Annotated[str, Field(pattern=FEATURE_PATTERN)]] = Field(
        default_factory=list,
        max_length=257,
        description=(
            "the columns of the hot rows (feature names, and 'label') that a k-anonymised "
            "release or an iML session of this stream may read, as a quasi-identifier or a "
            "kept column; default none. Never privacy.user_key"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> StreamCreate:
        names = [f.name for f in self.features]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate feature names: {dupes}")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("labels must be distinct")
        if self.privacy.user_key is not None and self.privacy.user_key not in names:
            raise ValueError(f"privacy.user_key {self.privacy.user_key!r} is not a feature")
        for f in self.features:  # attributes: of another feature, no cycle
            seen = [f.name]
            parent = f.of
            while parent is not None:
                if parent not in names:
                    raise ValueError(f"features: {f.name!r} is 'of' {parent!r}, not a feature")
                if parent in seen:
                    raise ValueError(f"features: 'of' makes a cycle: {' -> '.join(seen)}")
                seen.append(parent)
                parent = self.features[names.index(parent)].of
        unknown = sorted(set(self.privacy.table_weights) - set(names))
        if unknown:
            raise ValueError(f"privacy.table_weights: {unknown} are not features")
        unknown = sorted(set(self.releasable) - set(names) - {"label"})
        if unknown:
            raise ValueError(f"releasable: {unknown} are neither features nor 'label'")
        if len(set(self.releasable)) != len(self.releasable):
            raise ValueError("releasable: a name occurs twice")
        if self.privacy.user_key is not None and any(
            f.passthrough for f in self.features if f.name == self.privacy.user_key
        ):
            raise ValueError(
                f"features: {self.privacy.user_key!r} is privacy.user_key, never passed through"
            )
        if self.privacy.user_key is not None and self.privacy.user_key in self.releasable:
            raise ValueError(
                f"releasable: {self.privacy.user_key!r} is privacy.user_key, never released"
            )
        needed = len(self.features) + 1
        if self.max_tables is None:  # a stored configuration always has its own
            selecting = self.privacy.epsilon_selection > 0
            self.max_tables = needed + (SELECTION_SLOTS if selecting else 0)
        elif self.max_tables < needed:
            raise ValueError(
                f"max_tables must be at least the number of features + 1 (the prior table) "
                f"= {needed}, got {self.max_tables}"
            )
        if self.privacy.selection_rounds is None:  # stored configurations from before it too
            self.privacy.selection_rounds = max(self.max_tables - needed, 1)
        table = self.sketch.width * self.sketch.depth * len(self.labels)
        if table > MAX_TABLE_CELLS:
            raise ValueError(
                f"sketch.width × sketch.depth × labels = {table} cells in a table, more than "
                f"{MAX_TABLE_CELLS} (a table is one Redis string of 4-byte cells, at most 512 MiB)"
            )
        window = table * self.max_tables
        if window > MAX_WINDOW_CELLS:
            raise ValueError(
                f"sketch.width × sketch.depth × labels × max_tables = {window} "
                f"cells in a window, more than {MAX_WINDOW_CELLS} (1 GiB of Redis memory a window)"
            )
        if (
            self.cold_retention_windows is not None
            and self.cold_retention_windows < self.hot_windows
        ):
            raise ValueError(
                f"cold_retention_windows: {self.cold_retention_windows} is less than "
                f"hot_windows = {self.hot_windows}; the hot period's raw rows are in Redis "
                "until it ends, so the cold store keeps at least as many windows"
            )
        if window * self.partitions > MAX_WINDOW_CELLS:
            raise ValueError(
                f"partitions: {self.partitions} parts of {window} cells each is "
                f"{window * self.partitions} cells in a window, more than {MAX_WINDOW_CELLS} "
                f"(1 GiB of Redis memory a window; each part holds its own tables)"
            )
        return self

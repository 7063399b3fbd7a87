"""Re-identification audit request and answer bodies (docs/ARCHITECTURE.md, "Re-identification
audits"). Every input is bounded; errors name the field and the limit."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.core.reidentification.attacks import MAX_DRAWS
from service.streams.schemas import NAME_PATTERN

MAX_INLINE_ROWS = 20_000
"""The most inline records one request may carry."""
MAX_INLINE_DIMENSIONS = 4096
"""The most numbers per inline record."""
MAX_INLINE_VALUES = 4_000_000
"""The most numbers of all inline records together (rows × dimensions; the MNIST "5 vs 3" pair
is 1,902 × 784 = 1.5 M). The body limit, SELECTIVITY_MAX_BODY_BYTES, may bind first."""
MAX_STREAM_ROWS = 20_000
"""A stream source audits at most this many records of the hot period, the first in entry
order (a larger hot period is audited on its first 20,000)."""
MAX_STREAM_DIMENSIONS = 4096
"""A stream's records are one-hot encoded per count table; past this many (table, value)
columns in all, only the most frequent values are kept (a rarer value is then no column)."""
MAX_LABEL = 64  # characters of a label
MIN_EPSILON = 1e-7  # as a stream's ε: a smaller one makes the noise scale overflow
MAX_EPSILON = 1e6
DEFAULT_DRAWS = 5
"""Noise draws (and trainings) an audit runs by default: one draw's accuracy is not a figure."""
ID_PATTERN = r"^ra_[0-9a-f]{32}$"

AttackName = Literal["growpu", "nnpu", "upu", "kmeans"]
ALL_ATTACKS: tuple[AttackName, ...] = ("growpu", "nnpu", "upu", "kmeans")
Label = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL)]
LabelInt = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Number = Annotated[float, Field(allow_inf_nan=False, ge=-1e30, le=1e30)]


def label_text(v: object) -> object:
    """Labels may be given as strings or integers; both are compared as their text."""
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AuditSourceIn(Strict):
    """Exactly one of ``stream`` (the records of its hot period, with their labels) and
    ``rows`` with ``labels`` (inline numeric vectors, one label per row)."""

    stream: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    rows: (
        list[Annotated[list[Number], Field(min_length=1, max_length=MAX_INLINE_DIMENSIONS)]] | None
    ) = Field(
        default=None,
        min_length=2,
        max_length=MAX_INLINE_ROWS,
        description=f"inline records, at most {MAX_INLINE_ROWS} of at most "
        f"{MAX_INLINE_DIMENSIONS} numbers, {MAX_INLINE_VALUES} numbers in all; kept only "
        "while the job runs",
    )
    labels: list[Label | LabelInt] | None = Field(
        default=None,
        max_length=MAX_INLINE_ROWS,
        description="one label per inline row (strings, or integers compared as text)",
    )

    @model_validator(mode="after")
    def _one(self) -> AuditSourceIn:
        if (self.stream is None) == (self.rows is None):
            raise ValueError("give exactly one of 'stream' and 'rows'")
        if self.stream is not None and self.labels is not None:
            raise ValueError("labels: only inline rows take labels (a stream has its own)")
        if self.rows is not None:
            if self.labels is None:
                raise ValueError("labels: required with rows (one per row)")
            if len(self.labels) != len(self.rows):
                raise ValueError(
                    f"labels: {len(self.labels)} labels for {len(self.rows)} rows (one per row)"
                )
            d = len(self.rows[0])
            for i, row in enumerate(self.rows):
                if len(row) != d:
                    raise ValueError(f"rows[{i}]: {len(row)} numbers, rows[0] has {d}")
            if len(self.rows) * d > MAX_INLINE_VALUES:
                raise ValueError(
                    f"rows: {len(self.rows)} × {d} numbers exceeds the limit of {MAX_INLINE_VALUES}"
                )
            self.labels = [label_text(v) for v in self.labels]  # type: ignore[misc]
        return self


class AuditReleaseIn(Strict):
    """What the attacker reads: the positive class (``class_mean``: its exact mean, or with
    ``epsilon`` an ε-DP noisy sum and count of its records, ε for the whole record, add/remove
    neighbours; inline rows declare ``value_range``, a stream's records are one-hot), or the
    stream's own noisy count tables (``count_tables``: at the stream's ε; no ``epsilon``)."""

    kind: Literal["class_mean", "count_tables"]
    epsilon: float | None = Field(
        default=None,
        ge=MIN_EPSILON,
        le=MAX_EPSILON,
        allow_inf_nan=False,
        description="class_mean only: ε of the release for the whole record (every "
        "coordinate), add/remove one record; omitted = the exact mean",
    )
    value_range: tuple[Number, Number] | None = Field(
        default=None,
        description="class_mean with epsilon on inline rows (required there): [min, max], the "
        "declared range every coordinate is clipped to before the sum; never read from the data",
    )

    @model_validator(mode="after")
    def _eps(self) -> AuditReleaseIn:
        if self.kind == "count_tables" and self.epsilon is not None:
            raise ValueError("epsilon: count_tables are audited at the stream's own ε; omit it")
        if self.value_range is not None:
            if self.epsilon is None:
                raise ValueError(
                    "value_range: only with epsilon (the exact mean clips nothing); omit it"
                )
            lo, hi = self.value_range
            if not hi > lo:
                raise ValueError(f"value_range: max must be > min, got [{lo:g}, {hi:g}]")
        return self


class AuditCreate(Strict):
    source: AuditSourceIn
    positive_label: Label | LabelInt = Field(description="the label whose class is released")
    release: AuditReleaseIn
    attacks: list[AttackName] = Field(
        default_factory=lambda: list(ALL_ATTACKS),
        min_length=1,
        max_length=4,
        description="a non-empty subset of growpu, nnpu, upu, kmeans",
    )
    classifier: Literal["linear", "mlp"] = Field(
        default="linear", description="linear, or the 3-layer perceptron (hidden size 300)"
    )
    draws: int = Field(
        default=DEFAULT_DRAWS,
        ge=1,
        le=MAX_DRAWS,
        description=f"noise draws of the release, each attacked by freshly trained attacks "
        f"(count_tables: the tables' one release, re-trained on); 1 to {MAX_DRAWS}",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AuditCreate:
        self.positive_label = str(label_text(self.positive_label))
        if len(set(self.attacks)) != len(self.attacks):
            raise ValueError("attacks: an attack occurs twice")
        if self.release.kind == "count_tables" and self.source.stream is None:
            raise ValueError("release: count_tables needs a stream source (its tables)")
        if self.source.stream is not None and self.release.value_range is not None:
            raise ValueError(
                "release.value_range: a stream's records are one-hot per count table (each "
                "has one 1 per table); omit it"
            )
        if (
            self.source.rows is not None
            and self.release.epsilon is not None
            and self.release.value_range is None
        ):
            raise ValueError(
                "release.value_range: required with epsilon for inline rows: [min, max], the "
                "range every coordinate is clipped to (declared, never read from the data)"
            )
        labels = self.source.labels
        if labels is not None:
            if self.positive_label not in labels:
                raise ValueError(
                    f"positive_label: {self.positive_label!r} is not among source.labels"
                )
            if all(v == self.positive_label for v in labels):
                raise ValueError("source.labels: need at least one record of another label")
        return self


class AuditCreatedOut(BaseModel):
    id: str


class Spread(BaseModel):
    mean: float
    sd: float = Field(description="sample standard deviation over the draws (0 for one)")
    min: float
    max: float


class AttackResult(BaseModel):
    """Means over the draws; ``spread`` per figure. Gains are over what the prior alone gives."""

    accuracy: float = Field(description="share of the records whose class is recovered, 0-1")
    precision: float | None = Field(
        default=None,
        description="of the records labelled positive, the share that are (null: none labelled)",
    )
    recall: float | None = Field(
        default=None, description="of the positive records, the share labelled positive"
    )
    accuracy_gain: float | None = Field(
        default=None, description="accuracy − the prior's (the majority class for everyone)"
    )
    precision_gain: float | None = Field(
        default=None, description="precision − pi_p (labelling at random has precision pi_p)"
    )
    positive_share: float | None = Field(
        default=None, description="share of the records the attack labels positive"
    )
    draws: int | None = Field(default=None, description="runs these figures are over")
    spread: dict[str, Spread | None] | None = Field(
        default=None, description="per figure: mean, sd, min, max over the draws"
    )
    seconds: float | None = None


class AuditOut(BaseModel):
    id: str
    status: Literal["running", "done", "failed"]
    progress: float = Field(description="0-1")
    stage: str | None = Field(default=None, description="what the job is doing now")
    source: str = Field(description="'inline' or 'stream:<name>'")
    positive_label: str
    release: dict[str, Any]
    attacks: list[str]
    classifier: str
    created_at: str = Field(description="ISO 8601, UTC")
    results: dict[str, AttackResult] | None = Field(
        default=None, description="per attack run, and 'prior' and 'oracle'"
    )
    n: int | None = Field(default=None, description="records attacked")
    pi_p: float | None = Field(default=None, description="share of them in the positive class")
    dimensions: int | None = Field(default=None, description="numbers per record")
    epsilon: float | None = Field(
        default=None,
        description="ε of the release (null: exact, or no guarantee); class_mean: for the whole "
        "record, add/remove one record (guarantee)",
    )
    guarantee: dict[str, Any] | None = Field(
        default=None,
        description="class_mean with ε: epsilon (whole record), neighbours, unit, source, "
        "epsilon_sum and epsilon_count (their split), domain, l1_bound, sum_noise_scale, "
        "count_noise_scale; count_tables: the stream's ε and where its guarantee is stated",
    )
    draws: int | None = Field(default=None, description="noise draws attacked")
    mechanism: str | None = Field(
        default=None, description="count_tables: the stream's noise mechanism"
    )
    noise_scale: float | None = Field(
        default=None,
        description="class_mean: the discrete Laplace scale of each coordinate of the class's "
        "sum, in the records' units (0: exact)",
    )
    count_noise_scale: float | None = Field(
        default=None, description="class_mean: the discrete Laplace scale of the class's count"
    )
    epoch: int | None = Field(default=None, description="a stream source: the epoch read")
    count_period: list[int] | None = Field(
        default=None, description="count_tables: the first and last window of the tables read"
    )
    n_hat_p: float | None = Field(
        default=None,
        description="count_tables: the prior table's noisy positive count, the mean's divisor",
    )
    dropped_columns: int | None = Field(
        default=None, description="a stream source: rare (table, value) columns left out"
    )
    seconds: float | None = None
    error: str | None = None


def finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None

"""k-anonymisation request and answer bodies (docs/ARCHITECTURE.md, "HTTP API"). Every input is
bounded; errors name the field and the limit."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    model_validator,
)

from service.core.anonymity.hierarchy import parse_hierarchy
from service.streams.schemas import NAME_PATTERN

MAX_INLINE_ROWS = 100_000
"""The most inline rows one request may carry (the body limit, SELECTIVITY_MAX_BODY_BYTES, may
bind first), and ``max_rows`` fewer with more quasi-identifiers. A stream source is capped at
the same number of hot rows."""
WORK_BOUND = 4_000_000_000
"""The most rows² × (quasi-identifiers + 1) one run may cluster: SaNGreeA's worst case (range
quasi-identifiers, distinct values) costs about 7.6e-9 CPU seconds per unit on one core, so a run
at the bound takes about 30 s, well under a minute (BENCHMARKS.md, "Anonymization job size")."""


def max_rows(quasi_identifiers: int) -> int:
    """The most rows one run may cluster with that many quasi-identifiers (``WORK_BOUND``,
    never more than ``MAX_INLINE_ROWS``): 44,721 with one, 21,081 with 8, 11,009 with 32."""
    return min(MAX_INLINE_ROWS, math.isqrt(WORK_BOUND // (quasi_identifiers + 1)))


MAX_K = 10_000
MAX_QIS = 32
MAX_KEEP = 64
MAX_COLUMNS = 256  # columns per inline row
MAX_NAME = 128  # characters of a column name
MAX_VALUE = 1024  # characters of a string value
MAX_WEIGHT = 1e6
ID_PATTERN = r"^an_[0-9a-f]{32}$"

ColumnName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
Value = (
    Annotated[str, StringConstraints(max_length=MAX_VALUE)]
    | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
    | Annotated[float, Field(allow_inf_nan=False)]
    | bool
    | None
)
Row = Annotated[dict[ColumnName, Value], Field(max_length=MAX_COLUMNS)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckedOnce(Strict):
    """A body whose whole-body check (``_consistent``, linear in its rows) runs once per
    instance: a large body is validated in a worker thread (``service.api.limits``), and
    FastAPI's second validation of the same instance, on the event loop, skips it."""

    _checked: bool = PrivateAttr(default=False)


class SourceIn(Strict):
    """Exactly one of ``stream`` (the rows of its hot period: features by name and ``label``)
    and ``rows`` (inline)."""

    stream: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    rows: list[Row] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INLINE_ROWS,
        description=f"inline rows, at most {MAX_INLINE_ROWS}; kept only while the job runs",
    )

    @model_validator(mode="after")
    def _one(self) -> SourceIn:
        if (self.stream is None) == (self.rows is None):
            raise ValueError("give exactly one of 'stream' and 'rows'")
        return self


class QuasiIdentifierIn(Strict):
    name: ColumnName
    kind: Literal["range", "hierarchy"]
    hierarchy: dict[str, Any] | None = Field(
        default=None,
        description='a generalisation tree {"value": "*", "children": [...]} (at most 4096 '
        "nodes, 64 levels); a hierarchy QI without one gets the flat tree value → '*'",
    )

    @model_validator(mode="after")
    def _tree(self) -> QuasiIdentifierIn:
        if self.hierarchy is not None:
            if self.kind != "hierarchy":
                raise ValueError(f"{self.name}: only a 'hierarchy' QI takes a hierarchy")
            parse_hierarchy(self.hierarchy, attribute=f"{self.name}.hierarchy")
        return self


# Per quasi-identifier, > 0 (a request's or a session's weight vector).
Weights = Annotated[
    dict[ColumnName, Annotated[float, Field(gt=0, le=MAX_WEIGHT)]], Field(max_length=MAX_QIS)
]


def _check_names(
    quasi_identifiers: list[QuasiIdentifierIn],
    weights: dict[str, float] | None,
    rows: list[dict[str, Any]] | None,
    needed_extra: list[str],
) -> list[str]:
    """The checks both bodies share: distinct QI names, weights only for QIs, every inline
    row holding the QIs (and ``needed_extra``). Returns the QI names."""
    names = [q.name for q in quasi_identifiers]
    if len(set(names)) != len(names):
        raise ValueError("quasi_identifiers: a name occurs twice")
    unknown = sorted(set(weights or {}) - set(names))
    if unknown:
        raise ValueError(f"weights: {unknown[0]!r} is not a quasi-identifier")
    needed = set(names) | set(needed_extra)
    for i, row in enumerate(rows or []):
        missing = needed - row.keys()
        if missing:
            raise ValueError(f"source.rows[{i}]: no column {sorted(missing)[0]!r}")
    return names


class AnonymizationCreate(CheckedOnce):
    source: SourceIn
    k: int = Field(ge=2, le=MAX_K, description="every released cluster has at least k rows")
    quasi_identifiers: list[QuasiIdentifierIn] = Field(min_length=1, max_length=MAX_QIS)
    weights: Weights | None = Field(
        default=None, description="per QI, > 0; omitted QIs weigh 1; scaled to mean 1"
    )
    keep: list[ColumnName] = Field(
        default_factory=list,
        max_length=MAX_KEEP,
        description="columns released unchanged (not quasi-identifiers)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AnonymizationCreate:
        if self._checked:
            return self
        rows = self.source.rows
        if rows is not None and len(rows) < self.k:
            raise ValueError(f"source.rows: {len(rows)} rows, fewer than k={self.k}")
        most = max_rows(len(self.quasi_identifiers))
        if rows is not None and len(rows) > most:
            raise ValueError(
                f"source.rows: {len(rows)} rows, more than {most}, the most one run clusters "
                f"with {len(self.quasi_identifiers)} quasi-identifiers (its time grows with "
                "rows² × (quasi-identifiers + 1))"
            )
        names = _check_names(self.quasi_identifiers, self.weights, rows, self.keep)
        if "cluster" in names or "cluster" in self.keep:
            raise ValueError("quasi_identifiers, keep: 'cluster' is the release's own column")
        both = sorted(set(self.keep) & set(names))
        if both:
            raise ValueError(f"keep: {both[0]!r} is a quasi-identifier")
        if len(set(self.keep)) != len(self.keep):
            raise ValueError("keep: a name occurs twice")
        self._checked = True
        return self


class CreatedOut(BaseModel):
    id: str


class AnonymizationOut(BaseModel):
    id: str
    status: Literal["running", "done", "failed"]
    progress: float = Field(description="0-1")
    k: int
    source: str = Field(description="'inline' or 'stream:<name>'")
    rows: int | None = None
    clusters: int | None = None
    ngil: float | None = None
    loss: dict[str, float] | None = Field(
        default=None,
        description="per QI: the mean over rows of its normalised generalisation, in [0, 1]",
    )
    weighted_loss: dict[str, float] | None = Field(
        default=None, description="per QI: its share of NGIL (they sum to ngil)"
    )
    weights: dict[str, float] = Field(description="the weights as used (mean 1)")
    seconds: float | None = None
    error: str | None = None


MAX_SAMPLE = 2000
IML_ID_PATTERN = r"^iw_[0-9a-f]{32}$"


class WeightsSessionCreate(CheckedOnce):
    """An iML session over the first ``sample`` rows of a source (the study used the first
    500 complete Adult rows)."""

    source: SourceIn
    k: int = Field(ge=2, le=100, description="the clusters' size while the weights are learnt")
    quasi_identifiers: list[QuasiIdentifierIn] = Field(min_length=1, max_length=MAX_QIS)
    weights: Weights | None = Field(
        default=None, description="the starting weights; omitted = equal"
    )
    sample: int = Field(default=500, ge=6, le=MAX_SAMPLE, description="rows used, the first ones")

    @model_validator(mode="after")
    def _consistent(self) -> WeightsSessionCreate:
        if not self._checked:
            rows = self.source.rows
            _check_names(self.quasi_identifiers, self.weights, rows and rows[: self.sample], [])
            self._checked = True
        return self


class ChoiceIn(Strict):
    choice: int = Field(ge=0, le=1, description="the candidate cluster the row belongs in")


class ClusterView(BaseModel):
    size: int
    values: dict[str, str] = Field(description="each QI generalised over the cluster")


class Question(BaseModel):
    row: dict[str, Any] = Field(description="the row's quasi-identifiers")
    clusters: list[ClusterView] = Field(description="the two candidates, 0 and 1")


class WeightsSessionOut(BaseModel):
    session: str
    answered: int
    weights: dict[str, float] = Field(description="the current weight vector (mean 1)")
    question: Question

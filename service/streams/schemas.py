"""Stream bodies out (the configuration in is ``service.core.streamconfig``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.core.streamconfig import (
    FEATURE_PATTERN,
    NAME_PATTERN,
    FeatureIn,
    PrivacyIn,
    SketchIn,
    StreamCreate,
    StreamName,
)

__all__ = [
    "FEATURE_PATTERN",
    "NAME_PATTERN",
    "FeatureIn",
    "PrivacyIn",
    "SketchIn",
    "StreamCreate",
    "StreamName",
    "StreamList",
    "StreamOut",
    "TableOut",
    "TablesOut",
]


class TableOut(BaseModel):
    name: str
    features: list[str]
    first_epoch: int = Field(description="the first window this table counts in")
    reason: str = Field(description="'feature' (one per feature) or 'selected' (a group)")
    score: float | None = Field(description="not released: exact gains are not private")
    created_at: datetime
    selected_epoch: int | None = None
    selection_rank: int | None = None
    selection_epsilon: float | None = None
    extends: str | None = None


class TablesOut(BaseModel):
    stream: str
    max_tables: int
    tables: list[TableOut]


class StreamOut(StreamCreate):
    model_config = ConfigDict(extra="ignore")
    epoch: int
    epoch_started_at: datetime
    created_at: datetime
    noise_scale: float = Field(description="Laplace b or Gaussian σ of a table of weight 1")
    l1_sensitivity: float
    l2_sensitivity: float
    budget: list[dict[str, Any]] = Field(
        description="each table slot's weight, share of the per-window budget, ε or ρ share "
        "and noise scale (privacy.table_weights)"
    )
    tables: list[TableOut]


class StreamList(BaseModel):
    streams: list[StreamOut]

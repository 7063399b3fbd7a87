"""Ingest bodies (docs/ARCHITECTURE.md, "Data path")."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.core.streamconfig import Scalar


class ObservationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(default=None, min_length=1, max_length=128)
    features: dict[str, Scalar]
    label: str = Field(min_length=1, max_length=64)
    event_time: datetime | None = None


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    observations: list[ObservationIn] = Field(min_length=1)


class IngestOut(BaseModel):
    accepted: int
    window: int

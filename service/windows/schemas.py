from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class WindowOut(BaseModel):
    epoch: int
    state: str
    period: str  # "open" | "hot" | "count" | "expired"
    observations: int | None
    opened_at: datetime
    closed_at: datetime | None
    cold_sealed_at: datetime | None
    hot_deleted_at: datetime | None
    expired_at: datetime | None


class WindowsOut(BaseModel):
    epoch: int
    served_epoch: int | None
    hot_period: tuple[int, int]
    count_period: tuple[int, int]
    windows: list[WindowOut]


class RollOut(BaseModel):
    epoch: int

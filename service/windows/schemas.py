from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class WindowOut(BaseModel):
    epoch: int
    state: str
    period: str  # "open" | "hot" | "count" | "expired"
    observations: int | None = Field(
        description="observations accepted into the window, while it is in the hot period; "
        "null once it left it (an exact count is not kept past the raw data's period)"
    )
    opened_at: datetime
    closed_at: datetime | None
    cold_sealed_at: datetime | None
    hot_deleted_at: datetime | None
    cold_deleted_at: datetime | None = Field(
        default=None,
        description="when the cold store deleted the window's raw rows (cold_retention_windows)",
    )
    expired_at: datetime | None


class WindowsOut(BaseModel):
    epoch: int
    served_epoch: int | None
    hot_period: tuple[int, int]
    count_period: tuple[int, int]
    windows: list[WindowOut]


class RollOut(BaseModel):
    epoch: int

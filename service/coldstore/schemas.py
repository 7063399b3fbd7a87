"""Unlock (break-glass) bodies (docs/ARCHITECTURE.md, "Cold store and break-glass unlock")."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.streams.schemas import StreamName

MAX_TTL_SECONDS = 86400
MAX_WINDOW = 2**31 - 1
"""The largest window number: windows are 32-bit ``INTEGER`` columns in SQL (PostgreSQL's
``integer``), so anything larger is refused with a 422 naming the field before it reaches SQL."""
WINDOW_RANGE = f"1 <= window <= {MAX_WINDOW} (2^31-1, a 32-bit SQL integer)"


class UnlockRequestIn(BaseModel):
    """Either a window range or a time range (event arrival time, UTC), not both."""

    model_config = ConfigDict(extra="forbid")

    stream: StreamName
    from_window: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WINDOW,
        description=f"first window of the range; {WINDOW_RANGE}, at most the stream's current one",
    )
    to_window: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WINDOW,
        description=f"last window of the range; {WINDOW_RANGE}, at most the stream's current one",
    )
    from_time: datetime | None = None
    to_time: datetime | None = None
    justification: str = Field(min_length=10, max_length=2000)
    ttl_seconds: int = Field(
        default=900,
        ge=60,
        le=MAX_TTL_SECONDS,
        description=f"grant lifetime: 60 <= ttl_seconds <= {MAX_TTL_SECONDS}",
    )

    @model_validator(mode="after")
    def _range(self) -> UnlockRequestIn:
        windows = self.from_window is not None or self.to_window is not None
        times = self.from_time is not None or self.to_time is not None
        if windows == times:
            raise ValueError("give either from_window and to_window, or from_time and to_time")
        if windows and (self.from_window is None or self.to_window is None):
            raise ValueError("from_window and to_window go together")
        if times and (self.from_time is None or self.to_time is None):
            raise ValueError("from_time and to_time go together")
        if windows and self.from_window > self.to_window:  # type: ignore[operator]
            raise ValueError("from_window must be <= to_window")
        if times:
            if self.from_time.tzinfo is None or self.to_time.tzinfo is None:  # type: ignore[union-attr]
                raise ValueError("from_time and to_time need a time zone (e.g. 'Z')")
            if self.from_time > self.to_time:  # type: ignore[operator]
                raise ValueError("from_time must be <= to_time")
        return self


class ApproveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    share: str = Field(min_length=20, max_length=1000, description="one SLIP-39 mnemonic share")


UnlockStatus = Literal["pending", "granted", "closed"]
"""The ``status`` filter of the list: ``closed`` also takes ``expired`` requests."""
MAX_LIST_LIMIT = 500


class UnlockRequestOut(BaseModel):
    id: str
    stream: str
    status: Literal["pending", "granted", "expired", "closed"]
    requested_by: str
    requester_actor: str = Field(
        description="the actor holding the requesting key: none of its keys may approve"
    )
    justification: str
    from_window: int | None
    to_window: int | None
    from_time: datetime | None
    to_time: datetime | None
    ttl_seconds: int
    key_id: int
    threshold: int
    approvals: int
    created_at: datetime
    granted_at: datetime | None
    expires_at: datetime | None
    closed_at: datetime | None
    note: str | None = None


class UnlockRequestPage(BaseModel):
    requests: list[UnlockRequestOut]
    next_before: str | None = Field(
        default=None, description="pass as ``before`` for the next (older) page; null at the end"
    )


ExportFormat = Literal["ndjson", "arrow"]

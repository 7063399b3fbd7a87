from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

ModelStatus = Literal["untrained", "current", "stale", "refused"]


class ModelCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    webhook_url: AnyHttpUrl | None = Field(default=None, description="POSTed on retrain events")
    webhook_secret: str | None = Field(
        default=None,
        min_length=16,
        max_length=200,
        description="HMAC-SHA256 key of the webhook signature; generated (and shown once) if "
        "a webhook_url is given without one",
    )


class ModelOut(BaseModel):
    id: str
    name: str
    status: ModelStatus
    epoch: int = Field(description="the stream's open epoch")
    trained_epoch: int | None
    trained_at: datetime | None
    stale_since: datetime | None
    retrain_deadline: datetime | None = Field(
        description="when featurize starts refusing this model unless it retrains"
    )
    webhook_url: str | None
    created_at: datetime


class ModelCreated(ModelOut):
    webhook_secret: str | None = Field(description="shown once")


class TrainedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epoch: int = Field(ge=1, le=2**63 - 1)

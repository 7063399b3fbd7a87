from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.core.streamconfig import Scalar


class FeaturizeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Scalar]] = Field(min_length=1)
    model_id: str | None = Field(default=None, max_length=128)


class FeaturizeOut(BaseModel):
    epoch: int
    columns: list[str]
    rows: list[list[float | str | None]] = Field(
        description=(
            "one row per row sent, in the order of columns: floats (null: a numeric "
            "passthrough value missing), then the strings of the categorical features "
            "passed through (null when missing)"
        )
    )

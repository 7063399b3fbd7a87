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


class WindowRates(BaseModel):
    window: int
    counts: dict[str, int] = Field(description="the window's noisy label counts (may be < 0)")
    rates: dict[str, float] = Field(description="add-one smoothed: (max(c, 0) + 1) / (Σ + L)")


class LabelRatesOut(BaseModel):
    epoch: int = Field(description="the served epoch, whose count period the windows are")
    half_life_windows: float
    noise_sd: float = Field(description="the noise's standard deviation in one window's count")
    windows: list[WindowRates] = Field(description="oldest first")
    recent: dict[str, float] = Field(
        description=(
            "the label rates pooled over the windows with weights 2^(−age / half_life_windows), "
            "age 0 the newest"
        )
    )
    pooled: dict[str, float] = Field(description="the label rates pooled over every window")

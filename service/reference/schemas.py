from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.core.streamconfig import Scalar


class PredictIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Scalar]] = Field(min_length=1)


class PredictOut(BaseModel):
    epoch: int = Field(description="the epoch whose count period featurized the rows")
    model_epoch: int = Field(
        description="the epoch the reference model was trained at: always ``epoch`` (a model "
        "of an earlier hot period is never served)"
    )
    labels: list[str]
    probabilities: list[list[float]]


class QualityPoint(BaseModel):
    """Exact statistics of hot rows: kept only while every window they come from is hot."""

    epoch: int
    train_rows: int = Field(description="rows the model was fitted on")
    trained: bool
    eval_rows: int | None = Field(description="the newest rows of the train set, held out")
    log_loss: float | None = Field(description="the model's log-loss on the held-out rows")
    auc: float | None
    prior_log_loss: float | None = Field(
        description="log-loss of predicting the fitted rows' label rates for every held-out row"
    )


class QualityOut(BaseModel):
    stream: str
    description: str
    epochs: list[QualityPoint]

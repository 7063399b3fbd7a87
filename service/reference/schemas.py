from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.ingest.schemas import Scalar


class PredictIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Scalar]] = Field(min_length=1)


class PredictOut(BaseModel):
    epoch: int = Field(description="the epoch whose count period featurized the rows")
    model_epoch: int = Field(description="the epoch the reference model was trained at")
    labels: list[str]
    probabilities: list[list[float]]


class QualityPoint(BaseModel):
    epoch: int
    train_rows: int
    trained: bool
    eval_rows: int | None
    log_loss: float | None
    auc: float | None
    prior_log_loss: float | None = Field(
        description="log-loss of predicting the train set's label rates for everyone"
    )


class QualityOut(BaseModel):
    stream: str
    description: str
    epochs: list[QualityPoint]

"""Annotation queue bodies (DESIGN §12.1). Every input is bounded; errors name the field."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.core import kanon
from service.core.cmm import DEPTH_MAX, DEPTH_MIN, WIDTH_MAX, WIDTH_MIN
from service.ingest.schemas import Scalar
from service.streams.schemas import NAME_PATTERN

MAX_TEXT_CHARS = 2000
MAX_LABELS = 100
MAX_NEXT = 50


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SketchIn(Strict):
    width: int = Field(
        default=1 << 16, ge=WIDTH_MIN, le=WIDTH_MAX, description="a power of two; cells per row"
    )
    depth: int = Field(default=4, ge=DEPTH_MIN, le=DEPTH_MAX)

    @field_validator("width")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"must be a power of two, got {v}")
        return v


class QueueCreate(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="lower-case, 1-64 chars")
    beta: float = Field(
        ge=kanon.BETA_MIN, le=kanon.BETA_MAX, description="probability a candidate is kept"
    )
    k: int = Field(ge=1, le=kanon.K_MAX, description="sampled occurrences needed for release")
    labels: list[str] | None = Field(
        default=None,
        min_length=2,
        max_length=MAX_LABELS,
        description="required for text queues; record queues default to the stream's labels",
    )
    payload_kind: Literal["text", "record"] = "text"
    stream: str | None = Field(
        default=None, pattern=NAME_PATTERN, description="record queues: the stream"
    )
    uncertainty: Literal["client", "model"] = Field(
        default="client",
        description="'model': the stream's reference model scores record candidates (1 − "
        "max probability, scaled to [0, 1]); until it exists, the client's score (or 0.5)",
    )
    lease_seconds: int = Field(default=300, ge=5, le=86_400)
    epsilon: float | None = Field(
        default=None,
        gt=0,
        le=kanon.EPSILON_MAX,
        description="the ε at which the queue's δ is reported; default max(1, −ln(1−β))",
    )
    sketch: SketchIn = Field(default_factory=SketchIn)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for lab in v:
            if not (1 <= len(lab) <= 64):
                raise ValueError("every label must have 1 to 64 characters")
        if len(set(v)) != len(v):
            raise ValueError("labels must be distinct")
        return v

    @model_validator(mode="after")
    def _check(self) -> QueueCreate:
        if self.payload_kind == "record" and self.stream is None:
            raise ValueError("stream: a 'record' queue needs the name of its stream")
        if self.payload_kind == "text":
            if self.stream is not None:
                raise ValueError("stream: only 'record' queues name a stream")
            if self.uncertainty == "model":
                raise ValueError(
                    "uncertainty: 'model' needs payload_kind 'record' (the stream's reference "
                    "model scores records; there is none for text)"
                )
            if self.labels is None:
                raise ValueError("labels: a 'text' queue needs its label set")
        if self.epsilon is not None and self.epsilon < kanon.min_epsilon(beta=self.beta):
            raise ValueError(
                f"epsilon: must be >= -ln(1-beta) = {kanon.min_epsilon(beta=self.beta):.6g} "
                f"(Li, Qardaji & Su, Thm 5), got {self.epsilon}"
            )
        return self


class QueueOut(BaseModel):
    name: str
    beta: float
    k: int
    labels: list[str]
    payload_kind: Literal["text", "record"]
    stream: str | None
    uncertainty: Literal["client", "model"]
    lease_seconds: int
    epsilon: float
    delta: float = Field(description="δ of the release at (β, k, ε): Li, Qardaji & Su, Thm 5")
    sketch: SketchIn
    created_at: datetime


class QueueList(BaseModel):
    queues: list[QueueOut]


class CandidateIn(Strict):
    text: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS)
    record: dict[str, Scalar] | None = Field(default=None, max_length=256)
    uncertainty: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one(self) -> CandidateIn:
        if (self.text is None) == (self.record is None):
            raise ValueError("give exactly one of 'text' and 'record'")
        return self


class CandidatesIn(Strict):
    candidates: list[CandidateIn] = Field(min_length=1)


class CandidatesOut(BaseModel):
    received: int = Field(description="candidates received; never how many were sampled")


class TaskOut(BaseModel):
    id: str
    text: str | None = None
    record: dict[str, Any] | None = None
    uncertainty: float
    lease_expires_at: datetime


class TasksOut(BaseModel):
    tasks: list[TaskOut]


class LeaseOut(BaseModel):
    id: str
    lease_expires_at: datetime


class LabelIn(Strict):
    label: str = Field(min_length=1, max_length=64)


class LabelOut(BaseModel):
    id: str
    label: str
    replayed: bool = Field(description="true when the task was already labelled (this label)")
    observation_window: int | None = Field(
        description="record queues: the window of the stream the labelled record went to"
    )


class SkipOut(BaseModel):
    id: str
    skipped: bool


class LabelledTask(BaseModel):
    seq: int
    id: str
    text: str | None = None
    record: dict[str, Any] | None = None
    label: str
    uncertainty: float
    labelled_at: datetime
    labelled_by: str


class LabelsOut(BaseModel):
    labels: list[LabelledTask]
    next_after: int | None = Field(description="pass as ?after= for the next page; null: done")


class StatsOut(BaseModel):
    queue: str
    received: int = Field(description="candidates submitted")
    sampled: int = Field(description="candidates kept by β-sampling")
    distinct: int = Field(description="distinct sampled candidates (HyperLogLog estimate)")
    tracking: int = Field(description="keys whose sketch estimate reached k, counted exactly")
    waiting_under_k: int = Field(
        description="distinct sampled keys not released (estimate: distinct − released)"
    )
    released: int
    in_pool: int
    leased: int
    labelled: int
    skipped: int
    label_counts: dict[str, int]
    uncertainty_histogram: list[int] = Field(
        description="tasks waiting in the pool by uncertainty, 10 bins over [0, 1]"
    )
    scored_by_model: int
    scored_by_fallback: int


class PrivacyOut(BaseModel):
    queue: str
    beta: float
    k: int
    epsilon: float
    delta: float
    log_delta: float
    min_epsilon: float = Field(description="−ln(1−β): the smallest ε the theorem covers")
    curve: list[dict[str, float]] = Field(description="δ at other ε, for the dashboard")
    source: str

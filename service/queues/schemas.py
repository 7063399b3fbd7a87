"""Annotation queue bodies (docs/ARCHITECTURE.md, "HTTP API"). Every input is bounded; errors
name the field."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.core.annotation import sampled_kanon as kanon
from service.core.streamconfig import Scalar
from service.streams.schemas import NAME_PATTERN

MAX_TEXT_CHARS = 2000
MAX_LABELS = 100
MAX_NEXT = 50
RELEASE_SECONDS_DEFAULT = 3600
RELEASE_SECONDS_MAX = 30 * 86_400


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
        description="'client': the submitted score, by bucket of 0.1 (a class of the release is "
        "a key and its bucket); 'model': the stream's reference model scores each released "
        "record at its release (1 − max probability, scaled to [0, 1]; 0.5 while there is "
        "none), and submitted scores are ignored",
    )
    lease_seconds: int = Field(default=300, ge=5, le=86_400)
    release_seconds: int = Field(
        default=RELEASE_SECONDS_DEFAULT,
        ge=1,
        le=RELEASE_SECONDS_MAX,
        description="length of a release period: releases happen at multiples of it since "
        "the Unix epoch, each of the classes with k sampled candidates within that period",
    )
    epsilon: float | None = Field(
        default=None,
        gt=0,
        le=kanon.EPSILON_MAX,
        description="the ε at which the queue's δ is reported; default max(1, −ln(1−β))",
    )
    accept_delta_above_ceiling: bool = Field(
        default=False,
        description="create the queue even though its δ exceeds the operator's ceiling "
        "(SELECTIVITY_QUEUE_DELTA_CEILING); the ledger and the curator page show it",
    )

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
            lowest = kanon.covered_epsilon(beta=self.beta)
            raise ValueError(
                f"epsilon: must be >= -ln(1-beta) = {lowest:.6g} "
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
    release_seconds: int
    epsilon: float
    delta: float = Field(description="δ of the release at (β, k, ε): Li, Qardaji & Su, Thm 5")
    accept_delta_above_ceiling: bool
    created_at: datetime


class QueueList(BaseModel):
    queues: list[QueueOut]


class CandidateIn(Strict):
    text: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        description=f"at most {MAX_TEXT_CHARS} characters as sent and in its canonical form "
        "(NFKC, case-folded, white space collapsed), which can be up to 18 times longer",
    )
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
    uncertainty: float | None = Field(
        description="the class's uncertainty at the release (client scores: the middle of "
        "their bucket of 0.1); null for a 'model' queue, whose model scores are not kept"
    )
    labelled_at: datetime
    labelled_by: str


class LabelsOut(BaseModel):
    labels: list[LabelledTask]
    next_after: int | None = Field(description="pass as ?after= for the next page; null: done")


class StatsOut(BaseModel):
    """Nothing here depends on which candidates were sampled (docs/PRIVACY.md, promise
    5): how many were kept, or how many keys wait below k, would tell a submitter whether its
    own candidates were."""

    queue: str
    received: int | None = Field(
        description="candidates submitted; null for annotators (it would time submissions)"
    )
    release_seconds: int
    next_release_at: datetime = Field(description="the end of the open release period")
    released: int
    in_pool: int
    leased: int
    labelled: int
    skipped: int
    label_counts: dict[str, int]
    uncertainty_histogram: list[int] = Field(
        description="tasks waiting in the pool by uncertainty, 10 bins over [0, 1]"
    )
    scored_by_model: int = Field(description="released tasks scored by the reference model")
    scored_by_fallback: int = Field(description="released tasks given 0.5 (no model yet)")


class PrivacyOut(BaseModel):
    queue: str
    beta: float
    k: int
    epsilon: float
    delta: float
    log_delta: float
    min_epsilon: float = Field(description="−ln(1−β) rounded up: the smallest ε the theorem covers")
    curve: list[dict[str, float]] = Field(description="δ at other ε, for the dashboard")
    delta_ceiling: float = Field(description="the operator's ceiling on a queue's δ")
    above_ceiling: bool = Field(description="δ exceeds the ceiling")
    accept_delta_above_ceiling: bool = Field(
        description="the queue was created with accept_delta_above_ceiling"
    )
    release_seconds: int
    guarantee: str = Field(description="the guarantee in words: what it means, whom it protects")
    source: str

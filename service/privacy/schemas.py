"""Bodies of the (β, k) ↔ (ε, δ) calculator (docs/ARCHITECTURE.md, "Annotation queues"). Every
input is bounded."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.core.annotation import sampled_kanon as kanon


class KAnonIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float | None = Field(
        default=None, ge=kanon.BETA_MIN, le=kanon.BETA_MAX, description="sampling probability"
    )
    k: int | None = Field(default=None, ge=1, le=kanon.K_MAX, description="release threshold")
    epsilon: float = Field(gt=0, le=kanon.EPSILON_MAX, description="must be ≥ −ln(1−β)")
    delta: float | None = Field(
        default=None,
        ge=1e-300,
        lt=1,
        description="target δ: give it with one of beta, k omitted, to solve for that one",
    )

    @model_validator(mode="after")
    def _check(self) -> KAnonIn:
        if self.beta is not None and self.k is not None and self.delta is not None:
            raise ValueError("delta: give delta only to solve for k or beta (omit that one)")
        if self.beta is None and self.k is None:
            raise ValueError("beta, k: give both (δ is computed) or one of them and delta")
        if (self.beta is None or self.k is None) and self.delta is None:
            missing = "beta" if self.beta is None else "k"
            raise ValueError(f"delta: required to solve for {missing}")
        if self.beta is not None and self.epsilon < kanon.min_epsilon(beta=self.beta):
            raise ValueError(
                f"epsilon: must be >= -ln(1-beta) = {kanon.min_epsilon(beta=self.beta):.6g} "
                f"for beta={self.beta} (Li, Qardaji & Su, Thm 5), got {self.epsilon}"
            )
        return self


class KAnonOut(BaseModel):
    beta: float
    k: int
    epsilon: float
    delta: float = Field(description="0.0 when below the smallest double; see log_delta")
    log_delta: float = Field(description="natural log of δ")
    solved_for: Literal["delta", "k", "beta"]
    target_delta: float | None
    gamma: float = Field(description="(e^ε − 1 + β) / e^ε")
    n_m: int = Field(description="⌈k/γ − 1⌉, where the search for the maximum starts")
    n_max: int = Field(description="the n where the maximum over n ≥ n_m is reached")
    source: str

"""A stream as the hot paths need it: specs, hash seed, tables, noise parameters.

Sensitivity (DESIGN §4): adding or removing one observation changes ``depth`` cells of every
table by ±1 (the prior table changes one cell; it is counted as a full table, which only
over-states the sensitivity). With T = ``max_tables`` (fixed at creation so that adding tables
later never changes the noise) and c = ``max_contributions_per_window`` (1 without a user key):

    Δ1 = c·T·depth          (L1: at most c·T·depth cells change by 1 each)
    Δ2 = c·sqrt(T·depth)    (L2: T·depth cells change by at most c each)

Laplace: every cell gets discrete Laplace noise of scale b = Δ1/ε → ε-DP per window
(Ghosh, Roughgarden, Sundararajan 2009; Canonne, Kamath, Steinke 2020 §1).
Gaussian: discrete Gaussian with σ = Δ2/sqrt(2ρ) → ρ-zCDP per window (CKS 2020, Thm 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from service.core.featurize import FeatureSpec
from service.core.noise import discrete_gaussian_variance, discrete_laplace_variance
from service.core.sketch import SketchSpec
from service.streams.schemas import StreamCreate


@dataclass(frozen=True)
class TableRef:
    id: int
    name: str
    features: tuple[str, ...]
    first_epoch: int
    reason: str = "feature"


@dataclass(frozen=True)
class Noise:
    mechanism: str
    l1_sensitivity: float
    l2_sensitivity: float
    scale: float  # Laplace b, Gaussian σ, 0 for none
    variance: float  # per-cell variance of the noise


def noise_for(cfg: StreamCreate) -> Noise:
    assert cfg.max_tables is not None
    c = cfg.privacy.max_contributions_per_window if cfg.privacy.user_key else 1
    t_depth = cfg.max_tables * cfg.sketch.depth
    l1 = float(c * t_depth)
    l2 = c * math.sqrt(t_depth)
    mech = cfg.privacy.mechanism
    if mech == "laplace":
        assert cfg.privacy.epsilon is not None
        scale = l1 / cfg.privacy.epsilon
        var = discrete_laplace_variance(scale=scale)
    elif mech == "gaussian":
        assert cfg.privacy.rho is not None
        scale = l2 / math.sqrt(2.0 * cfg.privacy.rho)
        var = discrete_gaussian_variance(sigma=scale)
    else:
        scale, var = 0.0, 0.0
    return Noise(mech, l1, l2, scale, var)


@dataclass(frozen=True)
class StreamRuntime:
    id: int
    name: str
    config: StreamCreate
    hash_seed: bytes
    tables: tuple[TableRef, ...]
    features: tuple[FeatureSpec, ...] = field(init=False)
    spec: SketchSpec = field(init=False)
    noise: Noise = field(init=False)
    label_index: dict[str, int] = field(init=False)
    passthrough: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        set_ = object.__setattr__
        set_(
            self,
            "features",
            tuple(
                FeatureSpec(f.name, f.kind, tuple(f.buckets or ()), f.passthrough)
                for f in cfg.features
            ),
        )
        set_(
            self,
            "spec",
            SketchSpec(width=cfg.sketch.width, depth=cfg.sketch.depth, n_labels=len(cfg.labels)),
        )
        set_(self, "noise", noise_for(cfg))
        set_(self, "label_index", {lab: i for i, lab in enumerate(cfg.labels)})
        set_(self, "passthrough", tuple(f.name for f in cfg.features if f.passthrough))

    @property
    def labels(self) -> list[str]:
        return self.config.labels

    @property
    def feature_names(self) -> set[str]:
        return {f.name for f in self.features}

    def counted_at(self, epoch: int) -> StreamRuntime:
        """The runtime as featurization at ``epoch`` sees it: only tables with a window in the
        count period (a selected group joins once its first window is counted; the per-feature
        tables are always there, all zeros before any window is counted). Memoised, and
        ``self`` when every table qualifies, so callers can cache by identity."""
        hi = self.count_period(epoch)[1]
        visible = tuple(t for t in self.tables if t.reason == "feature" or t.first_epoch <= hi)
        if len(visible) == len(self.tables):
            return self
        memo: dict[int, StreamRuntime] = self.__dict__.setdefault("_counted", {})
        if hi not in memo:
            memo[hi] = replace(self, tables=visible)
        return memo[hi]

    def count_period(self, epoch: int) -> tuple[int, int]:
        """Windows [lo, hi] summed for featurization when ``epoch`` is the open window:
        the ``retention_windows`` windows before the hot period (DESIGN §3)."""
        hi = epoch - self.config.hot_windows
        return hi - self.config.retention_windows + 1, hi

    def hot_period(self, epoch: int) -> tuple[int, int]:
        return epoch - self.config.hot_windows + 1, epoch

"""What the accuracy benchmark runs: the operating point (``Sketching``), the privacy
configurations (``Privacy``), the cuts and windows (``Plan``), the sweep (``Setup``) and the
record of one scored model at one cut (``Eval``).

The stream configuration is written once (``Sketching.stream_body``) and read both ways: the HTTP
arm registers it with the service, the core arm validates the same body with the service's own
model and derives its noise from ``service.core.dp.budget``."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pandas as pd

from bench import movielens
from service.core.dp.budget import Noise, noise_for
from service.core.dp.noise import zcdp_to_approx_dp
from service.core.streamconfig import StreamCreate

CUTS_FULL = (0.5, 0.6, 0.7, 0.8, 0.9)
SHARES_FULL = (0.01, 0.02, 0.05, 0.10)
EPSILONS_FULL = (0.1, 0.5, 1.0, 5.0)
TEST_SHARE = 0.01
MECHANISMS = ("none", "laplace", "gaussian")

FEATURE_WORDS = MappingProxyType(
    {
        "user_id": "user",
        "movie_id": "movie",
        "genres": "genres",
        "age": "age (bucketed)",
        "gender": "gender",
        "occupation": "occupation",
        "zip3": "zip3",
    }
)


def features_text(features: Sequence[str]) -> str:
    return ", ".join(FEATURE_WORDS[f] for f in features)


@functools.cache
def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """The largest ρ whose ρ-zCDP implies (ε, δ)-DP (``zcdp_to_approx_dp`` is increasing in ρ;
    bisection, rounded down so that the guarantee holds)."""
    lo, hi = 1e-12, max(epsilon, 1.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        if zcdp_to_approx_dp(rho=mid, delta=delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Privacy:
    mechanism: str  # "none" | "laplace" | "gaussian"
    epsilon: float | None = None  # laplace: ε; gaussian: the ε whose ρ = ε²/2
    # gaussian only: None for ρ = ε²/2 (the laplace row's zCDP bound); a δ for the largest ρ
    # that is (ε, δ)-DP (the laplace row's ε, with a δ)
    delta: float | None = None

    @property
    def rho(self) -> float | None:
        if self.mechanism != "gaussian":
            return None
        assert self.epsilon is not None
        if self.delta is not None:
            return rho_for_approx_dp(self.epsilon, self.delta)
        return self.epsilon**2 / 2

    @property
    def label(self) -> str:
        """The configuration's name in tables and in the per-cut CSV."""
        if self.mechanism == "none":
            return "no noise"
        if self.mechanism == "laplace":
            return f"laplace ε={self.epsilon:g}"
        if self.delta is None:
            return f"gaussian ρ={self.rho:g} (ε={self.epsilon:g})"
        return f"gaussian ρ={self.rho:.4g} ((ε={self.epsilon:g}, δ={self.delta:g})-DP)"

    @property
    def body(self) -> dict[str, Any]:
        """The stream's ``privacy`` mechanism fields."""
        if self.mechanism == "none":
            return {"mechanism": "none"}
        if self.mechanism == "laplace":
            return {"mechanism": "laplace", "epsilon": self.epsilon}
        return {"mechanism": "gaussian", "rho": self.rho}


def privacies(
    epsilons: Sequence[float],
    mechanisms: Sequence[str] = MECHANISMS,
    gaussian_delta: float | None = None,
) -> list[Privacy]:
    """The sweep: no noise, laplace ε, gaussian ρ = ε²/2 (or the (ε, δ)-DP ρ with a δ),
    restricted to ``mechanisms``."""
    out = [Privacy("none")] if "none" in mechanisms else []
    if "laplace" in mechanisms:
        out += [Privacy("laplace", e) for e in epsilons]
    if "gaussian" in mechanisms:
        out += [Privacy("gaussian", e, delta=gaussian_delta) for e in epsilons]
    return out


@dataclass(frozen=True)
class Sketching:
    """The stream owner's operating point: which features get a count table (and so
    ``max_tables`` = features + the prior table), the sketch width and depth, and the budget
    split across tables (``privacy.table_weights``; ``"prior"``: ``privacy.prior_weight``)."""

    features: tuple[str, ...] = tuple(movielens.FEATURES)
    width: int = 16384
    depth: int = 3
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def max_tables(self) -> int:
        return len(self.features) + 1

    @property
    def default(self) -> bool:
        return self == Sketching()

    @property
    def all_features(self) -> bool:
        return self.features == tuple(movielens.FEATURES)

    def stream_features(self) -> list[dict[str, Any]]:
        kept = [f for f in movielens.stream_features() if f["name"] in self.features]
        # an "of" declaration only towards a feature the stream has
        return [{k: v for k, v in f.items() if k != "of" or v in self.features} for f in kept]

    def privacy_body(self, privacy: Privacy) -> dict[str, Any]:
        weights = dict(self.weights)
        if not weights:
            return privacy.body
        return {
            **privacy.body,
            "table_weights": {f: w for f, w in weights.items() if f != "prior"},
            "prior_weight": weights.get("prior", 1.0),
        }

    def stream_body(self, name: str, privacy: Privacy, *, retention: int) -> dict[str, Any]:
        """The stream both arms count with: ``hot_windows = 1`` (the train set is the open
        window), no scheduled roll (only forced ones), ``retention`` windows counted."""
        return {
            "name": name,
            "features": self.stream_features(),
            "labels": ["0", "1"],
            "window_seconds": 366 * 86400,
            "hot_windows": 1,
            "retention_windows": retention,
            "privacy": self.privacy_body(privacy),
            "sketch": {"width": self.width, "depth": self.depth},
            "max_tables": self.max_tables,
        }

    def stream_config(self, privacy: Privacy, *, retention: int = 1) -> StreamCreate:
        return StreamCreate.model_validate(self.stream_body("bench", privacy, retention=retention))

    def noise(self, privacy: Privacy) -> Noise:
        """The per-window noise of every table, as the service derives it."""
        return noise_for(self.stream_config(privacy))

    def weight(self, feature: str) -> float:
        return dict(self.weights).get(feature, 1.0)

    def feature_rows(self, df: pd.DataFrame) -> list[dict[str, Any]]:
        """Rows for ``featurize`` with the operating point's features only (the service
        refuses unknown features)."""
        rows = movielens.feature_rows(df)
        if self.all_features:
            return rows
        return [{f: r[f] for f in self.features} for r in rows]

    def observations(self, df: pd.DataFrame) -> list[dict[str, Any]]:
        obs = movielens.observations(df)
        if not self.all_features:
            for o in obs:
                o["features"] = {f: o["features"][f] for f in self.features}
        return obs


@dataclass(frozen=True)
class Plan:
    n: int
    cuts: tuple[int, ...]  # row index of every cut
    test_rows: int

    def window(self, share: float) -> int:
        w = round(share * self.n)
        bad = [c for c in self.cuts if c % w]
        if bad:
            raise SystemExit(f"window of {w} rows ({share:.0%}) does not divide the cuts {bad}")
        return w

    def test(self, cut: int) -> slice:
        return slice(cut, cut + self.test_rows)

    def cut_windows(self, share: float) -> dict[int, int]:
        """The window whose end is each cut: {window number (1-based): cut row}."""
        w = self.window(share)
        return {cut // w: cut for cut in self.cuts}


def make_plan(n: int, cut_shares: Sequence[float]) -> Plan:
    return Plan(n, tuple(round(c * n) for c in cut_shares), round(TEST_SHARE * n))


@dataclass(frozen=True)
class Setup:
    shares: tuple[float, ...]
    epsilons: tuple[float, ...]
    cut_shares: tuple[float, ...]
    core_shares: tuple[float, ...]
    core_epsilons: tuple[float, ...]
    core_draws: int
    ablation_share: float | None
    ablation_draws: int
    http_draws_eps1: int
    quick: bool
    mechanisms: tuple[str, ...] = MECHANISMS
    gaussian_delta: float | None = None  # gaussian rows: ρ for (ε, δ)-DP instead of ε²/2
    sketching: Sketching = Sketching()

    def privacy(self, mechanism: str, epsilon: float | None = None) -> Privacy:
        delta = self.gaussian_delta if mechanism == "gaussian" else None
        return Privacy(mechanism, epsilon, delta=delta)

    def configs(self) -> list[Privacy]:
        return privacies(self.epsilons, self.mechanisms, self.gaussian_delta)

    def core_configs(self) -> list[Privacy]:
        """(d): no noise and laplace at the core's ε, largest first."""
        eps = sorted(self.core_epsilons, reverse=True)
        return [Privacy("none"), *(Privacy("laplace", e) for e in eps)]


QUICK = Setup((0.02, 0.10), (1.0,), (0.7, 0.9), (0.10,), (1.0,), 2, None, 0, 1, True)
# (d) at ε ∈ {1, 5} (at ε ≤ 0.5 both sketches sit near the label prior), 3 noise draws each;
# the per-table ablation at 10 %, ε = 1, 2 draws; the ε = 1 HTTP rows 3 draws (fresh streams).
FULL = Setup(SHARES_FULL, EPSILONS_FULL, CUTS_FULL, SHARES_FULL, (1.0, 5.0), 3, 0.10, 2, 3, False)


@dataclass
class Eval:
    """One model scored at one cut (a row of the per-cut CSV)."""

    method: str  # baseline | prior | raw-hot | http | core-median | core-min | ablation:<table>
    share: float | None
    privacy: str | None
    cut: int
    log_loss: float
    auc: float
    rounds: int = 0
    backoff_movie: float = math.nan  # test rows whose movie_id table backs off
    backoff_user: float = math.nan
    est_bias: float = math.nan  # core only: mean (estimate − exact count), movie table, test rows
    est_rmse: float = math.nan  # core only: RMS of (estimate − exact count), idem
    draw: int = 0  # which independent noise draw (a fresh stream for HTTP)

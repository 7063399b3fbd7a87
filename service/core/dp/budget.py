"""The noise of a stream's count tables and the split of its per-window budget across tables.

Sensitivity (docs/ARCHITECTURE.md, "Privacy"). One counted observation adds ±1 to ``depth``
cells of every table it is counted in and 1 to one prior cell: at most T·depth cells change by
1 (the prior table changes one cell; it is counted as a full table, which only over-states the
sensitivity), T = ``max_tables`` (fixed at creation so that adding tables later never changes
the noise). Without a user key a window counts every observation, so adding or removing one
observation changes one counted observation. With a user key a window counts the first c =
``max_contributions_per_window`` observations of each user in arrival order
(``service.core.features.counting.within_bound``), so

* adding or removing one **user** (all of the user's observations) changes at most c counted
  observations;
* adding or removing one **observation** o of user u changes at most two: if o was counted
  (one of u's first c), removing it lets u's (c+1)-th observation in — the counted set loses o
  and gains that one (a swap); if o was not counted, nothing changes. Adding is the reverse.

So with k = the number of observations the noise is calibrated to (``calibration_multiple``):

    Δ1 = k·T·depth          (L1: k counted observations, T·depth cells each)
    Δ2 = k·sqrt(T·depth)    (L2: by the triangle inequality over the k observations' changes)

and a change of m counted observations is (m/k)·ε-DP (Laplace; (m/k)²·ρ-zCDP for Gaussian):

* no user key: k = 1; one observation m = 1: ε.
* user key, ``table_calibration = "max_c_2"`` (new streams): k = max(c, 2); one observation
  m = 2: (2/k)·ε ≤ ε; one user m = c: (c/k)·ε ≤ ε per window.
* user key, ``table_calibration = "c"`` (streams created before, as stored): k = c; one
  observation (2/c)·ε — 2ε at c = 1, the understatement the old ledger made —; one user ε.

Replacing one observation by another (the substitution neighbour) is one removal and one
addition: twice the add/remove figure, m ≤ 4 counted observations with a user key, 2 without.

Laplace: every cell gets discrete Laplace noise of scale b = Δ1/ε → ε-DP per window for a
change of k counted observations (Ghosh, Roughgarden, Sundararajan 2009; Canonne, Kamath,
Steinke 2020 §1). Gaussian: discrete Gaussian with σ = Δ2/sqrt(2ρ) → ρ-zCDP (CKS 2020, Thm 4).

Budget split across tables (``privacy.table_weights``, ``privacy.prior_weight``). The noise
above gives each of the T table slots the same share. With weights, slot s (a feature's table,
the prior table, or a slot for a selected group or left unused, weight 1) gets the share
w_s / W of the budget, W = Σ_s w_s over all T slots. k counted observations change k·depth
cells of one table (L1 k·depth, L2 k·sqrt(depth)); so table s with

    Laplace  b_s = k·depth / ε_s,          ε_s = ε·w_s/W    is ε_s-DP,
    Gaussian σ_s = k·sqrt(depth / (2ρ_s)), ρ_s = ρ·w_s/W    is ρ_s-zCDP,

and the tables together, by basic composition of ε (and additivity of ρ, Bun & Steinke 2016
Lemma 2.3), are ε-DP (ρ-zCDP) per window: Σ_s ε_s = ε whatever the weights. With every weight
1, b_s = Δ1/ε and σ_s = Δ2/sqrt(2ρ): the uniform noise above. In terms of the uniform scale,
b_s = b·f_s and σ_s = σ·sqrt(f_s) with f_s = (W/T)/w_s.

Slots for selected groups. Only count-table selection fills a slot beyond the features' tables
and the prior table, and a slot takes its share 1/W of the budget whether it is filled or not:
b_s = k·depth·W/(ε·w_s) grows with W. So a stream reserves none unless selection is on
(``privacy.epsilon_selection`` > 0: ``max_tables`` defaults to features + 1 + 4, else features
+ 1), and a new stream that asks for more than features + 1 with selection off is refused
(``unused_slots``): its configuration is fixed at creation, so those slots could never be
filled. S reserved slots raise every existing table's Laplace scale by (W + S)/W and its
Gaussian σ by sqrt((W + S)/W) (``slot_cost``). A stored configuration keeps its ``max_tables``
and so its noise, which was drawn with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.core.dp.noise import discrete_gaussian_variance, discrete_laplace_variance
from service.core.streamconfig import StreamCreate


@dataclass(frozen=True)
class Noise:
    mechanism: str
    l1_sensitivity: float
    l2_sensitivity: float
    scale: float  # Laplace b, Gaussian σ, 0 for none: of a table of weight 1 when all are 1
    variance: float  # per-cell variance of that noise
    slots: int = 1  # T, max_tables
    total_weight: float = 1.0  # W: the weights of all T slots (T when every weight is 1)

    def factor(self, weight: float) -> float:
        """f_s = (W/T)/w_s: how much larger than ``scale`` a table of this weight's Laplace
        scale is (its Gaussian σ: the square root of it)."""
        return (self.total_weight / self.slots) / weight

    def scale_for(self, weight: float) -> float:
        f = self.factor(weight)
        return self.scale * (f if self.mechanism == "laplace" else math.sqrt(f))

    def variance_for(self, weight: float) -> float:
        if self.mechanism == "laplace":
            return discrete_laplace_variance(scale=self.scale_for(weight))
        if self.mechanism == "gaussian":
            return discrete_gaussian_variance(sigma=self.scale_for(weight))
        return 0.0

    def share(self, weight: float) -> float:
        """The share w_s/W of the per-window budget a table of this weight gets."""
        return weight / self.total_weight


def total_weight(cfg: StreamCreate) -> float:
    """W = Σ of the T slots' weights: each feature's table (``table_weights``, default 1), the
    prior table (``prior_weight``) and the slots left for selected groups (1 each)."""
    p = cfg.privacy
    features = sum(p.table_weights.get(f.name, 1.0) for f in cfg.features)
    return features + p.prior_weight + free_slots(cfg)


def free_slots(cfg: StreamCreate) -> int:
    """The slots beyond the features' tables and the prior table: for selected groups."""
    assert cfg.max_tables is not None
    return cfg.max_tables - len(cfg.features) - 1


def unused_slots(cfg: StreamCreate) -> str | None:
    """Why a new stream's ``max_tables`` reserves slots nothing can fill (selection off), or
    None. Each would take a share of the per-window budget and so raise every table's noise
    for good (the configuration is fixed at creation)."""
    free = free_slots(cfg)
    if free <= 0 or cfg.privacy.epsilon_selection > 0:
        return None
    needed = len(cfg.features) + 1
    assert cfg.max_tables is not None
    grow = slot_cost(total_weight(cfg) - free, free)
    return (
        f"max_tables: {cfg.max_tables} is more than features + 1 (the prior table) = {needed} "
        f"while privacy.epsilon_selection is 0: only selection fills the {free} extra "
        f"slot{'s' if free > 1 else ''}, which would take {free / total_weight(cfg):.0%} of "
        f"the per-window budget and raise every table's noise scale ×{grow['laplace']:.3g} "
        f"(laplace; gaussian ×{grow['gaussian']:.3g}); omit max_tables, set it to {needed}, "
        "or turn selection on"
    )


def slot_cost(weight: float, slots: int) -> dict[str, float]:
    """What ``slots`` slots of weight 1 cost the tables of total weight ``weight`` (W without
    them): each slot's ``share`` 1/(W + S) of the per-window budget, and the factor by which
    every existing table's noise grows, ``laplace`` (W + S)/W and ``gaussian`` its square
    root (b_s ∝ W, σ_s ∝ sqrt(W): module docstring)."""
    grown = (weight + slots) / weight
    return {"share": 1.0 / (weight + slots), "laplace": grown, "gaussian": math.sqrt(grown)}


def calibration_multiple(cfg: StreamCreate) -> int:
    """k: how many counted observations the tables' noise is calibrated to (see above): 1
    without a user key; with one, max(c, 2) (``table_calibration = "max_c_2"``) or c (``"c"``,
    streams created before max(c, 2))."""
    p = cfg.privacy
    if not p.user_key:
        return 1
    c = p.max_contributions_per_window
    return max(c, 2) if p.table_calibration == "max_c_2" else c


def observations_changed(cfg: StreamCreate, *, level: str) -> int:
    """m: the most counted observations of one window that one neighbour changes. ``level``
    ``"observation"``: adding or removing one observation (1 without a user key; 2 with one, a
    swap: the user's next observation is counted in its place); ``"user"``: adding or removing
    one user (c with a user key)."""
    p = cfg.privacy
    if level == "user":
        return p.max_contributions_per_window if p.user_key else 1
    return 2 if p.user_key else 1


def window_multiplier(cfg: StreamCreate, *, level: str) -> float:
    """m/k: one window's tables are (m/k)·ε-DP (Laplace) or (m/k)²·ρ-zCDP (Gaussian) for the
    neighbour of ``level`` (``observations_changed``)."""
    return observations_changed(cfg, level=level) / calibration_multiple(cfg)


def noise_for(cfg: StreamCreate) -> Noise:
    assert cfg.max_tables is not None
    c = calibration_multiple(cfg)
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
    return Noise(mech, l1, l2, scale, var, cfg.max_tables, total_weight(cfg))


def budget_split(cfg: StreamCreate) -> list[dict[str, Any]]:
    """Each table slot's weight, share w_s/W of the per-window budget, ε_s or ρ_s, and noise
    scale (Laplace b_s or Gaussian σ_s): every feature's table, the prior table, then the slots
    left for selected groups (``slots`` of them, each with what the line shows). Σ over all
    slots of ``share`` is 1, of ``epsilon`` (``rho``) the stream's ε (ρ)."""
    assert cfg.max_tables is not None
    noise = noise_for(cfg)
    p = cfg.privacy
    rows: list[dict[str, Any]] = []

    def row(table: str, weight: float, slots: int = 1) -> None:
        share = noise.share(weight)
        rows.append(
            {
                "table": table,
                "slots": slots,
                "weight": weight,
                "share": share,
                "epsilon": p.epsilon * share if p.epsilon is not None else None,
                "rho": p.rho * share if p.rho is not None else None,
                "noise_scale": noise.scale_for(weight),
            }
        )

    for f in cfg.features:
        row(f.name, p.table_weights.get(f.name, 1.0))
    row("(prior)", p.prior_weight)
    free = free_slots(cfg)
    if free:
        row("(selected groups)", 1.0, free)
    return rows

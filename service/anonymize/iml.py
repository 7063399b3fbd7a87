"""Learning SaNGreeA's weight vector from a human's choices ("iML", Malle, Kieseberg and
Holzinger, "Interactive Anonymization for Privacy aware Machine Learning", section 4.1): shown a
row r and two partly anonymised clusters A and B, the human says which cluster r belongs in.

**The rule.** Let ``d_A[j]`` be attribute j's normalised generalisation of ``A ∪ {r}`` (the
attribute's term of the per-row cost ``c(A ∪ r)`` of ``service.core.anonymity.sangreea`` without its
weight: ``(max(hi, x) − min(lo, x)) / (max_j − min_j)`` for a range,
``height(Λ(lca(node, r))) / height(H_j)`` for a hierarchy), and likewise ``d_B``. SaNGreeA with
weights ``w`` puts r where ``Σ_j w_j · d[j]`` is smaller. Model the human as choosing A with
probability ``σ(Σ_j w_j (d_B[j] − d_A[j]))`` (a Bradley–Terry / logistic preference on the
weighted cost the algorithm minimises) and write ``w_j = exp(θ_j)`` to keep weights positive.
The log-likelihood of "chose A" has the gradient ``(1 − p) · w_j · (d_B[j] − d_A[j])`` in
``θ_j``: it raises exactly the attributes on which the chosen cluster generalises r less. We take
the sign-and-size of that gradient without the ``(1 − p) · w_j`` factor, i.e. the exponentiated
-gradient (Hedge) step

    w_j ← w_j · exp(η · (d_other[j] − d_chosen[j])),   then w ← w / mean(w),

with ``η = LEARNING_RATE``. ``d`` is in [0, 1], so one answer changes a weight by at most the
factor ``e^η``, an attribute the two clusters generalise alike keeps its weight before the
rescaling, and the mean-1 scaling is the core's (``normalise_weights``). Dropping ``w_j`` keeps
an attribute whose weight has become small from being frozen there (with it, the step in θ
shrinks with the weight); dropping ``(1 − p)`` makes an answer that agrees with the current
weights count too, as the study's per-answer update did.

**The question.** The sample is clustered by SaNGreeA with the current weights; the row asked
next is the next of the sample in a fixed order, and its two candidates are the two clusters
other than its own whose GIL it raises least under the current weights. An answer for the
second candidate means "the weights are wrong here", one for the first confirms them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from service.core.anonymity.sangreea import SangreeaResult

LEARNING_RATE = 0.5


def row_costs(res: SangreeaResult, row: Mapping[str, Any]) -> npt.NDArray[np.float64]:
    """``d[c, j]``: attribute j's normalised generalisation of cluster c with ``row`` added,
    attributes in the order ranges, then hierarchies (``res.ranges + res.cats``)."""
    c = res.n_clusters
    out = np.zeros((c, len(res.ranges) + len(res.cats)))
    for j, name in enumerate(res.ranges):
        x = float(row[name])
        span = float(res.table_max[j] - res.table_min[j])
        lo = np.minimum(res.range_lo[:, j], x)
        hi = np.maximum(res.range_hi[:, j], x)
        out[:, j] = (hi - lo) / span if span > 0 else 0.0
    for j, name in enumerate(res.cats):
        h = res.hierarchies[j]
        node = h.index()[str(row[name])]
        out[:, len(res.ranges) + j] = h.cost()[h.lca[res.node[:, j], node]]
    return out


def candidates(res: SangreeaResult, row_index: int, d: npt.NDArray[np.float64]) -> tuple[int, int]:
    """The two clusters other than the row's own whose GIL the row raises least under the
    result's weights, (m+1)·c(cl ∪ r) − m·c(cl); ties to the lower cluster id."""
    names = [*res.ranges, *res.cats]
    w = np.array([res.weights[n] for n in names])
    own_cost = res.gil / res.size  # c(cl)
    raise_ = (res.size + 1) * (d @ w) - res.size * own_cost
    raise_[int(res.cluster[row_index])] = np.inf
    order = np.argsort(raise_, kind="stable")
    return int(order[0]), int(order[1])


def update(
    weights: Mapping[str, float],
    names: Sequence[str],
    d_chosen: npt.NDArray[np.float64],
    d_other: npt.NDArray[np.float64],
    *,
    eta: float = LEARNING_RATE,
) -> dict[str, float]:
    """The rule of the module docstring: ``w_j · exp(η (d_other[j] − d_chosen[j]))``, scaled to
    mean 1."""
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be a finite number > 0, got {eta=}")
    new = {
        n: float(weights[n]) * math.exp(eta * float(d_other[j] - d_chosen[j]))
        for j, n in enumerate(names)
    }
    mean = sum(new.values()) / len(new)
    return {n: v / mean for n, v in new.items()}

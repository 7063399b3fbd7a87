"""Re-identification audit: how many records' classes an attacker recovers from a class mean.

Su, Huynh, Chen, Lu, Lu, "Re-identification Attack to Privacy-Preserving Data Analysis with
Noisy Sample-Mean", KDD 2020 ("the paper").  The attacker holds all ``n`` unlabelled records
``X_u`` and one released statistic: the (noisy) mean ``x̄_p`` of the positive class, whose count
``n_p`` and hence prior ``π_p = n_p / n`` it also knows (the paper assumes ``π_p`` is given, §4.2;
the DP noise scale below needs ``n_p`` too).  It learns a decision function ``g`` and labels a
record positive when ``g(x) > 0``; the audit reports the **re-identification accuracy**, the
fraction of records whose class is recovered.

The mean as a PU risk (§4.3)
----------------------------
PU learning (du Plessis et al. NeurIPS 2014) rewrites the supervised risk with positive and
unlabelled data: ``R(g) = π_p E_p[l(g,+1)] + E_u[l(g,-1)] − π_p E_p[l(g,-1)]``.  The paper
replaces every expectation over labelled positives by the loss AT THE MEAN (the mean is "the
only positive sample"):

    R_RI(g) = π_p l(g(x̄_p), +1) + Ê_u[l(g(x), -1)] − π_p l(g(x̄_p), -1)
            = 2 π_p l(g(x̄_p), +1) + Ê_u[l(g(x), -1)] − π_p      (symmetric loss),

which for a linear ``g`` and a loss linear in ``g`` equals the complete-data risk (Theorem 4.1),
and in expectation over the Laplace noise too (Theorem 4.2).  The loss is the sigmoid loss
``l(z, y) = sigmoid(−y z)`` (symmetric: ``l(z,1) + l(z,-1) = 1``).

* **uPU** minimises ``R_RI`` on mini-batches (:func:`upu_risk`).
* **nnPU** (Kiryo et al. NeurIPS 2017) keeps the negative part non-negative,
  ``R = π_p l(g(x̄),1) + max(0, Ê_u[l(g,-1)] − π_p l(g(x̄),-1))`` (:func:`nnpu_risk`), trained by
  their Algorithm 1: when the negative part ``r_n < −β`` the step descends ``−γ r_n`` instead
  (``β = 0, γ = 1``, their defaults).
* **growPU** (the paper's Exhibits 1–3; hyper-parameters of Table 3 in :class:`PUConfig`):
  pre-train (the mean, repeated b times, against b unlabelled records labelled −1, until at most
  ``π_pre`` of the batch's unlabelled records are classified positive), growth (self-training
  on the classifier's own pseudo-labels of b unlabelled records plus the mean, negatives
  weighted ``w_n = (1−π_p)(n̂_p+1)/(π_p n̂_n)``, until at least ``π_grow`` are positive) and
  fine-tune (the same for ``T_tune`` steps, the weight of the side that is more than ``α``
  beyond ``π_p`` multiplied by ``γ``).  The growth risk is the paper's §5 formula,
  ``π_p/(n̂_p+1) [l(g(x̄),1) + Σ_{X̂_p} l(g(x),1)] + π_n/n̂_n Σ_{X̂_n} l(g(x),-1)``, which is
  ``π_p/(n̂_p+1) · Σ w_i l_i`` with Exhibit 3's weights: that is the loss each step descends.

  Readings of what the paper leaves open or the extracted text garbles, made explicit:

  (1) **The loss of growPU's training steps** (Exhibit 1 ``Train(model, data, label,
  weight)``).  The paper states no loss for them; its classifiers end in "a sigmoid function
  to output" (§6.1.3), and after pre-training every sample carries a (pseudo-)label, so the
  step is supervised and needs no symmetric loss (that condition is for rewriting the risk
  with unlabelled data, §4.2).  We read it as the weighted cross-entropy of the sigmoid output,
  ``l(z, y) = log(1 + exp(−y z))`` (PyTorch's ``BCELoss`` with weights: ``growpu_loss =
  "logistic"``).  The sigmoid loss of uPU/nnPU (``"sigmoid"``, our earlier reading) saturates:
  a record scored ``|g| ≫ 1`` on the wrong side has gradient ``≈ 0``, so pre-training stalls
  with about 20 % of the records positive, growth cannot move them, and growPU ended at 77 %
  on MNIST "5 vs 3" (linear, noiseless); with the cross-entropy, 95.0 % (paper 93.6).
  (2) **Adam's learning rate for growPU**: 1e-5 (``growpu_learning_rate``; uPU, nnPU and the
  oracle keep 1e-3).  The paper gives none; at 1e-3 the linear growPU scores the same (95–96 %)
  but the 3-layer perceptron drifts during fine-tuning (self-training on its own labels: 92 %
  after growth, 73 % after 2,000 fine-tune steps); at 1e-5 it ends at 92 % (paper 92.0).
  (3) The stopping proportions of the pre-train and growth loops (Exhibit 1, lines 11–12 and
  19–20) are taken over the b unlabelled records of the batch, re-classified after the step,
  and pre-training also requires the mean (the batch's other half) to be classified positive:
  counted over Exhibit 2's whole batch the proportion could not fall to ``π_pre = 0.05`` while
  the mean is positive, and without the second condition a fresh 3-layer perceptron that
  scores everything negative "stops" after one or two steps with no pseudo-labels worth the
  name.  (4) Exhibit 1 line 25 passes ``X`` where lines 17 and Exhibit 3 use ``X_u``; we
  sample from ``X_u``.  (5) The growth loop, a ``while 1`` in the paper, is capped at
  ``T_tune`` steps.  (6) As in Exhibit 3 line 11 the mean is the sample ``x̃_p`` of the
  positive side with weight ``w_p``; the pseudo-labels are the sign of ``g`` on the b records
  (no top-k selection), mini-batches of b, the prior ``π_p`` the true class share.  (7) The
  final labels are ``g(x) > 0`` (the paper's ``C(x) = 1``; it never labels the top ``π_p n``
  by score, and on MNIST that rule scores within 1.5 points of it).

Baselines on the same records: **K-means** (2 clusters, :func:`scipy.cluster.vq.kmeans2` with
k-means++ seeding, the better of the two cluster-to-class assignments: it uses the true labels,
so it is an optimistic baseline), the **prior** (everyone in the majority class) and the
**oracle** (the same classifier trained with the sigmoid loss on the true labels and scored on
the records it was trained on: the paper's upper bound).

The release (§6.1.2): the exact class mean, or the ε-DP mean ``x̄_p + Lap(b)^d`` with
``b = (max(x) − min(x)) / (n_p ε)`` (:func:`laplace_mean_scale`), the L1 sensitivity per
coordinate of a mean of ``n_p`` values in ``[min, max]``.  Following the paper, ``min`` and
``max`` are the records' overall minimum and maximum unless the caller gives the domain
(``value_range``); ``n_p`` is treated as public.  The noise comes from the project's CSPRNG
sampler (:func:`service.core.noise.discrete_laplace`, ``os.urandom``): ``b · L / 2**20`` with
``L ~ Lap_Z(2**20)``, a Laplace(b) variate rounded to a grid of ``b / 2**20``
(:func:`laplace_noise`); its distribution function differs from Laplace(b)'s by less than
``2**-20``.

Randomness: training (initialisation, batches, dropout, K-means seeding) uses numpy's
``default_rng`` seeded from the OS; only the DP noise must be unpredictable.  ``seed`` fixes both
(the noise through :class:`~service.core.noise.SeededRandomBits`) and is FOR TESTS ONLY.

Run time is dominated by the training steps (``PUConfig``: the paper's 10,000 pre-train and
10,000 fine-tune steps at most, 1,000 epochs for uPU/nnPU); ``python -m bench reidentification``
measures it on MNIST.  The batches are small matrix products: run an audit with BLAS limited to
one thread (the service's audit job does, ``SELECTIVITY_AUDIT_THREADS``), as threads of a shared
machine only contend (on this 2-core host a linear step is 20× slower with the default threads).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.cluster.vq import kmeans2

from service.core.noise import RandomBits, SeededRandomBits, discrete_laplace
from service.core.pu_models import (
    LEARNING_RATE,
    Adam,
    Classifier,
    ClassifierName,
    LossGrad,
    make_model,
    sigmoid,
    train_step,
)

__all__ = [
    "ATTACKS",
    "PUConfig",
    "audit",
    "laplace_mean_scale",
    "laplace_noise",
    "nnpu_risk",
    "release_mean",
    "upu_risk",
]

F32 = NDArray[np.float32]
Attack = Literal["growpu", "nnpu", "upu", "kmeans"]
ATTACKS: tuple[str, ...] = ("growpu", "nnpu", "upu", "kmeans")
Progress = Callable[[float, str], None]

_GRID_BITS = 20  # the Laplace noise is rounded to a grid of scale / 2**20


@dataclass(frozen=True)
class PUConfig:
    """Training hyper-parameters.  Defaults: the paper's Table 3 for MNIST (b, π_pre, π_grow,
    T_pre, T_tune, α, γ), §6.1.1 (1,000 epochs for uPU and nnPU), Kiryo et al. (β = 0,
    nnPU's γ = 1), Adam's learning rate 1e-3 (see :mod:`service.core.pu_models`).  ``oracle_epochs``
    is ours (the paper does not say how long its oracle trained).  growPU's own training
    (the paper gives neither): ``growpu_loss`` ``"logistic"`` (the cross-entropy of the sigmoid
    output, default; ``"sigmoid"``: the sigmoid loss of uPU/nnPU, the earlier reading) and
    ``growpu_learning_rate`` 1e-5 (see the module docstring for both)."""

    batch_size: int = 500
    pi_pre: float = 0.05
    pi_grow: float = 0.45
    t_pre: int = 10_000
    t_tune: int = 10_000
    alpha: float = 0.05
    gamma: float = 0.5
    pu_epochs: int = 1_000
    nnpu_beta: float = 0.0
    nnpu_gamma: float = 1.0
    oracle_epochs: int = 100
    learning_rate: float = LEARNING_RATE
    growpu_loss: Literal["logistic", "sigmoid"] = "logistic"
    growpu_learning_rate: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("batch_size", "t_pre", "t_tune", "pu_epochs", "oracle_epochs"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("pi_pre", "pi_grow", "alpha", "gamma"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        if not (self.nnpu_beta >= 0 and self.nnpu_gamma > 0 and self.learning_rate > 0):
            raise ValueError("nnpu_beta must be >= 0, nnpu_gamma and learning_rate > 0")
        if self.growpu_loss not in ("logistic", "sigmoid"):
            raise ValueError(
                f"growpu_loss must be 'logistic' or 'sigmoid', got {self.growpu_loss!r}"
            )
        if not (math.isfinite(self.growpu_learning_rate) and self.growpu_learning_rate > 0):
            raise ValueError(f"growpu_learning_rate must be > 0, got {self.growpu_learning_rate!r}")


# ------------------------------------------------------------------------------------------
# Risks (also the training objectives)
# ------------------------------------------------------------------------------------------


def _dsig(z: NDArray[np.floating]) -> NDArray[np.floating]:
    """d sigmoid(z) / dz."""
    s = sigmoid(z)
    return s * (1.0 - s)


def upu_risk(z_mean: float, z_u: NDArray[np.floating], *, pi_p: float) -> float:
    """uPU risk with the mean as the positive sample (the paper's ``R_RI``, §4.3):
    ``π_p l(z̄,+1) + mean(l(z_u,-1)) − π_p l(z̄,-1)``, ``l`` the sigmoid loss, ``z = g(x)``."""
    zp = np.array([z_mean], dtype=np.float64)
    rp_pos = float(sigmoid(-zp)[0])
    rp_neg = float(sigmoid(zp)[0])
    ru_neg = float(np.mean(sigmoid(np.asarray(z_u, dtype=np.float64))))
    return pi_p * rp_pos + ru_neg - pi_p * rp_neg


def nnpu_risk(z_mean: float, z_u: NDArray[np.floating], *, pi_p: float) -> float:
    """nnPU risk (Kiryo et al. 2017, eq. 7) with the mean as the positive sample:
    ``π_p l(z̄,+1) + max(0, mean(l(z_u,-1)) − π_p l(z̄,-1))``."""
    zp = np.array([z_mean], dtype=np.float64)
    rp_pos = float(sigmoid(-zp)[0])
    neg = float(np.mean(sigmoid(np.asarray(z_u, dtype=np.float64)))) - pi_p * float(sigmoid(zp)[0])
    return pi_p * rp_pos + max(0.0, neg)


def _pu_loss_grad(pi_p: float, *, non_negative: bool, beta: float, gamma: float) -> LossGrad:
    """Loss and gradient for a batch whose LAST row is the mean, the others unlabelled."""

    def loss_grad(z: F32) -> tuple[float, F32]:
        zu, zp = z[:-1].astype(np.float64), float(z[-1])
        su = sigmoid(zu)
        sp = 1.0 / (1.0 + math.exp(-zp)) if zp > -30 else 0.0
        rp_pos, rp_neg = 1.0 - sp, sp
        ds_p = sp * (1.0 - sp)
        neg = float(su.mean()) - pi_p * rp_neg
        dz = np.empty(len(z), dtype=np.float64)
        dz[:-1] = su * (1.0 - su) / len(zu)
        dz[-1] = -pi_p * ds_p
        if non_negative and neg < -beta:
            # Kiryo et al. Algorithm 1: step on -γ r_n (pushes the negative risk back up).
            return pi_p * rp_pos, (-gamma * dz).astype(np.float32)
        dz[-1] += -pi_p * ds_p  # d/dz of π_p sigmoid(-z̄)
        return pi_p * rp_pos + (max(neg, 0.0) if non_negative else neg), dz.astype(np.float32)

    return loss_grad


def _weighted_loss_grad(y: F32, w: F32, scale: float) -> LossGrad:
    """``scale · Σ w_i sigmoid(-y_i z_i)`` and its gradient."""

    def loss_grad(z: F32) -> tuple[float, F32]:
        s = sigmoid(-y * z)
        return float(scale * np.sum(w * s)), (-scale * w * y * s * (1.0 - s)).astype(np.float32)

    return loss_grad


def _weighted_logistic_grad(y: F32, w: F32, scale: float) -> LossGrad:
    """``scale · Σ w_i log(1 + exp(-y_i z_i))`` (the cross-entropy of the sigmoid output
    ``sigmoid(z)`` against the label ``(1 + y) / 2``) and its gradient
    ``-scale · w · y · sigmoid(-y z)``."""

    def loss_grad(z: F32) -> tuple[float, F32]:
        m = (-y * z).astype(np.float64)
        return (
            float(scale * np.sum(w * np.logaddexp(0.0, m))),
            (-scale * w * y * sigmoid(m)).astype(np.float32),
        )

    return loss_grad


# ------------------------------------------------------------------------------------------
# The release
# ------------------------------------------------------------------------------------------


def laplace_mean_scale(*, value_range: float, n_p: int, epsilon: float) -> float:
    """Laplace scale per coordinate for an ε-DP class mean (the paper §6.1.2):
    ``b = (max(x) − min(x)) / (n_p ε)``: changing one of ``n_p`` records moves each coordinate
    of their mean by at most ``(max − min)/n_p``."""
    if not (math.isfinite(value_range) and value_range > 0):
        raise ValueError(f"value_range must be finite and > 0, got {value_range=}")
    if n_p < 1:
        raise ValueError(f"n_p must be >= 1, got {n_p=}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    return value_range / (n_p * epsilon)


def laplace_noise(
    *, scale: float, size: int, bits: RandomBits | None = None
) -> NDArray[np.float64]:
    """``size`` Laplace(0, ``scale``) variates from the CSPRNG (``bits=None``: ``os.urandom``):
    ``scale · L / 2**20`` with ``L ~ Lap_Z(2**20)`` drawn by :func:`discrete_laplace`, i.e.
    Laplace(scale) rounded to a grid of ``scale / 2**20`` (CDFs within ``2**-20``)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale=}")
    units = discrete_laplace(scale=Fraction(2**_GRID_BITS), size=size, bits=bits)
    return units.astype(np.float64) * (scale / 2**_GRID_BITS)


def release_mean(
    x: NDArray[np.floating],
    is_pos: NDArray[np.bool_],
    *,
    epsilon: float | None,
    value_range: tuple[float, float] | None = None,
    bits: RandomBits | None = None,
) -> tuple[NDArray[np.float64], float]:
    """The released positive-class mean and the Laplace scale used (0.0 when noiseless)."""
    xp = x[is_pos]
    mean = xp.astype(np.float64).mean(axis=0)
    if epsilon is None:
        return mean, 0.0
    if value_range is None:
        lo, hi = float(x.min()), float(x.max())
        span = hi - lo if hi > lo else 1.0  # constant data: any positive range is a valid bound
    else:
        lo, hi = value_range
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise ValueError(
                f"value_range must be finite (min, max) with max > min, got {value_range}"
            )
        if x.min() < lo or x.max() > hi:
            raise ValueError("value_range must contain every value of x")
        span = hi - lo
    scale = laplace_mean_scale(value_range=span, n_p=len(xp), epsilon=epsilon)
    return mean + laplace_noise(scale=scale, size=mean.size, bits=bits), scale


# ------------------------------------------------------------------------------------------
# Attacks
# ------------------------------------------------------------------------------------------


class _Ticker:
    """Throttled progress: ``advance`` adds units of work; calls ``progress`` at most every 1 %."""

    def __init__(self, total: float, progress: Progress | None) -> None:
        self.total, self.done, self.progress, self._last = max(total, 1.0), 0.0, progress, -1.0

    def advance(self, units: float, stage: str) -> None:
        self.done = min(self.total, self.done + units)
        frac = self.done / self.total
        if self.progress is not None and (frac - self._last >= 0.01 or frac >= 1.0):
            self._last = frac
            self.progress(frac, stage)


def _batch(rng: np.random.Generator, n: int, b: int) -> NDArray[np.intp]:
    return rng.choice(n, size=b, replace=False) if b < n else rng.permutation(n)


def _train_pu(
    model: Classifier,
    x: F32,
    mean: F32,
    *,
    pi_p: float,
    cfg: PUConfig,
    non_negative: bool,
    rng: np.random.Generator,
    tick: _Ticker,
    stage: str,
) -> None:
    """uPU / nnPU: ``pu_epochs`` passes over the shuffled records in batches of ``b``, each
    batch with the mean appended as the one positive sample."""
    opt = Adam(model.params, lr=cfg.learning_rate)
    lg = _pu_loss_grad(pi_p, non_negative=non_negative, beta=cfg.nnpu_beta, gamma=cfg.nnpu_gamma)
    n, b = len(x), cfg.batch_size
    for _ in range(cfg.pu_epochs):
        order = rng.permutation(n)
        for i in range(0, n, b):
            train_step(model, opt, np.vstack([x[order[i : i + b]], mean[None, :]]), lg)
            tick.advance(1, stage)


def _grow_batch(
    model: Classifier,
    x: F32,
    mean: F32,
    idx: NDArray[np.intp],
    *,
    pi_p: float,
    cfg: PUConfig,
    fine_tune: bool,
) -> tuple[F32, F32, F32, float]:
    """Exhibit 3 (GrowSampleSelection): pseudo-labels of the batch, labels, weights, scale."""
    xb = x[idx]
    pos = model.decision(xb) > 0
    n_p, n_n = int(pos.sum()), int((~pos).sum())
    w_p = 1.0
    w_n = (1.0 - pi_p) * (n_p + 1) / (pi_p * n_n) if n_n else 0.0
    if fine_tune:
        share = n_p / (n_p + n_n)
        if share <= pi_p - cfg.alpha:
            w_n *= cfg.gamma
        if share >= pi_p + cfg.alpha:
            w_p *= cfg.gamma
    data = np.vstack([xb[~pos], xb[pos], mean[None, :]])
    y = np.concatenate([-np.ones(n_n), np.ones(n_p + 1)]).astype(np.float32)
    w = np.concatenate([np.full(n_n, w_n), np.full(n_p + 1, w_p)]).astype(np.float32)
    return data, y, w, pi_p / (n_p + 1)


def _train_growpu(
    model: Classifier,
    x: F32,
    mean: F32,
    *,
    pi_p: float,
    cfg: PUConfig,
    rng: np.random.Generator,
    tick: _Ticker,
) -> dict[str, int]:
    """growPU, Exhibits 1–3.  Returns the number of steps of each stage."""
    opt = Adam(model.params, lr=cfg.growpu_learning_rate)
    weighted = _weighted_logistic_grad if cfg.growpu_loss == "logistic" else _weighted_loss_grad
    n, b = len(x), cfg.batch_size
    b_u = min(b, n)
    means = np.repeat(mean[None, :], b_u, axis=0)
    y_pre = np.concatenate([-np.ones(b_u), np.ones(b_u)]).astype(np.float32)
    lg_pre = weighted(y_pre, np.ones(2 * b_u, dtype=np.float32), 1.0 / (2 * b_u))
    steps = {"pre_train": 0, "growth": 0, "fine_tune": 0}
    # Pre-train (Exhibit 1 lines 7-13, Exhibit 2).
    for _ in range(cfg.t_pre):
        idx = _batch(rng, n, b)
        train_step(model, opt, np.vstack([x[idx], means]), lg_pre)
        steps["pre_train"] += 1
        tick.advance(1, "growpu: pre-train")
        # Stop when at most π_pre of the batch's records are classified positive, the mean is.
        if (
            np.mean(model.decision(x[idx]) > 0) <= cfg.pi_pre
            and model.decision(mean[None, :])[0] > 0
        ):
            break
    tick.advance(cfg.t_pre - steps["pre_train"], "growpu: pre-train")
    # Growth (lines 14-21) then fine-tune (lines 22-26), Exhibit 3.
    for fine_tune, limit in ((False, cfg.t_tune), (True, cfg.t_tune)):
        stage = "fine_tune" if fine_tune else "growth"
        for _ in range(limit):
            idx = _batch(rng, n, b)
            data, y, w, scale = _grow_batch(
                model, x, mean, idx, pi_p=pi_p, cfg=cfg, fine_tune=fine_tune
            )
            train_step(model, opt, data, weighted(y, w, scale))
            steps[stage] += 1
            tick.advance(1, f"growpu: {stage.replace('_', '-')}")
            if not fine_tune and np.mean(model.decision(x[idx]) > 0) >= cfg.pi_grow:
                break
        tick.advance(limit - steps[stage], f"growpu: {stage.replace('_', '-')}")
    return steps


def _train_oracle(
    model: Classifier,
    x: F32,
    is_pos: NDArray[np.bool_],
    *,
    cfg: PUConfig,
    rng: np.random.Generator,
    tick: _Ticker,
) -> None:
    """Supervised: mean sigmoid loss on the true labels, ``oracle_epochs`` epochs."""
    opt = Adam(model.params, lr=cfg.learning_rate)
    y_all = np.where(is_pos, 1.0, -1.0).astype(np.float32)
    n, b = len(x), cfg.batch_size
    for _ in range(cfg.oracle_epochs):
        order = rng.permutation(n)
        for i in range(0, n, b):
            sel = order[i : i + b]
            lg = _weighted_loss_grad(y_all[sel], np.ones(len(sel), np.float32), 1.0 / len(sel))
            train_step(model, opt, x[sel], lg)
            tick.advance(1, "oracle")


def _kmeans_accuracy(x: F32, is_pos: NDArray[np.bool_], rng: np.random.Generator) -> float:
    """2-means (Lloyd, k-means++ seeding), the better cluster-to-class assignment."""
    _, labels = kmeans2(x.astype(np.float64), 2, minit="++", seed=rng)
    acc = float(np.mean((labels == 1) == is_pos))
    return max(acc, 1.0 - acc)


# ------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------


def _validate(
    x: Any, y: Any, positive: Any, attacks: Sequence[str], classifier: str, epsilon: Any
) -> tuple[F32, NDArray[np.bool_]]:
    xa = np.asarray(x)
    if xa.ndim != 2 or xa.shape[0] < 2 or xa.shape[1] < 1:
        raise ValueError(f"x must be a 2-D array of at least 2 records, got shape {xa.shape}")
    if not np.issubdtype(xa.dtype, np.number) or np.issubdtype(xa.dtype, np.complexfloating):
        raise ValueError(f"x must be real numbers, got dtype {xa.dtype}")
    xf = xa.astype(np.float32)
    if not np.all(np.isfinite(xf)):
        raise ValueError("x must be finite (no NaN or infinity, |value| < 3.4e38)")
    ya = np.asarray(y)
    if ya.shape != (xa.shape[0],):
        raise ValueError(f"y must have one label per record: {xa.shape[0]}, got shape {ya.shape}")
    is_pos = ya == positive
    if not is_pos.any() or is_pos.all():
        raise ValueError("y must contain the positive label and at least one other label")
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown or not attacks:
        raise ValueError(f"attacks must be a non-empty subset of {list(ATTACKS)}, got {unknown}")
    if classifier not in ("linear", "mlp"):
        raise ValueError(f"classifier must be 'linear' or 'mlp', got {classifier!r}")
    if epsilon is not None and not (
        isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0
    ):
        raise ValueError(f"epsilon must be a finite number > 0 or None, got {epsilon!r}")
    return xf, is_pos


def audit(
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    positive: object,
    attacks: Sequence[str] = ATTACKS,
    classifier: ClassifierName = "linear",
    epsilon: float | None = None,
    value_range: tuple[float, float] | None = None,
    oracle: bool = True,
    config: PUConfig | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    released: NDArray[np.floating] | None = None,
) -> dict[str, Any]:
    """Release the positive class's mean of ``x`` (exact, or ε-DP when ``epsilon`` is given),
    run ``attacks`` on the records and that mean, and score them against ``y``.

    ``x``: records (n × d, real); ``y``: their labels, ``positive`` the label of the released
    class.  ``progress(fraction, stage)`` is called as work completes (at most every 1 %, and
    with 1.0 at the end).  ``seed`` is FOR TESTS ONLY (it makes the DP noise predictable).
    ``released``: the positive-class mean as the attacker reads it from a release made
    elsewhere (e.g. the service's noisy count tables, ``service.audits``): it is attacked as
    given, no mean is computed or noised here, ``epsilon`` is only reported and
    ``noise_scale`` is 0.0.

    Returns ``{"results": {attack: {"accuracy": ...}, "prior": ..., "oracle": ...}, "n", "pi_p",
    "epsilon", "noise_scale", "classifier", "seconds"}``; accuracies are fractions in [0, 1].
    Raises ``ValueError`` naming the argument on bad input.
    """
    start = time.perf_counter()
    cfg = config or PUConfig()
    xf, is_pos = _validate(x, y, positive, attacks, classifier, epsilon)
    rng = np.random.default_rng(seed)
    bits = SeededRandomBits(seed) if seed is not None else None
    n = len(xf)
    pi_p = float(is_pos.mean())
    if released is None:
        mean64, scale = release_mean(
            xf, is_pos, epsilon=epsilon, value_range=value_range, bits=bits
        )
    else:
        mean64, scale = np.asarray(released, dtype=np.float64), 0.0
        if mean64.shape != (xf.shape[1],) or not np.all(np.isfinite(mean64)):
            raise ValueError(
                f"released must be {xf.shape[1]} finite numbers, got shape {mean64.shape}"
            )
    mean = mean64.astype(np.float32)

    batches = math.ceil(n / cfg.batch_size)
    work = {
        "growpu": cfg.t_pre + 2 * cfg.t_tune,
        "nnpu": cfg.pu_epochs * batches,
        "upu": cfg.pu_epochs * batches,
        "kmeans": 1,
    }
    # Work units: training steps (an epoch is `batches` steps; the ticker counts epochs).
    total = sum(work[a] for a in attacks) + (cfg.oracle_epochs * batches if oracle else 0)
    tick = _Ticker(total, progress)

    results: dict[str, dict[str, Any]] = {}
    for attack in dict.fromkeys(attacks):
        t0 = time.perf_counter()
        entry: dict[str, Any] = {}
        if attack == "kmeans":
            entry["accuracy"] = _kmeans_accuracy(xf, is_pos, rng)
            tick.advance(1, "kmeans")
        else:
            model = make_model(classifier, xf.shape[1], rng)
            if attack == "growpu":
                entry["steps"] = _train_growpu(
                    model, xf, mean, pi_p=pi_p, cfg=cfg, rng=rng, tick=tick
                )
            else:
                _train_pu(
                    model,
                    xf,
                    mean,
                    pi_p=pi_p,
                    cfg=cfg,
                    non_negative=attack == "nnpu",
                    rng=rng,
                    tick=tick,
                    stage=attack,
                )
            pred = model.decision(xf) > 0
            entry["accuracy"] = float(np.mean(pred == is_pos))
            entry["positive_share"] = float(pred.mean())
        entry["seconds"] = time.perf_counter() - t0
        results[attack] = entry
    results["prior"] = {"accuracy": max(pi_p, 1.0 - pi_p)}
    if oracle:
        t0 = time.perf_counter()
        model = make_model(classifier, xf.shape[1], rng)
        _train_oracle(model, xf, is_pos, cfg=cfg, rng=rng, tick=tick)
        results["oracle"] = {
            "accuracy": float(np.mean((model.decision(xf) > 0) == is_pos)),
            "seconds": time.perf_counter() - t0,
        }
    tick.advance(total, "done")
    return {
        "results": results,
        "n": n,
        "pi_p": pi_p,
        "epsilon": epsilon,
        "noise_scale": scale,
        "classifier": classifier,
        "config": asdict(cfg),
        "seconds": time.perf_counter() - start,
    }

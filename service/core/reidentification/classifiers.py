"""Small classifiers for the re-identification attacks of
:mod:`service.core.reidentification.attacks` (pure numpy).

Two decision functions ``g: R^d -> R`` (a record is classified positive when ``g(x) > 0``):

* :class:`LinearModel`: ``g(x) = x·w + c`` (the paper's "linear" classifier, Su et al. KDD 2020
  §6.1.3: input layer, output layer, no hidden layer);
* :class:`MLPModel`: the paper's "3lp-300", ``g(x) = relu(x W1 + b1) · w2 + c2`` with 300 hidden
  units and inverted dropout of 20 % on the hidden layer while training (§6.1.3).

Forward and backward passes are written by hand in float32.  Weights start uniform in
``±1/sqrt(fan_in)`` (the PyTorch default for ``nn.Linear``, which the paper's code used).

Training minimises a loss built from the **sigmoid loss** ``l(z, y) = sigmoid(-y z)``, which is
symmetric, ``l(z, 1) + l(z, -1) = 1`` (the condition of du Plessis et al. 2014 that the paper's
risk relies on, §4.2), with :class:`Adam` (Kingma & Ba, ICLR 2015, Algorithm 1).  The paper
does not give Adam's settings; we use Kingma & Ba's defaults ``beta1 = 0.9, beta2 = 0.999,
eps = 1e-8``, and the learning rate ``1e-3`` and L2 weight decay ``0.005`` (added to the
gradient, as Chainer's ``WeightDecay`` hook does) of Kiryo et al.'s nnPU code for MNIST.  Without
the decay the scores of the 784-dimensional MNIST records grow to |g(x)| ~ 30 within a few hundred
steps and the sigmoid loss saturates.  growPU's supervised steps use the cross-entropy of the
sigmoid output instead, at a learning rate of 1e-5
(:class:`service.core.reidentification.attacks.PUConfig`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, Protocol, cast

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Adam",
    "Classifier",
    "LinearModel",
    "LossGrad",
    "MLPModel",
    "make_model",
    "sigmoid",
    "sigmoid_loss",
    "train_step",
]

F32 = NDArray[np.float32]
ClassifierName = Literal["linear", "mlp"]

ADAM_BETA1 = 0.9
ADAM_BETA2 = 0.999
ADAM_EPS = 1e-8
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.005
HIDDEN = 300
DROPOUT = 0.2


def sigmoid(z: NDArray[np.floating]) -> NDArray[np.floating]:
    """``1 / (1 + exp(-z))``, computed without overflow for large ``|z|``."""
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def sigmoid_loss(z: NDArray[np.floating], y: float | NDArray[np.floating]) -> NDArray[np.floating]:
    """The sigmoid loss ``l(z, y) = sigmoid(-y z)`` for labels ``y`` in {-1, +1}."""
    return sigmoid(-np.asarray(y, dtype=z.dtype) * z)


class Classifier(Protocol):
    """A decision function with trainable parameters (float32 arrays, updated in place)."""

    params: list[F32]

    def forward(self, x: F32, *, train: bool) -> tuple[F32, object]:
        """``g(x)`` for the rows of ``x`` and a cache for :meth:`backward`."""
        ...

    def backward(self, cache: object, dz: F32) -> list[F32]:
        """Gradients of ``sum(dz * g(x))`` with respect to :attr:`params`."""
        ...

    def decision(self, x: F32) -> F32:
        """``g(x)`` in evaluation mode (no dropout), in chunks."""
        ...


def _uniform(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> F32:
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


class LinearModel:
    """``g(x) = x·w + c``."""

    def __init__(self, d: int, rng: np.random.Generator) -> None:
        self.params = [_uniform(rng, d, (d,)), _uniform(rng, d, (1,))]

    def forward(self, x: F32, *, train: bool) -> tuple[F32, object]:
        w, c = self.params
        return x @ w + c[0], x

    def backward(self, cache: object, dz: F32) -> list[F32]:
        x = cache
        assert isinstance(x, np.ndarray)
        return [dz @ x, np.array([dz.sum()], dtype=np.float32)]

    def decision(self, x: F32) -> F32:
        return self.forward(x, train=False)[0]


class MLPModel:
    """``g(x) = relu(x W1 + b1)·w2 + c2`` with inverted dropout (rate ``dropout``) on the hidden
    layer in training mode (the paper's 3-layer perceptron)."""

    def __init__(
        self,
        d: int,
        rng: np.random.Generator,
        *,
        hidden: int = HIDDEN,
        dropout: float = DROPOUT,
    ) -> None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout=}")
        self.params = [
            _uniform(rng, d, (d, hidden)),
            _uniform(rng, d, (hidden,)),
            _uniform(rng, hidden, (hidden,)),
            _uniform(rng, hidden, (1,)),
        ]
        self._rng = rng
        self._keep = 1.0 - dropout

    def forward(self, x: F32, *, train: bool) -> tuple[F32, object]:
        w1, b1, w2, c2 = self.params
        h = x @ w1
        h += b1
        np.maximum(h, 0.0, out=h)
        mask = None
        if train and self._keep < 1.0:
            mask = (self._rng.random(h.shape, dtype=np.float32) < self._keep).astype(np.float32)
            mask /= np.float32(self._keep)
            h *= mask
        return h @ w2 + c2[0], (x, h, mask)

    def backward(self, cache: object, dz: F32) -> list[F32]:
        x, h, mask = cast("tuple[F32, F32, F32 | None]", cache)
        w2 = self.params[2]
        dh = np.outer(dz, w2)
        dh *= h > 0
        if mask is not None:
            dh *= mask
        return [x.T @ dh, dh.sum(axis=0), dz @ h, np.array([dz.sum()], dtype=np.float32)]

    def decision(self, x: F32) -> F32:
        return np.concatenate(
            [self.forward(x[i : i + 4096], train=False)[0] for i in range(0, len(x), 4096)]
        )


def make_model(name: ClassifierName, d: int, rng: np.random.Generator) -> Classifier:
    """A fresh ``"linear"`` or ``"mlp"`` (3-layer perceptron, 300 hidden units) classifier."""
    if name == "linear":
        return LinearModel(d, rng)
    if name == "mlp":
        return MLPModel(d, rng)
    raise ValueError(f"classifier must be 'linear' or 'mlp', got {name!r}")


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) over a list of float32 arrays, updated in place:

    m <- b1 m + (1-b1) g;   v <- b2 v + (1-b2) g²;
    p <- p - lr · (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
    """

    def __init__(
        self,
        params: list[F32],
        *,
        lr: float = LEARNING_RATE,
        beta1: float = ADAM_BETA1,
        beta2: float = ADAM_BETA2,
        eps: float = ADAM_EPS,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr=}")
        self.params = params
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay=}")
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.weight_decay = weight_decay
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[F32]) -> None:
        self.t += 1
        c1 = 1.0 - self.beta1**self.t
        c2 = 1.0 - self.beta2**self.t
        step = np.float32(self.lr * math.sqrt(c2) / c1)
        eps = np.float32(self.eps * math.sqrt(c2))
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            if self.weight_decay:
                g = g + np.float32(self.weight_decay) * p
            m *= np.float32(self.beta1)
            m += np.float32(1.0 - self.beta1) * g
            v *= np.float32(self.beta2)
            v += np.float32(1.0 - self.beta2) * (g * g)
            p -= step * m / (np.sqrt(v) + eps)


LossGrad = Callable[[F32], tuple[float, F32]]


def train_step(model: Classifier, opt: Adam, x: F32, loss_grad: LossGrad) -> tuple[float, F32]:
    """One Adam step on ``loss_grad``: it maps the scores ``z = g(x)`` of the batch (training
    mode) to ``(loss, dloss/dz)``.  Returns the loss and the scores."""
    z, cache = model.forward(x, train=True)
    loss, dz = loss_grad(z)
    opt.step(model.backward(cache, dz.astype(np.float32, copy=False)))
    return loss, z

"""Exact integer noise for differentially private count tables (pure Python + numpy).

Every int32 cell of a count sketch starts from integer noise drawn here.  Two mechanisms:

* discrete Laplace ``Lap_Z(b)``:  ``P[X = x] = tanh(1/(2b)) * exp(-|x|/b)``  (pure ε-DP with
  ``b = Δ1/ε``), and
* discrete Gaussian ``N_Z(0, σ²)``: ``P[X = x] = exp(-x²/(2σ²)) / Σ_y exp(-y²/(2σ²))``
  (ρ-zCDP with ``σ = Δ2/sqrt(2ρ)``).

Source: C. L. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential
Privacy", NeurIPS 2020, arXiv:2004.00010 ("CKS"), Algorithm 1 (Bernoulli(exp(-γ)) for rational
γ), Algorithm 2 (discrete Laplace with rational scale t/s) and Algorithm 3 (discrete Gaussian
with rational σ²).  No floating point is involved in sampling.

Randomness
----------
Only cryptographically secure bytes are used in production: ``bits=None`` means
:class:`OsRandomBits` (``os.urandom``, i.e. the kernel's ``getrandom``).  No seeded or global PRNG
is ever touched, so cells that are never incremented reveal no PRNG state from which other
cells' noise could be recovered.  Randomness is injected through the :class:`RandomBits`
protocol, ``random_bytes(n) -> bytes``; :class:`SeededRandomBits` exists FOR TESTS ONLY.

Vectorisation
-------------
Each algorithm runs on a whole array of lanes; each of its loops becomes a *masked rejection
loop* where only the still-active lanes draw fresh randomness in a round.  Randomness comes in
bulk as little-endian words of 1, 2, 3, 4 or 8 bytes (the width with the fewest expected bytes
per draw):

* uniform integers in ``[0, m)`` by exact rejection: Lemire's multiply-shift on ``w``-bit words
  (``x = r*m``, value ``x >> w``, reject when ``x mod 2**w < 2**w mod m``), or for 8-byte words
  ``r mod m``, rejected when ``r // m == floor(2**64/m)``;
* Bernoulli(n/d) = ``[uniform[0, d) < n]``;
* Bernoulli(exp(-γ)), γ = n/d in [0, 1] (Alg. 1): ``K = 1``; while Bernoulli(γ/K): ``K += 1``;
  return "K odd".  In round K every active lane has the same K, so ``d*K`` is one scalar;
* Bernoulli(exp(-1)), the most frequent case, from ONE uniform ``W`` in ``[0, 9!)``: its
  mixed-radix digits ``(W // (k-1)!) mod k`` (k = 2..9) are independent and uniform on
  ``[0, k)``, and Alg. 1's ``A_k ~ Bernoulli(1/k)`` is ``[digit_k == 0]``, so "A_2 = ... = A_k =
  1" is exactly "k! divides W" and ``K = 1 + max{k <= 9 : k! | W}``; the lanes with 9! | W
  (probability 1/9!) continue the chain from K = 10 in the scalar fallback;
* Bernoulli(exp(-γ)), γ > 1 (Alg. 1): ``floor(γ)`` successive Bernoulli(exp(-1)) successes, then
  Bernoulli(exp(-(γ - floor γ))).

Discrete Laplace, scale ``t/s`` (Alg. 2): ``U ~ uniform[0, t)``, continue with Bernoulli(exp(-U/t));
``V`` = number of Bernoulli(exp(-1)) successes before the first failure; ``X = U + t*V``;
``Y = floor(X/s)``; ``B ~ Bernoulli(1/2)``; reject if ``B = 1 and Y = 0``; return ``(1-2B)*Y``.
(``U`` and ``B`` come from one uniform in ``[0, 2t)``.)

Discrete Gaussian (Alg. 3): proposal ``Y ~ Lap_Z(t)``, ``t = floor(σ) + 1`` (any positive
integer t is correct), accepted with Bernoulli(exp(-γ)), ``γ = (|Y| - σ²/t)² / (2σ²)``.  The
rational representation is chosen with ``σ²/t = m/b``, so that, EXACTLY,

    γ = M² / D,    M = |Y|*b - m,    D = 2*t*m*b <= 2**48,    m < 2**24.

Lanes with ``|M| < 2**32`` get ``floor(γ) = M² // D`` and ``M² mod D`` in uint64 without overflow.
A lane with ``|M| >= 2**32`` has ``γ >= k0 := floor(2**64 / D) >= 2**16``: it is tested against
Bernoulli(exp(-k0)) vectorised (it fails with probability ``1 - exp(-65536)``), and only a
surviving lane (never, in practice) finishes Bernoulli(exp(-(γ - k0))) with Python integers.

Rejection loops are run in batches sized from the known acceptance probability (see
:func:`_fill`), in chunks of ``2**17`` outputs.  Python-level per-lane loops exist only in rare
fallbacks (a chain whose denominator would pass 2**63, 9! | W, |M| >= 2**32 survivors), which
run the same algorithm with Python integers.

Parameter rounding (the only deviation from the requested parameters)
--------------------------------------------------------------------
A float parameter is first converted EXACTLY to a :class:`~fractions.Fraction`.

* Laplace: the scale ``t/s`` is used exactly when ``t, s <= 2**40`` (e.g. 10, 2.5, 1/3 as a
  Fraction).  Otherwise it is replaced by the SMALLEST fraction ``>= scale`` with denominator
  ``<= max(1, floor(2**28 / scale)) <= 2**48`` (a Farey neighbour): ROUNDED UP, relative increase
  ``< 2**-27`` (7.5e-9).  E.g. 0.7 -> 7/10, float(1/3) -> 1/3, 10.3 -> 268435438/26061693
  (+3.7e-10 relative).
* Gaussian: with ``t = floor(σ) + 1``, ``c = σ²/t`` is used exactly when ``2*t*num(c)*den(c) <=
  2**48``; otherwise ``c`` is ROUNDED UP to the smallest fraction with denominator ``<= Q``,
  ``Q ~ sqrt(2**47/(t*c))``; ``σ_eff² = t*c_eff``, relative increase ``< 2**-21 * max(1, 1/σ)``.

Larger scale / σ² only strengthens the guarantee (ε = Δ1/b and ρ = Δ2²/(2σ²) decrease), so
the guarantee computed for the requested parameter still holds.  :func:`effective_laplace_scale`
and :func:`effective_gaussian_sigma_squared` return the exact rationals actually used.

Non-exactness, precisely
------------------------
With ideal random bytes the samplers are exact for the effective parameters, except that

1. outputs are int64: should an intermediate ``X = U + t*V`` reach ``2**62`` the call raises
   :class:`OverflowError` instead of returning.  That needs ``V >= 2**62/t - 1 >= 2**21`` (t <=
   2**41), probability ``< exp(-2**21)`` per sample -- it never happens.
2. The pmf / variance helpers (for tests and accounting) are float64 evaluations of exact closed
   forms or rapidly converging series (relative error ~1e-15), taken at the REQUESTED, not the
   rounded, parameter (the two differ by the relative amounts above).
3. :func:`zcdp_to_approx_dp` is a float64 minimisation over α; every α gives a valid ε, so a
   suboptimal α only makes it looser; the formula itself has ~1e-15 relative rounding.

Limits: ``2**-20 <= scale <= 2**40`` and ``2**-20 <= σ <= 2**22`` (below 2**-20 the output is 0
with probability > 1 - 1e-300 anyway); a precise ValueError is raised outside them.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "MAX_GAUSSIAN_SIGMA",
    "MAX_LAPLACE_SCALE",
    "MIN_GAUSSIAN_SIGMA",
    "MIN_LAPLACE_SCALE",
    "OsRandomBits",
    "RandomBits",
    "SeededRandomBits",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "discrete_gaussian_variance",
    "discrete_laplace",
    "discrete_laplace_pmf",
    "discrete_laplace_variance",
    "effective_gaussian_sigma_squared",
    "effective_laplace_scale",
    "gaussian_sigma",
    "laplace_scale",
    "sample_noise",
    "zcdp_to_approx_dp",
]

Int64Array = NDArray[np.int64]
U64Array = NDArray[np.uint64]
BoolArray = NDArray[np.bool_]
IndexArray = NDArray[np.intp]

MIN_LAPLACE_SCALE = Fraction(1, 2**20)
MAX_LAPLACE_SCALE = 2**40
MIN_GAUSSIAN_SIGMA = Fraction(1, 2**20)
MAX_GAUSSIAN_SIGMA = 2**22

_CHUNK = 1 << 17
_EXACT_LAPLACE_LIMIT = 2**40  # keep t/s exactly when t, s <= this
_LAPLACE_PRECISION = 2**28  # max_den = floor(_LAPLACE_PRECISION / scale) when rounding
_MAX_GAUSS_DEN = 2**48  # D = 2*t*m*b
_U64_CHAIN_LIMIT = 2**63  # denominators d*K of a vectorised chain stay below this
_FAST_M_BITS = 32  # Gaussian lanes with |M| < 2**32 use uint64 arithmetic
_CHAIN_DIGITS = 9  # Bernoulli(exp(-1)) from one uniform in [0, 9!)
_FACT = math.factorial(_CHAIN_DIGITS)
_FACTORIALS = tuple((k, np.uint64(math.factorial(k))) for k in range(3, _CHAIN_DIGITS + 1))
_MAX_ABS_INTERMEDIATE = 2**62
_NONE: IndexArray = np.empty(0, dtype=np.intp)


# --------------------------------------------------------------------------------------------
# Randomness sources
# --------------------------------------------------------------------------------------------


@runtime_checkable
class RandomBits(Protocol):
    """A source of uniformly random bytes.

    ``random_bytes(n)`` must return exactly ``n`` independent uniformly random bytes.  Every
    sampler of this module consumes randomness only through this method.
    """

    def random_bytes(self, n: int) -> bytes: ...


class OsRandomBits:
    """The production source: the operating system's CSPRNG via ``os.urandom`` (``getrandom``).

    Stateless in Python: nothing a caller observes lets it predict other outputs.
    """

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def __repr__(self) -> str:
        return "OsRandomBits()"


class SeededRandomBits:
    """Deterministic bytes from numpy's PCG64 seeded with ``seed``.

    FOR TESTS ONLY -- never use it to noise real tables: PCG64 is not cryptographically secure,
    and its state can be recovered from its outputs (e.g. from never-incremented cells).
    """

    def __init__(self, seed: int) -> None:
        self._seed = operator.index(seed)
        self._bitgen = np.random.PCG64(self._seed)

    def random_bytes(self, n: int) -> bytes:
        if n <= 0:
            return b""
        words = self._bitgen.random_raw((n + 7) // 8)
        return words.astype("<u8", copy=False).tobytes()[:n]

    def __repr__(self) -> str:
        return f"SeededRandomBits(seed={self._seed})"


class _Source:
    """Typed views of a :class:`RandomBits` (checks the byte count it returns)."""

    __slots__ = ("_bits",)

    def __init__(self, bits: RandomBits | None) -> None:
        if bits is None:
            bits = OsRandomBits()
        elif not callable(getattr(bits, "random_bytes", None)):
            raise TypeError(f"bits must provide random_bytes(n) -> bytes, got {bits=}")
        self._bits = bits

    def raw(self, n: int) -> bytes:
        data = self._bits.random_bytes(n)
        if len(data) != n:
            raise RuntimeError(f"random_bytes({n}) returned {len(data)} bytes")
        return data

    def words(self, width: int, n: int) -> U64Array:
        """``n`` uniform unsigned words of ``width`` bytes (1, 2, 3, 4 or 8), as uint64."""
        raw = self.raw(width * n)
        if width == 3:  # unaligned little-endian uint32 view with stride 3, top byte masked off
            view = np.ndarray(shape=(n,), dtype="<u4", buffer=raw + b"\0", strides=(3,))
            return view.astype(np.uint64) & np.uint64(0xFFFFFF)
        dtype = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}[width]
        return np.frombuffer(raw, dtype=dtype).astype(np.uint64)  # a writable copy


# --------------------------------------------------------------------------------------------
# Exact primitives (vectorised) and their scalar Python-int fallbacks
# --------------------------------------------------------------------------------------------


def _word_width(m: int) -> int:
    """Word width (bytes) minimising the expected bytes per exact uniform draw in [0, m):
    ``width / P[accept]`` with ``P[reject] = (2**(8*width) mod m) / 2**(8*width)``."""
    best, best_cost = 8, math.inf
    for width in (1, 2, 3, 4, 8):
        span = 1 << (8 * width)
        if m <= span:
            cost = width * span / (span - span % m)
            if cost < best_cost:
                best, best_cost = width, cost
    return best


def _uniform_below(src: _Source, m: int, n: int) -> U64Array:
    """``n`` iid uniform integers in ``[0, m)``, ``1 <= m < 2**64``, by exact rejection.

    Words of ``w <= 4`` bytes: Lemire's method, ``x = r*m`` (< 2**64), value ``x >> 8w``, reject
    when ``x mod 2**8w < 2**8w mod m``.  8-byte words: value ``r mod m``, reject when
    ``r // m == floor(2**64/m)``.  Both are exactly uniform; rejected lanes are redrawn.
    """
    if m == 1 or n == 0:
        return np.zeros(n, dtype=np.uint64)
    width = _word_width(m)
    out, todo = _uniform_round(src, m, width, n)
    while todo.size:
        val, bad = _uniform_round(src, m, width, todo.size)
        out[todo] = val
        todo = todo[bad]
    return out


def _uniform_round(src: _Source, m: int, width: int, n: int) -> tuple[U64Array, IndexArray]:
    """One round of :func:`_uniform_below`: candidates, and the lanes whose draw is rejected."""
    r = src.words(width, n)
    m64 = np.uint64(m)
    if width <= 4:
        bits = 8 * width
        r *= m64  # x = r*m < 2**(8*width + 64 - 8*width)
        thr = (1 << bits) % m
        bad = np.flatnonzero((r & np.uint64((1 << bits) - 1)) < np.uint64(thr)) if thr else _NONE
        r >>= np.uint64(bits)
        return r, bad
    q = r // m64
    bad = np.flatnonzero(q >= np.uint64((1 << 64) // m))
    q *= m64
    r -= q
    return r, bad


def _py_uniform_below(src: _Source, m: int) -> int:
    """One uniform integer in ``[0, m)`` with Python ints (exact rejection, any size)."""
    if m == 1:
        return 0
    nbits = (m - 1).bit_length()
    mask = (1 << nbits) - 1
    nbytes = (nbits + 7) // 8
    while True:
        v = int.from_bytes(src.raw(nbytes), "little") & mask
        if v < m:
            return v


def _py_chain(src: _Source, num: int, den: int, k: int) -> bool:
    """CKS Alg. 1 (γ = num/den in [0, 1]) continued from counter ``K = k`` with Python ints:
    while Bernoulli(γ/K) = [uniform[0, den*K) < num]: K += 1; return K odd."""
    while _py_uniform_below(src, den * k) < num:
        k += 1
    return k % 2 == 1


def _py_bernoulli_exp_neg(src: _Source, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for any rational ``num/den >= 0`` (CKS Alg. 1), Python ints."""
    whole, frac = divmod(num, den)
    i = 0
    while i < whole:  # floor(γ) Bernoulli(exp(-1)) successes
        if not _py_chain(src, 1, 1, 1):
            return False
        i += 1
    return _py_chain(src, frac, den, 1)


def _bernoulli_exp_neg_fraction(src: _Source, num: U64Array, den: int) -> BoolArray:
    """Per lane Bernoulli(exp(-num_i/den)), ``0 <= num_i <= den`` (CKS Alg. 1, γ in [0, 1]).

    Round K: every active lane draws A ~ Bernoulli(num_i/(den*K)) = [uniform[0, den*K) < num_i];
    lanes with A = 0 stop with result "K odd"; the others continue with K + 1.
    """
    n = num.size
    out = np.ones(n, dtype=np.bool_)  # round K = 1: lanes stopping now return "1 odd"
    if den >= _U64_CHAIN_LIMIT:  # pragma: no cover - parameters keep den <= 2**48
        for lane, v in enumerate(num.tolist()):
            out[lane] = _py_chain(src, int(v), den, 1)
        return out
    idx = np.flatnonzero(_uniform_below(src, den, n) < num)
    cur = num[idx]
    k = 2
    while idx.size:
        m = den * k
        if m >= _U64_CHAIN_LIMIT:  # astronomically rare: finish with Python ints
            for lane, v in zip(idx.tolist(), cur.tolist(), strict=True):
                out[lane] = _py_chain(src, int(v), den, k)
            break
        out[idx] = k % 2 == 1
        go = np.flatnonzero(_uniform_below(src, m, idx.size) < cur)
        idx = idx[go]
        cur = cur[go]
        k += 1
    return out


def _bernoulli_exp_neg_one(src: _Source, n: int) -> BoolArray:
    """``n`` iid Bernoulli(exp(-1)) (CKS Alg. 1 with γ = 1) from one uniform in [0, 9!) each.

    K = 1 + max{k <= 9 : k! | W} (see module docstring); result = K odd = "max is even".
    """
    w = _uniform_below(src, _FACT, n)
    out = (w & np.uint64(1)) == 0  # 2! | W  -> max >= 2 (provisionally even)
    idx = np.flatnonzero(out)
    wi = w[idx]
    for k, fact in _FACTORIALS:
        if not idx.size:
            break
        go = np.flatnonzero(wi % fact == 0)
        idx = idx[go]
        wi = wi[go]
        out[idx] = k % 2 == 0
    for lane in idx.tolist():  # 9! | W: the chain goes on from K = 10 (probability 1/9!)
        out[lane] = _py_chain(src, 1, 1, _CHAIN_DIGITS + 1)
    return out


def _geometric_exp_neg_one(src: _Source, n: int) -> Int64Array:
    """``V`` = number of Bernoulli(exp(-1)) successes before the first failure
    (``P[V >= v] = exp(-v)``), the inner loop of CKS Alg. 2."""
    v = np.zeros(n, dtype=np.int64)
    idx = np.flatnonzero(_bernoulli_exp_neg_one(src, n))
    while idx.size:
        v[idx] += 1
        idx = idx[np.flatnonzero(_bernoulli_exp_neg_one(src, idx.size))]
    return v


def _all_exp_neg_one(src: _Source, counts: U64Array) -> BoolArray:
    """Per lane: ``counts_i`` successive Bernoulli(exp(-1)) successes, i.e.
    Bernoulli(exp(-counts_i)) (the γ > 1 part of CKS Alg. 1)."""
    ok = np.ones(counts.size, dtype=np.bool_)
    idx = np.flatnonzero(counts)
    left = counts[idx]
    while idx.size:
        b = _bernoulli_exp_neg_one(src, idx.size)
        ok[idx[~b]] = False
        go = np.flatnonzero(b & (left > 1))
        idx = idx[go]
        left = left[go] - np.uint64(1)
    return ok


# --------------------------------------------------------------------------------------------
# Vectorised CKS Algorithms 2 and 3
# --------------------------------------------------------------------------------------------


def _fill(n: int, accept_rate: float, attempt: Callable[[int], Int64Array]) -> Int64Array:
    """``n`` outputs of a rejection sampler: ``attempt(k)`` runs ``k`` independent proposals and
    returns the accepted values in proposal order.  Batches are sized ``need/accept_rate``
    plus a margin so one batch almost always suffices; surplus accepted values are dropped.

    Exact: the proposals are independent and, given the accept/reject pattern, the accepted
    values are iid from the target law, so which of them are kept (a function of the pattern
    only) does not bias them.
    """
    rate = min(1.0, max(accept_rate, 0.1))  # true rates are >= 0.28 (CKS Alg. 2 and 3)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        batch = int(need / rate + 4.0 * math.sqrt(need / rate)) + 16
        vals = attempt(batch)
        k = min(vals.size, need)
        out[filled : filled + k] = vals[:k]
        filled += k
    return out


def _laplace_attempt(src: _Source, t: int, s: int, n: int) -> Int64Array:
    """One round of CKS Alg. 2 (scale t/s) on ``n`` lanes; the accepted samples, in order."""
    w = _uniform_below(src, 2 * t, n)  # (U, B) uniform on [0, t) x {0, 1}
    if t > 1:  # accept with Bernoulli(exp(-U/t))
        w = w[_bernoulli_exp_neg_fraction(src, w >> np.uint64(1), t)]
    negative = (w & np.uint64(1)).astype(np.bool_)
    v = _geometric_exp_neg_one(src, w.size)
    if v.size and int(v.max()) > (_MAX_ABS_INTERMEDIATE - t) // t:
        raise OverflowError("discrete Laplace intermediate exceeds 2**62 (probability 0)")
    y = (w >> np.uint64(1)).astype(np.int64) + v * t  # X = U + t*V
    if s > 1:
        y //= s  # Y = floor(X/s)
    ok = ~(negative & (y == 0))  # reject B = 1, Y = 0
    y = y[ok]
    np.negative(y, out=y, where=negative[ok])
    return y


def _laplace_accept_rate(t: int, s: int) -> float:
    """P[one round of CKS Alg. 2 accepts] = P[D = 1] * (1 + exp(-s/t))/2 with
    P[D = 1] = (1 - e^-1) / (t (1 - e^{-1/t})) (only sizes batches)."""
    p_d = -math.expm1(-1.0) / (t * -math.expm1(-1.0 / t))
    return p_d * (1.0 + math.exp(-s / t)) / 2.0


def _laplace(src: _Source, t: int, s: int, n: int) -> Int64Array:
    """``n`` samples of Lap_Z(t/s) (CKS Alg. 2)."""
    return _fill(n, _laplace_accept_rate(t, s), lambda k: _laplace_attempt(src, t, s, k))


@dataclass(frozen=True)
class _GaussianParams:
    """σ² = t*m/b with Laplace proposal scale t; γ = (|Y|*b - m)² / (2*t*m*b)."""

    t: int
    m: int
    b: int

    @property
    def den(self) -> int:
        return 2 * self.t * self.m * self.b

    @property
    def sigma2(self) -> Fraction:
        return Fraction(self.t * self.m, self.b)

    def accept_rate(self) -> float:
        """P[CKS Alg. 3 accepts a proposal] = tanh(1/(2t)) e^{-σ²/(2t²)} Σ_y e^{-y²/(2σ²)}."""
        var = float(self.sigma2)
        return (
            math.tanh(0.5 / self.t)
            * math.exp(-var / (2.0 * self.t * self.t))
            * _gaussian_normaliser(math.sqrt(var))
        )


def _gaussian_attempt(src: _Source, p: _GaussianParams, n: int) -> Int64Array:
    """One round of CKS Alg. 3 on ``n`` lanes; the accepted samples, in order."""
    den = p.den
    d64 = np.uint64(den)
    y = _laplace(src, p.t, 1, n)
    absy = np.abs(y)
    ylim = ((1 << _FAST_M_BITS) + p.m - 1) // p.b  # |Y| <= ylim  <=>  |M| < 2**32
    fast: IndexArray | None = None  # None: all lanes are fast (the usual case)
    slow = _NONE
    if n and int(absy.max()) > ylim:
        fast = np.flatnonzero(absy <= ylim)
        slow = np.flatnonzero(absy > ylim)
    mm = absy if fast is None else absy[fast]
    mm = mm * p.b
    mm -= p.m
    np.abs(mm, out=mm)
    nn = mm.view(np.uint64)
    nn *= nn  # M², < 2**64
    whole = nn // d64  # floor(γ)
    ok = _all_exp_neg_one(src, whole)
    surv = np.flatnonzero(ok)
    frac = nn[surv] - whole[surv] * d64  # γ - floor(γ) = frac / D
    ok[surv] = _bernoulli_exp_neg_fraction(src, frac, den)
    if fast is None:
        accept = ok
    else:
        accept = np.zeros(n, dtype=np.bool_)
        accept[fast] = ok
    if slow.size:  # γ = M²/D >= 2**64/D >= k0: Bernoulli(exp(-k0)) first, exactly
        k0 = (1 << (2 * _FAST_M_BITS)) // den
        ok = _all_exp_neg_one(src, np.full(slow.size, k0, dtype=np.uint64))
        for lane in slow[ok].tolist():  # probability <= exp(-65536) each
            m_big = int(absy[lane]) * p.b - p.m
            accept[lane] = _py_bernoulli_exp_neg(src, m_big * m_big - k0 * den, den)
    return y[accept]


def _gaussian(src: _Source, p: _GaussianParams, n: int) -> Int64Array:
    """``n`` samples of N_Z(0, t*m/b) (CKS Alg. 3)."""
    return _fill(n, p.accept_rate(), lambda k: _gaussian_attempt(src, p, k))


def _chunked(size: int, fill: Callable[[int], Int64Array]) -> Int64Array:
    out = np.empty(size, dtype=np.int64)
    for start in range(0, size, _CHUNK):
        stop = min(size, start + _CHUNK)
        out[start:stop] = fill(stop - start)
    return out


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {name}={value!r}")
    try:
        as_float = float(value)
    except OverflowError:  # a huge exact rational: finite, but beyond float range
        as_float = math.inf if value > 0 else -math.inf  # type: ignore[operator]
        if isinstance(value, numbers.Rational):
            return as_float
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    return as_float


def _check_positive(name: str, value: object) -> float:
    as_float = _check_real(name, value)
    if not value > 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be > 0, got {name}={value!r}")
    return as_float


def _positive_fraction(name: str, value: object, lo: Fraction, hi: int) -> Fraction:
    """``value`` (validated finite and > 0) as an exact Fraction (floats convert exactly)."""
    _check_positive(name, value)
    if isinstance(value, Fraction):
        frac = value
    elif isinstance(value, numbers.Rational):
        frac = Fraction(int(value.numerator), int(value.denominator))
    else:
        frac = Fraction(float(value))  # type: ignore[arg-type]
    if frac < lo:
        raise ValueError(f"{name} must be >= 2**-20, got {name}={value!r}")
    if frac > hi:
        raise ValueError(f"{name} must be <= {hi}, got {name}={value!r}")
    return frac


def _check_size(size: object) -> int:
    if isinstance(size, bool):
        raise TypeError(f"size must be an int, got {size=}")
    try:
        n = operator.index(size)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"size must be an int, got {size=}") from None
    if n < 0:
        raise ValueError(f"size must be >= 0, got {size=}")
    return n


def _round_up(x: Fraction, max_den: int) -> Fraction:
    """The smallest fraction ``>= x`` with denominator ``<= max_den`` (its Farey neighbour).

    Continued-fraction walk as in :meth:`fractions.Fraction.limit_denominator`: the last
    convergent and the best semiconvergent with denominator ``<= max_den`` bracket ``x``; they
    are neighbours in the Farey sequence of order ``max_den``, so the upper one is the answer and
    exceeds ``x`` by less than ``1/max_den``.
    """
    if max_den < 1:
        raise ValueError(f"max_den must be >= 1, got {max_den=}")
    if x.denominator <= max_den:
        return x
    p0, q0, p1, q1 = 0, 1, 1, 0
    n, d = x.numerator, x.denominator
    while True:
        a = n // d
        q2 = q0 + a * q1
        if q2 > max_den:
            break
        p0, q0, p1, q1 = p1, q1, p0 + a * p1, q2
        n, d = d, n - a * d
    k = (max_den - q0) // q1
    semi = Fraction(p0 + k * p1, q0 + k * q1)
    conv = Fraction(p1, q1)
    up = semi if semi > x else conv
    if not up > x:  # pragma: no cover - mathematical impossibility
        raise AssertionError(f"rounding failed for {x=}, {max_den=}")
    return up


def _laplace_params(scale: float | Fraction) -> tuple[int, int]:
    x = _positive_fraction("scale", scale, MIN_LAPLACE_SCALE, MAX_LAPLACE_SCALE)
    if x.numerator > _EXACT_LAPLACE_LIMIT or x.denominator > _EXACT_LAPLACE_LIMIT:
        x = _round_up(x, max(1, math.floor(_LAPLACE_PRECISION / x)))
    return x.numerator, x.denominator


def _gaussian_params(sigma: float | Fraction) -> _GaussianParams:
    s = _positive_fraction("sigma", sigma, MIN_GAUSSIAN_SIGMA, MAX_GAUSSIAN_SIGMA)
    var = s * s
    t = math.isqrt(var.numerator // var.denominator) + 1  # floor(σ) + 1
    c = var / t
    if 2 * t * c.numerator * c.denominator > _MAX_GAUSS_DEN:
        # D = 2*t*m*b ~ 2*t*c*b², so denominators b <= sqrt(2**47/(t*c)) keep D <= 2**48
        q = max(1, math.isqrt(math.floor(Fraction(_MAX_GAUSS_DEN, 2 * t) / c)))
        while True:
            c_up = _round_up(c, q)
            if 2 * t * c_up.numerator * c_up.denominator <= _MAX_GAUSS_DEN:
                break
            if q == 1:  # pragma: no cover - excluded by MAX_GAUSSIAN_SIGMA
                raise ValueError(f"sigma too large, got {sigma=}")
            q //= 2
        c = c_up
    return _GaussianParams(t=t, m=c.numerator, b=c.denominator)


def effective_laplace_scale(*, scale: float | Fraction) -> Fraction:
    """The exact rational scale :func:`discrete_laplace` uses for ``scale``: ``scale`` itself
    when its numerator and denominator are ``<= 2**40``, else the smallest fraction ``>= scale``
    with denominator ``<= max(1, floor(2**28/scale))`` (relative increase < 2**-27).  Always
    ``>= scale``."""
    t, s = _laplace_params(scale)
    return Fraction(t, s)


def effective_gaussian_sigma_squared(*, sigma: float | Fraction) -> Fraction:
    """The exact rational σ² :func:`discrete_gaussian` uses for ``sigma``: ``σ²`` itself when
    ``2*t*num(c)*den(c) <= 2**48`` for ``c = σ²/t``, ``t = floor(σ)+1``; else ``σ²`` rounded UP
    (relative increase < 2**-21 * max(1, 1/σ)).  Always ``>= sigma**2``."""
    return _gaussian_params(sigma).sigma2


# --------------------------------------------------------------------------------------------
# Public samplers
# --------------------------------------------------------------------------------------------


def discrete_laplace(
    *, scale: float | Fraction, size: int, bits: RandomBits | None = None
) -> Int64Array:
    """``size`` iid samples of the discrete Laplace distribution ``Lap_Z(scale)`` (int64):

        P[X = x] = tanh(1/(2*scale)) * exp(-|x|/scale),   x in Z.

    With ``scale = Δ1/ε`` it gives ε-DP for integer queries of L1 sensitivity Δ1 (CKS §4 /
    Ghosh, Roughgarden, Sundararajan 2009).  Exact sampler: CKS 2020 Algorithm 2 (with Alg. 1),
    vectorised; ``scale`` is used as the exact rational ``effective_laplace_scale(scale=scale)``
    (>= scale, rounded up only if needed; see module docstring).  ``bits=None`` uses
    ``os.urandom``.
    """
    n = _check_size(size)
    t, s = _laplace_params(scale)
    src = _Source(bits)
    return _chunked(n, lambda k: _laplace(src, t, s, k))


def discrete_gaussian(
    *, sigma: float | Fraction, size: int, bits: RandomBits | None = None
) -> Int64Array:
    """``size`` iid samples of the discrete Gaussian ``N_Z(0, σ²)`` (int64):

        P[X = x] = exp(-x²/(2σ²)) / Σ_{y in Z} exp(-y²/(2σ²)).

    With ``σ = Δ2/sqrt(2ρ)`` it gives ρ-zCDP (CKS 2020 Theorem 4).  Exact sampler: CKS 2020
    Algorithm 3 (proposal Lap_Z(floor(σ)+1), acceptance Bernoulli(exp(-(|Y|-σ²/t)²/(2σ²))) by
    Alg. 1), vectorised with exact integer arithmetic; σ² is the exact rational
    ``effective_gaussian_sigma_squared(sigma=sigma)`` (>= σ², rounded up only if needed).
    ``bits=None`` uses ``os.urandom``.
    """
    n = _check_size(size)
    p = _gaussian_params(sigma)
    src = _Source(bits)
    return _chunked(n, lambda k: _gaussian(src, p, k))


def sample_noise(
    *,
    mechanism: Literal["laplace", "gaussian"],
    scale: float,
    size: int,
    bits: RandomBits | None = None,
) -> Int64Array:
    """Dispatch: ``mechanism='laplace'`` -> :func:`discrete_laplace` with Laplace scale ``b =
    scale``; ``'gaussian'`` -> :func:`discrete_gaussian` with ``σ = scale``."""
    if mechanism == "laplace":
        return discrete_laplace(scale=scale, size=size, bits=bits)
    if mechanism == "gaussian":
        return discrete_gaussian(sigma=scale, size=size, bits=bits)
    raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism=}")


# --------------------------------------------------------------------------------------------
# Calibration and accounting
# --------------------------------------------------------------------------------------------


def laplace_scale(*, l1_sensitivity: float, epsilon: float) -> float:
    """Discrete Laplace scale for ε-DP: ``b = Δ1/ε`` (Dwork, McSherry, Nissim, Smith 2006;
    discrete version: CKS 2020 §4 / Ghosh et al. 2009)."""
    d1 = _check_positive("l1_sensitivity", l1_sensitivity)
    eps = _check_positive("epsilon", epsilon)
    return d1 / eps


def gaussian_sigma(*, l2_sensitivity: float, rho: float) -> float:
    """Discrete Gaussian σ for ρ-zCDP: ``σ = Δ2/sqrt(2ρ)``, since N_Z(0, σ²) is
    ``Δ2²/(2σ²)``-zCDP (CKS 2020 Theorem 4; continuous case Bun & Steinke 2016 Prop. 1.6)."""
    d2 = _check_positive("l2_sensitivity", l2_sensitivity)
    r = _check_positive("rho", rho)
    return d2 / math.sqrt(2.0 * r)


def zcdp_to_approx_dp(*, rho: float, delta: float) -> float:
    """The ε such that ρ-zCDP implies (ε, δ)-DP, by CKS 2020 Corollary 13:

        ε = inf_{α > 1}  αρ + (ln(1/δ) + (α-1)·ln(1 - 1/α) - ln α) / (α - 1).

    Every α > 1 gives a valid ε, so the numerical minimisation (log-spaced grid, then
    golden-section refinement) can only err on the safe side.  The result is never larger than
    Bun & Steinke 2016 Prop. 1.3, ``ρ + 2·sqrt(ρ·ln(1/δ))`` (it is also checked against it), and
    is clamped at 0 (for tiny ρ and large δ the bound can be negative; any larger ε is valid).
    Agrees with OpenDP's ``make_zCDP_to_approxDP`` (same corollary).
    """
    r = _check_positive("rho", rho)
    d = _check_real("delta", delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    log_inv_delta = -math.log(d)

    def eps_of(log_am1: NDArray[np.float64]) -> NDArray[np.float64]:
        am1 = np.exp(log_am1)  # α - 1
        alpha = 1.0 + am1
        with np.errstate(over="ignore", invalid="ignore"):
            val = alpha * r + (log_inv_delta + am1 * np.log1p(-1.0 / alpha) - np.log(alpha)) / am1
        return np.where(np.isfinite(val), val, np.inf)

    grid = np.linspace(-30.0, 30.0, 6001)
    vals = eps_of(grid)
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    best = float(vals[i])
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(80):
        a = hi - golden * (hi - lo)
        b = lo + golden * (hi - lo)
        fa, fb = eps_of(np.array([a, b]))
        best = min(best, float(fa), float(fb))
        if fa < fb:
            hi = b
        else:
            lo = a
    bun_steinke = r + 2.0 * math.sqrt(r * log_inv_delta)
    return max(0.0, min(best, bun_steinke))  # (ε, δ)-DP implies (ε', δ)-DP for ε' >= ε


# --------------------------------------------------------------------------------------------
# Exact pmfs and variances (float64; for tests and accounting)
# --------------------------------------------------------------------------------------------


def discrete_laplace_pmf(x: NDArray[np.integer] | int, *, scale: float | Fraction) -> NDArray:
    """``P[X = x] = (1-q)/(1+q) · q^|x| = tanh(1/(2b)) · exp(-|x|/b)``, ``q = exp(-1/b)``, for
    ``X ~ Lap_Z(b)`` (CKS 2020 Definition 28).  Normalised in closed form."""
    b = _check_positive("scale", scale)
    ax = np.abs(np.asarray(x, dtype=np.float64))
    return math.tanh(0.5 / b) * np.exp(-ax / b)


def _gaussian_normaliser(s: float) -> float:
    """``Σ_{y in Z} exp(-y²/(2s²))``: direct sum for s < 1, else Poisson summation
    ``sqrt(2π)·s·(1 + 2·Σ_{k>=1} exp(-2π²s²k²))``."""
    if s < 1.0:
        y = np.arange(1, math.ceil(40.0 * s) + 2, dtype=np.float64)
        return float(1.0 + 2.0 * np.exp(-(y * y) / (2.0 * s * s)).sum())
    k = np.arange(1, 4, dtype=np.float64)
    theta = 1.0 + 2.0 * float(np.exp(-2.0 * (math.pi * s * k) ** 2).sum())
    return math.sqrt(2.0 * math.pi) * s * theta


def discrete_gaussian_pmf(x: NDArray[np.integer] | int, *, sigma: float | Fraction) -> NDArray:
    """``P[X = x] = exp(-x²/(2σ²)) / Σ_y exp(-y²/(2σ²))`` for ``X ~ N_Z(0, σ²)`` (CKS 2020
    Definition 1).  The normaliser is a direct sum (σ < 1) or its Poisson-summation (Jacobi
    theta) form (σ >= 1), both accurate to float64 precision."""
    s = _check_positive("sigma", sigma)
    ax = np.asarray(x, dtype=np.float64)
    return np.exp(-(ax * ax) / (2.0 * s * s)) / _gaussian_normaliser(s)


def discrete_laplace_variance(*, scale: float | Fraction) -> float:
    """``Var[Lap_Z(b)] = 2q/(1-q)²`` with ``q = exp(-1/b)`` (CKS 2020 §4); ``< 2b²``, ``~ 2b²``
    for large b."""
    b = _check_positive("scale", scale)
    one_minus_q = -math.expm1(-1.0 / b)
    q = math.exp(-1.0 / b)
    return 2.0 * q / (one_minus_q * one_minus_q)


def discrete_gaussian_variance(*, sigma: float | Fraction) -> float:
    """``Var[N_Z(0, σ²)] = Σ_y y² e^{-y²/(2σ²)} / Σ_y e^{-y²/(2σ²)} <= σ²`` (CKS 2020 Prop. 19),
    as an exact series: direct sum for σ < 1; for σ >= 1 by Poisson summation,
    ``σ²·(1 + 2Σ_k (1 - 4π²σ²k²)e^{-2π²σ²k²}) / (1 + 2Σ_k e^{-2π²σ²k²})`` (k >= 1)."""
    s = _check_positive("sigma", sigma)
    if s < 1.0:
        y = np.arange(1, math.ceil(40.0 * s) + 2, dtype=np.float64)
        w = np.exp(-(y * y) / (2.0 * s * s))
        return float(2.0 * (y * y * w).sum() / (1.0 + 2.0 * w.sum()))
    k = np.arange(1, 4, dtype=np.float64)
    e = np.exp(-2.0 * (math.pi * s * k) ** 2)
    num = 1.0 + 2.0 * float(((1.0 - 4.0 * (math.pi * s * k) ** 2) * e).sum())
    den = 1.0 + 2.0 * float(e.sum())
    return s * s * (num / den)

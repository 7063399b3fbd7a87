"""Tests of service.core.dp.noise: distributions, CSPRNG use, validation, conservative rounding.

Statistical tests use fixed seeds (``SeededRandomBits``), so they are deterministic: a test
either always passes or always fails.  The "false-failure rate" written next to a threshold is
the probability that a CORRECT sampler fails it for a random seed, i.e. the chance that the
fixed seed had been an unlucky one.  The OpenDP comparisons are the exception (OpenDP's sampler
cannot be seeded); their false-failure rate is per run, and is set to 1e-6.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from service.core.dp import noise
from service.core.dp.noise import (
    OsRandomBits,
    RandomBits,
    SeededRandomBits,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_pmf,
    discrete_laplace_variance,
    effective_gaussian_sigma_squared,
    effective_laplace_scale,
    gaussian_sigma,
    laplace_scale,
    sample_noise,
    zcdp_to_approx_dp,
)
from tests.helpers import forbid_prngs, spy_urandom

# p-value threshold of the seeded goodness-of-fit tests: false-failure rate 1e-5 per test.
ALPHA = 1e-5
# OpenDP comparisons are not seedable: false-failure rate 1e-6 per test and run.
ALPHA_UNSEEDED = 1e-6
N_GOF = 200_000

Pmf = Callable[[np.ndarray], np.ndarray]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _support(pmf: Pmf, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric integer support [-L, L] (L grown until the tails hold < 1e-3 expected samples)
    and the expected counts, with the tail mass folded into the two edge cells."""
    half = 8
    while True:
        x = np.arange(-half, half + 1)
        p = pmf(x)
        if n * (1.0 - p.sum()) < 1e-3 or half > 100_000:
            break
        half *= 2
    expected = n * p
    tail = n * max(0.0, 1.0 - p.sum()) / 2.0
    expected[0] += tail
    expected[-1] += tail
    return x, expected


def _pool(expected: np.ndarray, min_expected: float = 5.0) -> np.ndarray:
    """Bin labels pooling consecutive cells left to right until each bin expects >= 5."""
    labels = np.empty(expected.size, dtype=np.int64)
    label, acc = 0, 0.0
    for i, e in enumerate(expected):
        labels[i] = label
        acc += e
        if acc >= min_expected:
            label, acc = label + 1, 0.0
    if acc < min_expected and label > 0:  # leftover tail joins the last full bin
        labels[labels == label] = label - 1
    return labels


def _binned_counts(samples: np.ndarray, x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    clipped = np.clip(samples, x[0], x[-1]) - x[0]
    cell_counts = np.bincount(clipped, minlength=x.size)
    return np.bincount(labels, weights=cell_counts).astype(np.int64)


def gof_pvalue(samples: np.ndarray, pmf: Pmf) -> float:
    """Chi-square goodness of fit of integer samples against an exact pmf (pooled bins)."""
    x, expected = _support(pmf, samples.size)
    labels = _pool(expected)
    observed = _binned_counts(samples, x, labels)
    exp_binned = np.bincount(labels, weights=expected)
    exp_binned *= samples.size / exp_binned.sum()
    assert observed.size >= 2
    return float(stats.chisquare(observed, exp_binned).pvalue)


def two_sample_pvalue(a: np.ndarray, b: np.ndarray, pmf: Pmf) -> float:
    """Chi-square two-sample (homogeneity) test, bins pooled so that the smaller sample expects
    >= 5 per bin under ``pmf``."""
    x, expected = _support(pmf, min(a.size, b.size))
    labels = _pool(expected)
    table = np.vstack([_binned_counts(a, x, labels), _binned_counts(b, x, labels)])
    table = table[:, table.sum(axis=0) > 0]
    return float(stats.chi2_contingency(table).pvalue)


def laplace_pmf(scale: float) -> Pmf:
    return lambda x: discrete_laplace_pmf(x, scale=scale)


def gaussian_pmf(sigma: float) -> Pmf:
    return lambda x: discrete_gaussian_pmf(x, sigma=sigma)


def _opendp():  # imported lazily: only the comparison tests need it
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


# ----------------------------------------------------------------------------------------------
# goodness of fit against the exact pmf
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "seed"),
    [
        (0.7, 1),
        (3.0, 2),
        (25.0, 3),
        (Fraction(1, 3), 4),
        (1 / 3, 5),
        (10.3, 6),  # rounded to a nearby rational (larger numerator, 4-byte uniform path)
        (0.2, 7),  # 97% of the mass at 0
        (Fraction(22, 7), 8),
        (1234.5, 9),
    ],
)
def test_discrete_laplace_matches_exact_pmf(scale: float | Fraction, seed: int) -> None:
    samples = discrete_laplace(scale=scale, size=N_GOF, bits=SeededRandomBits(seed))
    assert gof_pvalue(samples, laplace_pmf(float(scale))) > ALPHA  # false-failure rate 1e-5


@pytest.mark.parametrize(
    ("sigma", "seed"),
    [
        (0.5, 11),
        (2.0, 12),
        (15.0, 13),
        (0.3, 14),  # rounded σ², t = 1
        (10.3, 15),  # rounded σ², D close to 2**48: 8-byte uniforms in the acceptance chain
        (Fraction(7, 3), 16),
        (1000.5, 17),
    ],
)
def test_discrete_gaussian_matches_exact_pmf(sigma: float | Fraction, seed: int) -> None:
    samples = discrete_gaussian(sigma=sigma, size=N_GOF, bits=SeededRandomBits(seed))
    assert gof_pvalue(samples, gaussian_pmf(float(sigma))) > ALPHA  # false-failure rate 1e-5


def test_tiny_sigma_is_almost_always_zero() -> None:
    # σ = 0.05: P[X != 0] = 2 e^-200 / Z; every |Y| >= 1 proposal takes the |M| >= 2**32 lane.
    samples = discrete_gaussian(sigma=0.05, size=20_000, bits=SeededRandomBits(18))
    assert not samples.any()


# ----------------------------------------------------------------------------------------------
# comparison with OpenDP's exact samplers (the reference implementation)
# ----------------------------------------------------------------------------------------------


# One scale of each in the fast set: the fits to the exact pmf above cover every scale there;
# the other comparisons with OpenDP (statistical, a second each) run in `make test`.
@pytest.mark.parametrize(
    ("scale", "seed"),
    [
        pytest.param(0.7, 21, marks=pytest.mark.slow),
        (3.0, 22),
        pytest.param(25.0, 23, marks=pytest.mark.slow),
    ],
)
def test_discrete_laplace_matches_opendp(scale: float, seed: int) -> None:
    dp = _opendp()
    space = (dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int))
    meas = space >> dp.m.then_laplace(scale=scale)
    reference = np.asarray(meas([0] * 20_000), dtype=np.int64)
    ours = discrete_laplace(scale=scale, size=N_GOF, bits=SeededRandomBits(seed))
    pvalue = two_sample_pvalue(ours, reference, laplace_pmf(scale))
    assert pvalue > ALPHA_UNSEEDED  # unseeded: false-failure rate 1e-6 per run


@pytest.mark.parametrize(
    ("sigma", "seed"),
    [
        pytest.param(0.5, 24, marks=pytest.mark.slow),
        (2.0, 25),
        pytest.param(15.0, 26, marks=pytest.mark.slow),
    ],
)
def test_discrete_gaussian_matches_opendp(sigma: float, seed: int) -> None:
    dp = _opendp()
    space = (dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int))
    meas = space >> dp.m.then_gaussian(scale=sigma)
    reference = np.asarray(meas([0] * 20_000), dtype=np.int64)
    ours = discrete_gaussian(sigma=sigma, size=N_GOF, bits=SeededRandomBits(seed))
    pvalue = two_sample_pvalue(ours, reference, gaussian_pmf(sigma))
    assert pvalue > ALPHA_UNSEEDED  # unseeded: false-failure rate 1e-6 per run


def test_zcdp_conversion_matches_opendp() -> None:
    dp = _opendp()
    space = (dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int))
    for sigma in (0.5, 2.0, 10.0, 100.0):
        meas = dp.c.make_zCDP_to_approxDP(space >> dp.m.then_gaussian(scale=sigma))
        rho = 1.0 / (2.0 * sigma * sigma)  # Δ2 = 1
        for delta in (1e-3, 1e-6, 1e-10):
            ours = zcdp_to_approx_dp(rho=rho, delta=delta)
            theirs = meas.map(1).epsilon(delta)
            assert ours == pytest.approx(theirs, rel=1e-7, abs=1e-12)


# ----------------------------------------------------------------------------------------------
# moments
# ----------------------------------------------------------------------------------------------


def _moment_check(samples: np.ndarray, pmf: Pmf, variance: float) -> None:
    x, _ = _support(pmf, 10**9)
    p = pmf(x)
    mu4 = float((p * x.astype(np.float64) ** 4).sum())
    n = samples.size
    # |z| < 5 under the CLT: false-failure rate ~6e-7 per check.
    assert abs(samples.mean()) < 5.0 * math.sqrt(variance / n)
    assert abs(samples.var() - variance) < 5.0 * math.sqrt((mu4 - variance**2) / n)


@pytest.mark.parametrize(("scale", "seed"), [(0.7, 31), (5.0, 32), (50.0, 33)])
def test_laplace_mean_and_variance(scale: float, seed: int) -> None:
    samples = discrete_laplace(scale=scale, size=N_GOF, bits=SeededRandomBits(seed))
    _moment_check(samples, laplace_pmf(scale), discrete_laplace_variance(scale=scale))


@pytest.mark.parametrize(("sigma", "seed"), [(0.5, 34), (3.0, 35), (40.0, 36)])
def test_gaussian_mean_and_variance(sigma: float, seed: int) -> None:
    samples = discrete_gaussian(sigma=sigma, size=N_GOF, bits=SeededRandomBits(seed))
    _moment_check(samples, gaussian_pmf(sigma), discrete_gaussian_variance(sigma=sigma))


@pytest.mark.parametrize("scale", [0.1, 0.7, 1.0, 3.0, 25.0, 400.0])
def test_laplace_pmf_and_variance_are_exact(scale: float) -> None:
    x = np.arange(-int(60 * scale) - 60, int(60 * scale) + 61)
    p = discrete_laplace_pmf(x, scale=scale)
    assert p.sum() == pytest.approx(1.0, rel=1e-12)
    assert p[x.size // 2] == pytest.approx(math.tanh(0.5 / scale), rel=1e-14)
    direct = float((p * x.astype(np.float64) ** 2).sum())
    assert discrete_laplace_variance(scale=scale) == pytest.approx(direct, rel=1e-10)
    assert discrete_laplace_variance(scale=scale) < 2 * scale**2


@pytest.mark.parametrize("sigma", [0.2, 0.5, 0.999, 1.0, 1.5, 3.0, 10.0, 123.4])
def test_gaussian_pmf_and_variance_are_exact(sigma: float) -> None:
    half = int(40 * sigma) + 10
    x = np.arange(-half, half + 1)
    weights = np.exp(-(x.astype(np.float64) ** 2) / (2 * sigma**2))
    direct_pmf = weights / weights.sum()
    p = discrete_gaussian_pmf(x, sigma=sigma)
    np.testing.assert_allclose(p, direct_pmf, rtol=1e-12, atol=1e-300)
    direct_var = float((direct_pmf * x.astype(np.float64) ** 2).sum())
    var = discrete_gaussian_variance(sigma=sigma)
    assert var == pytest.approx(direct_var, rel=1e-10)
    assert var <= sigma**2  # CKS Prop. 19


# ----------------------------------------------------------------------------------------------
# production randomness: os.urandom only, no PRNG
# ----------------------------------------------------------------------------------------------


def test_default_bits_read_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    requested = spy_urandom(monkeypatch)
    lap = discrete_laplace(scale=3.0, size=1000)
    assert requested and sum(requested) >= 1000
    requested.clear()
    gau = discrete_gaussian(sigma=3.0, size=1000)
    assert requested and sum(requested) >= 1000
    requested.clear()
    sample_noise(mechanism="laplace", scale=2.0, size=10)
    assert requested
    assert np.unique(lap).size > 5 and np.unique(gau).size > 5


def test_default_bits_never_touch_a_prng(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_prngs(monkeypatch)
    lap = discrete_laplace(scale=7.5, size=5000)
    gau = discrete_gaussian(sigma=4.2, size=5000)
    mix = sample_noise(mechanism="gaussian", scale=0.3, size=100)
    for arr, n in ((lap, 5000), (gau, 5000), (mix, 100)):
        assert arr.dtype == np.int64 and arr.shape == (n,)
    assert np.unique(lap).size > 10 and np.unique(gau).size > 10


def test_only_the_test_source_mentions_a_prng() -> None:
    source = inspect.getsource(noise)
    seeded = inspect.getsource(SeededRandomBits)
    outside = source.replace(seeded, "")
    assert "np.random" not in outside and "numpy.random" not in outside
    assert "import random" not in source and "from random" not in source
    assert "FOR TESTS ONLY" in (SeededRandomBits.__doc__ or "")


def test_random_bits_protocol() -> None:
    assert isinstance(OsRandomBits(), RandomBits)
    assert isinstance(SeededRandomBits(1), RandomBits)
    assert len(OsRandomBits().random_bytes(17)) == 17
    assert SeededRandomBits(5).random_bytes(13) == SeededRandomBits(5).random_bytes(13)

    class Short:
        def random_bytes(self, n: int) -> bytes:
            return b"\0" * (n // 2)

    with pytest.raises(RuntimeError, match="returned"):
        discrete_laplace(scale=2.0, size=10, bits=Short())
    with pytest.raises(TypeError, match="random_bytes"):
        discrete_laplace(scale=2.0, size=10, bits=object())  # type: ignore[arg-type]


def test_seeded_bits_are_reproducible() -> None:
    a = discrete_laplace(scale=4.0, size=1000, bits=SeededRandomBits(99))
    b = discrete_laplace(scale=4.0, size=1000, bits=SeededRandomBits(99))
    c = discrete_laplace(scale=4.0, size=1000, bits=SeededRandomBits(100))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    g = sample_noise(mechanism="gaussian", scale=3.0, size=500, bits=SeededRandomBits(7))
    np.testing.assert_array_equal(g, discrete_gaussian(sigma=3.0, size=500,
                                                       bits=SeededRandomBits(7)))  # fmt: skip


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scale": 0.0}, ValueError, r"scale must be > 0, got scale=0\.0"),
        ({"scale": -1}, ValueError, r"scale must be > 0, got scale=-1"),
        ({"scale": Fraction(-1, 2)}, ValueError, r"scale must be > 0"),
        ({"scale": math.nan}, ValueError, r"scale must be finite, got scale=nan"),
        ({"scale": math.inf}, ValueError, r"scale must be finite, got scale=inf"),
        ({"scale": 2.0**41}, ValueError, r"scale must be <= 1099511627776"),
        ({"scale": Fraction(10**400)}, ValueError, r"scale must be <= 1099511627776"),
        ({"scale": 1e-7}, ValueError, r"scale must be >= 2\*\*-20, got scale=1e-07"),
        ({"scale": "3"}, TypeError, r"scale must be a real number"),
        ({"scale": True}, TypeError, r"scale must be a real number"),
        ({"scale": 1.0, "size": -1}, ValueError, r"size must be >= 0, got size=-1"),
        ({"scale": 1.0, "size": 2.0}, TypeError, r"size must be an int, got size=2\.0"),
        ({"scale": 1.0, "size": True}, TypeError, r"size must be an int"),
    ],
)
def test_discrete_laplace_validation(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    kwargs = {"size": 3, **kwargs}
    with pytest.raises(error, match=message):
        discrete_laplace(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sigma": 0.0}, ValueError, r"sigma must be > 0, got sigma=0\.0"),
        ({"sigma": -2.0}, ValueError, r"sigma must be > 0"),
        ({"sigma": math.nan}, ValueError, r"sigma must be finite"),
        ({"sigma": -math.inf}, ValueError, r"sigma must be finite"),
        ({"sigma": 2.0**23}, ValueError, r"sigma must be <= 4194304"),
        ({"sigma": 2.0**-21}, ValueError, r"sigma must be >= 2\*\*-20"),
        ({"sigma": 1.0, "size": -5}, ValueError, r"size must be >= 0, got size=-5"),
        ({"sigma": None}, TypeError, r"sigma must be a real number"),
    ],
)
def test_discrete_gaussian_validation(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    kwargs = {"size": 3, **kwargs}
    with pytest.raises(error, match=message):
        discrete_gaussian(**kwargs)  # type: ignore[arg-type]


def test_other_validation() -> None:
    with pytest.raises(ValueError, match=r"mechanism must be 'laplace' or 'gaussian'"):
        sample_noise(mechanism="cauchy", scale=1.0, size=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epsilon must be > 0, got epsilon=0"):
        laplace_scale(l1_sensitivity=1.0, epsilon=0)
    with pytest.raises(ValueError, match=r"l1_sensitivity must be > 0"):
        laplace_scale(l1_sensitivity=-1.0, epsilon=1.0)
    with pytest.raises(ValueError, match=r"rho must be finite"):
        gaussian_sigma(l2_sensitivity=1.0, rho=math.inf)
    with pytest.raises(ValueError, match=r"l2_sensitivity must be > 0"):
        gaussian_sigma(l2_sensitivity=0.0, rho=1.0)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got delta=1\.0"):
        zcdp_to_approx_dp(rho=0.1, delta=1.0)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
        zcdp_to_approx_dp(rho=0.1, delta=0.0)
    with pytest.raises(ValueError, match=r"rho must be > 0"):
        zcdp_to_approx_dp(rho=-0.1, delta=1e-6)
    with pytest.raises(ValueError, match=r"scale must be > 0"):
        discrete_laplace_variance(scale=0.0)
    with pytest.raises(ValueError, match=r"sigma must be finite"):
        discrete_gaussian_pmf(np.arange(3), sigma=math.nan)


def test_size_zero_and_numpy_ints() -> None:
    four = np.int64(4)
    for arr in (
        discrete_laplace(scale=1.0, size=0),
        discrete_gaussian(sigma=1.0, size=0),
        discrete_laplace(scale=np.float64(2.5), size=four, bits=SeededRandomBits(1)),  # type: ignore[arg-type]
    ):
        assert arr.dtype == np.int64
    assert discrete_laplace(scale=1.0, size=0).shape == (0,)


# ----------------------------------------------------------------------------------------------
# properties (hypothesis)
# ----------------------------------------------------------------------------------------------

positive_scales = st.one_of(
    st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(10**6), max_denominator=10**6),
    st.integers(min_value=1, max_value=10**9),
)


@settings(max_examples=80, deadline=None)
@given(scale=positive_scales, size=st.integers(0, 40), seed=st.integers(0, 2**63))
def test_laplace_dtype_and_length(scale: float | Fraction, size: int, seed: int) -> None:
    out = discrete_laplace(scale=scale, size=size, bits=SeededRandomBits(seed))
    assert out.dtype == np.int64 and out.shape == (size,)


@settings(max_examples=80, deadline=None)
@given(
    sigma=st.one_of(
        st.floats(min_value=1e-3, max_value=4e6, allow_nan=False, allow_infinity=False),
        st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(10**5),
                     max_denominator=10**6),
    ),
    size=st.integers(0, 40),
    seed=st.integers(0, 2**63),
)  # fmt: skip
def test_gaussian_dtype_and_length(sigma: float | Fraction, size: int, seed: int) -> None:
    out = discrete_gaussian(sigma=sigma, size=size, bits=SeededRandomBits(seed))
    assert out.dtype == np.int64 and out.shape == (size,)


@settings(max_examples=40, deadline=None)
@given(
    mechanism=st.sampled_from(["laplace", "gaussian"]),
    scale=st.floats(min_value=0.01, max_value=1e3),
    size=st.integers(0, 30),
    seed=st.integers(0, 2**32),
)
def test_sample_noise_dtype_and_length(mechanism: str, scale: float, size: int, seed: int) -> None:
    out = sample_noise(mechanism=mechanism, scale=scale, size=size,  # type: ignore[arg-type]
                       bits=SeededRandomBits(seed))  # fmt: skip
    assert out.dtype == np.int64 and out.shape == (size,)


# ----------------------------------------------------------------------------------------------
# conservative parameter rounding
# ----------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scale=st.one_of(
    st.floats(min_value=2.0**-20, max_value=2.0**40, allow_nan=False, allow_infinity=False),
    st.fractions(min_value=Fraction(1, 2**20), max_value=Fraction(2**40)),
))  # fmt: skip
def test_laplace_rounding_is_conservative(scale: float | Fraction) -> None:
    exact = Fraction(scale)
    effective = effective_laplace_scale(scale=scale)
    assert effective >= exact
    assert (effective - exact) / exact < Fraction(1, 2**27)
    assert effective.numerator <= 2**40 and effective.denominator <= 2**48
    if exact.numerator <= 2**40 and exact.denominator <= 2**40:
        assert effective == exact


@settings(max_examples=300, deadline=None)
@given(sigma=st.one_of(
    st.floats(min_value=2.0**-20, max_value=2.0**22, allow_nan=False, allow_infinity=False),
    st.fractions(min_value=Fraction(1, 2**20), max_value=Fraction(2**22)),
))  # fmt: skip
def test_gaussian_rounding_is_conservative(sigma: float | Fraction) -> None:
    exact = Fraction(sigma) ** 2
    effective = effective_gaussian_sigma_squared(sigma=sigma)
    assert effective >= exact
    bound = Fraction(1, 2**21) * max(Fraction(1), 1 / Fraction(sigma))
    assert (effective - exact) / exact < bound
    params = noise._gaussian_params(sigma)
    assert (params.t - 1) ** 2 <= exact < params.t**2
    assert params.den <= 2**48 and params.m < 2**24
    assert Fraction(params.t * params.m, params.b) == effective


def test_exact_parameters_are_kept() -> None:
    assert effective_laplace_scale(scale=10) == 10
    assert effective_laplace_scale(scale=2.5) == Fraction(5, 2)
    assert effective_laplace_scale(scale=Fraction(1, 3)) == Fraction(1, 3)
    assert effective_laplace_scale(scale=0.7) == Fraction(7, 10)  # float 0.7 < 7/10
    assert effective_laplace_scale(scale=1 / 3) == Fraction(1, 3)  # float 1/3 < 1/3
    assert effective_gaussian_sigma_squared(sigma=2.0) == 4
    assert effective_gaussian_sigma_squared(sigma=15) == 225
    assert effective_gaussian_sigma_squared(sigma=Fraction(1, 3)) == Fraction(1, 9)
    assert effective_gaussian_sigma_squared(sigma=0.5) == Fraction(1, 4)


@settings(max_examples=300, deadline=None)
@given(
    x=st.fractions(min_value=Fraction(1, 10**4), max_value=Fraction(10**4)),
    max_den=st.integers(1, 60),
)
def test_round_up_is_the_smallest_upper_fraction(x: Fraction, max_den: int) -> None:
    brute = min(Fraction(math.ceil(x * q), q) for q in range(1, max_den + 1))
    assert noise._round_up(x, max_den) == brute


# ----------------------------------------------------------------------------------------------
# exact primitives (CKS Algorithm 1) and uniform integers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("m", "seed"),
    [(2, 41), (3, 42), (20, 43), (256, 44), (1000, 45), (65537, 46), (10**6, 47),
     (2**31 + 11, 48), (3 * 2**30 + 1, 52), (2**33 + 5, 49), (3 * 2**61 + 7, 53),
     (2**63 + 1, 54), (2**63 - 25, 50), (2**64 - 1, 51)],
)  # fmt: skip
def test_uniform_below_is_uniform(m: int, seed: int) -> None:
    src = noise._Source(SeededRandomBits(seed))
    values = noise._uniform_below(src, m, 100_000)
    assert values.dtype == np.uint64 and int(values.max()) < m
    k = min(m, 64)
    bins = np.array([(int(v) * k) // m for v in values.tolist()])
    edges = [-(-j * m // k) for j in range(k + 1)]  # ceil(j*m/k)
    expected = [100_000 * (hi - lo) / m for lo, hi in zip(edges, edges[1:], strict=False)]
    observed = np.bincount(bins, minlength=k)
    assert stats.chisquare(observed, expected).pvalue > ALPHA  # false-failure rate 1e-5


@pytest.mark.parametrize(
    ("num", "den", "seed"),
    [(0, 1, 61), (1, 7, 62), (1, 2, 63), (5, 5, 64), (3, 2**40, 65), (2**40 - 1, 2**40, 66)],
)
def test_bernoulli_exp_neg_fraction(num: int, den: int, seed: int) -> None:
    src = noise._Source(SeededRandomBits(seed))
    n = 200_000
    hits = int(noise._bernoulli_exp_neg_fraction(src, np.full(n, num, np.uint64), den).sum())
    p = math.exp(-num / den)
    if p == 1.0:
        assert hits == n
    else:
        assert stats.binomtest(hits, n, p).pvalue > ALPHA  # false-failure rate 1e-5


def test_bernoulli_exp_neg_one_and_geometric() -> None:
    src = noise._Source(SeededRandomBits(71))
    n = 200_000
    hits = int(noise._bernoulli_exp_neg_one(src, n).sum())
    assert stats.binomtest(hits, n, math.exp(-1)).pvalue > ALPHA  # false-failure rate 1e-5
    v = noise._geometric_exp_neg_one(src, n)
    pmf = lambda x: np.where(x >= 0, -math.expm1(-1) * np.exp(-np.abs(x)), 0.0)  # noqa: E731
    assert gof_pvalue(v, pmf) > ALPHA  # false-failure rate 1e-5
    two = noise._all_exp_neg_one(src, np.full(n, 2, np.uint64))
    assert stats.binomtest(int(two.sum()), n, math.exp(-2)).pvalue > ALPHA


@pytest.mark.parametrize(("num", "den", "seed"), [(7, 3, 81), (5, 2, 82), (1, 10**30, 83)])
def test_scalar_fallback_bernoulli(num: int, den: int, seed: int) -> None:
    src = noise._Source(SeededRandomBits(seed))
    n = 20_000
    hits = sum(noise._py_bernoulli_exp_neg(src, num, den) for _ in range(n))
    p = math.exp(-num / den)
    assert stats.binomtest(hits, n, p).pvalue > ALPHA  # false-failure rate 1e-5


# The rare scalar fallbacks are exercised by shrinking the thresholds that trigger them.


def test_chain_fallback_keeps_laplace_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noise, "_U64_CHAIN_LIMIT", 64)  # 25*K >= 64 from K = 3 on
    samples = discrete_laplace(scale=25, size=30_000, bits=SeededRandomBits(91))
    assert gof_pvalue(samples, laplace_pmf(25.0)) > ALPHA  # false-failure rate 1e-5


def test_factorial_fallback_keeps_laplace_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noise, "_CHAIN_DIGITS", 3)  # W in [0, 3!): continues 1/6 of the time
    monkeypatch.setattr(noise, "_FACT", 6)
    monkeypatch.setattr(noise, "_FACTORIALS", ((3, np.uint64(6)),))
    src = noise._Source(SeededRandomBits(92))
    hits = int(noise._bernoulli_exp_neg_one(src, 60_000).sum())
    assert stats.binomtest(hits, 60_000, math.exp(-1)).pvalue > ALPHA
    samples = discrete_laplace(scale=3, size=30_000, bits=SeededRandomBits(93))
    assert gof_pvalue(samples, laplace_pmf(3.0)) > ALPHA  # false-failure rate 1e-5


@pytest.mark.parametrize(("sigma", "seed"), [(2.0, 94), (0.7, 95)])
def test_big_m_fallback_keeps_gaussian_exact(
    monkeypatch: pytest.MonkeyPatch, sigma: float, seed: int
) -> None:
    monkeypatch.setattr(noise, "_FAST_M_BITS", 3)  # |M| >= 8 takes the slow lanes
    samples = discrete_gaussian(sigma=sigma, size=30_000, bits=SeededRandomBits(seed))
    assert gof_pvalue(samples, gaussian_pmf(sigma)) > ALPHA  # false-failure rate 1e-5


# ----------------------------------------------------------------------------------------------
# calibration / accounting
# ----------------------------------------------------------------------------------------------


def test_calibration() -> None:
    assert laplace_scale(l1_sensitivity=2.0, epsilon=0.5) == 4.0
    assert gaussian_sigma(l2_sensitivity=1.0, rho=0.5) == 1.0
    assert gaussian_sigma(l2_sensitivity=3.0, rho=0.125) == pytest.approx(6.0)


@pytest.mark.parametrize("rho", [1e-6, 1e-3, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-6, 1e-12])
def test_zcdp_to_approx_dp_is_at_most_bun_steinke(rho: float, delta: float) -> None:
    eps = zcdp_to_approx_dp(rho=rho, delta=delta)
    bun_steinke = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert 0 <= eps <= bun_steinke  # 0 for rho=1e-6, delta=1e-2: the bound is negative there
    smaller_delta = zcdp_to_approx_dp(rho=rho, delta=delta / 10)
    assert smaller_delta > eps or smaller_delta == eps == 0.0  # smaller δ costs more ε

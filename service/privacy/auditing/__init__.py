"""Empirical audit of the service's own releases: a statistical LOWER bound on ε, black-box.

What is audited
---------------
For each mechanism, as the service runs it (its own functions and CSPRNG noise: the window's
``noise_tables``, ``select``, ``bernoulli_mask``, the re-identification release's
``discrete_laplace`` calls), ``mechanisms`` finds a neighbouring pair of inputs ``D0, D1`` that
stresses it most (an exhaustive search over every data set of a few observations of a tiny
domain, through the counting path and the selection scoring: ``streams``), draws ``n`` releases
on each, and maps each release ``o`` to a real statistic ``s(o)`` (the log-likelihood ratio the
auditor expects; a wrong formula only costs power). The claim ``(ε, δ)`` is the ledger's (or the
mechanism's own report) for that neighbour relation.

The bound (DP-Sniper, Bichsel et al. 2021; DP-Auditorium, Kong et al. 2024)
---------------------------------------------------------------------------
If the mechanism is (ε, δ)-DP then for EVERY set S of outputs and both orders of the pair,
``P_1(S) <= e^ε · P_0(S) + δ``. Hence, for any S fixed before the test releases are seen,

    ε >= ln((P_1(S) − δ) / P_0(S)).

The releases of each input are split in halves. The first halves choose S among the sets
``{s >= t}`` and ``{s <= t}`` (t from up to 256 quantiles of the pooled values), each as
evidence for either input, maximising the bound below computed on those halves. The second
halves (``m = n/2`` releases each, independent of the choice) count the hits ``k_1`` of the
favoured input and ``k_0`` of the other, and with one-sided Clopper–Pearson bounds at level
``α/2`` each (``α = 1 − confidence``),

    p_1 = Beta^{-1}(α/2; k_1, m − k_1 + 1)          (P_1(S) >= p_1, probability >= 1 − α/2)
    p_0 = Beta^{-1}(1 − α/2; k_0 + 1, m − k_0)      (P_0(S) <= p_0, probability >= 1 − α/2)
    ε_lb = max(0, ln((p_1 − δ) / p_0))

By the union bound both hold together with probability ``>= 1 − α``, and then ε_lb <= the true
ε. So a mechanism that keeps its claim ε_c gets ``ε_lb > ε_c`` (FAIL) with probability at most
α: the audit's false-failure rate is α per audit, whatever the mechanism and the statistic.
The bound achievable with ``m`` releases is limited (``p_0 >= 1 − (α/2)^{1/m}``: about
``ln(m / ln(2/α))``), so claims far above that cannot be reached, and events rarer than about
``1/m`` (a δ, an outcome of probability 1e-9) are invisible.

What an audit proves, and what it cannot
----------------------------------------
A FAIL proves, at the stated confidence, that the implementation leaks more than it claims on
that pair: a bug (in the code, the calibration or the ledger). A PASS proves nothing about
privacy: it says only that this test on this pair, with this many releases, found no violation.
The bound is a lower bound; the pair searched is from a tiny domain; rare events (δ-sized, or
in floating-point corners) and other pairs are not seen; the noise source is the real one, so
a weak CSPRNG would not show. Privacy rests on the proofs in the docstrings and
docs/ARCHITECTURE.md; the audit checks that the code does what they say, and that the auditor
can tell (``suite.planted_cases``: bugs it must catch).
"""

from service.privacy.auditing.mechanisms import Case
from service.privacy.auditing.stats import Bound, lower_bound
from service.privacy.auditing.suite import Result, audit, planted_cases, run, service_cases

__all__ = [
    "Bound",
    "Case",
    "Result",
    "audit",
    "lower_bound",
    "planted_cases",
    "run",
    "service_cases",
]

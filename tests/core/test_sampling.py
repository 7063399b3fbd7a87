"""Pre-sampling from the CSPRNG and the canonical forms (docs/ARCHITECTURE.md,
"Annotation queues", steps 1–2)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats

from service.core.annotation.sampling import (
    bernoulli_mask,
    canonical_record,
    canonical_record_bytes,
    canonical_text,
)
from tests.helpers import spy_urandom


def test_rate_is_beta() -> None:
    # fixed bytes (a seeded generator, test only); two-sided binomial test at α = 1e-6: this
    # seed either passes or fails forever, and a wrong threshold fails by hundreds of σ
    gen = np.random.default_rng(7)
    n, beta = 200_000, 0.3
    kept = int(bernoulli_mask(n, beta, random_bytes=gen.bytes).sum())
    assert stats.binomtest(kept, n, beta).pvalue > 1e-6


def test_threshold_is_exact_at_the_edges() -> None:
    assert not bernoulli_mask(5, 0.5, random_bytes=lambda m: b"\xff" * m).any()
    assert bernoulli_mask(5, 1e-9, random_bytes=lambda m: b"\x00" * m).all()
    assert bernoulli_mask(5, 1.0).all() and not bernoulli_mask(5, 0.0).any()
    # U = 2^63 is kept iff β > 1/2
    half = (2**63).to_bytes(8, "little")
    assert not bernoulli_mask(1, 0.5, random_bytes=lambda m: half).any()
    assert bernoulli_mask(1, 0.5000001, random_bytes=lambda m: half).all()


def test_production_draws_from_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_urandom(monkeypatch)
    bernoulli_mask(100, 0.5)
    assert calls == [800]


def test_seeding_the_usual_prngs_does_not_repeat_the_draws() -> None:
    masks = []
    for _ in range(2):
        random.seed(1)
        np.random.seed(1)  # proving it has no effect
        masks.append(bernoulli_mask(256, 0.5))
    assert (masks[0] != masks[1]).any()  # equal with probability 2^-256


def test_canonical_text() -> None:
    assert canonical_text("  Turn ON\tthe   LIGHTS\n") == "turn on the lights"
    assert canonical_text("Straße") == canonical_text("STRASSE") == "strasse"
    assert canonical_text("ﬁle ＡＢＣ") == "file abc"  # NFKC: ligature, full-width
    assert canonical_text("e\u0301") == canonical_text("\u00e9")


def test_canonical_record() -> None:
    a = {"b": 24.0, "a": "x", "c": None}
    b = {"a": "x", "b": 24}
    assert canonical_record(a) == canonical_record(b) == {"a": "x", "b": 24}
    assert canonical_record_bytes(a) == b'{"a":"x","b":24}'

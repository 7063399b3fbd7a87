"""The annotation queue's pre-sampling and canonical forms
(docs/ARCHITECTURE.md, "Annotation queues", steps 1–2).

Sampling draws from the operating system's CSPRNG (``os.urandom``), never a seeded PRNG: the
(ε, δ) guarantee of Li, Qardaji and Su assumes the attacker cannot predict which records were
kept. The byte source is injectable so that tests can fix it; production callers pass none."""

from __future__ import annotations

import math
import os
import unicodedata
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import orjson

RandomBytes = Callable[[int], bytes]


def bernoulli_mask(n: int, beta: float, *, random_bytes: RandomBytes | None = None) -> np.ndarray:
    """``n`` independent Bernoulli(β) draws: a uniform 64-bit integer U per draw, kept iff
    U < ⌊β·2^64⌋, so P[keep] = β to within 2^-64 (exactly, for dyadic β)."""
    if not (0.0 <= beta <= 1.0):
        raise ValueError(f"beta must be in [0, 1], got {beta=}")
    if n <= 0:
        return np.zeros(0, dtype=bool)
    if beta >= 1.0:
        return np.ones(n, dtype=bool)
    threshold = math.floor(Fraction(beta) * 2**64)
    raw = (random_bytes or os.urandom)(8 * n)
    return np.frombuffer(raw, dtype="<u8") < np.uint64(threshold)


def canonical_text(text: str) -> str:
    """NFKC, case-folded, white space collapsed to single spaces and trimmed. Case folding can
    un-normalise some characters, so NFKC is applied again after it."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


def _canonical_value(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return int(v)  # 24.0 and 24 are the same record
    if isinstance(v, str):
        return unicodedata.normalize("NFC", v)
    return v


def canonical_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """Keys sorted, null values dropped, integral floats as integers, strings NFC."""
    return {
        unicodedata.normalize("NFC", k): _canonical_value(v)
        for k, v in sorted(record.items())
        if v is not None
    }


def canonical_record_bytes(record: Mapping[str, Any]) -> bytes:
    """Canonical JSON: the canonical record, sorted keys, no white space (orjson)."""
    return orjson.dumps(canonical_record(record), option=orjson.OPT_SORT_KEYS)

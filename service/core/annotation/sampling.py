"""The annotation queue's pre-sampling and canonical forms
(docs/ARCHITECTURE.md, "Annotation queues", steps 1–2).

Sampling draws from the operating system's CSPRNG (``os.urandom``), never a seeded PRNG: the
(ε, δ) guarantee of Li, Qardaji and Su assumes the attacker cannot predict which records were
kept. The byte source is injectable so that tests can fix it; production callers pass none."""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
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


NFKC_GROWTH = 18
"""The most characters one code point becomes in ``canonical_text`` (U+FDFA, 18 under NFKC;
case folding adds none beyond it in Unicode 14: ``tests/core/test_sampling.py`` checks every
code point)."""
_PIECE = 64  # code points normalised at a time when the result may be over its limit
_ASCII = re.compile(r"[\x00-\x7f]")


class TextTooLong(ValueError):
    """The canonical form is longer than the limit (the message names only the limit)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"longer than {limit} characters after normalisation")
        self.limit = limit


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def _pieces(text: str) -> Iterator[str]:
    """``text`` cut before ASCII characters, every ``_PIECE`` code points or more. No step of
    ``_fold`` crosses such a cut: NFKC decomposes one character at a time, reorders only runs
    of non-starters (an ASCII character is a starter) and never composes an ASCII character
    onto the one before it (no canonical pair ends in one); case folding is per character and
    keeps ASCII ASCII."""
    start = 0
    while start < len(text):
        m = _ASCII.search(text, start + _PIECE)
        end = m.start() if m else len(text)
        yield text[start:end]
        start = end


def canonical_text(text: str, *, max_chars: int | None = None) -> str:
    """NFKC, case-folded, white space collapsed to single spaces and trimmed. Case folding can
    un-normalise some characters, so NFKC is applied again after it.

    With ``max_chars``, a canonical form longer than that raises ``TextTooLong``, and the work
    stops near the limit: a text that could grow past it (``NFKC_GROWTH`` characters per code
    point) is normalised piece by piece, and refused as soon as the pieces' forms, each with
    its white space collapsed (their sum is at most the whole one's length), exceed it."""
    if max_chars is None or len(text) * NFKC_GROWTH <= max_chars:
        folded = _fold(text)
    else:
        parts, least = [], 0
        for piece in _pieces(text):
            part = _fold(piece)
            least += len(" ".join(part.split()))
            if least > max_chars:
                raise TextTooLong(max_chars)
            parts.append(part)
        folded = "".join(parts)
    out = " ".join(folded.split())
    if max_chars is not None and len(out) > max_chars:
        raise TextTooLong(max_chars)
    return out


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

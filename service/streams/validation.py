"""Checks of feature values shared by ingest and featurize: unknown names, types, lengths.
Errors name the field and the limit."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from service.core.features.runtime import StreamRuntime
from service.errors import ValidationError


def check_rows(
    rt: StreamRuntime, rows: Sequence[Mapping[str, object]], *, where: str, max_string: int
) -> None:
    """Raise ValidationError naming the first bad value, and every unknown feature."""
    known = rt.feature_names
    unknown: set[str] = set()
    kinds = {f.name: f.kind for f in rt.features}
    for i, row in enumerate(rows):
        for name, value in row.items():
            kind = kinds.get(name)
            if kind is None:
                unknown.add(name)
                continue
            if value is None:
                continue
            if kind == "numeric":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValidationError(
                        f"{where}[{i}].{name}: numeric feature needs a number, got a "
                        f"{type(value).__name__} (errors never repeat a row's value)"
                    )
                if not math.isfinite(value):
                    raise ValidationError(f"{where}[{i}].{name}: must be finite")
            elif isinstance(value, str):
                if len(value) > max_string:
                    raise ValidationError(
                        f"{where}[{i}].{name}: string longer than the limit of {max_string}"
                    )
                if "\x1f" in value or "\x00" in value:
                    raise ValidationError(f"{where}[{i}].{name}: control characters not allowed")
            elif isinstance(value, float) and not math.isfinite(value):
                raise ValidationError(f"{where}[{i}].{name}: must be finite")
    if unknown:
        raise ValidationError(
            f"unknown feature(s) {sorted(unknown)} for stream {rt.name!r}; known: {sorted(known)}"
        )


# Integers a body may hold exactly: orjson parses a wider one as a float, silently rounded, so
# distinct values (a categorical identifier) would collide, or miss the value ingest stored.
# Such integers are refused, by ingest and by every endpoint that takes rows of features.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# Every integer outside the range has 19 digits or more: a body's digits mapped to "1", the
# other bytes to "0", looked for as a run of 19 (two C-speed passes, ~1 ms a MiB).
_DIGITS = bytes(49 if 48 <= b <= 57 else 48 for b in range(256))
_LONG_RUN = b"1" * 19


def check_integers(raw: bytes, *, items: str, values: str | None = None) -> None:
    """Refuse a feature value that is an integer outside [INT_MIN, INT_MAX] (422 naming it):
    the parsed body holds it as a rounded float. The body's ``items`` list holds the rows,
    each a mapping of feature values, or holds it under ``values`` (ingest's
    ``observations[i].features``, a queue's ``candidates[i].record``). Bodies without a run of
    19 digits (nearly all) are not parsed again."""
    if _LONG_RUN not in raw.translate(_DIGITS):
        return
    try:
        body: Any = json.loads(raw)  # exact integers; only to find the offending value
    except ValueError:
        return
    rows = body.get(items) if isinstance(body, dict) else None
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        found = row.get(values) if values is not None and isinstance(row, dict) else row
        for name, value in (found if isinstance(found, dict) else {}).items():
            if type(value) is int and not INT_MIN <= value <= INT_MAX:
                where = f"{items}[{i}]" + (f".{values}" if values is not None else "")
                raise ValidationError(
                    f"{where}.{str(name)[:64]}: integer outside the range [-2^63, 2^64-1] "
                    "kept exact; send it as a string (an identifier) or as a float literal "
                    "(a quantity)"
                )

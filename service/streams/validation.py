"""Checks of feature values shared by ingest and featurize: unknown names, types, lengths.
Errors name the field and the limit."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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

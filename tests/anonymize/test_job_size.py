"""An inline k-anonymisation's size is bounded by its run time: rows² × (quasi-identifiers + 1)
at most ``WORK_BOUND`` (BENCHMARKS.md, "Anonymization job size"), a 422 naming the field and the
limit beyond it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError as PydanticValidationError

from service.anonymize.schemas import (
    MAX_INLINE_ROWS,
    MAX_QIS,
    WORK_BOUND,
    AnonymizationCreate,
    max_rows,
)


def test_the_row_limit_falls_with_the_quasi_identifiers() -> None:
    limits = [max_rows(s) for s in range(1, MAX_QIS + 1)]
    assert limits == sorted(limits, reverse=True)
    assert all(n <= MAX_INLINE_ROWS for n in limits)
    for s, n in zip(range(1, MAX_QIS + 1), limits, strict=True):
        assert n * n * (s + 1) <= WORK_BOUND < (n + 1) * (n + 1) * (s + 1)
    assert (max_rows(1), max_rows(8), max_rows(32)) == (44_721, 21_081, 11_009)


def _body(rows: int, qis: int) -> dict[str, Any]:
    names = [f"q{j}" for j in range(qis)]
    return {
        "source": {"rows": [dict.fromkeys(names, i) for i in range(rows)]},
        "k": 2,
        "quasi_identifiers": [{"name": n, "kind": "range"} for n in names],
    }


def test_rows_beyond_the_bound_are_a_422_naming_the_field_and_the_limit() -> None:
    most = max_rows(8)  # the 20,000 rows with 8 range QIs still fit; 21,082 do not
    AnonymizationCreate.model_validate(_body(most, 8))
    with pytest.raises(
        PydanticValidationError, match=f"source.rows: {most + 1} rows, more than {most}"
    ):
        AnonymizationCreate.model_validate(_body(most + 1, 8))

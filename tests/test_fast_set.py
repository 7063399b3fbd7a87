"""The fast set's property tests (``tests/conftest.py``): ``-m "not slow"`` (`make test-fast`)
runs each with a fifth of the examples it states, at least 10; any other selection, `make test`
included, runs the count it states."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import conftest


class _Config:
    def __init__(self, markexpr: str) -> None:
        self.markexpr = markexpr

    def getoption(self, name: str) -> str:
        assert name == "markexpr"
        return self.markexpr


class _Item:
    def __init__(self, obj: Any) -> None:
        self.obj = obj


def _property(max_examples: int, calls: list[int]) -> Any:
    @settings(max_examples=max_examples, database=None, deadline=None)
    @given(st.integers())
    def prop(x: int) -> None:
        calls.append(x)

    return prop


def _examples(test: Any) -> int:
    return int(test._hypothesis_internal_use_settings.max_examples)


@pytest.mark.parametrize("markexpr", ["not slow", " not  slow "])
def test_the_fast_set_runs_a_fifth_of_the_examples(markexpr: str) -> None:
    calls: list[int] = []
    big, mid, small = _property(300, calls), _property(20, []), _property(5, [])
    # a parametrized test is one function under several items: divided once
    items = [_Item(big), _Item(big), _Item(mid), _Item(small), _Item(lambda: None)]
    conftest.pytest_collection_modifyitems(_Config(markexpr), items)  # type: ignore[arg-type]
    assert (_examples(big), _examples(mid), _examples(small)) == (60, 10, 5)
    big()
    assert 0 < len(calls) <= 60


@pytest.mark.parametrize("markexpr", ["", "slow", "not slow and not docker", "docker"])
def test_any_other_selection_runs_the_stated_count(markexpr: str) -> None:
    calls: list[int] = []
    big = _property(300, calls)
    conftest.pytest_collection_modifyitems(_Config(markexpr), [_Item(big)])  # type: ignore[arg-type]
    assert _examples(big) == 300
    big()
    assert len(calls) > 60


def test_the_header_says_so() -> None:
    assert "max_examples / 5" in str(conftest.pytest_report_header(_Config("not slow")))  # type: ignore[arg-type]
    assert conftest.pytest_report_header(_Config("")) is None  # type: ignore[arg-type]

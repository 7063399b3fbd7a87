from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.workers.test_runner import _Workers


@pytest.fixture
def workers(tmp_path: Path, backend: Backend) -> Iterator[_Workers]:
    """``selectivity worker`` subprocesses on one Redis prefix and one data dir."""
    w = _Workers(tmp_path, backend)
    try:
        yield w
    finally:
        w.close()

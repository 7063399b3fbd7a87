"""When a stream's open window is due to roll (``service.windows.schedule``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.windows.schedule import roll_due


@pytest.mark.parametrize(
    ("age_seconds", "window_seconds", "due"),
    [(0, 60, False), (59.9, 60, False), (60, 60, True), (3600, 60, True), (86399, 86400, False)],
)
def test_roll_due(age_seconds: float, window_seconds: int, due: bool) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    started = now - timedelta(seconds=age_seconds)
    assert roll_due(epoch_started_at=started, window_seconds=window_seconds, now=now) is due

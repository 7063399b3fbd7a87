"""Pure scheduling rules: when a stream's open window is due to roll."""

from __future__ import annotations

from datetime import datetime


def roll_due(*, epoch_started_at: datetime, window_seconds: int, now: datetime) -> bool:
    """A scheduled roll happens when the open window is ``window_seconds`` old
    (docs/ARCHITECTURE.md, "Streams, windows and periods"). One roll advances one window; a
    stream that fell behind rolls again on the next tick."""
    return (now - epoch_started_at).total_seconds() >= window_seconds

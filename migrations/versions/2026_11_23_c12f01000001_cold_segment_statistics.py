"""cold segments: no exact per-window statistic past the hot period (issue 12, item 2)

A segment's row count and first/last entry ids (exact arrival times) become nullable: ``expire``
drops them, and coarsens ``first_ts``/``last_ts`` to the window's open/close times, when the
window leaves the hot period (so does the window's ``seal_cursor``, its last entry id). This
revision does the same for windows that already left it. Segment files of format version 1
keep their count in their clear header (rewriting it needs the private key).

Revision ID: c12f01000001
Revises: c12e01000001
Create Date: 2026-11-23 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c12f01000001"
down_revision = "c12e01000001"
branch_labels = None
depends_on = None

_GONE = (
    "SELECT 1 FROM stream_window w WHERE w.stream_id = cold_segment.stream_id AND "
    "w.epoch = cold_segment.epoch AND w.hot_deleted_at IS NOT NULL"
)


def _window(col: str) -> str:
    return (
        f"(SELECT {col} FROM stream_window w WHERE w.stream_id = cold_segment.stream_id "
        "AND w.epoch = cold_segment.epoch)"
    )


def upgrade() -> None:
    with op.batch_alter_table("cold_segment") as batch:
        for col in ("first_id", "last_id"):
            batch.alter_column(col, existing_type=sa.String(40), nullable=True)
        batch.alter_column("count", existing_type=sa.Integer(), nullable=True)
    op.execute(
        "UPDATE cold_segment SET count = NULL, first_id = NULL, last_id = NULL, "
        f"first_ts = {_window('opened_at')}, "
        f"last_ts = {_window('COALESCE(w.closed_at, w.opened_at)')} "
        f"WHERE EXISTS ({_GONE})"
    )
    op.execute("UPDATE stream_window SET seal_cursor = NULL WHERE hot_deleted_at IS NOT NULL")


def downgrade() -> None:
    # the dropped statistics cannot come back: rows without them get placeholders
    op.execute("UPDATE cold_segment SET count = 0 WHERE count IS NULL")
    op.execute("UPDATE cold_segment SET first_id = '', last_id = '' WHERE first_id IS NULL")
    with op.batch_alter_table("cold_segment") as batch:
        for col in ("first_id", "last_id"):
            batch.alter_column(col, existing_type=sa.String(40), nullable=False)
        batch.alter_column("count", existing_type=sa.Integer(), nullable=False)

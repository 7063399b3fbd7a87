"""cold segments: the window's part they seal

A stream's windows may be split into parts (``partitions``), each with its own hot stream whose
entry ids are its own: a segment names its part, and the unique key of a segment becomes
(stream, window, part, first entry id). Every segment before this revision is of part 0.

Revision ID: c32a01000001
Revises: c27g01000001
Create Date: 2026-11-27 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c32a01000001"
down_revision = "c27g01000001"
branch_labels = None
depends_on = None

OLD = "uq_cold_segment_stream_id_epoch_first_id"
NEW = "uq_cold_segment_stream_id_epoch_part_first_id"


def upgrade() -> None:
    with op.batch_alter_table("cold_segment") as batch:
        batch.add_column(sa.Column("part", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint(OLD, type_="unique")
        batch.create_unique_constraint(NEW, ["stream_id", "epoch", "part", "first_id"])


def downgrade() -> None:
    with op.batch_alter_table("cold_segment") as batch:
        batch.drop_constraint(NEW, type_="unique")
        batch.create_unique_constraint(OLD, ["stream_id", "epoch", "first_id"])
        batch.drop_column("part")

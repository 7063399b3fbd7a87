"""follow-ups of a roll (transactional outbox)

Revision ID: 7f3c1a9e2b10
Revises: 6a1e7c0b9d21
Create Date: 2026-11-23 11:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "7f3c1a9e2b10"
down_revision = "6a1e7c0b9d21"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "follow_up",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["stream.id"],
            name=op.f("fk_follow_up_stream_id_stream"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_follow_up")),
        sa.UniqueConstraint(
            "stream_id", "epoch", "kind", name=op.f("uq_follow_up_stream_id_epoch_kind")
        ),
    )
    op.create_index(op.f("ix_follow_up_stream_id"), "follow_up", ["stream_id"], unique=False)
    op.create_index(op.f("ix_follow_up_done_at"), "follow_up", ["done_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_follow_up_done_at"), table_name="follow_up")
    op.drop_index(op.f("ix_follow_up_stream_id"), table_name="follow_up")
    op.drop_table("follow_up")

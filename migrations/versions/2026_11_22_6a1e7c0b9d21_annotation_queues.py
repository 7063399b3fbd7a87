"""annotation queues

Revision ID: 6a1e7c0b9d21
Revises: 5c01d5eed001
Create Date: 2026-11-22 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '6a1e7c0b9d21'
down_revision = '5c01d5eed001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'annotation_queue',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('config', sa.JSON(), nullable=False),
        sa.Column('stream_id', sa.Integer(), nullable=True),
        sa.Column('secret', sa.LargeBinary(length=32), nullable=False),
        sa.Column('created_by', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['stream_id'],
            ['stream.id'],
            name=op.f('fk_annotation_queue_stream_id_stream'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_annotation_queue')),
        sa.UniqueConstraint('name', name=op.f('uq_annotation_queue_name')),
    )
    with op.batch_alter_table('annotation_queue', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_annotation_queue_stream_id'), ['stream_id'], unique=False
        )

    op.create_table(
        'annotation_task',
        sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('queue_id', sa.Integer(), nullable=False),
        sa.Column('key_hash', sa.String(length=64), nullable=False),
        sa.Column('payload', sa.JSON(), nullable=False),
        sa.Column('uncertainty', sa.Double(), nullable=False),
        sa.Column('released_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('label', sa.String(length=64), nullable=True),
        sa.Column('labelled_by', sa.String(length=32), nullable=True),
        sa.Column('labelled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('observation_window', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ['queue_id'],
            ['annotation_queue.id'],
            name=op.f('fk_annotation_task_queue_id_annotation_queue'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('seq', name=op.f('pk_annotation_task')),
        sa.UniqueConstraint('id', name=op.f('uq_annotation_task_id')),
        sa.UniqueConstraint(
            'queue_id', 'key_hash', name=op.f('uq_annotation_task_queue_id_key_hash')
        ),
    )
    with op.batch_alter_table('annotation_task', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_annotation_task_queue_id'), ['queue_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('annotation_task', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_annotation_task_queue_id'))

    op.drop_table('annotation_task')
    with op.batch_alter_table('annotation_queue', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_annotation_queue_stream_id'))

    op.drop_table('annotation_queue')

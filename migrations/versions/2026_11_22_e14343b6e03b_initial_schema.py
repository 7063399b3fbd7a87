"""initial schema

Revision ID: e14343b6e03b
Revises: 
Create Date: 2026-11-22 03:02:03.264792
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = 'e14343b6e03b'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_key',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=20), nullable=False),
    sa.Column('key_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_key'))
    )
    op.create_table('stream',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('hash_seed', sa.LargeBinary(length=32), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('epoch_started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('roll_target', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stream')),
    sa.UniqueConstraint('name', name=op.f('uq_stream_name'))
    )
    op.create_table('count_table',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=600), nullable=False),
    sa.Column('features', sa.JSON(), nullable=False),
    sa.Column('first_epoch', sa.Integer(), nullable=False),
    sa.Column('reason', sa.String(length=20), nullable=False),
    sa.Column('score', sa.Double(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_count_table_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_count_table')),
    sa.UniqueConstraint('stream_id', 'name', name=op.f('uq_count_table_stream_id_name'))
    )
    with op.batch_alter_table('count_table', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_count_table_stream_id'), ['stream_id'], unique=False)

    op.create_table('stream_window',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('observations', sa.Integer(), nullable=True),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('counted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cold_sealed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('hot_deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_stream_window_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stream_window')),
    sa.UniqueConstraint('stream_id', 'epoch', name=op.f('uq_stream_window_stream_id_epoch'))
    )
    with op.batch_alter_table('stream_window', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stream_window_stream_id'), ['stream_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('stream_window', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stream_window_stream_id'))

    op.drop_table('stream_window')
    with op.batch_alter_table('count_table', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_count_table_stream_id'))

    op.drop_table('count_table')
    op.drop_table('stream')
    op.drop_table('api_key')

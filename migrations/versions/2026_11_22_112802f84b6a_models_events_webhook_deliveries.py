"""models events webhook deliveries

Revision ID: 112802f84b6a
Revises: e14343b6e03b
Create Date: 2026-11-22 03:57:01.437727
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '112802f84b6a'
down_revision = 'e14343b6e03b'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('model',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('webhook_url', sa.String(length=2000), nullable=True),
    sa.Column('webhook_secret', sa.String(length=200), nullable=True),
    sa.Column('trained_epoch', sa.Integer(), nullable=True),
    sa.Column('trained_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('stale_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_model_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model')),
    sa.UniqueConstraint('stream_id', 'name', name=op.f('uq_model_stream_id_name'))
    )
    with op.batch_alter_table('model', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_model_stream_id'), ['stream_id'], unique=False)

    op.create_table('stream_event',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_stream_event_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stream_event'))
    )
    with op.batch_alter_table('stream_event', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stream_event_stream_id'), ['stream_id'], unique=False)

    op.create_table('webhook_delivery',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('model_id', sa.String(length=40), nullable=False),
    sa.Column('event_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['event_id'], ['stream_event.id'], name=op.f('fk_webhook_delivery_event_id_stream_event'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['model_id'], ['model.id'], name=op.f('fk_webhook_delivery_model_id_model'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_delivery'))
    )
    with op.batch_alter_table('webhook_delivery', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_delivery_model_id'), ['model_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('webhook_delivery', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_delivery_model_id'))

    op.drop_table('webhook_delivery')
    with op.batch_alter_table('stream_event', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stream_event_stream_id'))

    op.drop_table('stream_event')
    with op.batch_alter_table('model', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_model_stream_id'))

    op.drop_table('model')

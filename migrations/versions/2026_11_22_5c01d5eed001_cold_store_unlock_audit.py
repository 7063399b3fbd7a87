"""cold store, unlock requests, audit log

Revision ID: 5c01d5eed001
Revises: dc54b0832abf
Create Date: 2026-11-22 07:37:43.661326
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '5c01d5eed001'
down_revision = 'dc54b0832abf'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('prev_hash', sa.LargeBinary(length=32), nullable=False),
    sa.Column('hash', sa.LargeBinary(length=32), nullable=False),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_audit_log'))
    )
    op.create_table('coldstore_key',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('public_key', sa.LargeBinary(length=32), nullable=False),
    sa.Column('verification_tag', sa.LargeBinary(length=32), nullable=False),
    sa.Column('shares', sa.Integer(), nullable=False),
    sa.Column('threshold', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_coldstore_key'))
    )
    op.create_table('cold_segment',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('first_id', sa.String(length=40), nullable=False),
    sa.Column('last_id', sa.String(length=40), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('path', sa.String(length=500), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.LargeBinary(length=32), nullable=False),
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('first_ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['key_id'], ['coldstore_key.id'], name=op.f('fk_cold_segment_key_id_coldstore_key')),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_cold_segment_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_cold_segment')),
    sa.UniqueConstraint('stream_id', 'epoch', 'first_id', name=op.f('uq_cold_segment_stream_id_epoch_first_id'))
    )
    with op.batch_alter_table('cold_segment', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cold_segment_stream_id'), ['stream_id'], unique=False)

    op.create_table('unlock_request',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('requested_by', sa.String(length=32), nullable=False),
    sa.Column('justification', sa.Text(), nullable=False),
    sa.Column('from_epoch', sa.Integer(), nullable=True),
    sa.Column('to_epoch', sa.Integer(), nullable=True),
    sa.Column('from_ts', sa.DateTime(timezone=True), nullable=True),
    sa.Column('to_ts', sa.DateTime(timezone=True), nullable=True),
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('ttl_seconds', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('granted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key_id'], ['coldstore_key.id'], name=op.f('fk_unlock_request_key_id_coldstore_key')),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_unlock_request_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_unlock_request'))
    )
    with op.batch_alter_table('unlock_request', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_unlock_request_stream_id'), ['stream_id'], unique=False)

    op.create_table('unlock_approval',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('request_id', sa.String(length=32), nullable=False),
    sa.Column('admin_key_id', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['request_id'], ['unlock_request.id'], name=op.f('fk_unlock_approval_request_id_unlock_request'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_unlock_approval')),
    sa.UniqueConstraint('request_id', 'admin_key_id', name=op.f('uq_unlock_approval_request_id_admin_key_id'))
    )
    with op.batch_alter_table('unlock_approval', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_unlock_approval_request_id'), ['request_id'], unique=False)

    with op.batch_alter_table('stream_window', schema=None) as batch_op:
        batch_op.add_column(sa.Column('seal_cursor', sa.String(length=40), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('stream_window', schema=None) as batch_op:
        batch_op.drop_column('seal_cursor')

    with op.batch_alter_table('unlock_approval', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_unlock_approval_request_id'))

    op.drop_table('unlock_approval')
    with op.batch_alter_table('unlock_request', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_unlock_request_stream_id'))

    op.drop_table('unlock_request')
    with op.batch_alter_table('cold_segment', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_cold_segment_stream_id'))

    op.drop_table('cold_segment')
    op.drop_table('coldstore_key')
    op.drop_table('audit_log')

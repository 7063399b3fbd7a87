"""reference models and quality

Revision ID: 18e3d76448a5
Revises: 112802f84b6a
Create Date: 2026-11-22 04:01:06.424728
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '18e3d76448a5'
down_revision = '112802f84b6a'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('reference_model',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('model', sa.Text(), nullable=True),
    sa.Column('columns', sa.JSON(), nullable=False),
    sa.Column('train_rows', sa.Integer(), nullable=False),
    sa.Column('train_label_rates', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('eval_rows', sa.Integer(), nullable=True),
    sa.Column('log_loss', sa.Double(), nullable=True),
    sa.Column('auc', sa.Double(), nullable=True),
    sa.Column('prior_log_loss', sa.Double(), nullable=True),
    sa.Column('evaluated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['stream_id'], ['stream.id'], name=op.f('fk_reference_model_stream_id_stream'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reference_model')),
    sa.UniqueConstraint('stream_id', 'epoch', name=op.f('uq_reference_model_stream_id_epoch'))
    )
    with op.batch_alter_table('reference_model', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_reference_model_stream_id'), ['stream_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('reference_model', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_reference_model_stream_id'))

    op.drop_table('reference_model')

"""selected count tables

Revision ID: dc54b0832abf
Revises: 18e3d76448a5
Create Date: 2026-11-22 04:08:41.221905
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = 'dc54b0832abf'
down_revision = '18e3d76448a5'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('count_table', schema=None) as batch_op:
        batch_op.add_column(sa.Column('selected_epoch', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('selection_rank', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('selection_epsilon', sa.Double(), nullable=True))
        batch_op.add_column(sa.Column('extends', sa.String(length=600), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('count_table', schema=None) as batch_op:
        batch_op.drop_column('extends')
        batch_op.drop_column('selection_epsilon')
        batch_op.drop_column('selection_rank')
        batch_op.drop_column('selected_epoch')


"""streams: record the calibration of the count tables' noise of streams created before max(c, 2)

New user-keyed streams calibrate their count tables to max(c, 2) observations of a user per
window (``privacy.table_calibration = "max_c_2"``, service/core/dp/budget.py): removing one
observation can let the user's next one be counted instead, a swap of two. A stream created
before was calibrated to c; its noise cannot change (the cells are drawn), so this revision
writes the rule it was created with, ``"c"``, into its config, and the ledger reports what that
noise gives per observation (2ε/c).

Revision ID: c26a01000001
Revises: c18a01000001
Create Date: 2026-11-24 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c26a01000001"
down_revision = "c18a01000001"
branch_labels = None
depends_on = None

stream = sa.table("stream", sa.column("id", sa.Integer), sa.column("config", sa.JSON))


def upgrade() -> None:
    bind = op.get_bind()
    for sid, config in bind.execute(sa.select(stream.c.id, stream.c.config)).all():
        privacy = dict((config or {}).get("privacy") or {})
        if "table_calibration" in privacy:
            continue
        privacy["table_calibration"] = "c"
        bind.execute(
            stream.update()
            .where(stream.c.id == sid)
            .values(config={**(config or {}), "privacy": privacy})
        )


def downgrade() -> None:
    bind = op.get_bind()
    for sid, config in bind.execute(sa.select(stream.c.id, stream.c.config)).all():
        privacy = dict((config or {}).get("privacy") or {})
        if privacy.pop("table_calibration", None) is not None:
            bind.execute(
                stream.update()
                .where(stream.c.id == sid)
                .values(config={**(config or {}), "privacy": privacy})
            )

"""streams: keep the plug-in selection score for streams created before "aic" (issue 18)

New streams score candidate count-table groups with the penalised gain ``"aic"``
(service/core/dp/selection.py). A stream created before has no ``privacy.selection_score`` in its
stored config, and would otherwise switch its picks on upgrade; this revision writes the score
it was created with, ``"mi"``, into its config.

Revision ID: c18a01000001
Revises: c12f01000001
Create Date: 2026-11-23 18:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c18a01000001"
down_revision = "c12f01000001"
branch_labels = None
depends_on = None

stream = sa.table("stream", sa.column("id", sa.Integer), sa.column("config", sa.JSON))


def upgrade() -> None:
    bind = op.get_bind()
    for sid, config in bind.execute(sa.select(stream.c.id, stream.c.config)).all():
        privacy = dict((config or {}).get("privacy") or {})
        if "selection_score" in privacy:
            continue
        privacy["selection_score"] = "mi"
        bind.execute(
            stream.update()
            .where(stream.c.id == sid)
            .values(config={**(config or {}), "privacy": privacy})
        )


def downgrade() -> None:
    bind = op.get_bind()
    for sid, config in bind.execute(sa.select(stream.c.id, stream.c.config)).all():
        privacy = dict((config or {}).get("privacy") or {})
        if privacy.pop("selection_score", None) is not None:
            bind.execute(
                stream.update()
                .where(stream.c.id == sid)
                .values(config={**(config or {}), "privacy": privacy})
            )

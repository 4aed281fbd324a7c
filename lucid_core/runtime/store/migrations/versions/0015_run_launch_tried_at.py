"""runs.launch_tried_at: when a round first sent the run's launch to its host (None: never tried), so that a
launch that could not reach its host on the first try is known to have started nothing there. Runs planned
before this revision count as tried: an older round may have sent their launch

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("launch_tried_at", sa.Float(), nullable=True))
    op.execute("UPDATE runs SET launch_tried_at = planned_at WHERE state = 'planned'")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("launch_tried_at")

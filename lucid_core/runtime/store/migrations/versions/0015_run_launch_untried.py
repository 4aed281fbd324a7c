"""runs.launch_untried: true from when a round plans a run until it sends the run's launch to its host, so that a
first launch that could not reach its host is known to have started nothing there. Existing runs, and runs a
controller of an older version writes (it does not know the column), read false: they may have been launched

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
        batch_op.add_column(sa.Column("launch_untried", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("launch_untried")

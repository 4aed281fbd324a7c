"""runs.unreadable_since: when a running run's status began to read as garbage on its host, so that a round
stops it once that has lasted `runtime.unreadable_stop_after_s` instead of holding its GPUs for ever

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("unreadable_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("unreadable_since")

"""runs.pruned_at: when a round removed an ended run's files from its host (`runtime.keep_ended_runs_days`), so
that it is done once and `lucid logs` can say where the logs went; ix_runs_unpruned on runs (pruned_at, ended_at),
so that a round finds the oldest runs not yet pruned without scanning every run

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pruned_at", sa.Float(), nullable=True))
    op.create_index("ix_runs_unpruned", "runs", ["pruned_at", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_unpruned", table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("pruned_at")

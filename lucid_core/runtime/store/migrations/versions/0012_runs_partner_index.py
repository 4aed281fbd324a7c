"""ix_runs_partner on runs (partner): who shared a GPU with a job (`surfaces.shared_time`, read by every job
status) looks its partners' runs up instead of scanning every run

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_partner", "runs", ["partner"])


def downgrade() -> None:
    op.drop_index("ix_runs_partner", table_name="runs")

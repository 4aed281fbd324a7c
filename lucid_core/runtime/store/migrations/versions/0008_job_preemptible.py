"""jobs.preemptible (the job resumes from its own checkpoints) and jobs.yields (times Lucid stopped it)

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("preemptible", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("yields", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("yields")
        batch_op.drop_column("preemptible")

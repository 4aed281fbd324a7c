"""jobs.idempotency_key: a client that lost the answer to a submission can send it again safely

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=300), nullable=True))
        batch_op.create_unique_constraint("uq_jobs_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_jobs_idempotency_key", type_="unique")
        batch_op.drop_column("idempotency_key")

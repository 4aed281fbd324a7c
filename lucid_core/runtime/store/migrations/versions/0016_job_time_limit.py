"""jobs.time_limit_s: the longest a job may run, all its runs together (`lucid submit --time-limit`); a job that
reaches it is stopped and fails saying so. Existing jobs, and jobs an older controller writes, have none.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("time_limit_s", sa.Float(), nullable=True))


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite 3.35+ has it): batch mode would copy `jobs` and drop the old table, which the
    # runs' and events' foreign keys to it refuse on SQLite
    op.drop_column("jobs", "time_limit_s")

"""ix_jobs_finished on jobs (state, end_time, start_time, user, gpus, job_id): a round's history read walks
it, covered, instead of sorting every finished job

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_finished", "jobs", ["state", "end_time", "start_time", "user", "gpus", "job_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_finished", table_name="jobs")

"""runs.observed_speed*: the latest speed estimate of a main run sharing its GPUs, from its telemetry

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observed_speed", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("observed_speed_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("observed_speed_samples", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("observed_speed_emulated", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("observed_speed_emulated")
        batch_op.drop_column("observed_speed_samples")
        batch_op.drop_column("observed_speed_at")
        batch_op.drop_column("observed_speed")

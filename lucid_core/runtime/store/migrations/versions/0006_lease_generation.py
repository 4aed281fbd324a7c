"""Fencing: leases.generation (grows at every take), rounds.generation/fenced, hosts.remove_when_empty

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("generation", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("generation", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("fenced", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("remove_when_empty", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("remove_when_empty")
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("fenced")
        batch_op.drop_column("generation")
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("generation")

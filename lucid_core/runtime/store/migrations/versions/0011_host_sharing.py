"""hosts.gpu_model and hosts.sharing: the key packing models are applied by; longer model kinds (one per key)

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_model", sa.String(128), nullable=True))
        batch_op.add_column(sa.Column("sharing", sa.String(16), nullable=False, server_default="time-slice"))
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.alter_column("kind", existing_type=sa.String(32), type_=sa.String(160))
    # hosts registered before: the GPU model nvidia-smi reported for their GPUs, where they were discovered
    op.execute("UPDATE hosts SET gpu_model = (SELECT MIN(gpus.model) FROM gpus WHERE gpus.host = hosts.name "
               "AND gpus.declared = false) WHERE gpu_model IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.alter_column("kind", existing_type=sa.String(160), type_=sa.String(32))
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("sharing")
        batch_op.drop_column("gpu_model")

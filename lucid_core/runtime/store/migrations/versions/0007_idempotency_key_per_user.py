"""jobs (user, idempotency_key) unique together: keys scoped by user without an in-band separator

Keys were stored as user + "\\x1f" + key under a unique constraint on the one column; "\\x1f" may occur
in both, so two different (user, key) pairs could collide. Stored keys lose their user prefix.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_jobs = sa.table("jobs", sa.column("user", sa.String), sa.column("idempotency_key", sa.String))


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_jobs_idempotency_key", type_="unique")
    prefix_len = sa.func.length(_jobs.c.user) + 2  # the user, the separator, then the client's key
    op.execute(_jobs.update().where(_jobs.c.idempotency_key.is_not(None))
               .values(idempotency_key=sa.func.substr(_jobs.c.idempotency_key, prefix_len)))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_jobs_user_idempotency_key", ["user", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_jobs_user_idempotency_key", type_="unique")
    op.execute(_jobs.update().where(_jobs.c.idempotency_key.is_not(None))
               .values(idempotency_key=_jobs.c.user + "\x1f" + _jobs.c.idempotency_key))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_jobs_idempotency_key", ["idempotency_key"])

"""Alembic environment: runs on the connection the store hands over (never a config file URL)."""

from __future__ import annotations

from alembic import context

from lucid_core.runtime.store.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

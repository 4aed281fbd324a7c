"""Where the store is: LUCID_STORE_URL, else one SQLite file in LUCID_HOME (no SQLAlchemy needed to say so)."""

from __future__ import annotations

import os

from lucid_core.config import lucid_home


def default_store_url(env: dict[str, str] | None = None) -> str:
    """LUCID_STORE_URL when set, else a SQLite file in LUCID_HOME."""
    env = dict(os.environ) if env is None else env
    if env.get("LUCID_STORE_URL"):
        return env["LUCID_STORE_URL"]
    return f"sqlite:///{lucid_home(env) / 'lucid.db'}"

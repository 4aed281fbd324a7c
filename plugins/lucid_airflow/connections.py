"""Turn Airflow Connections into what lucid_core needs: a SQLAlchemy URL for the Lucid store."""

from __future__ import annotations

STORE_CONN_ID = "lucid_db"


def sqlalchemy_url(conn) -> str:
    """A SQLAlchemy URL from an Airflow Connection (get_uri() loses the SQLite path and says postgres://)."""
    from sqlalchemy.engine import URL

    extra = conn.extra_dejson or {}
    if extra.get("sqlalchemy_url"):
        return str(extra["sqlalchemy_url"])
    kind = (conn.conn_type or "").lower()
    if kind == "sqlite":
        return f"sqlite:///{conn.host or conn.schema}"
    if kind in {"postgres", "postgresql"}:
        return URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                          host=conn.host or None, port=conn.port or None,
                          database=conn.schema or None).render_as_string(hide_password=False)
    return conn.get_uri()


def store_url(conn_id: str = STORE_CONN_ID) -> str:
    """The store URL inside a task (Task SDK connection lookup)."""
    from airflow.sdk import BaseHook

    return sqlalchemy_url(BaseHook.get_connection(conn_id))


def server_store_url(conn_id: str = STORE_CONN_ID) -> str:
    """The store URL inside the API server (secrets backends, then the metadata DB)."""
    from airflow.models.connection import Connection

    return sqlalchemy_url(Connection.get_connection_from_secrets(conn_id))

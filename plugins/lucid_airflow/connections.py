"""Turn Airflow Connections into what lucid_core needs: a SQLAlchemy URL for the Lucid store."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

STORE_CONN_ID = "lucid_db"
# one known_hosts key: its type and base64 body, on one line (what `ssh-keyscan` prints after the host)
HOST_KEY_PATTERN = re.compile(r"[A-Za-z0-9@._+-]{1,64} [A-Za-z0-9+/]{16,16384}={0,2}")


class ConnectionProblem(ValueError):
    """An Airflow connection Lucid reads holds what it cannot use; names the connection and the field (never
    the value: extras hold keys and passwords)."""


def _json_object(text: str) -> bool:
    """Whether `text` is JSON for an object or null (an empty extra, however spaced)."""
    import json

    try:
        return isinstance(json.loads(text), dict | None)
    except ValueError:
        return False


def extra_fields(conn, names: Iterable[str]) -> dict[str, str]:
    """The named fields of a connection's extra that are set, each as text; ConnectionProblem for an extra that
    is not a JSON object (the Task SDK reads unparsable JSON as empty) or a field that is not text."""
    extra, raw = conn.extra_dejson, getattr(conn, "extra", None)
    extra = {} if extra is None else extra  # JSON null: no extra
    unparsed = not extra and isinstance(raw, str) and bool(raw.strip()) and not _json_object(raw)
    if not isinstance(extra, Mapping) or unparsed:
        raise ConnectionProblem(f"connection {conn.conn_id}: its extra must be a JSON object of fields")
    fields: dict[str, str] = {}
    for name in names:
        value = extra.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or "\x00" in value:
            raise ConnectionProblem(f"connection {conn.conn_id}: extra.{name} must be text, not "
                                    f"{type(value).__name__}")
        fields[name] = value
    return fields


def host_key_entry(conn, where: str, key: str) -> str:
    """The known_hosts line for `where` from a connection's extra.host_key; one key on one line, else
    ConnectionProblem (a newline would add entries for other hosts)."""
    key = key.strip()
    if not HOST_KEY_PATTERN.fullmatch(key):
        raise ConnectionProblem(f"connection {conn.conn_id}: extra.host_key must be one public key on one line, "
                                "'<type> <base64>' (as ssh-keyscan prints it after the host)")
    if not where or any(c.isspace() or c in ",#*?!|" for c in where):  # a list or a pattern would trust the key
        raise ConnectionProblem(f"connection {conn.conn_id}: host must be one address, not a list or a pattern")
    entry = f"{where} {key}"
    from paramiko.hostkeys import HostKeyEntry

    try:  # paramiko's known_hosts reader skips only SSHException: a key it fails on otherwise (base64 cut short,
        # an ed25519 key of 31 bytes) raises out of every host's connect, since all share the file
        readable = HostKeyEntry.from_line(entry) is not None
    except Exception:
        readable = False
    if not readable:
        raise ConnectionProblem(f"connection {conn.conn_id}: extra.host_key is no public key paramiko can read "
                                "(copy the whole '<type> <base64>' line ssh-keyscan prints)")
    return entry


#: connection types whose host, port, login, password and schema name a PostgreSQL store (`lucid`: LucidHook's own)
POSTGRES_TYPES = frozenset({"postgres", "postgresql", "lucid"})


def sqlalchemy_url(conn) -> str:
    """A SQLAlchemy URL from an Airflow Connection (get_uri() loses the SQLite path and says postgres://): its
    `extra.sqlalchemy_url`, else a SQLite file or PostgreSQL from its fields. A `lucid`-typed connection is read as
    PostgreSQL everywhere (the DAGs and the plugin's pages, as LucidHook reads it); any other type is refused
    naming the ones that work (get_uri() gave `lucid://...`, which no SQLAlchemy dialect takes)."""
    from sqlalchemy.engine import URL

    extra = extra_fields(conn, ("sqlalchemy_url",))
    if "sqlalchemy_url" in extra:
        return extra["sqlalchemy_url"]
    kind = (conn.conn_type or "").lower()
    if kind == "sqlite":
        return f"sqlite:///{conn.host or conn.schema}"
    if kind in POSTGRES_TYPES:
        return URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                          host=conn.host or None, port=conn.port or None,
                          database=conn.schema or None).render_as_string(hide_password=False)
    # a connection given as a URI keeps its scheme as the type (`postgresql+psycopg2://...`): its URI is the URL,
    # when SQLAlchemy has a dialect for it (`lucid://`, `generic://` have none: refused here, not in every reader)
    from sqlalchemy.engine import make_url

    uri = conn.get_uri()
    try:
        make_url(uri).get_dialect()
    except Exception:  # no such dialect, or no URL at all
        raise ConnectionProblem(f"connection {conn.conn_id}: conn type {kind or '(none)'!r} names no Lucid store: "
                                "use postgres, lucid (PostgreSQL fields) or sqlite (host: the file), a SQLAlchemy "
                                "URI, or set extra.sqlalchemy_url") from None
    return uri


def store_url(conn_id: str = STORE_CONN_ID) -> str:
    """The store URL inside a task (Task SDK connection lookup)."""
    from airflow.sdk import BaseHook

    return sqlalchemy_url(BaseHook.get_connection(conn_id))


def server_store_url(conn_id: str = STORE_CONN_ID) -> str:
    """The store URL inside the API server (secrets backends, then the metadata DB)."""
    from airflow.models.connection import Connection

    return sqlalchemy_url(Connection.get_connection_from_secrets(conn_id))

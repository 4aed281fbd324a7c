"""Read a store through its DB-API driver alone (sqlite3, psycopg2), without SQLAlchemy.

Importing SQLAlchemy's ORM and the table mappings takes 0.3 s, longer than `lucid queue` may take in all, so the
CLI's read-only answers read this way. Only a store already at the packaged schema head is read here: a new
file, an older schema or a URL this module does not know is opened by `Store`, which migrates it. Values come
back as the ORM gives them (a Boolean column as bool, a JSON column parsed), so one `job_views` shapes both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any
from urllib.parse import unquote

from lucid_core.runtime.store.schema_head import packaged_head

#: Columns the ORM reads as bool (SQLite keeps 0/1) and as JSON (SQLite keeps text), per table; a test holds
#: these to the table mappings, so a new column cannot be read raw by one path and converted by the other.
BOOLEAN_COLUMNS = {
    "jobs": frozenset({"amp", "long_cold_start", "ended_in_profiling", "cancel_requested", "profiled",
                       "profile_emulated", "no_share", "preemptible"}),
    "runs": frozenset({"profile_in_place", "observed_speed_emulated", "launch_untried"}),
}
JSON_COLUMNS = {"jobs": frozenset({"env"}), "runs": frozenset({"gpu_indices"})}

_SQLITE_NAMES = ("sqlite", "sqlite+pysqlite")
_POSTGRES_NAMES = ("postgresql", "postgres", "postgresql+psycopg2")
_BUSY_TIMEOUT_S = 10.0  # as `Store`'s SQLite connections wait for a writer's lock
#: A database URL split as SQLAlchemy's `make_url` splits it (the same grammar), so a plain read connects to the
#: very database `Store` would: user, password and database percent-decoded, the host and port as written.
_URL = re.compile(r"""
    (?P<name>[\w+]+)://
    (?:(?P<user>[^:/]*)(?::(?P<password>[^@]*))?@)?
    (?:(?:\[(?P<ipv6host>[^/?]+)\]|(?P<ipv4host>[^/:?]+))?(?::(?P<port>[^/?]*))?)?
    (?:/(?P<database>[^?]*))?
    (?:\?(?P<query>.*))?
    """, re.X)


@dataclass(frozen=True)
class UrlParts:
    """What a store URL names, decoded as SQLAlchemy decodes it."""

    name: str
    user: str | None
    password: str | None
    host: str | None
    port: int | None
    database: str | None
    query: str | None


def url_parts(url: str) -> UrlParts | None:
    """`url` split as `sqlalchemy.engine.make_url` splits it; None when it does not parse (or its port is not a
    number), which `Store` then reports."""
    match = _URL.match(url)
    if match is None:
        return None
    part = match.groupdict()
    if part["port"] and not part["port"].isdigit():
        return None
    decoded = {k: unquote(part[k]) if part[k] is not None else None for k in ("user", "password", "database")}
    return UrlParts(part["name"], decoded["user"], decoded["password"], part["ipv4host"] or part["ipv6host"],
                    int(part["port"]) if part["port"] else None, decoded["database"], part["query"])


def _sqlite_file(parts: UrlParts) -> Path | None:
    """The existing file a SQLite URL names, as SQLAlchemy opens it (decoded, `~` not expanded, relative to the
    working folder); None: no such file, in memory, or a URL with a host or options."""
    name = parts.database
    if parts.host or parts.query is not None or not name or name.startswith((":memory:", "file:")):
        return None
    path = Path(name)
    return path if path.is_file() else None


def _connect(url: str) -> tuple[Any, str] | None:
    """A DB-API connection and its dialect name, or None when this URL is not one read here."""
    parts = url_parts(url)
    if parts is None:
        return None
    if parts.name in _SQLITE_NAMES:
        path = _sqlite_file(parts)
        if path is None:
            return None
        import sqlite3

        return sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_S, isolation_level=None), "sqlite"
    if parts.name not in _POSTGRES_NAMES or parts.query is not None:  # options may be SQLAlchemy's own
        return None
    try:
        import psycopg2
    except ImportError:
        return None
    given = {"host": parts.host, "port": parts.port, "user": parts.user, "password": parts.password,
             "dbname": parts.database}
    connection = psycopg2.connect(**{k: v for k, v in given.items() if v is not None})
    # one snapshot for every read of an answer (a history page and its total agree), and no write by mistake
    connection.set_session(isolation_level="REPEATABLE READ", readonly=True)
    return connection, "postgresql"


def _converted(table: str, names: Sequence[str], values: Sequence[Any], dialect: str) -> SimpleNamespace:
    """One row as a record with the ORM's values: bools for Boolean columns, and on SQLite (which keeps text;
    psycopg2 parses PostgreSQL's json itself) parsed JSON columns; text that is not JSON reads as None, as
    `Store.stored_json` reads it through the ORM."""
    booleans = BOOLEAN_COLUMNS.get(table, frozenset())
    documents = JSON_COLUMNS.get(table, frozenset()) if dialect == "sqlite" else frozenset()
    record = dict(zip(names, values, strict=True))
    for name in booleans.intersection(record):
        if record[name] is not None:
            record[name] = bool(record[name])
    for name in documents.intersection(record):
        if isinstance(record[name], str | bytes):
            try:
                record[name] = json.loads(record[name])
            except ValueError:
                record[name] = None
    return SimpleNamespace(**record)


class PlainReader:
    """One read-only session on a current store: `records` and `scalar` run SQL written with `?` placeholders
    (turned into psycopg2's `%s`), inside one transaction, so the reads of one answer see one state."""

    def __init__(self, connection: Any, dialect: str) -> None:
        self.connection = connection
        self.dialect = dialect
        self._cursor = connection.cursor()
        if dialect == "sqlite":
            self._cursor.execute("BEGIN")  # psycopg2 opens its transaction at the first statement itself

    def _execute(self, sql: str, params: Sequence[Any]) -> Any:
        self._cursor.execute(sql.replace("?", "%s") if self.dialect == "postgresql" else sql, tuple(params))
        return self._cursor

    def records(self, table: str, sql: str, params: Sequence[Any] = ()) -> list[SimpleNamespace]:
        """The rows of a query on `table`, each a record of its columns (named as selected)."""
        cursor = self._execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [_converted(table, names, row, self.dialect) for row in cursor.fetchall()]

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row (None when there is no row)."""
        row = self._execute(sql, params).fetchone()
        return None if row is None else row[0]

    def now(self) -> float:
        """The database's current time in epoch seconds: the one clock of the store (`db_clock`)."""
        if self.dialect == "postgresql":
            return float(self.scalar("SELECT CAST(EXTRACT(epoch FROM clock_timestamp()) AS FLOAT)"))
        return float(self.scalar("SELECT (julianday('now') - 2440587.5) * 86400.0"))

    def close(self) -> None:
        try:
            self.connection.rollback()  # it wrote nothing: end the read transaction
        finally:
            self.connection.close()

    def __enter__(self) -> PlainReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def open_plain_reader(url: str) -> PlainReader | None:
    """A plain reader of the store at `url`, or None when it must be opened by `Store`: a URL other than an
    existing SQLite file or PostgreSQL through psycopg2 (either with no options), a store without the packaged
    head's stamp (new, older, newer), or no packaged head to compare with."""
    head = packaged_head()
    if head is None:
        return None
    opened = _connect(url)
    if opened is None:
        return None
    reader = PlainReader(*opened)
    try:
        stamped = [r.version_num for r in reader.records("alembic_version", "SELECT version_num FROM alembic_version")]
    except Exception as exc:  # no alembic_version table (an empty file, or not a store): `Store` says what it is
        reader.close()
        if "locked" in str(exc):  # a writer held the file for the whole busy timeout: `Store` would wait again
            raise
        return None
    if stamped != [head]:
        reader.close()
        return None
    return reader

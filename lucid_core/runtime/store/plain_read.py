"""Read a store through its DB-API driver alone (sqlite3, psycopg2), without SQLAlchemy.

Importing SQLAlchemy's ORM and the table mappings takes 0.3 s, longer than `lucid queue` may take in all, so the
CLI's read-only answers read this way. Only a store already at the packaged schema head is read here: a new
file, an older schema or a URL this module does not know is opened by `Store`, which migrates it. Values come
back as the ORM gives them (a Boolean column as bool, a JSON column parsed), so one `job_views` shapes both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

from lucid_core.runtime.store.schema_head import packaged_head

#: Columns the ORM reads as bool (SQLite keeps 0/1) and as JSON (SQLite keeps text), per table; a test holds
#: these to the table mappings, so a new column cannot be read raw by one path and converted by the other.
BOOLEAN_COLUMNS = {
    "jobs": frozenset({"amp", "long_cold_start", "ended_in_profiling", "cancel_requested", "profiled",
                       "profile_emulated", "no_share", "preemptible"}),
    "runs": frozenset({"profile_in_place", "observed_speed_emulated"}),
}
JSON_COLUMNS = {"jobs": frozenset({"env"}), "runs": frozenset({"gpu_indices"})}

_SQLITE_PREFIXES = ("sqlite:///", "sqlite+pysqlite:///")
_POSTGRES_PREFIXES = ("postgresql://", "postgres://", "postgresql+psycopg2://")
_BUSY_TIMEOUT_S = 10.0  # as `Store`'s SQLite connections wait for a writer's lock


def _sqlite_file(url: str) -> Path | None:
    """The existing file a SQLite URL names (None: no such file, in memory, or a URL with options)."""
    prefix = next((p for p in _SQLITE_PREFIXES if url.startswith(p)), None)
    if prefix is None:
        return None
    name = url[len(prefix):]
    if not name or "?" in name or name.startswith((":memory:", "file:")):
        return None
    path = Path(name).expanduser()
    return path if path.is_file() else None


def _connect(url: str) -> tuple[Any, str] | None:
    """A DB-API connection and its dialect name, or None when this URL is not one read here."""
    path = _sqlite_file(url)
    if path is not None:
        import sqlite3

        return sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_S, isolation_level=None), "sqlite"
    prefix = next((p for p in _POSTGRES_PREFIXES if url.startswith(p)), None)
    if prefix is None or "?" in url:  # options may be SQLAlchemy's own, which libpq refuses: `Store` reads those
        return None
    try:
        import psycopg2
    except ImportError:
        return None
    return psycopg2.connect("postgresql://" + url[len(prefix):]), "postgresql"


def _converted(table: str, names: Sequence[str], values: Sequence[Any]) -> SimpleNamespace:
    """One row as a record with the ORM's values: bools for Boolean columns, parsed JSON (None when a hand
    edit left text that is not JSON: one odd row must not fail the whole read)."""
    booleans, documents = BOOLEAN_COLUMNS.get(table, frozenset()), JSON_COLUMNS.get(table, frozenset())
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
        return [_converted(table, names, row) for row in cursor.fetchall()]

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
    except Exception:  # no alembic_version table (an empty file, or not a store): `Store` says what it is
        reader.close()
        return None
    if stamped != [head]:
        reader.close()
        return None
    return reader

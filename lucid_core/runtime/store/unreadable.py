"""A store that cannot be read, in words: where it is (never with its password) and why, on one line.

The pages and the HTTP API answer 503 with these words, not a bare 500, when the store's database server is
down or refuses, the URL names a database that does not exist, or the store was never set up (no tables yet).
"""

from __future__ import annotations

#: PostgreSQL's SQLSTATE for a table that does not exist (psycopg2 says it as `pgcode`, psycopg 3 as `sqlstate`)
UNDEFINED_TABLE = "42P01"
#: what to do about a store without tables: anything that opens it for the scheduler migrates it
SET_UP_WORDS = "run the lucid_scheduling_round DAG once or any `lucid` command, which create them"
#: PostgreSQL's SQLSTATE for a column that does not exist: a store older than the code reading it
UNDEFINED_COLUMN = "42703"
#: how SQLite says its file cannot be opened or read (its other OperationalErrors are faults of a statement)
SQLITE_UNREADABLE = ("unable to open database file", "disk i/o error", "file is not a database",
                     "database disk image is malformed")
#: what to check about a store that does not answer
REACH_WORDS = ("check that its database server is running and that the store's URL (the lucid_db connection, "
               "LUCID_STORE_URL) names the right host and database")


def store_place(url: str) -> str:
    """Where a store URL points, without user or password: `host:port/database`, or the SQLite file."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parts = make_url(url)
    except ArgumentError:
        return "(a URL that cannot be read)"
    if parts.get_backend_name() == "sqlite":
        return parts.database or "an in-memory SQLite database"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.host or 'localhost'}{port}/{parts.database or ''}"


def missing_table(exc: BaseException) -> bool:
    """Whether a database error says a table does not exist: a store no migration has set up."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None)
    return code == UNDEFINED_TABLE or str(cause).startswith("no such table")


def missing_column(exc: BaseException) -> bool:
    """Whether a database error says a column does not exist: a store migrated by an older version than this."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None)
    return code == UNDEFINED_COLUMN or str(cause).startswith("no such column")


def _sqlite_cause(exc: BaseException) -> str | None:
    """The lower-cased message of a SQLite driver error (None for another driver's)."""
    import sqlite3

    cause = getattr(exc, "orig", None) or exc
    return str(cause).lower() if isinstance(cause, sqlite3.Error) else None


def cause_line(url: str, exc: BaseException) -> str:
    """The driver's first line about `exc`, without the URL's password (a driver may quote what it was given)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    cause = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else type(cause).__name__
    try:
        password = make_url(url).password
    except ArgumentError:
        password = None
    return text.replace(str(password), "***") if password else text


def unreadable_words(url: str, exc: BaseException) -> str | None:
    """Why the store at `url` cannot be read, as a page or the API says it; None for a database error that is no
    such thing (bad SQL, a broken constraint): that stays a server error."""
    from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

    place, cause = store_place(url), cause_line(url, exc)
    if isinstance(exc, OperationalError | ProgrammingError) and missing_table(exc):
        return f"The Lucid store at {place} is not set up yet: it has no tables ({cause}); {SET_UP_WORDS}."
    if isinstance(exc, OperationalError | ProgrammingError) and missing_column(exc):
        return (f"The Lucid store at {place} was set up by an older version of Lucid ({cause}); run the "
                "lucid_scheduling_round DAG once or any `lucid` command, which bring it up to date.")
    sqlite = _sqlite_cause(exc)
    if sqlite is not None and sqlite.startswith("database is locked"):
        return f"The Lucid store at {place} is busy ({cause}): another writer holds it; try again in a moment."
    if sqlite is not None and not sqlite.startswith(SQLITE_UNREADABLE):
        return None  # a statement's fault (a syntax error, a constraint), not a store that cannot be read
    if isinstance(exc, OperationalError | InterfaceError):
        return f"The Lucid store at {place} cannot be read: {cause}; {REACH_WORDS}."
    return None

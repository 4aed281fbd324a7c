"""The database's clock: the one clock every controller judges the round lease by.

A lease written with one controller's clock and judged with another's breaks as soon as their clocks
disagree by more than the TTL (a host whose NTP broke takes a live lease over at once). Reading the time
inside the statement that writes or compares the expiry leaves one clock for all: the PostgreSQL server's,
or, for SQLite, the clock of the machine that holds the file (every process using it shares that one).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

_UNIX_EPOCH_JULIAN_DAY = 2440587.5
_SECONDS_PER_DAY = 86400.0


def database_now(dialect: str) -> ColumnElement[float]:
    """A SQL expression for the database's current time in seconds since the Unix epoch.

    PostgreSQL's `clock_timestamp()` (not `now()`, which is the transaction's start: a renewal late in a
    long transaction would extend from a stale time); SQLite's `julianday('now')`, the same for every
    process on the machine that holds the file.
    """
    if dialect == "postgresql":
        return sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Float)
    if dialect == "sqlite":
        return (sa.func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY) * _SECONDS_PER_DAY
    raise ValueError(f"the store does not know the clock of a {dialect} database (PostgreSQL or SQLite)")


def time_expression(dialect: str, now: float | None) -> ColumnElement[float]:
    """`now` as a SQL value where a caller gives one (tests that step time by hand), else the database's clock."""
    return database_now(dialect) if now is None else sa.literal(float(now), sa.Float)


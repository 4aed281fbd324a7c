"""The database's clock: the one clock every controller, submitter and page of a store goes by.

A lease written with one controller's clock and judged with another's breaks as soon as their clocks
disagree by more than the TTL (a host whose NTP broke takes a live lease over at once); a run started at one
worker's time and judged vanished at another's, a submit time from the API server's clock and a wait
measured with a round's, go wrong the same way. The lease reads the time inside the statement that writes
or compares its expiry; everything else reads it through `database_time` / `database_clock`. One clock for
all: the PostgreSQL server's; for SQLite, `julianday('now')` is the clock of the machine each process runs on,
which is one clock because SQLite's processes all run where the file is (it is no network database).
"""

from __future__ import annotations

import time
from collections.abc import Callable

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



def database_time(engine: sa.Engine) -> float:
    """The database's current time in epoch seconds, read with one query."""
    with engine.connect() as conn:
        return float(conn.execute(sa.select(database_now(conn.dialect.name))).scalar_one())


def database_clock(engine: sa.Engine, local: Callable[[], float] = time.time) -> Callable[[], float]:
    """This machine's clock moved onto the database's: the offset between them is measured once (one query,
    against the midpoint of the local readings around it), so a round that reads the time thousands of times
    asks the database once, and every time it writes is on the one clock that submitters and other
    controllers (an Airflow task on another worker) write with too."""
    before = local()
    at_database = database_time(engine)
    offset = at_database - (before + local()) / 2.0

    def now() -> float:
        return local() + offset

    return now

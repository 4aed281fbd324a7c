"""Have the scheduler's rounds stalled? Judged by their own cadence (the median gap between recent round starts),
never sooner than STALL_FLOOR_S. `lucid eta`, `queue` and `status` say so: until rounds resume nothing starts,
and what the store shows (a job RUNNING, a reason) may be out of date. Nothing here imports SQLAlchemy at
import: `queue` and `status` read through a plain reader."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from lucid_core.policy.view import saved_number
from lucid_core.runtime.surfaces.job_views import ACTIVE_STATES
from lucid_core.sim.rounds import MIN_INTERVAL_S
from lucid_core.units import duration_words

if TYPE_CHECKING:
    from lucid_core.runtime.store.plain_read import PlainReader
    from lucid_core.runtime.store.store import Store

CADENCE_ROUNDS = 20  # the recent rounds whose starts give the cadence
MAX_CADENCE_S = 3600.0  # a longer median gap between rounds is no cadence to go by
STALL_FLOOR_S = 120.0  # a round may take a host deadline or two: never called stalled sooner than this
STALL_ROUNDS = 5  # rounds missed in a row at the cadence: stalled
#: the latest rounds' starts, as a plain reader asks for them (`round_starts` reads the same through the ORM)
ROUND_STARTS_SQL = f"SELECT started_at FROM rounds ORDER BY id DESC LIMIT {CADENCE_ROUNDS}"


def trusted_starts(values: Iterable[Any], now: float) -> list[float]:
    """Round starts read back from the store, sorted: a row that is not a finite number, or is stamped after
    `now`, is left out (a row is untrusted)."""
    return sorted(float(t) for t in values if saved_number(t) and t <= now)


def median_gap(starts: list[float]) -> float | None:
    """The rounds' cadence: the median gap (the lower middle one: a gap that was measured) between sorted
    starts; None with fewer than three gaps or a median outside [MIN_INTERVAL_S, MAX_CADENCE_S] (a pause, a
    clock set at boot, an odd row: no cadence to go by)."""
    gaps = [b - a for a, b in pairwise(starts) if b > a]
    if len(gaps) < 3:
        return None
    interval = statistics.median_low(gaps)
    return interval if MIN_INTERVAL_S <= interval <= MAX_CADENCE_S else None


def stall_after_s(starts: list[float]) -> float:
    """How long after the last round's start the rounds count as stalled: STALL_ROUNDS gaps of their cadence,
    never less than STALL_FLOOR_S (the floor alone without a cadence)."""
    interval = median_gap(starts)
    return STALL_FLOOR_S if interval is None else max(STALL_FLOOR_S, STALL_ROUNDS * interval)


def stalled_words(starts: list[float], now: float) -> str | None:
    """What a reader is told when no round has started for longer than `stall_after_s` (None while rounds keep
    their pace). `starts`: `trusted_starts` of the latest rounds."""
    if not starts:
        return "no scheduling round has run yet: nothing starts until one runs (lucid round)"
    age = now - starts[-1]
    if age <= stall_after_s(starts):
        return None
    interval = median_gap(starts)
    pace = f" (they ran every {duration_words(interval)} before)" if interval is not None else ""
    return (f"rounds stalled: no scheduling round has started for {duration_words(age)}{pace}; nothing starts "
            "and states shown may be out of date until rounds resume (lucid round --every, or the round DAG)")


def round_starts(store: Store, now: float, rounds: int = CADENCE_ROUNDS) -> list[float]:
    """`trusted_starts` of the store's latest `rounds` rounds, read through the ORM."""
    from sqlalchemy import select

    from lucid_core.runtime.store.schema import RoundRow

    with store.session() as s:
        return trusted_starts(s.scalars(select(RoundRow.started_at).order_by(RoundRow.id.desc()).limit(rounds)), now)


def stalled_note(store: Store) -> str | None:
    """`stalled_words` of the store's rounds now, when it holds a job not yet ended (None otherwise: there is
    nothing for rounds to do, and a fresh store has run none)."""
    from sqlalchemy import select

    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        active = s.scalar(select(JobRow.job_id).where(JobRow.state.in_(ACTIVE_STATES)).limit(1))
    now = store.now()
    return None if active is None else stalled_words(round_starts(store, now), now)


def plain_stalled_note(reader: PlainReader) -> str | None:
    """`stalled_note` through a plain reader (`lucid queue` and `status` read that way)."""
    marks = ", ".join("?" for _ in ACTIVE_STATES)
    if reader.scalar(f"SELECT job_id FROM jobs WHERE state IN ({marks}) LIMIT 1", ACTIVE_STATES) is None:
        return None
    now = reader.now()
    return stalled_words(trusted_starts((r.started_at for r in reader.records("rounds", ROUND_STARTS_SQL)), now), now)

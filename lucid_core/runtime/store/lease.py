"""The round lease: one row that at most one writer (a scheduling round or an admin command) holds.

Every take of the lease bumps its fencing generation, which only grows: a take-over, and also a
second take by the same holder (an Airflow task retried while its first try still runs), fences the
previous one. A holder writes through `Store.fenced(lease)`: the first write of each transaction
first renews the row *if its generation is still the holder's*, inside that same transaction, so a
holder that was taken over changes nothing (`Fenced`), and a take-over waits for (or is ordered after)
the transaction that renewed (a row lock on PostgreSQL, the write lock on SQLite). The take is a
single conditional UPDATE (or the first INSERT), so two holders racing cannot both win. Expiry is
written and judged by the database's clock (`db_clock`), never a controller's own: a controller whose
clock runs ahead cannot see a live lease as lapsed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from lucid_core.runtime.store.db_clock import time_expression
from lucid_core.runtime.store.fencing import Fenced, Lease, current_in, renew_in
from lucid_core.runtime.store.schema import LeaseRow
from lucid_core.runtime.store.store import Store

ROUND_LEASE = "scheduling-round"
#: no take asks for longer: an expiry further ahead than this was not written by a take or renewal (another
#: controller's bad write), and holding it would stop every round for ever, so it counts as lapsed
MAX_LEASE_TTL_S = 86400.0


class LeaseHeld(RuntimeError):
    """Another holder has the lease (and did not give it back in time)."""


def acquire(store: Store, holder: str, ttl_s: float, now: float | None = None,
            name: str = ROUND_LEASE) -> Lease | None:
    """Take the lease until the database's now + ttl_s with a new generation; None when someone else holds it.

    The holder's own unexpired lease is taken again (a new generation), which fences its earlier take.
    Expiry is written and judged by the database's clock, one for every controller (`db_clock`); `now`
    replaces it where a test steps time by hand.
    """
    if not 0 < ttl_s <= MAX_LEASE_TTL_S:
        raise ValueError(f"a lease TTL of {ttl_s:g} s is not in (0, {MAX_LEASE_TTL_S:g}]")
    at = time_expression(store.dialect, now)
    with store.session() as s:
        taken = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == name, or_(LeaseRow.expires_at < at, LeaseRow.expires_at > at + MAX_LEASE_TTL_S,
                                              LeaseRow.holder == holder))
            .values(holder=holder, expires_at=at + ttl_s, generation=LeaseRow.generation + 1)
            .execution_options(synchronize_session=False)).rowcount
        if taken == 1:
            generation = s.scalar(select(LeaseRow.generation).where(LeaseRow.name == name))
            return Lease(name, holder, int(generation), ttl_s)
        if s.get(LeaseRow, name) is not None:
            return None
    try:
        with store.session() as s:
            s.execute(insert(LeaseRow).values(name=name, holder=holder, expires_at=at + ttl_s, generation=1))
        return Lease(name, holder, 1, ttl_s)
    except IntegrityError:
        return None


def current(store: Store, name: str = ROUND_LEASE) -> tuple[str, int] | None:
    """(holder, generation) of the lease row, expired or not; None before its first take."""
    return current_in(store, name)


def renew(store: Store, lease: Lease, now: float | None = None) -> None:
    """Extend the lease now (a long step between writes), by the database's clock unless `now` is given;
    raises `Fenced` when it was taken over."""
    with store.engine.begin() as conn:
        if renew_in(conn, lease, now):
            return
    raise Fenced(lease, current(store, lease.name))


def release(store: Store, lease: Lease | str, name: str = ROUND_LEASE) -> None:
    """Give the lease back (only if this take still holds it; a bare holder name gives back any take)."""
    where = [LeaseRow.name == (lease.name if isinstance(lease, Lease) else name)]
    if isinstance(lease, Lease):
        where += [LeaseRow.holder == lease.holder, LeaseRow.generation == lease.generation]
    else:
        where.append(LeaseRow.holder == lease)
    with store.session() as s:
        s.execute(update(LeaseRow).where(*where).values(expires_at=0.0).execution_options(synchronize_session=False))


def holder_of(store: Store, now: float | None = None, name: str = ROUND_LEASE) -> str | None:
    """Who holds the lease now, by the database's clock unless `now` is given (None when free or expired)."""
    with store.session() as s:
        at = time_expression(store.dialect, now)
        return s.scalar(select(LeaseRow.holder).where(
            LeaseRow.name == name, LeaseRow.expires_at >= at, LeaseRow.expires_at <= at + MAX_LEASE_TTL_S))


def admin_holder(what: str) -> str:
    """The holder name of an admin command on this machine (shown to a round that waits for it)."""
    return f"admin:{socket.gethostname()}:{os.getpid()}:{what}"[:128]


@contextmanager
def admin_lease(store: Store, what: str, *, wait_s: float = 30.0, ttl_s: float = 60.0,
                poll_s: float = 0.05) -> Iterator[Store]:
    """Hold the round lease for an inventory change, so it is serialised with rounds; yields a store
    whose writes are fenced on it. Waits up to `wait_s` for a running round to finish, then refuses."""
    holder = admin_holder(what)
    deadline = time.monotonic() + wait_s
    while True:
        taken = acquire(store, holder, ttl_s)
        if taken is not None:
            break
        if time.monotonic() >= deadline:
            raise LeaseHeld(f"a scheduling round holds the store's lease ({holder_of(store) or 'just now'}); "
                            f"waited {wait_s:g} s: try again when it has finished")
        time.sleep(poll_s)
    try:
        yield store.fenced(taken)
    finally:
        release(store, taken)

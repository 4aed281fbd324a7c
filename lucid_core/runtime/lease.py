"""The round lease: one row that at most one scheduling round holds at a time.

A holder takes the row when it is free or expired (a crashed round's lease lapses after its
TTL), renews it while it works and gives it back at the end. The take is a single conditional
UPDATE (or the first INSERT), so two rounds racing on SQLite or PostgreSQL cannot both win.
"""

from __future__ import annotations

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError

from lucid_core.runtime.schema import LeaseRow
from lucid_core.runtime.store import Store

ROUND_LEASE = "scheduling-round"


class LeaseHeld(RuntimeError):
    """Another round holds the lease."""


def acquire(store: Store, holder: str, ttl_s: float, now: float, name: str = ROUND_LEASE) -> bool:
    """Take (or renew) the lease until now + ttl_s; False when someone else holds it."""
    with store.session() as s:
        taken = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == name, or_(LeaseRow.expires_at < now, LeaseRow.holder == holder))
            .values(holder=holder, expires_at=now + ttl_s)
            .execution_options(synchronize_session=False)).rowcount
        if taken == 1:
            return True
        if s.get(LeaseRow, name) is not None:
            return False
    try:
        with store.session() as s:
            s.add(LeaseRow(name=name, holder=holder, expires_at=now + ttl_s))
        return True
    except IntegrityError:
        return False


def release(store: Store, holder: str, name: str = ROUND_LEASE) -> None:
    """Give the lease back (only if still ours)."""
    with store.session() as s:
        s.execute(update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder)
                  .values(expires_at=0.0).execution_options(synchronize_session=False))


def holder_of(store: Store, now: float, name: str = ROUND_LEASE) -> str | None:
    """Who holds the lease now (None when free or expired)."""
    with store.session() as s:
        row = s.get(LeaseRow, name)
        return row.holder if row is not None and row.expires_at >= now else None

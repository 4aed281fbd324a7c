"""Fencing: a lease take, its renewal inside a writer's own transaction, and the hook that makes it the first write.

`Store.fenced` installs the hook; `lease` takes and gives back the row. Kept apart from both so that the store
and the lease each import this and not each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from lucid_core.runtime.store.db_clock import time_expression
from lucid_core.runtime.store.schema import LeaseRow


class Fenced(BaseException):
    """This holder's lease was taken over: it must write nothing more.

    A BaseException, like a KeyboardInterrupt, so that no `except Exception` on the way (a host call
    that failed, a step that reports and goes on) can swallow it and let the holder keep acting.
    """

    def __init__(self, lease: Lease, found: tuple[str, int] | None) -> None:
        self.lease = lease
        self.found = found
        now = f"held by {found[0]} at generation {found[1]}" if found else "gone"
        super().__init__(f"lease {lease.name!r} generation {lease.generation} of {lease.holder} was taken "
                         f"over (now {now}): this holder writes nothing more")


@dataclass(frozen=True)
class Lease:
    """One take of the lease: who, which generation, and how long each renewal extends it."""

    name: str
    holder: str
    generation: int
    ttl_s: float


def renew_in(conn: Connection, lease: Lease, now: float | None = None) -> bool:
    """Extend the lease to the database's now + TTL (or `now` + TTL where given) inside the caller's
    transaction, if it is still this take's; False when fenced."""
    return conn.execute(
        update(LeaseRow)
        .where(LeaseRow.name == lease.name, LeaseRow.holder == lease.holder, LeaseRow.generation == lease.generation)
        .values(expires_at=time_expression(conn.dialect.name, now) + lease.ttl_s)).rowcount == 1


def current_in(store: Any, name: str) -> tuple[str, int] | None:
    """(holder, generation) of the lease row, expired or not, read through `store`; None before its first take."""
    with store.session() as s:
        row = s.get(LeaseRow, name)
        return None if row is None else (row.holder, int(row.generation))


def install_fence(factory: sessionmaker, lease: Any, clock: Callable[[], float] | None, raw: Any) -> None:
    """Hook a session factory so that each transaction's first write checks (and renews) the lease first,
    by the database's clock unless a `clock` is given (tests); `raw` is the unfenced store, read for who
    holds the lease when the check fails."""
    def check(session: Session) -> None:
        if session.info.get("fence_checked"):
            return
        session.info["fence_checked"] = True
        if not renew_in(session.connection(), lease, None if clock is None else clock()):
            session.info.pop("fence_checked", None)
            raise Fenced(lease, current_in(raw, lease.name))

    def on_execute(state: Any) -> None:
        if state.is_update or state.is_insert or state.is_delete:
            check(state.session)

    def on_flush(session: Session, _context: Any, _instances: Any) -> None:
        if session.new or session.dirty or session.deleted:
            check(session)

    def on_end(session: Session, *_args: Any) -> None:
        session.info.pop("fence_checked", None)

    sa.event.listen(factory, "do_orm_execute", on_execute)
    sa.event.listen(factory, "before_flush", on_flush)
    sa.event.listen(factory, "after_commit", on_end)
    sa.event.listen(factory, "after_rollback", on_end)

"""LucidHook: the Lucid store behind an Airflow connection, and the job calls a user's pipeline needs.

lucid_core is imported on first use, so DAG files that use the Lucid operators still parse cheaply.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from lucid_airflow.connections import STORE_CONN_ID, sqlalchemy_url

if TYPE_CHECKING:
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest


# how long a wait rides out a store it cannot reach (a restart, a fail-over) before it gives up: ending the
# wait at the first failed read fails the task while its job runs on, and the retry submits a second job
STORE_OUTAGE_S = 600.0
# the cancel_requested event's message of a cancel the Airflow side asked for (a task's timeout or kill): a retry
# submits anew after one, and takes over a job a person cancelled (to fail for good)
TASK_CANCEL_NOTE = "cancel requested by its Airflow task (timeout or kill)"


class LucidJobTimeout(TimeoutError):
    """A job was still not finished when its wait ran out."""


def is_transient_store_error(exc: BaseException) -> bool:
    """True for a store that could not be reached or answered (the connection refused, dropped or timed
    out, SQLite locked): worth reading again. An unknown job or a bad connection stays wrong."""
    from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    return isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout, ConnectionError))


class StoreOutage:
    """Tracks how long the store has been unreachable; `give_up` once it has been for `limit_s` seconds."""

    def __init__(self, limit_s: float = STORE_OUTAGE_S) -> None:
        self.limit_s = float(limit_s)
        self.since: float | None = None

    def failed(self, exc: BaseException, now: float) -> bool:
        """Record a failed read; True when the wait should end (not transient, or unreachable too long)."""
        if not is_transient_store_error(exc):
            return True
        if self.since is None:
            self.since = now
        return now - self.since >= self.limit_s

    def recovered(self) -> None:
        self.since = None


class LucidHook(BaseHook):
    """Submit, watch and cancel Lucid jobs through the store the `lucid_db` connection points at.

    The connection is the one the scheduling DAGs use: type `postgres` or `sqlite` (fields as usual),
    or type `lucid` with the store's SQLAlchemy URL in `extra.sqlalchemy_url` (a `lucid` connection
    without it is read as PostgreSQL fields). The hook never migrates the store: the scheduler owns it.
    """

    conn_name_attr = "lucid_conn_id"
    default_conn_name = STORE_CONN_ID
    conn_type = "lucid"
    hook_name = "Lucid GPU scheduler"

    def __init__(self, lucid_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lucid_conn_id = lucid_conn_id
        self._store: Store | None = None

    @classmethod
    def url_from_connection(cls, conn: Any) -> str:
        """The store's SQLAlchemy URL; a `lucid`-typed connection's fields are read as PostgreSQL's."""
        return sqlalchemy_url(conn)

    def store_url(self) -> str:
        return self.url_from_connection(self.get_connection(self.lucid_conn_id))

    async def astore_url(self) -> str:
        """The store URL from inside a trigger: the connection is looked up without blocking the event loop."""
        return self.url_from_connection(await self.aget_connection(self.lucid_conn_id))

    def get_conn(self) -> Store:
        """The store (opened once per hook, never migrated from here)."""
        if self._store is None:
            from lucid_core.runtime.store.store import Store

            self._store = Store(self.store_url(), migrate=False)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.dispose()
            self._store = None

    def submit_job(self, request: JobRequest) -> str:
        """Record the job (or find the one already submitted with the request's idempotency key); its id."""
        from lucid_core.runtime.surfaces.submission import submit

        return submit(self.get_conn(), request)

    def latest_job_with_key_prefix(self, user: str, prefix: str) -> Any:
        """The last job (`KeyedJob`) `user` submitted under an idempotency key starting with `prefix`, or None."""
        from lucid_core.runtime.surfaces.submission import latest_job_with_key_prefix

        return latest_job_with_key_prefix(self.get_conn(), user, prefix)

    def get_job(self, job_id: str) -> dict[str, Any]:
        """The job's status record: state, exit code, end reason, runs (lucid_core.runtime.surfaces.queries.status)."""
        from lucid_core.runtime.surfaces.queries import status

        return status(self.get_conn(), job_id)

    def cancel_job(self, job_id: str) -> str:
        """Ask the scheduler to stop the job (the next round does); its state at the time of asking."""
        from lucid_core.runtime.surfaces.submission import cancel

        return cancel(self.get_conn(), job_id, message=TASK_CANCEL_NOTE)

    def wait_for_job(self, job_id: str, *, poll_interval: float = 30.0, timeout: float | None = None,
                     store_outage_s: float = STORE_OUTAGE_S) -> dict[str, Any]:
        """Poll until the job reaches a terminal state and return its status; LucidJobTimeout past `timeout` s.

        A store that cannot be reached is read again for up to `store_outage_s` seconds before the error
        is raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = StoreOutage(store_outage_s)
        while True:
            try:
                info = self.get_job(job_id)
            except Exception as exc:
                if outage.failed(exc, time.monotonic()):
                    raise
                self.log.warning("Cannot read Lucid job %s (%s); reading again in %s s", job_id,
                                 type(exc).__name__, poll_interval)
                if deadline is not None and time.monotonic() >= deadline:
                    raise LucidJobTimeout(f"job {job_id} not known to have ended after {timeout} s "
                                          "(the store could not be read)") from exc
                time.sleep(poll_interval)
                continue
            outage.recovered()
            if is_terminal(info["state"]):
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise LucidJobTimeout(f"job {job_id} still {info['state']} after {timeout} s")
            self.log.info("Lucid job %s is %s%s", job_id, info["state"],
                          f" ({info['pending_reason']})" if info.get("pending_reason") else "")
            time.sleep(poll_interval)

    async def aget_conn(self) -> Store:
        """The store from inside a trigger: connection lookup and engine set-up stay off the event loop. It keeps
        no connection between polls: a triggerer runs every deferred wait of a sweep, and one kept connection
        each would exhaust a PostgreSQL server's (100 by default) and starve the scheduler."""
        if self._store is None:
            from lucid_core.runtime.store.store import Store

            url = await self.astore_url()
            self._store = await asyncio.to_thread(Store, url, migrate=False, pooled=False)
        return self._store

    async def aget_job(self, job_id: str) -> dict[str, Any]:
        """The job's status from a trigger: the query runs in a worker thread, not in the event loop."""
        store = await self.aget_conn()
        from lucid_core.runtime.surfaces.queries import status

        return await asyncio.to_thread(status, store, job_id)

    async def acancel_job(self, job_id: str) -> str:
        store = await self.aget_conn()
        from lucid_core.runtime.surfaces.submission import cancel

        return await asyncio.to_thread(cancel, store, job_id, message=TASK_CANCEL_NOTE)


def is_terminal(state: str) -> bool:
    """True for the states lucid_core ends a job in (COMPLETED, FAILED, CANCELLED)."""
    from lucid_core.domain import TERMINAL_STATES

    return state in {s.value for s in TERMINAL_STATES}


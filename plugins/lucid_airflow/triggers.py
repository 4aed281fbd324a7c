"""LucidJobTrigger: waits in the triggerer for a Lucid job to end, polling the store off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from lucid_airflow.connections import STORE_CONN_ID
from lucid_airflow.hooks import STORE_OUTAGE_S, LucidHook, StoreOutage, is_terminal
from lucid_core.domain import JobState


class LucidJobTrigger(BaseTrigger):
    """Fires one event when the job is COMPLETED, FAILED or CANCELLED (or when the store cannot be read).

    The event's payload: `status` ("success" only for COMPLETED, "error" otherwise), `job_id`, `state`,
    `exit_code`, `end_reason` and `message`. Each poll's query runs in a worker thread.
    """

    def __init__(self, job_id: str, lucid_conn_id: str = STORE_CONN_ID, poll_interval: float = 30.0,
                 cancel_on_kill: bool = True, deadline: float | None = None,
                 store_outage_s: float = STORE_OUTAGE_S) -> None:
        super().__init__()
        self.job_id = job_id
        self.lucid_conn_id = lucid_conn_id
        self.poll_interval = float(poll_interval)
        self.cancel_on_kill = cancel_on_kill
        # epoch seconds: past it, the wait ends with status "timeout" (the task's execution_timeout, which
        # Airflow does not enforce on a deferred task by killing anything)
        self.deadline = deadline
        # an unreachable store is read again for this long before the wait ends with the error
        self.store_outage_s = float(store_outage_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"job_id": self.job_id, "lucid_conn_id": self.lucid_conn_id, "poll_interval": self.poll_interval,
                 "cancel_on_kill": self.cancel_on_kill, "deadline": self.deadline,
                 "store_outage_s": self.store_outage_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = LucidHook(lucid_conn_id=self.lucid_conn_id)
        outage = StoreOutage(self.store_outage_s)
        try:
            while True:
                try:
                    info = await hook.aget_job(self.job_id)
                except Exception as exc:  # an unknown job, or a store unreachable too long, ends the wait
                    if outage.failed(exc, time.time()):
                        yield TriggerEvent({"status": "error", "job_id": self.job_id, "state": None,
                                            "exit_code": None, "end_reason": None,
                                            "message": f"cannot read job {self.job_id}: {exc}"})
                        return
                    self.log.warning("Cannot read Lucid job %s (%s); reading again", self.job_id,
                                     type(exc).__name__)
                    info = {"state": "unknown (store unreachable)"}
                else:
                    outage.recovered()
                if is_terminal(info["state"]):
                    yield TriggerEvent(job_event(info))
                    return
                now = time.time()
                if self.deadline is not None and now >= self.deadline:
                    yield TriggerEvent({"status": "timeout", "job_id": self.job_id, "state": info["state"],
                                        "exit_code": None, "end_reason": None,
                                        "message": f"Lucid job {self.job_id} still {info['state']} at the task's "
                                                   "execution_timeout"})
                    return
                self.log.info("Lucid job %s is %s%s", self.job_id, info["state"],
                              f" ({info['pending_reason']})" if info.get("pending_reason") else "")
                wait = self.poll_interval if self.deadline is None else min(self.poll_interval, self.deadline - now)
                await asyncio.sleep(max(0.0, wait))
        finally:
            await asyncio.to_thread(hook.close)

    async def on_kill(self) -> None:
        """The task was marked failed, marked success or cleared while deferred: stop the job too (not on triggerer
        restarts)."""
        if not self.cancel_on_kill:
            return
        hook = LucidHook(lucid_conn_id=self.lucid_conn_id)
        try:
            state = await hook.acancel_job(self.job_id)
            self.log.info("Asked Lucid to cancel job %s (was %s)", self.job_id, state)
        finally:
            await asyncio.to_thread(hook.close)


def job_event(info: dict[str, Any]) -> dict[str, Any]:
    """The event payload for a job's terminal status record."""
    completed = info["state"] == JobState.COMPLETED.value
    return {"status": "success" if completed else "error", "job_id": info["job_id"], "state": info["state"],
            "exit_code": info.get("exit_code"), "end_reason": info.get("end_reason"),
            "message": job_outcome(info)}


def job_outcome(info: dict[str, Any]) -> str:
    """One line a person can read: the job, how it ended and why (the scheduler's end reason or exit code)."""
    head = f"Lucid job {info['job_id']} {info['state']}"
    if info.get("end_reason"):
        return f"{head}: {info['end_reason']}"
    return f"{head}: exit code {info['exit_code']}" if info.get("exit_code") is not None else head

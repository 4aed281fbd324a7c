"""A job that an MPS server fault ended goes back to the queue, to run alone, instead of failing.

Under MPS a fatal GPU error of one client reaches every client of the server on that GPU: the partner of a
faulting job dies with it, and MPS does not say which client caused it (nor does the order of the ends:
a culprit may take seconds to exit). So a run of a pair that ends non-zero on its own (no stop asked for
it) within `FAULT_END_WINDOW_S` of a fault its GPU set's daemon logged while both ran goes back to the
queue, and its job may no longer share a GPU: the retry runs alone, where a culprit faults by itself and
fails as usual and a victim completes. A run that failed long after the fault failed of something else.
The log is read only then, bounded, and judged defensively (`hosts.mps`); a host that does not answer,
or a log without such a line, leaves the usual failure. A job is requeued this way at most
`MAX_FAULT_REQUEUES` times.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from lucid_core.domain import JobState, Pool
from lucid_core.runtime.hosts.executor import RunStatus
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.hosts.mps import START_FAILED, START_FAILED_WORDS
from lucid_core.runtime.round.base import RoundBase, update_unsynced
from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow

START_RETRY_EVENT = "mps_start_failed"
MAX_START_RETRIES = 3  # a job whose runs meet a daemon that will not start this often fails as usual
MAX_FAULT_REQUEUES = 1  # then it runs alone, so a second partner's fault cannot reach it
FAULT_REQUEUE_EVENT = "mps_fault_requeued"


def _failed_alone(exit_code: int | None, stop_reason: str | None) -> bool:
    """A run that ended with a non-zero exit status on its own (no stop asked for it)."""
    return exit_code is not None and exit_code != 0 and stop_reason is None


class MpsFaultChecks(RoundBase):
    """The partner-fault check of a run's end, and the requeue it leads to."""

    def _partner_fault(self, run: RunRow, status: RunStatus) -> str | None:
        """Why `run`, which just ended non-zero, goes back to the queue: its GPU set's MPS daemon logged a fault
        while it ran beside its partner, shortly before it ended. None: it ends as usual."""
        host = self._hosts.get(run.host)
        if (host is None or host.sharing != "mps" or run.pool != Pool.MAIN.value or not run.partner
                or run.started_at is None or status.state != "EXITED"
                or not _failed_alone(status.exit_code, run.stop_reason)):
            return None
        with self.store.session() as s:
            candidates = s.scalars(select(RunRow).where(
                RunRow.job_id == run.partner, RunRow.host == run.host, RunRow.kind == "main",
                RunRow.started_at.is_not(None), RunRow.run_id != run.run_id).order_by(RunRow.planned_at.desc())).all()
            user = s.scalar(select(JobRow.user).where(JobRow.job_id == run.job_id))
            requeues = s.scalar(select(func.count()).select_from(JobEventRow).where(
                JobEventRow.job_id == run.job_id, JobEventRow.kind == FAULT_REQUEUE_EVENT)) or 0
        mine = set(run.gpu_indices or [])
        # the partner's run that ran beside this one: on its GPUs, started before it ended
        other = next((o for o in candidates if mine & set(o.gpu_indices or [])
                      and (o.ended_at is None or o.ended_at >= run.started_at)), None)
        if other is None or requeues >= MAX_FAULT_REQUEUES:
            return None
        address = host_address(host)
        read = self._on_host(run.host, lambda: self.executor.mps_fault_read(
            address, run.gpu_indices, (run.run_id, other.run_id), user))
        fault = read.fault_ending(run.run_id, (run.run_id, other.run_id)) if read is not None else None
        if fault is None:
            return None
        return (f"an MPS server fault while it shared GPUs {sorted(mine)} on {run.host} with {other.job_id} ended it "
                f"(which of the two faulted MPS does not say; it retries alone; the daemon's log: "
                f"{fault.line[:300]!r})")

    def _daemon_start_failed(self, run: RunRow, status: RunStatus) -> str | None:
        """Why `run` never started its job: the MPS wrapper could not start its GPU set's control daemon (exit
        `START_FAILED` with the wrapper's line as its only stderr). That is the host's failure, not the job's:
        the job goes back to the queue and the host cools down. None: the run ended as usual."""
        host = self._hosts.get(run.host)
        if (host is None or host.sharing != "mps" or run.pool != Pool.MAIN.value or status.state != "EXITED"
                or status.exit_code != START_FAILED or run.stop_reason is not None):
            return None
        with self.store.session() as s:
            retries = s.scalar(select(func.count()).select_from(JobEventRow).where(
                JobEventRow.job_id == run.job_id, JobEventRow.kind == START_RETRY_EVENT)) or 0
        if retries >= MAX_START_RETRIES:
            return None
        address = host_address(host)
        text = self._on_host(run.host, lambda: self.executor.read(address, run.run_id, "stderr.log", 4096))
        lines = [line for line in (text or "").splitlines() if line.strip()]
        if len(lines) != 1 or not lines[0].startswith(START_FAILED_WORDS):
            return None  # the job's own exit status 97, or a host that did not answer: it ends as usual
        return lines[0][:300]

    def _requeue(self, s: Any, job: JobRow, event: str, why: str, *, alone: bool) -> bool:
        """Put the job back in the queue (its run's end is not counted as the job's failure), recording `why` as
        an `event`; `alone`: it may not share a GPU again."""
        if not self._move_job(s, job, JobState.QUEUED):
            return False
        values: dict[str, Any] = {"start_time": None, **({"no_share": True} if alone else {})}
        s.execute(update_unsynced(JobRow).where(JobRow.job_id == job.job_id).values(**values))
        self._event(s, job.job_id, event, why[:1000])
        self.report.requeued.append(job.job_id)
        return True

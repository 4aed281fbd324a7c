"""A job whose partner's fault ended it on an MPS host goes back to the queue instead of failing.

Under MPS a fatal GPU error of one client reaches every client of the server on that GPU: the partner of
a faulting job dies with it. MPS does not say which client caused it, so the order of the ends decides:
a run that ends non-zero while its partner still runs fails as usual (it ended first: the presumed
culprit); a run that ends non-zero after its partner did (or in the same round: which came first is not
known, and both go back) is requeued when its GPU set's daemon logged a fault while both ran. The log is
read only then, bounded, and judged defensively (`hosts.mps`); a host that does not answer, or a log
without such a line, leaves the usual failure. A job is requeued this way at most `MAX_FAULT_REQUEUES`
times (a job that faults its partners itself every time would otherwise come back forever).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sqlalchemy import func, select

from lucid_core.domain import JobState, Pool, RunState
from lucid_core.runtime.hosts.executor import RunStatus
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.round.base import RoundBase, update_unsynced
from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow

MAX_FAULT_REQUEUES = 2
FAULT_REQUEUE_EVENT = "mps_fault_requeued"


def _failed_alone(exit_code: int | None, stop_reason: str | None) -> bool:
    """A run that ended with a non-zero exit status on its own (no stop asked for it)."""
    return exit_code is not None and exit_code != 0 and stop_reason is None


class MpsFaultChecks(RoundBase):
    """The partner-fault check of a run's end, and the requeue it leads to."""

    # the runs this round's polls found exited, by run id (set by reconcile; none outside it)
    _exited_now: Mapping[str, RunStatus] = MappingProxyType({})

    def _partner_fault(self, run: RunRow, status: RunStatus) -> str | None:
        """Why `run`, which just ended, goes back to the queue: its partner ended non-zero before it (or in
        this round) and the GPU set's MPS daemon logged a fault while both ran. None: it ends as usual."""
        host = self._hosts.get(run.host)
        if (host is None or host.sharing != "mps" or run.pool != Pool.MAIN.value or not run.partner
                or status.state != "EXITED" or not _failed_alone(status.exit_code, run.stop_reason)):
            return None
        with self.store.session() as s:
            other = s.scalar(select(RunRow).where(
                RunRow.job_id == run.partner, RunRow.host == run.host, RunRow.kind == "main",
                RunRow.started_at.is_not(None), RunRow.run_id != run.run_id).order_by(RunRow.planned_at.desc())
                .limit(1))
            user = s.scalar(select(JobRow.user).where(JobRow.job_id == run.job_id))
            requeues = s.scalar(select(func.count()).select_from(JobEventRow).where(
                JobEventRow.job_id == run.job_id, JobEventRow.kind == FAULT_REQUEUE_EVENT)) or 0
        if other is None or sorted(other.gpu_indices or []) != sorted(run.gpu_indices or []):
            return None
        polled = self._exited_now.get(other.run_id)
        partner_failed = (_failed_alone(other.exit_code, other.stop_reason) if other.state == RunState.ENDED
                          else polled is not None and _failed_alone(polled.exit_code, other.stop_reason))
        if not partner_failed or requeues >= MAX_FAULT_REQUEUES:
            return None  # it ended first (the presumed culprit), or its partner ended well, or too many tries
        address = host_address(host)
        read = self._on_host(run.host, lambda: self.executor.mps_fault_read(
            address, run.gpu_indices, (run.run_id, other.run_id), user))
        fault = read.fault_during((run.run_id, other.run_id)) if read is not None else None
        if fault is None:
            return None
        return (f"its partner {other.job_id}'s MPS server fault ended it (run {other.run_id} failed first; the "
                f"MPS log of GPUs {sorted(run.gpu_indices)} on {run.host}: {fault.line[:300]!r})")

    def _requeue_after_fault(self, s: Any, job: JobRow, why: str) -> bool:
        """Put the job back in the queue with `why`; its run's failure is not counted as the job's."""
        if not self._move_job(s, job, JobState.QUEUED):
            return False
        s.execute(update_unsynced(JobRow).where(JobRow.job_id == job.job_id).values(start_time=None))
        self._event(s, job.job_id, FAULT_REQUEUE_EVENT, why[:1000])
        self.report.requeued.append(job.job_id)
        return True

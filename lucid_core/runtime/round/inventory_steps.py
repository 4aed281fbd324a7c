"""Round steps that change the inventory's side of runs: runs on hosts removed from it, drained hosts
deleted once empty, hosts silent too long given up on.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from lucid_core.domain import ACTIVE_RUN_STATES, JobState, RunState, left_alone
from lucid_core.runtime.round.base import (
    RoundBase,
    _log,
    update_unsynced,
)
from lucid_core.runtime.store.schema import (
    GpuRow,
    HostRow,
    JobRow,
    RunRow,
)


class HostInventorySteps(RoundBase):
    """Inventory repair steps of a round."""

    # ------------------------------------------------------------------ inventory changes
    def repair_unknown_hosts(self) -> None:
        """Runs on a host the inventory no longer has (removed while a round had placed work there): a
        planned run never started, so its job waits again; a running one cannot be reached or stopped, so
        its job fails with the reason. Either way the round goes on instead of failing on the name."""
        with self.store.session() as s:
            known = select(HostRow.name)
            orphans = list(s.scalars(select(RunRow).where(RunRow.state.in_(ACTIVE_RUN_STATES),
                                                          RunRow.host.not_in(known))))
        for run in orphans:
            with self.store.session() as s:
                ended = s.execute(update_unsynced(RunRow).where(
                    RunRow.run_id == run.run_id, RunRow.host == run.host, RunRow.state == run.state).values(
                    state=RunState.ENDED, ended_at=self.clock(),
                    outcome=f"host {run.host} was removed from the inventory "
                            + ("before launch" if run.state == RunState.PLANNED else "while it ran"))).rowcount
                job = s.get(JobRow, run.job_id)
                if not ended or job is None or left_alone(job.state):
                    continue
                if run.state == RunState.PLANNED and not job.cancel_requested:
                    back = JobState.SUBMITTED if run.kind == "profiling" and not job.profiled else JobState.QUEUED
                    if self._move_job(s, job, back, f"host {run.host} was removed before run {run.run_id} started"):
                        self.report.requeued.append(job.job_id)
                else:
                    self._end_job(s, job, JobState.FAILED, None,
                                  f"host {run.host} was removed from the inventory while run {run.run_id} ran "
                                  "there; its processes were not stopped by the scheduler", run)

    def remove_drained_hosts(self) -> None:
        """Delete hosts drained to be removed (`lucid hosts drain --remove`) once nothing of theirs is active."""
        with self.store.session() as s:
            waiting = list(s.scalars(select(HostRow).where(HostRow.remove_when_empty.is_(True))))
            for host in waiting:
                busy = s.scalar(select(RunRow.run_id).where(
                    RunRow.host == host.name, RunRow.state.in_((*ACTIVE_RUN_STATES, RunState.LOST))).limit(1))
                if busy is not None:
                    continue
                s.execute(delete(GpuRow).where(GpuRow.host == host.name))
                s.execute(delete(HostRow).where(HostRow.name == host.name))
                self.report.removed_hosts.append(host.name)
                _log.info("host %s drained and removed", host.name)

    def give_up_lost_hosts(self) -> None:
        """With `host_lost_after_s` set: end the runs of hosts silent that long (fail or requeue their jobs),
        and stop what is left of such runs on hosts that answer again before new work lands there."""
        from lucid_core.runtime.hosts.loss import LOST_RUN_STATE, mark_lost, reap_lost

        if self.settings.host_lost_after_s is None:
            return
        loss = mark_lost(self.store, self.now, self.settings.host_lost_after_s, requeue=self.settings.requeue_lost)
        for job_id in loss.failed:
            self.report.ended[job_id] = JobState.FAILED.value
        for job_id in loss.cancelled:
            self.report.ended[job_id] = JobState.CANCELLED.value
        self.report.requeued.extend(loss.requeued)
        with self.store.session() as s:
            back = s.scalar(select(RunRow.run_id).join(HostRow, HostRow.name == RunRow.host).where(
                RunRow.state == LOST_RUN_STATE, HostRow.reachable.is_(True)).limit(1))
        if back is not None:
            reap_lost(self.store, self.executor, self.now, grace_s=self.settings.stop_grace_s)

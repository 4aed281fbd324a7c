"""Hosts that never come back: their runs are marked lost after a timeout; jobs fail or are requeued.

A host unreachable for longer than `lost_after_s` (counted from when a sweep first saw it down) loses
its active runs: each becomes state ``lost`` (the process may still be alive there, so the GPU is not
trusted again until it is reaped), planned ones too (a round that died after launching one had not
recorded it). Their jobs end FAILED with the reason, or go back to the queue
when `requeue` is set. Peers of a wide job on other hosts are stopped with it.

When a lost host answers again, `reap_lost` stops whatever is left of its lost runs before any new
work lands there, and marks them ended. A scheduling round calls `mark_lost` after reconciling
and `reap_lost` before deciding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select, update

from lucid_core.domain import ACTIVE_RUN_STATES, JobState, RunState, left_alone
from lucid_core.policy.view import saved_number
from lucid_core.runtime.hosts.executor import HostCommandFailed, HostExecutor, HostUnreachable
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.store.schema import HostRow, JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store

LOST_RUN_STATE = RunState.LOST
UNREACHABLE_SINCE = "hosts_unreachable_since"


@dataclass
class LossReport:
    """What one sweep did: lost run ids, jobs failed, cancelled (their cancel was pending), requeued, lost runs
    reaped on return."""

    lost_runs: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)


def lost_hosts(store: Store, now: float, lost_after_s: float) -> dict[str, float]:
    """Unreachable hosts silent for longer than `lost_after_s`: name -> seconds since first seen down.

    When a host was first seen down is kept in the scheduler state (key UNREACHABLE_SINCE), since
    `last_seen` only moves when a host has work to poll and so says little about when it went away.
    """
    with store.session() as s:
        down = set(s.scalars(select(HostRow.name).where(HostRow.reachable.is_(False))))
    saved = store.get_state(UNREACHABLE_SINCE)
    # another controller may have written it: only finite times not after now count (a time in the future
    # would keep a dead host's jobs running for ever); a host with none counts from now
    since = ({h: float(t) for h, t in saved.items() if h in down and saved_number(t) and t <= now}
             if isinstance(saved, dict) else {})
    since.update({h: now for h in down if h not in since})
    store.set_state(UNREACHABLE_SINCE, since)
    return {name: now - t for name, t in since.items() if now - t > lost_after_s}


def mark_lost(store: Store, now: float, lost_after_s: float, *, requeue: bool = False) -> LossReport:
    """End the active runs of hosts gone for longer than `lost_after_s`; fail or requeue their jobs."""
    report = LossReport()
    gone = lost_hosts(store, now, lost_after_s)
    if not gone:
        return report
    with store.session() as s:
        runs = list(s.scalars(select(RunRow).where(RunRow.host.in_(list(gone)),
                                                   RunRow.state.in_(ACTIVE_RUN_STATES))))
        for run in runs:
            why = f"host {run.host} unreachable for {gone[run.host]:.0f} s (lost after {lost_after_s:g} s)"
            # a planned run too: a round that died between its launch and its record may have started it
            # there, so it is reaped (stopped, or found never started) when the host answers, like a running one
            run.state, run.ended_at, run.outcome = LOST_RUN_STATE, now, f"lost: {why}"[:1000]
            report.lost_runs.append(run.run_id)
            s.execute(update(RunRow).where(RunRow.run_id == run.run_id, RunRow.host.not_in(list(gone)),
                                           RunRow.state == RunState.RUNNING).values(stop_reason="peer_ended")
                      .execution_options(synchronize_session=False))
            s.execute(update(RunRow).where(RunRow.run_id == run.run_id, RunRow.state == RunState.PLANNED)
                      .values(state=LOST_RUN_STATE, ended_at=now, outcome="peer lost before launch")
                      .execution_options(synchronize_session=False))
            job = s.get(JobRow, run.job_id)
            if job is None or left_alone(job.state) or job.job_id in report.requeued:
                continue
            s.add(JobEventRow(job_id=job.job_id, time=now, kind="lost", message=f"run {run.run_id}: {why}"))
            if job.cancel_requested:  # it was being cancelled: that is how it ends, its host lost or not
                job.state, job.end_time, job.exit_code = JobState.CANCELLED.value, now, None
                job.end_reason = f"cancelled; its run was lost: {why}"[:1000]
                job.pending_reason = job.queue_position = None
                report.cancelled.append(job.job_id)
                s.add(JobEventRow(job_id=job.job_id, time=now, kind="cancelled", message=f"lost: {why}"))
            elif requeue:
                job.state = (JobState.SUBMITTED if run.kind == "profiling" and not job.profiled
                             else JobState.QUEUED).value
                job.start_time = None
                report.requeued.append(job.job_id)
                s.add(JobEventRow(job_id=job.job_id, time=now, kind="requeued",
                                  message="back in the queue after its host was lost"))
            else:
                job.state, job.end_time, job.exit_code = JobState.FAILED.value, now, None
                job.end_reason = f"lost: {why}"
                job.pending_reason = job.queue_position = None
                report.failed.append(job.job_id)
                s.add(JobEventRow(job_id=job.job_id, time=now, kind="failed", message=f"lost: {why}"))
    return report


def reap_lost(store: Store, executor: HostExecutor, now: float, grace_s: float = 5.0) -> LossReport:
    """On hosts that answer again, stop what is left of their lost runs and mark those runs ended."""
    report = LossReport()
    with store.session() as s:
        runs = list(s.scalars(select(RunRow).where(RunRow.state == LOST_RUN_STATE)))
        hosts = {h.name: h for h in s.scalars(select(HostRow))}
    still_gone: set[str] = set()
    for run in runs:
        host = hosts.get(run.host)
        if host is None or run.host in still_gone:
            continue
        try:
            status = executor.stop(host_address(host), run.run_id, "lost", grace_s)
        except HostUnreachable:
            still_gone.add(run.host)  # keep its runs lost (the GPUs stay held); try again next time
            continue
        except HostCommandFailed:  # this run's stop answered garbage: it stays lost, tried again next time
            continue
        if status.state == "UNREADABLE":
            continue
        with store.session() as s:
            row = s.get(RunRow, (run.run_id, run.host))
            if row is not None and row.state == LOST_RUN_STATE:
                row.state = RunState.ENDED
                row.exit_code = status.exit_code
                row.outcome = f"{row.outcome}; reaped when the host returned ({status.state})"[:1000]
                s.execute(update(HostRow).where(HostRow.name == run.host).values(reachable=True, last_seen=now)
                          .execution_options(synchronize_session=False))
        report.reaped.append(run.run_id)
    return report

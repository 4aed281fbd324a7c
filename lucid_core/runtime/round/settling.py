"""Round steps that read what hosts say about runs and settle their ends: polls, sweeps of leftovers,
checked records, and each job's fate once its run ended (one terminal state, compare-and-set).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select

from lucid_core.domain import ACTIVE_RUN_STATES, PROFILING_END_SLACK_S, JobState, RunState, left_alone
from lucid_core.policy.view import saved_float, saved_indices, saved_number, saved_time_limit
from lucid_core.runtime.hosts.executor import (
    HostCommandFailed,
    HostUnreachable,
    RunStatus,
)
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.round.base import (
    TERMINAL_VALUES,
    call_value,
    cancelled_reason,
    pair_results,
    update_unsynced,
)
from lucid_core.runtime.round.mps_faults import FAULT_REQUEUE_EVENT, START_RETRY_EVENT, MpsFaultChecks
from lucid_core.runtime.round.time_limits import TIME_LIMIT_STOP, TimeLimitSteps, time_limit_words
from lucid_core.runtime.store.schema import (
    HostRow,
    JobRow,
    RunRow,
)

UNREADABLE_STOP = "unreadable"  # the stop reason of a run stopped because its status stayed unreadable
STOPPED_OUTCOME = "stopped"  # how the outcome of every run that ended of a stop begins


def unreadable_since(stored: Any, now: float) -> float:
    """When a run's unreadable streak began: the stored time where it is a finite time not after `now`
    (another controller or a hand edit may have written anything), else now."""
    return float(stored) if saved_number(stored) and stored <= now else now


def ended_at(run: RunRow, status: RunStatus, answered_at: float, floor: float | None) -> float:
    """When a run ended: when its host answered, less how long before that the host says its exit record was
    written (a round reads an end up to its interval late, which inflated every job's run time and the durations
    the models learn). Never before the run started, nor before `floor` (the previous round's start, when the run
    was still running): the record's time is a file's, which a job on an account host can set, and a job may
    not make itself look shorter than what a round could have seen."""
    if status.state != "EXITED" or status.ended_ago_s is None:
        return answered_at
    bounds = [b for b in (saved_float(run.started_at), floor) if b is not None and b <= answered_at]
    return max(answered_at - status.ended_ago_s, *bounds)


class SettlingSteps(MpsFaultChecks, TimeLimitSteps):
    """Poll and settle steps of a round."""

    # ---------------------------------------------------------------------------- reconcile
    def reconcile(self) -> None:
        """Poll every host with active runs; end what ended; collect telemetry; honour cancels."""
        now = self.now
        with self.store.session() as s:
            runs = list(s.scalars(select(RunRow).where(RunRow.state == RunState.RUNNING)))
        by_host: dict[str, list[RunRow]] = {}
        for run in runs:
            by_host.setdefault(run.host, []).append(run)
        self.keep_lease()  # polls read only: renew first when a quarter of the TTL has passed
        idle_due = self._idle_probes_due(by_host)
        polls = self._fan_out({name: [self._poll_call(host, by_host.get(name, []))]
                               for name, host in self._hosts.items()
                               if by_host.get(name) or not host.reachable or name in idle_due}, reads=True)
        seen: list[tuple[RunRow, RunStatus]] = []
        for name, (result,) in polls.items():
            if isinstance(result.error, HostUnreachable):
                self._host_failed(name, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # garbled answer: judge this host's runs next round
                self.report.errors.append(str(result.error))
                if not by_host.get(name):  # an idle host's probe: it answered, so it is not probed first again
                    self._host_seen(name)
                continue
            statuses = call_value(result)
            self._host_seen(name)
            seen.extend((run, statuses[run.run_id]) for run in by_host.get(name, []) if run.run_id in statuses)
        answered_at = self.clock()  # the polls' answers are in: what a host said of an end is as of then
        swept = self._sweep_leftovers([run for run, status in seen
                                       if status.state == "EXITED" and run.stop_reason is None])
        for run, status in seen:
            self._judge(run, status, now, swept.get((run.run_id, run.host)), answered_at)
        self.hold_time_limits(answered_at)
        self._cancel_requested()
        self.collect_due_profiles(now)

    def _judge(self, run: RunRow, status: RunStatus, now: float, sweep: RunStatus | None,
               answered_at: float | None = None) -> None:
        """Act on one run's polled status (`sweep`: the leftover sweep of a run that ended on its own). Its
        records are the host's and, on account hosts, within reach of jobs: whatever they hold, only this run
        is affected, never the round."""
        if status.state == "UNREADABLE":
            self._unreadable(run, status, now)
            return
        self._readable_again(run)
        self._note_tampering(run, status)
        if status.state == "RUNNING":
            return  # profiles of windows that ended are collected after reconcile
        if status.state == "NOPID":  # a run asked to stop (a launch that went unanswered) waits for its stop
            if run.stop_reason is None and now - run.planned_at > self.settings.launch_grace_s:
                self._launch_failed(run, "wrapper never started on the host")
            return
        if status.state == "EXITED" and run.stop_reason is None and sweep is not None and sweep.state == "EXITED":
            status = replace(status, escaped=sweep.escaped)
        self._settle(run, status, answered_at)

    def _unreadable(self, run: RunRow, status: RunStatus, now: float) -> None:
        """A run whose status line the host garbled: named in the report and the job's events (once), and
        judged again next round. Once it has read so for `unreadable_stop_after_s` the run is stopped (its
        job then fails): a record the round cannot read must not hold GPUs for ever. A cancel reaches it
        sooner through the stop, which needs no status."""
        why = f"run {run.run_id} on host {run.host}: unreadable status {status.detail!r}"
        self.report.errors.append(f"job {run.job_id}: {why}")
        self._event_once(run.job_id, "run_unreadable", why)
        since = unreadable_since(run.unreadable_since, now)
        limit = self.settings.unreadable_stop_after_s
        stop = limit is not None and now - since >= limit and run.stop_reason is None
        if since == run.unreadable_since and not stop:
            return
        with self.store.session() as s:
            values: dict[str, Any] = {"unreadable_since": since}
            if stop:
                values["stop_reason"] = UNREADABLE_STOP
            where = [RunRow.run_id == run.run_id, RunRow.host == run.host, RunRow.state == RunState.RUNNING]
            if stop:
                where.append(RunRow.stop_reason.is_(None))  # a cancel or a yield that came first stands
            changed = s.execute(update_unsynced(RunRow).where(*where).values(**values)).rowcount
            if stop and changed:
                self._event(s, run.job_id, "stopping", f"run {run.run_id} on host {run.host}: its status has been "
                            f"unreadable for {now - since:.0f} s (runtime.unreadable_stop_after_s {limit:g}); "
                            "stopping it, the job fails")

    def _readable_again(self, run: RunRow) -> None:
        """A run whose status reads again after reading as garbage: its count of unreadable time starts over."""
        if run.unreadable_since is None:
            return
        with self.store.session() as s:
            s.execute(update_unsynced(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host)
                      .values(unreadable_since=None))

    def _note_tampering(self, run: RunRow, status: RunStatus) -> None:
        """Record (once per run and record) that a run's pid or exit-code file failed its check on the host:
        the host judged the run by what the kernel says instead, so nothing else follows from it."""
        if not status.tampered:
            return
        what = " and ".join({"pid": "its pid file named another process",
                             "exit_code": "its exit-code file was not written by its wrapper",
                             "records": "its control directory was removed while it ran"}[t]
                            for t in status.tampered)
        self._event_once(run.job_id, "records_tampered",
                         f"run {run.run_id} on host {run.host}: {what}; the file was not believed")

    def _idle_probes_due(self, busy: dict[str, list[RunRow]]) -> set[str]:
        """Idle hosts to probe: reachable, not draining, not heard from in `idle_probe_s`, so that one that died
        while idle reads unreachable (pages, metrics, alerts) and gets no work before work is placed there. At
        most `host_parallelism` a round, those heard from longest ago first: a fleet gone idle at once spreads."""
        every = self.settings.idle_probe_s
        if every is None:
            return set()

        def heard(host: HostRow) -> float:  # a time in the future or no time at all: never heard from
            seen = host.last_seen
            return float(seen) if saved_number(seen) and seen <= self.now else -math.inf

        due = sorted((h for name, h in self._hosts.items() if not busy.get(name) and h.reachable and not h.draining
                      and self.now - heard(h) >= every), key=heard)
        return {h.name for h in due[: self.settings.host_parallelism]}

    def _poll_call(self, host: HostRow, runs: list[RunRow]) -> Callable[[], dict[str, RunStatus]]:
        """The reconcile call for one host: poll its running runs, or probe it when idle."""
        address, run_ids = host_address(host), [r.run_id for r in runs]
        if run_ids:
            return lambda: self.executor.poll(address, run_ids)

        def probe() -> dict[str, RunStatus]:  # idle: unreachable last time, or not heard from for a while
            try:
                self.executor.probe(address)
            except (HostUnreachable, HostCommandFailed):
                raise
            except Exception as exc:  # whatever else a probe meets is this host's alone, never the round's
                raise HostCommandFailed(f"host {host.name}: probe failed: {type(exc).__name__}: {exc}") from exc
            return {}

        return probe

    def _sweep_leftovers(self, runs: list[RunRow]) -> dict[tuple[str, str], RunStatus]:
        """A run that ended on its own may leave processes behind (a daemon it started, workers that
        left its group) holding GPU memory the next job needs: the stop script, run on an ended run,
        kills only what still carries the run's marker. Returns the sweeps that answered, per (run, host);
        for the others the poll's status stands."""
        if not runs:
            return {}
        self.renew_lease()
        grace = self.settings.stop_grace_s
        batches: dict[str, list[Callable[[], RunStatus]]] = {}
        for run in runs:
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(lambda a=address, r=run: self.executor.stop(a, r.run_id, "ended",
                                                                                               grace))
        swept = {}
        for run, result in pair_results(runs, self._fan_out(batches, extra_s=grace)):
            value = self._answer(run.host, result)
            if value is not None:
                swept[(run.run_id, run.host)] = value
        return swept

    def _settle(self, run: RunRow, status: RunStatus, answered_at: float | None = None) -> None:
        """A run ended (on its own or stopped): record it and decide the job's fate. `answered_at`: when its host's
        answer came (default now)."""
        if status.state not in {"EXITED", "VANISHED", "MISSING"}:
            return
        fault = self._partner_fault(run, status)  # a host read, only for a failed run of an MPS pair
        no_daemon = None if fault is not None else self._daemon_start_failed(run, status)  # only for exit 97 there
        ended = ended_at(run, status, self.clock() if answered_at is None else answered_at, self.previous_start)
        # asked to stop, and the host never ran it (a launch that went unanswered): the stop is as good as done
        never_ran = run.stop_reason is not None and status.state == "MISSING" and run.started_at is None
        stopped = (status.stop_requested and run.stop_reason is not None) or never_ran
        by_peer = not stopped and self._ended_after_a_peers_stop(run, status)
        stopped = stopped or by_peer
        if by_peer:
            code = "no exit code" if status.exit_code is None else f"code {status.exit_code}"
            outcome = (f"stopped: it ended on its own ({code}) after the stop of another node of its run, before "
                       "its own stop reached it")
        elif status.state == "MISSING":
            outcome = ("not launched: its host never started it (its launch had gone unanswered)" if never_ran
                       else "run directory vanished from the host")
        elif status.state == "VANISHED":
            outcome = STOPPED_OUTCOME if stopped else "process vanished without an exit code"
            if status.detail:
                outcome += f" (its status could not be read: {status.detail!r})"
            if "exit_code" in status.tampered and not stopped:
                outcome += " (an exit-code file it left was not written by its wrapper and was not believed)"
        else:
            outcome = STOPPED_OUTCOME if stopped else f"exited with code {status.exit_code}"
            if status.disk_full and not stopped:
                outcome += f"; the disk of host {run.host} was full when it ended: its log may be cut short"
        if status.escaped and run.stop_reason is None:
            outcome += (f"; {status.escaped} of its processes outlived it (they had left its process group) "
                        "and were killed")
        elif status.escaped:
            outcome += f"; the stop also killed {status.escaped} of its processes that had left its process group"
        if fault is not None:
            outcome += f"; requeued: {fault}"
        elif no_daemon is not None:
            outcome = f"the job never started: {no_daemon}; requeued, host {run.host} cools down"
            self._cool_down(run.host, no_daemon)
        with self.store.session() as s:
            row = s.get(RunRow, (run.run_id, run.host))
            if row is None or row.state == RunState.ENDED:
                return
            row.state, row.ended_at, row.exit_code, row.outcome = RunState.ENDED, ended, status.exit_code, outcome
            s.flush()
            self._settled.add((run.run_id, run.host))
            still = s.scalar(select(RunRow.host).where(RunRow.run_id == run.run_id,
                                                       RunRow.state.in_(ACTIVE_RUN_STATES)).limit(1))
            job = s.get(JobRow, run.job_id)
            if job is None or left_alone(job.state):
                return
            ended = self._last_node_end(s, run, job, ended)
            if still is not None and not stopped:
                # a wide job: other nodes still run. Success waits for them; a failure fails the
                # job now and takes the other nodes down with it.
                if status.state == "EXITED" and status.exit_code == 0:
                    return
                s.execute(update_unsynced(RunRow).where(RunRow.run_id == run.run_id, RunRow.state == RunState.RUNNING)
                          .values(stop_reason="peer_ended"))
                self._end_job(s, job, JobState.FAILED, status.exit_code,
                              f"node {run.host} (rank {run.node_rank}): {outcome}", run, at=ended)
                return
            if stopped or run.stop_reason == "peer_ended":
                reason = run.stop_reason
                if reason == "cancel":
                    self._end_job(s, job, JobState.CANCELLED, None, cancelled_reason(s, job.job_id), run,
                                  at=ended)
                elif reason == "peer_ended":
                    return  # the peer that ended first decided the job's fate
                elif reason == TIME_LIMIT_STOP:
                    limit = saved_time_limit(job.time_limit_s)
                    words = time_limit_words(limit) if limit is not None else "its time limit"
                    self._end_job(s, job, JobState.FAILED, None, f"stopped: it ran past {words}; {outcome}", run,
                                  at=ended)
                elif reason == UNREADABLE_STOP:
                    self._end_job(s, job, JobState.FAILED, None, "stopped: its status on host "
                                  f"{run.host} could not be read for runtime.unreadable_stop_after_s; {outcome}", run,
                                  at=ended)
                else:
                    self._event(s, job.job_id, "stopped", f"{run.kind} run {run.run_id} stopped ({reason})")
                return
            if status.state == "EXITED" and status.exit_code == 0:
                self._end_job(s, job, JobState.COMPLETED, 0, outcome, run, at=ended)
            elif fault is not None:
                self._requeue(s, job, FAULT_REQUEUE_EVENT, fault, alone=True)
            elif no_daemon is not None:
                self._requeue(s, job, START_RETRY_EVENT, f"on {run.host}: {no_daemon}", alone=False)
            else:
                self._end_job(s, job, JobState.FAILED, status.exit_code, outcome, run, at=ended)

    def _last_node_end(self, s: Any, run: RunRow, job: JobRow, ended: float) -> float:
        """A wide job ends with its last node: the latest end among its run's nodes, whatever order they were read
        in (`ended`, this node's, for a job on one host)."""
        if not isinstance(job.gpus, int) or job.gpus <= len(saved_indices(run.gpu_indices)):
            return ended
        last = saved_float(s.scalar(select(func.max(RunRow.ended_at)).where(RunRow.run_id == run.run_id)))
        return max(ended, last) if last is not None and last <= self.clock() else ended

    def _ended_after_a_peers_stop(self, run: RunRow, status: RunStatus) -> bool:
        """A node of a wide run the round is stopping (a yield, a profiling window's end) that ended before its
        own stop reached it, while another node of the run was stopped: a distributed job's rank ends, often
        with an error, once its peer is gone. It ended of the stop, not of a failure of the job's own."""
        if run.stop_reason in (None, "peer_ended") or status.state not in {"EXITED", "VANISHED"}:
            return False
        with self.store.session() as s:
            peer = s.scalar(select(RunRow.host).where(
                RunRow.run_id == run.run_id, RunRow.host != run.host, RunRow.state == RunState.ENDED,
                RunRow.outcome.startswith(STOPPED_OUTCOME)).limit(1))
        return peer is not None

    def _end_job(self, s: Any, job: JobRow, state: JobState, exit_code: int | None, why: str, run: RunRow,
                 at: float | None = None) -> bool:
        """Move a job to a terminal state once (compare-and-set: only from a state that is not terminal), as of
        `at` (when its run ended; default now); False, with a logged conflict, when another writer ended it first."""
        now = self.clock() if at is None else at
        ran = run.started_at is not None
        in_window = ran and (run.kind == "profiling" or (run.profiling_until is not None
                                                           and now <= run.profiling_until + PROFILING_END_SLACK_S))
        in_profiling = in_window and state is not JobState.CANCELLED
        ended = s.execute(update_unsynced(JobRow)
            .where(JobRow.job_id == job.job_id, JobRow.state.not_in(TERMINAL_VALUES))
                          .values(state=state.value, end_time=now, exit_code=exit_code, end_reason=why,
                                  ended_in_profiling=in_profiling, pending_reason=None, queue_position=None)).rowcount
        if not ended:
            self._conflict(job.job_id, f"ending it as {state.value}: it had already ended")
            return False
        s.expire(job)
        where = " inside its profiling window" if in_profiling else ""
        self._event(s, job.job_id, state.value.lower(), f"{why}{where}")
        self.report.ended[job.job_id] = state.value
        return True

    def _move_job(self, s: Any, job: JobRow, state: JobState, why: str | None = None,
                  expect: tuple[str, ...] | None = None) -> bool:
        """Compare-and-set a job's state: from `expect` (default: any state that is not terminal) to `state`."""
        allowed = JobRow.state.in_(expect) if expect is not None else JobRow.state.not_in(TERMINAL_VALUES)
        moved = s.execute(update_unsynced(JobRow).where(JobRow.job_id == job.job_id, allowed)
                          .values(state=state.value)).rowcount
        if not moved:
            self._conflict(job.job_id, f"moving it to {state.value}: its state changed meanwhile")
            return False
        s.expire(job)
        if why:
            self._event(s, job.job_id, state.value.lower(), why)
        return True

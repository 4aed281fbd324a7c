"""Round steps that carry out planned work on hosts: launching planned runs (first nodes, then the
other nodes of wide jobs), stopping runs that have a stop reason, and what a refused launch means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import distinct, func, select

from lucid_core.domain import ACTIVE_RUN_STATES, TERMINAL_STATES, JobState, RunState, left_alone
from lucid_core.runtime.hosts.calls import CallResult
from lucid_core.runtime.hosts.executor import (
    HostCommandFailed,
    HostUnreachable,
    LaunchConflict,
    LaunchResult,
    RunAsRefused,
    RunStatus,
)
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.round.base import (
    TERMINAL_VALUES,
    _log,
    call_value,
    cancelled_reason,
    pair_results,
    update_unsynced,
)
from lucid_core.runtime.round.ended_runs import EndedRunSteps
from lucid_core.runtime.round.launch_specs import LaunchSpecSteps
from lucid_core.runtime.store import lease
from lucid_core.runtime.store.schema import DecisionRow, JobRow, RunRow


class LaunchSteps(EndedRunSteps, LaunchSpecSteps):
    """Launch and stop steps of a round."""

    # ------------------------------------------------------------------ carry out pending rows
    def carry_out_pending(self) -> None:
        """Launch planned runs and stop runs that have a stop reason; mark decisions done."""
        with self.store.session() as s:
            planned = list(s.scalars(select(RunRow).where(RunRow.state == RunState.PLANNED)
                                     .order_by(RunRow.planned_at, RunRow.node_rank)))
        stopping = self._stopping()
        down = self._stop_runs(stopping, "stop")
        still_stopping = {r.job_id for r in stopping if r.host in down}
        # first nodes first: a run whose first node is refused never starts its others (wide jobs only)
        for wave in ([r for r in planned if r.node_rank == 0], [r for r in planned if r.node_rank != 0]):
            launches: list[RunRow] = []
            batches: dict[str, list[Callable[[], LaunchResult]]] = {}
            for run in wave:
                if run.host in down or run.job_id in still_stopping:
                    continue  # never start a job again while its previous run may still be alive
                with self.store.session() as s:
                    job = s.get(JobRow, run.job_id)
                    still_planned = s.scalar(select(RunRow.state).where(
                        RunRow.run_id == run.run_id, RunRow.host == run.host)) == RunState.PLANNED
                if not still_planned:
                    continue  # another node's launch failed this round and ended this one: nothing of it may start
                if job is None or left_alone(job.state) or job.cancel_requested:
                    ended = job is not None and left_alone(job.state)
                    self._abandon_planned(run, f"not launched: its job is {job.state}" if ended and job
                                          else "job cancelled before launch")
                    continue
                try:
                    address, spec = host_address(self._hosts[run.host]), self._launch_spec(run, job)
                except (TypeError, ValueError) as exc:  # its stored env is not a mapping of names: this job alone
                    self.report.errors.append(f"launch {run.run_id} on {run.host}: {exc}")
                    self._launch_failed(run, f"its stored launch settings cannot be read: {exc}", final=True)
                    continue
                launches.append(run)
                batches.setdefault(run.host, []).append(lambda a=address, sp=spec: self.executor.launch(a, sp))
            if not launches:
                continue
            self.renew_lease()  # a round that lost its lease launches nothing
            first_tries = self._mark_launch_tried(launches)
            results = pair_results(launches, self._fan_out(batches))
            self._crash("after_launch")  # the hosts run them, the store does not know yet
            # record what started before handling refusals: a refusal ends the other nodes of its run
            try:
                for run, outcome in [*[r for r in results if r[1].ok], *[r for r in results if not r[1].ok]]:
                    self._apply_launch(run, outcome, down, first_tries)
            except lease.Fenced:  # lost the lease between renewing it and the launches reaching their hosts
                for run, outcome in results:
                    if outcome.ok and outcome.value is not None and not outcome.value.already_launched:
                        self._undo_stale_launch(run)
                raise
        self._close_decisions()

    def _undo_stale_launch(self, run: RunRow) -> None:
        """This round lost its lease between renewing it and its launch reaching the host: when the new holder
        no longer expects the run (it ended it before launch), stop it, so no run lives that the store does not
        know; a run still planned is the new holder's to launch (the host answers already_launched)."""
        with self.raw_store.session() as s:
            state = s.scalar(select(RunRow.state).where(RunRow.run_id == run.run_id, RunRow.host == run.host))
        if state in ACTIVE_RUN_STATES:
            return
        _log.warning("round %s: run %s reached %s after the lease was lost (store: %s); stopping it",
                     self.report.round_id, run.run_id, run.host, state or "no row")
        self._on_host(run.host, lambda: self.executor.stop(host_address(self._hosts[run.host]), run.run_id,
                                                           "fenced", self.settings.stop_grace_s))

    def _mark_launch_tried(self, runs: list[RunRow]) -> set[tuple[str, str]]:
        """Record that these runs' launches are about to be sent; returns the (run id, host) never tried before."""
        first: set[tuple[str, str]] = set()
        with self.store.session() as s:
            for run in (r for r in runs if r.launch_untried):  # the update's condition, in SQL, decides
                if s.execute(update_unsynced(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host,
                             RunRow.launch_untried.is_(True)).values(launch_untried=False)).rowcount:
                    first.add((run.run_id, run.host))
        return first

    def _apply_launch(self, run: RunRow, outcome: CallResult[LaunchResult], down: set[str],
                      first_tries: set[tuple[str, str]]) -> None:
        """Record one launch's outcome in the store: started, host down, or refused. A host down keeps the run
        planned (it may have started there), unless this first try never reached the host: then it ends."""
        error = outcome.error
        if isinstance(error, HostUnreachable):
            down.add(run.host)
            self._host_failed(run.host, error)
            if not error.reached and (run.run_id, run.host) in first_tries:  # certainly nothing started there
                self._launch_failed(run, f"host {run.host} did not answer its launch: {error}", unreached=True)
                down.update(self._stop_started_peers(run.run_id))
            return
        if isinstance(error, LaunchConflict):  # the host's ledger says the store was behind: requeue, no cool-down
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._launch_failed(run, str(error), conflict=True)
            down.update(self._stop_started_peers(run.run_id))
            if error.holder is not None:
                self._stop_run_the_store_ended(run.host, error.holder)
            return
        if isinstance(error, RunAsRefused):  # the job's user cannot run there: no retry, the host stays in use
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._launch_failed(run, str(error), final=True)
            down.update(self._stop_started_peers(run.run_id))
            return
        if error is not None:
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._cool_down(run.host, str(error))
            self._launch_failed(run, str(error))
            down.update(self._stop_started_peers(run.run_id))
            return
        result = outcome.value
        assert result is not None
        now = self.clock()
        values: dict[str, Any] = {"state": RunState.RUNNING, "pid": result.pid, "started_at": now}
        if run.profiling_until is not None and not result.already_launched:
            # the window is the job's: it counts from the launch, not from when it was planned
            values["profiling_until"] = now + (run.profiling_until - run.planned_at)
        with self.store.session() as s:
            s.execute(update_unsynced(RunRow)
                .where(RunRow.run_id == run.run_id, RunRow.host == run.host).values(**values))
            row = s.get(JobRow, run.job_id)
            if row is not None and run.node_rank == 0:
                row.start_time = now  # start of the job's current run
            self._event(s, run.job_id, "launched", f"{run.kind} run {run.run_id} on {run.host} "
                        f"GPUs {run.gpu_indices} pid {result.pid}"
                        + (" (already running: relaunch skipped)" if result.already_launched else ""))
        if not result.already_launched:
            self.report.launched.append(run.run_id)

    def _close_decisions(self) -> None:
        with self.store.session() as s:
            open_ids = set(s.scalars(select(RunRow.decision_id).where(
                RunRow.decision_id.is_not(None), RunRow.state == RunState.PLANNED)))
            for decision in s.scalars(select(DecisionRow).where(DecisionRow.status == "pending")):
                if decision.id not in open_ids and decision.kind in {"StartProfiling", "Place"}:
                    decision.status, decision.executed_at = "done", self.clock()
                elif decision.kind in {"StopProfiling", "Preempt"}:
                    busy = s.scalar(select(RunRow.run_id).where(
                        RunRow.job_id == decision.job_id, RunRow.state == RunState.RUNNING,
                        RunRow.stop_reason.is_not(None)).limit(1))
                    if busy is None:
                        decision.status, decision.executed_at = "done", self.clock()

    @staticmethod
    def _untried(s: Any, where: Any) -> set[tuple[str, str]]:
        """(run id, host) of the planned runs `where` holds whose launch was never sent, decided in SQL: text or
        a number a hand edit left in the flag reads as sent there (SQLAlchemy would read 'false' as true)."""
        return {(run_id, host) for run_id, host in s.execute(select(RunRow.run_id, RunRow.host).where(
            where, RunRow.state == RunState.PLANNED, RunRow.launch_untried.is_(True)))}

    def _abandon_planned(self, run: RunRow, why: str) -> None:
        """End a planned run of a job that ended or was cancelled. A round that died between a launch and
        its record may have started it: stop it on its host first (MISSING when it never started); a host
        that does not answer keeps the run planned for a later round. A launch never sent needs no stop."""
        host = self._hosts.get(run.host)
        with self.store.session() as s:
            sent = not self._untried(s, (RunRow.run_id == run.run_id) & (RunRow.host == run.host))
        if host is not None and sent:
            self.renew_lease()
            status = self._on_host(run.host, lambda: self.executor.stop(host_address(host), run.run_id, "cancel",
                                                                        self.settings.stop_grace_s))
            if status is None:
                return
            if status.state != "MISSING":
                self._abandon(run, f"stopped ({status.state}), as a round that died had launched it: {why}")
                return
        self._abandon(run, why)

    def _abandon(self, run: RunRow, why: str) -> None:
        with self.store.session() as s:
            s.execute(update_unsynced(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host).values(
                state=RunState.ENDED, ended_at=self.clock(), outcome=why))

    def _launch_failed(self, run: RunRow, why: str, final: bool = False, conflict: bool = False,
                       unreached: bool = False) -> None:
        """The host refused the launch: end the run and put the job back where it waits (or fail it when
        `final`: trying again cannot help). A `conflict` (the host's ledger of live runs refused it) ends
        the run with outcome 'conflict: ...', one `unreached` (its host never answered the first try) with
        'not launched: ...'; neither counts as one of the job's launch failures.

        Other nodes of a wide job that did start, or whose launch went out unanswered (planned, tried: they may
        run), are only marked for a stop (`peer_ended`): they count as ended once the stop has reached their
        host, so a requeued job never runs beside its old copy.
        """
        with self.store.session() as s:
            untried = self._untried(s, RunRow.run_id == run.run_id)
            for peer in s.scalars(select(RunRow).where(RunRow.run_id == run.run_id)):
                maybe_started = peer.state == RunState.PLANNED and (peer.run_id, peer.host) not in untried
                if peer.host != run.host and (peer.state == RunState.RUNNING or maybe_started):
                    peer.state, peer.stop_reason = RunState.RUNNING, peer.stop_reason or "peer_ended"
                elif peer.state in ACTIVE_RUN_STATES:
                    peer.state, peer.ended_at = RunState.ENDED, self.clock()
                    word = "conflict" if conflict else "not launched" if unreached else "launch failed"
                    peer.outcome = f"{word}: {why}"[:1000]
            s.flush()
            failures = s.scalar(select(func.count(distinct(RunRow.run_id))).where(  # tries, not nodes
                RunRow.job_id == run.job_id, RunRow.outcome.like("launch failed%"))) or 0
            job = s.get(JobRow, run.job_id)
            if job is None or left_alone(job.state):
                return
            self._event(s, job.job_id, "launch_conflict" if conflict else "not_launched" if unreached
                        else "launch_failed", why[:1000])
            if conflict or unreached:
                failures = 0
            if conflict:
                other = s.scalar(select(RunRow.run_id).where(RunRow.job_id == run.job_id, RunRow.run_id != run.run_id,
                                                             RunRow.state.in_(ACTIVE_RUN_STATES)).limit(1))
                if other is not None:
                    return  # the job runs (or is about to) as another run: that one decides its fate
            if final:
                self._end_job(s, job, JobState.FAILED, None, why[:1000], run)
                return
            if failures >= self.settings.max_launch_failures:
                self._end_job(s, job, JobState.FAILED, None,
                              f"could not be launched ({failures} tries); last error: {why[:500]}", run)
                return
            back = JobState.SUBMITTED if run.kind == "profiling" and not job.profiled else JobState.QUEUED
            if not self._move_job(s, job, back):
                return
        self.report.requeued.append(run.job_id)

    def _stop_started_peers(self, run_id: str) -> set[str]:
        """Stop now (TERM, grace, KILL) the nodes of `run_id` that a failed launch marked `peer_ended`; returns
        the hosts that did not answer (their nodes stay running with the stop reason: later rounds retry)."""
        with self.store.session() as s:
            peers = list(s.scalars(select(RunRow).where(RunRow.run_id == run_id, RunRow.state == RunState.RUNNING,
                                                        RunRow.stop_reason.is_not(None))))
        return self._stop_runs(peers, "peer_ended")

    def _stop_runs(self, runs: list[RunRow], default_reason: str) -> set[str]:
        """Stop each run on its host (TERM, grace, KILL) and settle it; returns the hosts that did not
        answer, whose runs stay `running` with their stop reason for a later round to retry."""
        down: set[str] = set()
        if not runs:
            return down
        self.renew_lease()
        grace = self.settings.stop_grace_s
        batches: dict[str, list[Callable[[], RunStatus]]] = {}
        for run in runs:
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(
                lambda a=address, r=run: self.executor.stop(a, r.run_id, r.stop_reason or default_reason, grace))
        results = pair_results(runs, self._fan_out(batches, extra_s=grace))
        answered: list[tuple[RunRow, RunStatus]] = []
        for run, result in results:
            if run.host in down:
                continue
            if isinstance(result.error, HostUnreachable):
                down.add(run.host)
                self._host_failed(run.host, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # this run's stop answered garbage: retried next round
                self.report.errors.append(f"stop of run {run.run_id} (job {run.job_id}) on {run.host}: {result.error}")
                continue
            status = call_value(result)
            if status.state == "UNREADABLE":
                self._unreadable(run, status, self.clock())
                continue
            if status.state == "MISSING":  # nothing of it there, and the stop left word that none may start: done
                status = replace(status, stop_requested=True)
            answered.append((run, status))
        # the nodes the stop ended first: a node of the same run that had already ended on its own (its peer's
        # going ended it) is then judged knowing its peer was stopped
        for run, status in sorted(answered, key=lambda pair: not pair[1].stop_requested):
            self._note_tampering(run, status)
            self._settle(run, status)
        return down

    def _stopping(self) -> list[RunRow]:
        with self.store.session() as s:
            return list(s.scalars(select(RunRow).where(RunRow.state == RunState.RUNNING,
                                                       RunRow.stop_reason.is_not(None))))

    def carry_out_pending_stops(self) -> None:
        self._stop_runs(self._stopping(), "stop")

    def _cancel_requested(self) -> None:
        active = [st.value for st in JobState if st not in TERMINAL_STATES]
        with self.store.session() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.cancel_requested.is_(True), JobRow.state.in_(active))))
            for job in jobs:
                # every run not over: a run in a state this version does not know may be running, so the job
                # is not called cancelled while one exists (its GPUs would look free); the round reports it
                runs = list(s.scalars(select(RunRow).where(RunRow.job_id == job.job_id,
                                                           RunRow.state.not_in((RunState.ENDED, RunState.LOST)))))
                untried = self._untried(s, RunRow.job_id == job.job_id)
                for run in runs:
                    if run.state == RunState.PLANNED and (run.run_id, run.host) in untried:
                        run.state, run.ended_at, run.outcome = RunState.ENDED, self.clock(), "cancelled before launch"
                    elif run.state in ACTIVE_RUN_STATES:  # running, or its launch went out unanswered: stopped first
                        run.state, run.stop_reason = RunState.RUNNING, "cancel"
                if all(r.state == RunState.ENDED for r in runs):
                    ended = s.execute(update_unsynced(JobRow).where(
                        JobRow.job_id == job.job_id, JobRow.state.not_in(TERMINAL_VALUES)).values(
                        state=JobState.CANCELLED.value, end_time=self.clock(),
                        end_reason=cancelled_reason(s, job.job_id),
                        pending_reason=None, queue_position=None)).rowcount
                    if not ended:
                        self._conflict(job.job_id, "cancelling it: it had already ended")
                        continue
                    self._event(s, job.job_id, "cancelled", "cancelled before it ran")
                    self.report.ended[job.job_id] = JobState.CANCELLED.value
        self.carry_out_pending_stops()

"""The decide step: build the view, ask the policy, and record each decision with the runs it plans
(one handler per decision type), all in one fenced transaction.
"""

from __future__ import annotations

import operator
import time
from typing import Any

from sqlalchemy import bindparam, true, update

from lucid_core.domain import ACTIVE_RUN_STATES, JobState, Pool, RunState
from lucid_core.policy.decisions import (
    Decision,
    Place,
    Preempt,
    SetProfilerParams,
    SetSharingMode,
    StartProfiling,
    StopProfiling,
    Unpair,
)
from lucid_core.runtime.round.base import (
    RoundBase,
    collector_paused,
    gpus_text,
    update_unsynced,
)
from lucid_core.runtime.round.pending import pending_reasons
from lucid_core.runtime.round.snapshot import Snapshot, load_snapshot
from lucid_core.runtime.round.view_builder import HOLD_PREFIX, build_view
from lucid_core.runtime.store.schema import (
    DecisionRow,
    JobEventRow,
    JobRow,
    RunRow,
)

#: the job columns the decide step writes back when the policy changed them (`state` only for waiting jobs)
LEARNED_FIELDS = ("predicted_duration", "share_class", "known_min_duration", "no_share", "yields",
                  "queue_position", "pending_reason", "predicted_by", "state")


class DecisionSteps(RoundBase):
    """The decide step of a round and its decision records."""

    # ------------------------------------------------------------------------------- decide
    def decide(self) -> list[Decision]:
        """Build the view, let the policy decide, and commit decisions + planned runs + job fields.

        The view's clock is the round's start, the same instant reconcile judged profiling windows by,
        so every window the policy sees expired has had its telemetry collected.
        """
        now = self.now
        if not self._hosts:
            self._load_hosts()
        self.collect_due_profiles(now)
        with collector_paused():
            return self._decide_from_store(now)

    def _decide_from_store(self, now: float) -> list[Decision]:
        """Read the snapshot, decide on the view built from it, and write the decisions in one session."""
        snapshot = load_snapshot(self.store, now)
        self._observe_pairs(snapshot, now)
        t0 = time.perf_counter()
        built = build_view(snapshot, self.config, now, self.policy_factory)
        self.report.errors.extend(built.unreadable.values())
        decisions = built.policy.schedule(built.view)
        self.report.decide_ms = (time.perf_counter() - t0) * 1000
        sharing_reason = snapshot.state.get("sharing_reason")
        for decision in decisions:
            if isinstance(decision, SetSharingMode):
                sharing_reason = decision.reason
        reasons = pending_reasons(built.view, built.policy, sharing_reason, built.leaving)
        self._crash("after_snapshot")  # decided from the snapshot, nothing written yet
        with self.store.session() as s:
            for decision in decisions:
                self._record(s, decision, built.view, now, snapshot)
            self._write_pair_speeds(s, now)
            changes = self._job_field_changes(s, built, snapshot, reasons)
            self._record_predictions(s, built.policy, built.view, decisions, now)
            self._write_job_fields(s, changes, snapshot)
            self._write_scheduler_state(s, built.view, sharing_reason)
        return decisions

    def _write_pair_speeds(self, s: Any, now: float) -> None:
        """Keep this round's pair speed estimates on the runs: eta, explain and the pages use what was measured."""
        for job_id, estimate in self._speeds.items():
            s.execute(update_unsynced(RunRow)
                      .where(RunRow.job_id == job_id, RunRow.kind == "main", RunRow.state == RunState.RUNNING)
                      .values(observed_speed=estimate.speed, observed_speed_at=now,
                              observed_speed_samples=estimate.samples, observed_speed_emulated=estimate.emulated))

    @staticmethod
    def _job_field_changes(s: Any, built: Any, snapshot: Snapshot,
                           reasons: dict[str, tuple[int | None, str | None]]) -> list[dict[str, Any]]:
        """What the policy learned of each job (predictions, classes, queue positions, reasons) where it
        changed; a run whose profiling window the policy ended in place loses its window."""
        view = built.view
        windowed = {r.job_id for r in snapshot.runs if r.profiling_until is not None}
        changes = []
        stored = operator.attrgetter(*LEARNED_FIELDS)
        waiting = (JobState.SUBMITTED, JobState.QUEUED)
        seen, frozen, key, queued = snapshot.jobs, built.frozen, built.prediction_key, JobState.QUEUED
        for job_id, job in view.jobs.items():
            old = seen.get(job_id)
            if old is None or job_id in frozen:
                continue  # placeholders, and jobs whose stop is still pending
            position, reason = reasons.get(job_id, (None, None))
            share = int(job.share_class) if job.share_class is not None else None
            now_state = job.state
            is_waiting = now_state in waiting
            state = now_state.value if is_waiting else old.state  # other moves are the decisions'
            new = (job.predicted_duration, share, job.known_min_duration, job.no_share, job.yields, position, reason,
                   key if now_state is queued and job.profile is not None
                   and share is not None and job.predicted_duration is not None else None, state)
            if new != stored(old):  # one tuple compare: a round looks at every waiting job
                change = {"job_id": job_id, **dict(zip(LEARNED_FIELDS, new, strict=True))}
                if not is_waiting:
                    del change["state"]
                changes.append(change)
            if job_id not in windowed:  # most jobs: no window to end
                continue
            alloc = view.allocations.get(job_id)
            if alloc is not None and alloc.profiling_until is None:
                s.execute(update_unsynced(RunRow)
                          .where(RunRow.job_id == job_id, RunRow.state.in_(ACTIVE_RUN_STATES),
                                 RunRow.profiling_until.is_not(None)).values(profiling_until=None))
        return changes

    def _write_job_fields(self, s: Any, changes: list[dict[str, Any]], snapshot: Snapshot) -> None:
        """One executemany per column set; state moves go compare-and-set through `_write_moves`."""
        s.flush()
        for key_set in {tuple(sorted(c)) for c in changes if "state" not in c}:
            s.execute(update(JobRow), [c for c in changes if "state" not in c and tuple(sorted(c)) == key_set])
        self._write_moves(s, [c for c in changes if "state" in c], snapshot)

    @staticmethod
    def _write_scheduler_state(s: Any, view: Any, sharing_reason: str | None) -> None:
        """The policy state the next round's view starts from (sharing mode, profiler knobs)."""
        from lucid_core.runtime.store.schema import SchedulerStateRow

        state = {**view.policy_state(), "sharing_reason": sharing_reason}
        for key, value in state.items():
            row = s.get(SchedulerStateRow, key)
            if row is None:
                s.add(SchedulerStateRow(key=key, value=value))
            elif row.value != value:
                row.value = value

    def _write_moves(self, s: Any, moves: list[dict[str, Any]], snapshot: Snapshot) -> None:
        """Job field changes that include a state: each a compare-and-set on the state the snapshot saw."""
        if not moves:
            return
        table = JobRow.__table__
        for key_set in {tuple(sorted(c)) for c in moves}:
            batch = [{**{f"v_{k}": v for k, v in c.items()},
                      "seen": self._recorded_states.get(c["job_id"], snapshot.jobs[c["job_id"]].state)}
                     for c in moves if tuple(sorted(c)) == key_set]
            columns = [k for k in key_set if k != "job_id"]
            statement = (table.update()
                         .where(table.c.job_id == bindparam("v_job_id"), table.c.state == bindparam("seen"))
                         .values({k: bindparam(f"v_{k}") for k in columns}))
            changed = s.execute(statement, batch).rowcount
            if changed is not None and 0 <= changed < len(batch):
                self._conflict("(several)", f"{len(batch) - changed} job(s) changed state after this round read them")

    @staticmethod
    def _record_predictions(s: Any, policy: Any, view: Any, decisions: list[Decision], now: float) -> None:
        """A job event per placement with the predicted duration it used, in words: `explain` shows what the
        decision used, not what the model says later (queued jobs are re-predicted every round)."""
        from lucid_core.runtime.round.prediction_words import prediction_notes

        placed = [view.jobs[d.job_id] for d in decisions
                  if isinstance(d, Place) and d.job_id in view.jobs and not d.job_id.startswith(HOLD_PREFIX)]
        if placed:
            notes = prediction_notes(policy.describe().duration_model, placed)
            s.add_all([JobEventRow(job_id=job_id, time=now, kind="Predicted", message=note)
                       for job_id, note in notes.items()])

    def _record(self, s: Any, decision: Decision, view: Any, now: float, snapshot: Snapshot) -> None:
        """Write one decision: move its job (compare-and-set), add its row, then its type's own records."""
        kind = type(decision).__name__
        job_id = getattr(decision, "job_id", None)
        if job_id is not None and job_id.startswith(HOLD_PREFIX):
            return
        if isinstance(decision, (StartProfiling, Place, StopProfiling, Preempt)) and not self._move_for(
                s, decision, snapshot):
            return
        row = DecisionRow(round_id=self.report.round_id or 0, time=now, kind=kind, job_id=job_id,
                          payload=_payload(decision), reason=decision.reason, status="pending")
        s.add(row)
        s.flush()
        self.report.decisions.append((kind, job_id, decision.reason))
        if isinstance(decision, (StartProfiling, Place)):
            self._plan_runs(s, decision, view, now, row)
        elif isinstance(decision, (StopProfiling, Preempt)):
            self._mark_stops(s, decision, now)
        elif isinstance(decision, Unpair):
            self._unpair(s, decision)
            row.status, row.executed_at = "done", now
        elif isinstance(decision, (SetSharingMode, SetProfilerParams)):
            row.status, row.executed_at = "done", now

    def _move_for(self, s: Any, decision: StartProfiling | Place | StopProfiling | Preempt, snapshot: Snapshot) -> bool:
        """Compare-and-set: the job must still be in the state this round's snapshot saw (or this round set)."""
        job_id = decision.job_id
        starts = isinstance(decision, (StartProfiling, Place))
        target = {StartProfiling: JobState.PROFILING, Place: JobState.RUNNING}.get(type(decision), JobState.QUEUED)
        extra: dict[str, Any] = ({"attempts": JobRow.attempts + 1, "pending_reason": None, "queue_position": None}
                                 if starts else {})
        seen = snapshot.jobs.get(job_id)
        expected = self._recorded_states.get(job_id, seen.state if seen is not None else None)
        moved = expected is not None and s.execute(update_unsynced(JobRow).where(
            JobRow.job_id == job_id, JobRow.state == expected,
            JobRow.cancel_requested.is_not(True) if starts else true())
            .values(state=target.value, **extra)).rowcount == 1
        if not moved:
            self._conflict(job_id, f"{type(decision).__name__}: the job left state {expected or 'unknown'} "
                                   "after this round read it; nothing recorded")
            return False
        self._recorded_states[job_id] = target.value
        return True

    def _plan_runs(self, s: Any, decision: StartProfiling | Place, view: Any, now: float, row: DecisionRow) -> None:
        """The planned runs of a start, one per host of its GPUs (rank 0 first); a new pair resets the
        partner's speed readings."""
        profiling = isinstance(decision, StartProfiling)
        job = s.get(JobRow, decision.job_id)
        s.refresh(job)  # attempts as just counted
        alloc = view.allocations.get(decision.job_id)
        pool = alloc.pool if alloc is not None else (Pool.PROFILING if profiling else Pool.MAIN)
        until = now + decision.window_s if isinstance(decision, StartProfiling) else (
            alloc.profiling_until if alloc is not None else None)
        run_id = f"{job.job_id}-{'prof' if profiling else 'main'}{job.attempts}"
        by_host: dict[str, list[int]] = {}
        for ref in decision.gpus:
            by_host.setdefault(ref.host, []).append(ref.index)
        partner = decision.partner if isinstance(decision, Place) else None
        for rank, (host, indices) in enumerate(by_host.items()):
            s.add(RunRow(run_id=run_id, host=host, job_id=job.job_id, kind="profiling" if profiling else "main",
                         pool=pool.value, gpu_indices=indices, node_rank=rank, partner=partner,
                         profile_in_place=isinstance(decision, Place) and decision.profile_in_place,
                         profiling_until=until, state=RunState.PLANNED, decision_id=row.id, planned_at=now,
                         launch_untried=True))
        if partner is not None:
            s.execute(update_unsynced(RunRow)
                      .where(RunRow.job_id == partner, RunRow.state.in_(ACTIVE_RUN_STATES))
                      .values(partner=job.job_id, observed_speed=None, observed_speed_at=None,
                              observed_speed_samples=None, observed_speed_emulated=None))
        self._event(s, job.job_id, type(decision).__name__, f"{gpus_text(decision.gpus)}: {decision.reason}")

    def _mark_stops(self, s: Any, decision: StopProfiling | Preempt, now: float) -> None:
        """A stop: running runs get the reason (carried out on the host next), and so do planned ones whose launch
        went out unanswered (they may run there); the other planned ones end unlaunched."""
        reason = "profiling_window" if isinstance(decision, StopProfiling) else "preempt"
        s.execute(update_unsynced(RunRow).where(RunRow.job_id == decision.job_id, RunRow.state == RunState.PLANNED,
                                                RunRow.launch_untried.is_not(True)).values(state=RunState.RUNNING))
        s.execute(update_unsynced(RunRow).where(RunRow.job_id == decision.job_id, RunRow.state == RunState.RUNNING)
                  .values(stop_reason=reason))
        s.execute(update_unsynced(RunRow).where(RunRow.job_id == decision.job_id, RunRow.state == RunState.PLANNED)
                  .values(state=RunState.ENDED, outcome=f"{reason} before launch", ended_at=now))
        self._event(s, decision.job_id, type(decision).__name__, decision.reason)

    def _unpair(self, s: Any, decision: Unpair) -> None:
        """Both jobs of an unstable pair may not share again; the speeds measured go into their events."""
        measured = "; ".join(f"{j}: {self._speeds[j].describe()}" for j in (decision.job_id, decision.partner)
                             if j in self._speeds)
        for member in (decision.job_id, decision.partner):
            job = s.get(JobRow, member)
            if job is None:
                continue
            job.no_share = True
            self._event(s, member, "Unpair", decision.reason + (f" (measured {measured})" if measured else ""))


def _payload(decision: Decision) -> dict[str, Any]:
    """A decision's fields as JSON (GPUs as [host, index] pairs, enums by value)."""
    payload: dict[str, Any] = {}
    for name in getattr(decision, "__slots__", ()):
        value = getattr(decision, name)
        if name == "gpus":
            value = [[g.host, g.index] for g in value]
        elif hasattr(value, "value"):
            value = value.value
        payload[name] = value
    return payload

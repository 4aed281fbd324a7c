"""`lucid eta`: when will a job start and end? Run the live policy forward from the live state.

The view is rebuilt exactly as a round builds it; then time jumps from event to event (a
running job reaching its predicted end, a profiling window closing, the policy's wake-ups),
calling the same policy's `schedule` at each one, until the asked-for job is placed. Jobs are
assumed to run for their predicted durations and nobody else submits: it is a what-if, not a promise.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from lucid_core.config import LucidConfig
from lucid_core.domain import TERMINAL_STATES, JobState, Pool
from lucid_core.policy.decisions import Place
from lucid_core.runtime.store import Store
from lucid_core.runtime.view_builder import HOLD_PREFIX, PolicyFactory, build_view, default_policy, load_snapshot


@dataclass(frozen=True)
class Eta:
    job_id: str
    state: str
    start: float | None
    end: float | None
    predicted_duration: float | None
    steps: int
    note: str


def _duration(policy: object, job: object) -> float:
    model = getattr(policy, "duration_model", None)
    if getattr(job, "predicted_duration", None) is not None:
        return float(job.predicted_duration)  # type: ignore[attr-defined]
    if model is not None:
        return float(model.predict_duration([job])[0])
    return 3600.0


def estimate(store: Store, job_id: str, config: LucidConfig, now: float, *,
             policy_factory: PolicyFactory | None = None, horizon_s: float = 30 * 86400.0,
             max_steps: int = 100000) -> Eta:
    """Start and end of `job_id` if the current policy kept deciding on the current cluster."""
    from lucid_core.runtime.schema import JobRow

    with store.session() as s:
        row = s.get(JobRow, job_id)
        if row is None:
            raise KeyError(job_id)
        state = JobState(row.state)
        if state in TERMINAL_STATES:
            return Eta(job_id, state.value, row.start_time, row.end_time, row.predicted_duration, 0, "already ended")
    snapshot = load_snapshot(store, now)
    built = build_view(snapshot, config, now, policy_factory or default_policy)
    view, policy = built.view, built.policy
    ends: list[tuple[float, str]] = []
    for alloc in view.allocations.values():
        if alloc.job_id.startswith(HOLD_PREFIX) or alloc.pool is not Pool.MAIN:
            continue
        job = view.jobs[alloc.job_id]
        ends.append((max(now, alloc.start + _duration(policy, job)), alloc.job_id))
    heapq.heapify(ends)
    target = view.jobs.get(job_id)
    if target is None:
        return Eta(job_id, state.value, None, None, None, 0, "job is not in the scheduler's view (stop pending)")
    if job_id in view.allocations and view.allocations[job_id].pool is Pool.MAIN:
        start = view.allocations[job_id].start
        dur = _duration(policy, target)
        return Eta(job_id, state.value, start, start + dur, dur, 0, "running: predicted end")
    t = now
    for step in range(1, max_steps + 1):
        view.now = t
        for decision in policy.schedule(view):
            if isinstance(decision, Place):
                job = view.jobs[decision.job_id]
                dur = _duration(policy, job)
                if decision.job_id == job_id:
                    return Eta(job_id, state.value, t, t + dur, dur, step,
                               "placed in the what-if run of the live policy")
                heapq.heappush(ends, (t + dur, decision.job_id))
        candidates = [e[0] for e in ends[:1]]
        wake = policy.next_wakeup(view) if hasattr(policy, "next_wakeup") else None
        if wake is not None and wake > t:
            candidates.append(wake)
        if not candidates:
            return Eta(job_id, state.value, None, None, target.predicted_duration, step,
                       "never placed: nothing running ends and the policy waits for nothing")
        t = min(candidates)
        if t - now > horizon_s:
            break
        view.now = t
        while ends and ends[0][0] <= t:
            _, ended = heapq.heappop(ends)
            if ended in view.allocations:
                alloc = view.stop(ended)
                job = view.jobs[ended]
                job.state, job.end_time = JobState.COMPLETED, t
                policy.on_finish(view, job, t - alloc.start)
    return Eta(job_id, state.value, None, None, target.predicted_duration, max_steps,
               f"not placed within {horizon_s / 86400:g} days of simulated time")

"""Event-driven simulator: replays a trace through any SchedulingPolicy.

Events are arrivals, run ends, profiling-window ends and the policy's own wake-ups; between
events nothing changes, so time jumps. Work is kept in exclusive-seconds: a job co-located at
normalized speed s progresses s seconds of work per second; its end is re-planned whenever
its partner arrives or leaves. The policy decides; this driver only carries decisions out.

A run starts from an empty cluster (a trace replay) or from a `StartState`, a cluster caught
mid-run (a what-if such as `lucid eta`); `Until` lets a run stop before every job has ended.
"""

from __future__ import annotations

import heapq
import math
import time as wallclock
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, JobState, Pool, Profile
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.decisions import Decision, Place, Preempt, StartProfiling, StopProfiling
from lucid_core.policy.view import ClusterView
from lucid_core.sim.records import JobOutcome, TraceRecord, Workload
from lucid_core.sim.start import StartState, Until

SpeedFn = Callable[[Workload, Workload], tuple[float, float]]
StopCause = Literal["job", "time", "rounds", "idle"]

_FINISH, _ARRIVAL, _WAKE = 0, 1, 2  # at equal times: free GPUs first, then arrivals


@dataclass(slots=True)
class _Run:
    """Simulator-only state of a job: its true work and how it is being served."""

    record: TraceRecord
    workload: Workload | None
    remaining: float = 0.0  # exclusive-seconds of work left in the current run
    rate: float = 1.0
    since: float = 0.0  # when `remaining` was last brought up to date
    version: int = 0
    served: float = 0.0  # wall seconds spent on GPUs (any run)
    shared: float = 0.0
    shared_since: float | None = None
    preemptions: int = 0
    profiled: bool = False
    lost_work: float = 0.0  # work to redo on restart (preemption checkpoint cost)


@dataclass
class SimResult:
    policy: str
    outcomes: list[JobOutcome]
    busy_timeline: list[tuple[float, int]]  # (time, busy main-cluster GPUs) change points
    total_gpus: int
    decision_counts: dict[str, int]
    wall_seconds: float
    events: int
    decision_log: list[tuple[float, str, str, str]] = field(default_factory=list)
    rounds: int = 0  # calls of the policy's `schedule`
    # why an `until` run stopped before every job ended: the job finished, the time or round
    # limit passed, or nothing was left to happen ("idle"); None when every job ended
    stopped_by: StopCause | None = None
    view: ClusterView | None = None  # the cluster where an early stop left it, to look at or resume


def default_speeds(a: Workload, b: Workload) -> tuple[float, float]:
    """Co-located speeds when no catalog is given: from the summed GPU utilization."""
    load = (a.gpu_util + b.gpu_util) / 100.0
    s = 1.0 if load <= 1.0 else max(0.5, 1.0 / load)
    return s, s


def simulate(records: Sequence[TraceRecord], policy: SchedulingPolicy, config: LucidConfig, *,
             main_nodes: int = 0, profiling_nodes: int | None = None,
             workloads: Sequence[Workload] | None = None, speeds: SpeedFn | None = None,
             check_invariants: bool = False, keep_log: bool = False,
             progress: Callable[[int, int], None] | None = None,
             start: StartState | None = None, until: Until | None = None) -> SimResult:
    """Run `policy` over `records` on `main_nodes` nodes (+ a profiling pool when it profiles).

    With `start`, the run continues the cluster of `start.view` (whose jobs `policy` already
    knows) from `start.now`, and `records` are later submissions. With `until`, it may stop
    before every job has ended (see `SimResult.stopped_by`); without, unfinished jobs are an error.
    """
    started = wallclock.perf_counter()
    if workloads is not None and len(workloads) != len(records):
        raise ValueError(f"{len(workloads)} workloads for {len(records)} trace records")
    speeds = speeds or default_speeds
    if start is None:
        view = ClusterView(config)
        view.add_nodes(Pool.MAIN, main_nodes)
        if getattr(policy, "profiles", False):
            view.add_nodes(Pool.PROFILING, config.profiler.pool_nodes if profiling_nodes is None else profiling_nodes)
    elif main_nodes or profiling_nodes is not None:
        raise ValueError("a run from a start state uses the start view's nodes; give no main_nodes/profiling_nodes")
    else:
        view = start.view
    carried = start.jobs if start is not None else ()
    too_wide = [r.job_id for r in records if r.gpus > view.main.total_gpus]
    if too_wide:
        raise ValueError(f"{len(too_wide)} job(s) need more GPUs than the {view.main.total_gpus} of the cluster "
                         f"(e.g. {too_wide[:3]}); give the simulation more nodes or filter the trace")
    runs: dict[str, _Run] = {}
    heap: list[tuple[float, int, int, str, int]] = []
    seq = 0
    for i, rec in enumerate(records):
        if rec.job_id in runs:
            raise ValueError(f"duplicate job id {rec.job_id} in trace")
        runs[rec.job_id] = _Run(rec, workloads[i] if workloads is not None else None)
        heap.append((rec.submit_time, _ARRIVAL, seq, rec.job_id, 0))
        seq += 1
    for rec in carried:
        if rec.job_id in runs:
            raise ValueError(f"job {rec.job_id} is both in the start state and submitted")
        runs[rec.job_id] = _Run(rec, None)
    heapq.heapify(heap)
    precompute = getattr(policy, "precompute", None)
    if precompute is not None:
        precompute([Job(job_id=r.job_id, user=r.user or r.vc, vc=r.vc, gpus=r.gpus, submit_time=r.submit_time,
                        name=r.name) for r in records])

    measured_profile = view.profile_of  # what the view knew before: no profile in a fresh view

    def profile_of(job_id: str) -> Profile | None:
        run = runs.get(job_id)
        w = run.workload if run is not None else None
        if w is None:
            return measured_profile(job_id)
        return Profile(w.gpu_util, w.mem_util, w.gpu_mem_mb, w.amp, emulated=True)

    def workload_of(job_id: str) -> Workload | None:
        """A job's workload for co-located speeds: the trace's, else one from its measured profile."""
        w = runs[job_id].workload
        if w is not None:
            return w
        p = view.jobs[job_id].profile
        return None if p is None else Workload(job_id, p.gpu_util, p.mem_util, p.gpu_mem_mb, p.amp)

    view.profile_of = profile_of
    outcomes: list[JobOutcome] = []
    if start is None:
        timeline: list[tuple[float, int]] = [(records[0].submit_time if records else 0.0, 0)]
    else:
        timeline = [(start.now, view.main.busy_gpus)]
    counts: Counter[str] = Counter()
    log: list[tuple[float, str, str, str]] = []
    wakes: set[float] = set()
    events = 0
    total = len(records) + len(carried)
    next_progress = 0

    def push(t: float, kind: int, job_id: str, version: int = 0) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, job_id, version))
        seq += 1

    def settle(run: _Run, now: float) -> None:
        run.remaining -= (now - run.since) * run.rate
        run.since = now

    def plan_end(job_id: str, now: float) -> None:
        run = runs[job_id]
        run.version += 1
        push(now + max(run.remaining, 0.0) / run.rate, _FINISH, job_id, run.version)

    def set_rate(job_id: str, rate: float, now: float) -> None:
        run = runs[job_id]
        settle(run, now)
        if rate < 1.0 and run.shared_since is None:
            run.shared_since = now
        elif rate >= 1.0 and run.shared_since is not None:
            run.shared += now - run.shared_since
            run.shared_since = None
        run.rate = rate
        plan_end(job_id, now)

    def begin(job_id: str, now: float) -> None:
        run = runs[job_id]
        run.remaining = run.record.duration + run.lost_work
        run.lost_work = 0.0
        run.rate, run.since = 1.0, now

    def halt(job_id: str, now: float) -> None:
        """Bring a stopping run up to date and drop its planned end."""
        run = runs[job_id]
        settle(run, now)
        alloc_start = view.jobs[job_id].start_time
        run.served += now - (alloc_start if alloc_start is not None else now)
        if run.shared_since is not None:
            run.shared += now - run.shared_since
            run.shared_since = None
        run.version += 1

    def apply(decision: Decision, now: float) -> None:
        counts[type(decision).__name__] += 1
        if keep_log:
            log.append((now, type(decision).__name__, getattr(decision, "job_id", ""), decision.reason))
        if isinstance(decision, StartProfiling):
            run = runs[decision.job_id]
            run.profiled = True
            begin(decision.job_id, now)
            view.jobs[decision.job_id].start_time = now
            if run.remaining <= decision.window_s:
                plan_end(decision.job_id, now)
            else:
                run.version += 1
                wake(now + decision.window_s)
        elif isinstance(decision, StopProfiling):
            halt(decision.job_id, now)
        elif isinstance(decision, Place):
            run = runs[decision.job_id]
            begin(decision.job_id, now)
            if decision.profile_in_place:
                run.profiled = True
                until = view.allocations[decision.job_id].profiling_until
                if until is not None:
                    wake(until)
            if decision.partner is not None:
                a, b = workload_of(decision.job_id), workload_of(decision.partner)
                s_job, s_partner = speeds(a, b) if a is not None and b is not None else (1.0, 1.0)
                set_rate(decision.job_id, min(1.0, s_job), now)
                set_rate(decision.partner, min(1.0, s_partner), now)
                view.speed_reports.append((decision.job_id, min(s_job, s_partner)))
            else:
                plan_end(decision.job_id, now)
        elif isinstance(decision, Preempt):
            run = runs[decision.job_id]
            halt(decision.job_id, now)
            run.preemptions += 1
            run.lost_work = config.tiresias.checkpoint_cost_s
            run.record = replace(run.record, duration=max(run.remaining, 0.0))  # the rest of its work

    def wake(t: float) -> None:
        if t not in wakes:
            wakes.add(t)
            push(t, _WAKE, "")

    original = {r.job_id: r.duration for r in records}
    submitted_at = {r.job_id: r.submit_time for r in records}
    if start is not None:
        original.update((r.job_id, r.duration) for r in carried)
        submitted_at.update((r.job_id, r.submit_time) for r in carried)
        _resume(start, runs, speeds, workload_of, plan_end, wake)
    stop_job = until.job_finished if until is not None else None
    stop_time = until.time if until is not None and until.time is not None else math.inf
    max_rounds = until.rounds if until is not None else None
    stopped_by: StopCause | None = None
    rounds = 0
    while heap:
        now = heap[0][0]
        if now > stop_time:
            stopped_by = "time"
            break
        view.now = now
        changed = False
        while heap and heap[0][0] == now:
            _, kind, _, job_id, version = heapq.heappop(heap)
            events += 1
            if kind == _WAKE:
                wakes.discard(now)
                continue
            if kind == _ARRIVAL:
                rec = runs[job_id].record
                job = Job(job_id=rec.job_id, user=rec.user or rec.vc, vc=rec.vc, gpus=rec.gpus,
                          submit_time=rec.submit_time, name=rec.name)
                view.add_job(job)
                policy.on_submit(view, job)
                changed = True
                continue
            run = runs[job_id]
            if version != run.version:
                continue
            job = view.jobs[job_id]
            alloc = view.allocations[job_id]
            in_profiling = alloc.pool is Pool.PROFILING or (
                alloc.profiling_until is not None and original[job_id] <= (now - alloc.start) + 1e-9)
            halt(job_id, now)
            partner = alloc.partner
            view.stop(job_id)
            if partner is not None and partner in runs:
                set_rate(partner, 1.0, now)
            job.end_time = now
            job.state = JobState.COMPLETED
            policy.on_finish(view, job, original[job_id])
            start = alloc.start
            outcomes.append(JobOutcome(
                job_id=job_id, vc=job.vc, gpus=job.gpus, submit_time=submitted_at[job_id],
                duration=original[job_id], start_time=start, end_time=now,
                queue_delay=max(0.0, now - submitted_at[job_id] - run.served),
                ended_in_profiling=in_profiling, shared_seconds=run.shared,
                preemptions=run.preemptions, profiled=run.profiled))
            changed = True
            if job_id == stop_job:
                stopped_by = "job"
        decisions = policy.schedule(view)
        rounds += 1
        for d in decisions:
            apply(d, now)
        if decisions or changed:
            busy = view.main.busy_gpus
            if timeline[-1][1] != busy:
                timeline.append((now, busy))
        nxt = policy.next_wakeup(view) if hasattr(policy, "next_wakeup") else None
        if nxt is not None and nxt > now:
            wake(nxt)
        if check_invariants:
            view.check_invariants()
        if progress is not None and len(outcomes) >= next_progress:
            progress(len(outcomes), total)
            next_progress = len(outcomes) + max(1, total // 100)
        if stopped_by is not None:
            break
        if rounds == max_rounds:
            stopped_by = "rounds"
            break
    if until is not None and stopped_by is None and len(outcomes) != total:
        stopped_by = "idle"
    if stopped_by is None and len(outcomes) != total:
        stuck = [j for j in runs if view.jobs.get(j) is None or view.jobs[j].end_time is None]
        raise RuntimeError(f"simulation ended with {total - len(outcomes)} unfinished jobs "
                           f"(e.g. {stuck[:3]}): a job wider than the cluster?")
    return SimResult(policy.name, outcomes, timeline, view.main.total_gpus, dict(counts),
                     wallclock.perf_counter() - started, events, log, rounds, stopped_by,
                     view if stopped_by is not None else None)


def _resume(start: StartState, runs: dict[str, _Run], speeds: SpeedFn,
            workload_of: Callable[[str], Workload | None], plan_end: Callable[[str, float], None],
            wake: Callable[[float], None]) -> None:
    """Bring the start state's running jobs into the engine as if it had started them itself.

    A pair runs at its co-located speeds from now on (a member's measured rate in `start.rates`
    taking the place of its workload's speed); a profiling-pool run that outlives its
    window gets no end, only a wake-up when the window closes (the policy then stops it); the
    policy is asked to decide at `start.now` first.
    """
    view, now = start.view, start.now
    view.now = now
    for job_id, left in start.remaining.items():
        run, alloc = runs[job_id], view.allocations[job_id]
        run.remaining, run.since = left, now
        run.profiled = alloc.profiling_until is not None or view.jobs[job_id].profile is not None
        partner = alloc.partner
        if partner is not None and partner in start.remaining and job_id < partner:
            a, b = workload_of(job_id), workload_of(partner)
            pair_speeds = speeds(a, b) if a is not None and b is not None else (1.0, 1.0)
            for member, speed in zip((job_id, partner), pair_speeds, strict=True):
                speed = start.rates.get(member, speed)
                runs[member].rate = min(1.0, speed)
                if speed < 1.0:
                    runs[member].shared_since = now
    for job_id in start.remaining:
        run, alloc = runs[job_id], view.allocations[job_id]
        window_end = alloc.profiling_until
        if alloc.pool is Pool.PROFILING and window_end is not None and run.remaining > window_end - now:
            run.version += 1
        else:
            plan_end(job_id, now)
        if window_end is not None:
            wake(max(window_end, now))
    wake(now)


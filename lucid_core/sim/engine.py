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
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from lucid_core.config import LucidConfig
from lucid_core.domain import PROFILING_END_SLACK_S, GpuRef, Job, JobState, Pool, Profile
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.decisions import Decision, Place, Preempt, StartProfiling, StopProfiling, checkpoint_cost_s
from lucid_core.policy.view import ClusterView
from lucid_core.sim.records import JobOutcome, TraceRecord, Workload, replay_problem
from lucid_core.sim.rounds import RoundCadence
from lucid_core.sim.start import StartState, Until

SpeedFn = Callable[[Workload, Workload], tuple[float, float]]
StopCause = Literal["job", "time", "rounds", "idle"]

_FINISH, _ARRIVAL, _WAKE = 0, 1, 2  # at equal times: free GPUs first, then arrivals
CLOSED_HOLD_PREFIX = "~closed:"  # placeholder jobs holding the freed GPUs of a start state's closed nodes


@dataclass(frozen=True)
class HostCatalogs:
    """Each GPU model of a fleet measured by its own catalog: a job's profile and co-located speeds on a host
    come from the catalog of that host's key (its workload drawn there), not from one catalog for all."""

    node_key: Mapping[str, Hashable]  # node -> key of its catalog (hosts not named: `default`)
    workloads: Mapping[Hashable, Sequence[Workload]]  # key -> one workload per trace record
    speeds: Mapping[Hashable, SpeedFn]  # key -> co-located speeds of two of its workloads
    default: Hashable = None

    def key_of(self, node: str | None) -> Hashable:
        return self.node_key.get(node, self.default) if node is not None else self.default


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
             start: StartState | None = None, until: Until | None = None,
             host_catalogs: HostCatalogs | None = None, rounds: RoundCadence | None = None) -> SimResult:
    """Run `policy` over `records` on `main_nodes` nodes (+ a profiling pool when it profiles).

    With `start`, the run continues the cluster of `start.view` (whose jobs `policy` already
    knows) from `start.now`, and `records` are later submissions. With `until`, it may stop
    before every job has ended (see `SimResult.stopped_by`); without, unfinished jobs are an error.
    With `rounds`, the policy decides only when a live deployment's round would (`sim/rounds.py`).
    """
    return Simulation(records, policy, config, main_nodes=main_nodes, profiling_nodes=profiling_nodes,
                      workloads=workloads, speeds=speeds, check_invariants=check_invariants, keep_log=keep_log,
                      progress=progress, start=start, until=until, host_catalogs=host_catalogs,
                      rounds=rounds).run()


class Simulation:
    """One replay: the event heap, each job's true work (`_Run`) and the outcomes; the policy decides,
    this object only carries its decisions out in simulated time. Build one per run."""

    def __init__(self, records: Sequence[TraceRecord], policy: SchedulingPolicy, config: LucidConfig, *,
                 main_nodes: int = 0, profiling_nodes: int | None = None,
                 workloads: Sequence[Workload] | None = None, speeds: SpeedFn | None = None,
                 check_invariants: bool = False, keep_log: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 start: StartState | None = None, until: Until | None = None,
                 host_catalogs: HostCatalogs | None = None, rounds: RoundCadence | None = None) -> None:
        self.started = wallclock.perf_counter()
        if workloads is not None and len(workloads) != len(records):
            raise ValueError(f"{len(workloads)} workloads for {len(records)} trace records")
        self.records, self.policy, self.config = records, policy, config
        self.speeds = speeds or default_speeds
        self.host_catalogs = host_catalogs
        if host_catalogs is not None and (workloads is not None or speeds is not None):
            raise ValueError("give per-host catalogs or one set of workloads and speeds, not both")
        self.index = {r.job_id: i for i, r in enumerate(records)} if host_catalogs is not None else {}
        self.check_invariants, self.keep_log, self.progress = check_invariants, keep_log, progress
        self.start, self.until, self.rounds = start, until, rounds
        # profiles measured before the run (a live start state's); a trace job's come from its workload
        self._measured_profile: Callable[[str], Profile | None] = lambda job_id: None
        self.view = self._initial_view(main_nodes, profiling_nodes)
        self.carried = start.jobs if start is not None else ()
        for rec in records:
            problem = replay_problem(rec)
            if problem is not None:  # a NaN time once looped for ever: the heap cannot order it
                raise ValueError(f"trace record {rec.job_id!r}: {problem}")
        too_wide = [r.job_id for r in records if r.gpus > self.view.main.total_gpus]
        if too_wide:
            raise ValueError(f"{len(too_wide)} job(s) need more GPUs than the {self.view.main.total_gpus} of the "
                             f"cluster (e.g. {too_wide[:3]}); give the simulation more nodes or filter the trace")
        self.runs: dict[str, _Run] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self._load(workloads)
        policy.precompute([r.to_job() for r in records])
        if self.start is not None:  # a live view caught mid-run: its measured profiles, then the trace's
            self._measured_profile = self.view.profile_of
            self.view.profile_of = self._profile_of
        self.outcomes: list[JobOutcome] = []
        first = (records[0].submit_time if records else 0.0, 0)
        self.timeline: list[tuple[float, int]] = [first] if start is None else [(start.now, self.view.main.busy_gpus)]
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[float, str, str, str]] = []
        self.wakes: set[float] = set()
        self.events = 0
        self.total = len(records) + len(self.carried)
        self.original = {r.job_id: r.duration for r in records}
        self.submitted_at = {r.job_id: r.submit_time for r in records}

    def _initial_view(self, main_nodes: int, profiling_nodes: int | None) -> ClusterView:
        """An empty cluster of the given size, or the start state's cluster caught mid-run."""
        if self.start is None:
            view = ClusterView(self.config, profile_of=self._profile_of)
            view.add_nodes(Pool.MAIN, main_nodes)
            if self.policy.profiles:
                view.add_nodes(Pool.PROFILING,
                               self.config.profiler.pool_nodes if profiling_nodes is None else profiling_nodes)
            return view
        if main_nodes or profiling_nodes is not None:
            raise ValueError("a run from a start state uses the start view's nodes; give no main_nodes/profiling_nodes")
        return self.start.view

    def _load(self, workloads: Sequence[Workload] | None) -> None:
        """Every submission becomes an arrival event; the start state's jobs are carried in."""
        for i, rec in enumerate(self.records):
            if rec.job_id in self.runs:
                raise ValueError(f"duplicate job id {rec.job_id} in trace")
            self.runs[rec.job_id] = _Run(rec, workloads[i] if workloads is not None else None)
            self.heap.append((rec.submit_time, _ARRIVAL, self.seq, rec.job_id, 0))
            self.seq += 1
        for rec in self.carried:
            if rec.job_id in self.runs:
                raise ValueError(f"job {rec.job_id} is both in the start state and submitted")
            self.runs[rec.job_id] = _Run(rec, None)
        heapq.heapify(self.heap)

    # --- what the policy may know of a job -----------------------------------------------
    def _node_of(self, job_id: str) -> str | None:
        alloc = self.view.allocations.get(job_id)
        return alloc.gpus[0].host if alloc is not None and alloc.gpus else None

    def _catalog_workload(self, job_id: str, node: str | None) -> Workload | None:
        """The job's workload in the catalog of `node`'s GPU model (per-host catalogs), else its one workload."""
        if self.host_catalogs is None:
            run = self.runs.get(job_id)
            return run.workload if run is not None else None
        index = self.index.get(job_id)
        drawn = self.host_catalogs.workloads.get(self.host_catalogs.key_of(node))
        return drawn[index] if index is not None and drawn is not None else None

    def _profile_of(self, job_id: str) -> Profile | None:
        w = self._catalog_workload(job_id, self._node_of(job_id) if self.host_catalogs is not None else None)
        if w is None:
            return self._measured_profile(job_id)
        return Profile(w.gpu_util, w.mem_util, w.gpu_mem_mb, w.amp, emulated=True)

    def _workload_of(self, job_id: str, node: str | None = None) -> Workload | None:
        """A job's workload for co-located speeds on `node` (default: where it runs): the trace's, else one
        from its measured profile."""
        if node is None and self.host_catalogs is not None:
            node = self._node_of(job_id)
        w = self._catalog_workload(job_id, node)
        if w is not None:
            return w
        p = self.view.jobs[job_id].profile
        return None if p is None else Workload(job_id, p.gpu_util, p.mem_util, p.gpu_mem_mb, p.amp)

    def _pair_speeds(self, node: str | None) -> SpeedFn:
        if self.host_catalogs is None:
            return self.speeds
        return self.host_catalogs.speeds.get(self.host_catalogs.key_of(node), default_speeds)

    # --- events and the work of running jobs ---------------------------------------------
    def _push(self, t: float, kind: int, job_id: str, version: int = 0) -> None:
        heapq.heappush(self.heap, (t, kind, self.seq, job_id, version))
        self.seq += 1

    def _wake(self, t: float) -> None:
        if t not in self.wakes:
            self.wakes.add(t)
            self._push(t, _WAKE, "")

    @staticmethod
    def _settle(run: _Run, now: float) -> None:
        run.remaining -= (now - run.since) * run.rate
        run.since = now

    def _plan_end(self, job_id: str, now: float) -> None:
        run = self.runs[job_id]
        run.version += 1
        self._push(now + max(run.remaining, 0.0) / run.rate, _FINISH, job_id, run.version)

    def _set_rate(self, job_id: str, rate: float, now: float, *, shared: bool) -> None:
        """A run's speed from now on; `shared`: whether it now has a partner on its GPUs (its time counts as
        shared whatever the pair's speed: a pair measured at full speed still shares)."""
        run = self.runs[job_id]
        self._settle(run, now)
        if shared and run.shared_since is None:
            run.shared_since = now
        elif not shared and run.shared_since is not None:
            run.shared += now - run.shared_since
            run.shared_since = None
        run.rate = rate
        self._plan_end(job_id, now)

    def _begin(self, job_id: str, now: float) -> None:
        run = self.runs[job_id]
        run.remaining = run.record.duration + run.lost_work
        run.lost_work = 0.0
        run.rate, run.since = 1.0, now

    def _halt(self, job_id: str, now: float) -> None:
        """Bring a stopping run up to date and drop its planned end."""
        run = self.runs[job_id]
        self._settle(run, now)
        alloc_start = self.view.jobs[job_id].start_time
        run.served += now - (alloc_start if alloc_start is not None else now)
        if run.shared_since is not None:
            run.shared += now - run.shared_since
            run.shared_since = None
        run.version += 1

    # --- carrying out the policy's decisions ----------------------------------------------
    def _apply(self, decision: Decision, now: float) -> None:
        self.counts[type(decision).__name__] += 1
        if self.keep_log:
            self.log.append((now, type(decision).__name__, getattr(decision, "job_id", ""), decision.reason))
        if isinstance(decision, StartProfiling):
            self._start_profiling(decision, now)
        elif isinstance(decision, StopProfiling):
            self._halt(decision.job_id, now)
        elif isinstance(decision, Place):
            self._place(decision, now)
        elif isinstance(decision, Preempt):
            run = self.runs[decision.job_id]
            self._halt(decision.job_id, now)
            run.preemptions += 1
            run.lost_work = checkpoint_cost_s(self.config, self.view.jobs[decision.job_id].gpus)
            run.record = replace(run.record, duration=max(run.remaining, 0.0))  # the rest of its work

    def _start_profiling(self, decision: StartProfiling, now: float) -> None:
        run = self.runs[decision.job_id]
        run.profiled = True
        self._begin(decision.job_id, now)
        self.view.jobs[decision.job_id].start_time = now
        if run.remaining <= decision.window_s or self.rounds is not None:
            # on a round cadence a run may outlive its window until the next round, and its work end there; a stop
            # drops the planned end (`_halt`). At every event the stop comes at the window's end: no end is planned,
            # as a stale end would still be an instant the policy decides at
            self._plan_end(decision.job_id, now)
        else:
            run.version += 1
        if run.remaining > decision.window_s:
            self._wake(now + decision.window_s)

    def _place(self, decision: Place, now: float) -> None:
        run = self.runs[decision.job_id]
        self._begin(decision.job_id, now)
        if decision.profile_in_place:
            run.profiled = True
            until = self.view.allocations[decision.job_id].profiling_until
            if until is not None:
                self._wake(until)
        if decision.partner is not None:
            node = self._node_of(decision.partner) if self.host_catalogs is not None else None  # partner's GPUs
            a, b = self._workload_of(decision.job_id, node), self._workload_of(decision.partner, node)
            s_job, s_partner = self._pair_speeds(node)(a, b) if a is not None and b is not None else (1.0, 1.0)
            self._set_rate(decision.job_id, min(1.0, s_job), now, shared=True)
            self._set_rate(decision.partner, min(1.0, s_partner), now, shared=True)
            self.view.speed_reports.append((decision.job_id, min(s_job, s_partner)))
        else:
            self._plan_end(decision.job_id, now)

    # --- arrivals and ends --------------------------------------------------------------------
    def _arrive(self, job_id: str) -> None:
        job = self.runs[job_id].record.to_job()
        self.view.add_job(job)
        self.policy.on_submit(self.view, job)

    def _finish(self, job_id: str, now: float) -> None:
        """A run's work is done: free its GPUs, speed its partner back up, record the outcome."""
        run, view = self.runs[job_id], self.view
        job = view.jobs[job_id]
        alloc = view.allocations[job_id]
        in_profiling = alloc.pool is Pool.PROFILING or (
            alloc.profiling_until is not None and now <= alloc.profiling_until + PROFILING_END_SLACK_S
            and self.original[job_id] <= (now - alloc.start) + 1e-9)
        self._halt(job_id, now)
        partner = alloc.partner
        view.stop(job_id)
        if partner is not None and partner in self.runs:
            self._set_rate(partner, 1.0, now, shared=False)
        job.end_time = now
        job.state = JobState.COMPLETED
        self.policy.on_finish(view, job, self.original[job_id])
        self.outcomes.append(JobOutcome(
            job_id=job_id, vc=job.vc, gpus=job.gpus, submit_time=self.submitted_at[job_id],
            duration=self.original[job_id], start_time=alloc.start, end_time=now,
            queue_delay=max(0.0, now - self.submitted_at[job_id] - run.served),
            ended_in_profiling=in_profiling, shared_seconds=run.shared,
            preemptions=run.preemptions, profiled=run.profiled))

    def _take_events(self, now: float, stop_job: str | None) -> tuple[bool, bool]:
        """Pop every event at `now`; (whether the cluster changed, whether `stop_job` finished)."""
        changed = stop = False
        heap = self.heap
        while heap and heap[0][0] == now:
            _, kind, _, job_id, version = heapq.heappop(heap)
            self.events += 1
            if kind == _WAKE:
                self.wakes.discard(now)
                continue
            if kind == _ARRIVAL:
                self._arrive(job_id)
                changed = True
                continue
            if version != self.runs[job_id].version:
                continue
            self._finish(job_id, now)
            changed = True
            stop = stop or job_id == stop_job
        return changed, stop

    def run(self) -> SimResult:
        """Advance from event to event, asking the policy to decide after each instant (on a round cadence:
        at each round), until every job has ended (or `until` says stop)."""
        view, until, start = self.view, self.until, self.start
        if start is not None:
            self.original.update((r.job_id, r.duration) for r in self.carried)
            self.submitted_at.update((r.job_id, r.submit_time) for r in self.carried)
            _resume(start, self.runs, self._pair_speeds(None), self._workload_of, self._plan_end, self._wake,
                    on_cadence=self.rounds is not None)
        stop_job = until.job_finished if until is not None else None
        stop_time = until.time if until is not None and until.time is not None else math.inf
        max_rounds = until.rounds if until is not None else None
        stopped_by: StopCause | None = None
        rounds = next_progress = 0
        while self.heap:
            now = self.heap[0][0]
            if now > stop_time:
                stopped_by = "time"
                break
            view.now = now
            changed, job_done = self._take_events(now, stop_job)
            if job_done:
                stopped_by = "job"
            if self.rounds is not None and self.rounds.next_round(now) != now:  # between rounds: seen at the next
                self._wake(self.rounds.next_round(now))
                self._note_busy(now, changed)
                if stopped_by is not None:
                    break
                continue
            if start is not None and start.closed:
                self._hold_closed(start.closed)
            decisions = self.policy.schedule(view)
            rounds += 1
            for d in decisions:
                self._apply(d, now)
            self._note_busy(now, bool(decisions) or changed)
            nxt = self.policy.next_wakeup(view)
            if nxt is not None and nxt > now:
                self._wake(nxt)
            if self.check_invariants:
                view.check_invariants()
            if self.progress is not None and len(self.outcomes) >= next_progress:
                self.progress(len(self.outcomes), self.total)
                next_progress = len(self.outcomes) + max(1, self.total // 100)
            if stopped_by is not None:
                break
            if rounds == max_rounds:
                stopped_by = "rounds"
                break
        return self._result(stopped_by, rounds)

    def _hold_closed(self, closed: frozenset[str]) -> None:
        """Hold the free GPUs of closed nodes before the policy decides: they take no new work (see `StartState`)."""
        view = self.view
        for pool in (Pool.MAIN, Pool.PROFILING):
            nodes = view.pool(pool).nodes
            for name in sorted(closed & nodes.keys()):
                free = [i for i, occupants in enumerate(nodes[name].occupants) if not occupants]
                if not free:
                    continue
                self.seq += 1
                hold_id = f"{CLOSED_HOLD_PREFIX}{self.seq}:{pool.value}:{name}"
                view.add_job(Job(job_id=hold_id, user="~", vc="~", gpus=len(free), submit_time=view.now,
                                 no_share=True))
                view.start(hold_id, pool, tuple(GpuRef(name, i) for i in free))

    def _note_busy(self, now: float, changed: bool) -> None:
        """Extend the busy-GPU timeline when the cluster changed at `now`."""
        if changed and self.timeline[-1][1] != self.view.main.busy_gpus:
            self.timeline.append((now, self.view.main.busy_gpus))

    def _result(self, stopped_by: StopCause | None, rounds: int) -> SimResult:
        if self.until is not None and stopped_by is None and len(self.outcomes) != self.total:
            stopped_by = "idle"
        if stopped_by is None and len(self.outcomes) != self.total:
            stuck = [j for j in self.runs if self.view.jobs.get(j) is None or self.view.jobs[j].end_time is None]
            raise RuntimeError(f"simulation ended with {self.total - len(self.outcomes)} unfinished jobs "
                               f"(e.g. {stuck[:3]}): a job wider than the cluster?")
        return SimResult(self.policy.name, self.outcomes, self.timeline, self.view.main.total_gpus,
                         dict(self.counts), wallclock.perf_counter() - self.started, self.events, self.log, rounds,
                         stopped_by, self.view if stopped_by is not None else None)


def _resume(start: StartState, runs: dict[str, _Run], speeds: SpeedFn,
            workload_of: Callable[[str], Workload | None], plan_end: Callable[[str, float], None],
            wake: Callable[[float], None], on_cadence: bool = False) -> None:
    """Bring the start state's running jobs into the engine as if it had started them itself.

    A pair runs at its co-located speeds from now on (a member's measured rate in `start.rates`
    taking the place of its workload's speed); a profiling-pool run that outlives its window
    is stopped by the policy when the window closes (a wake-up; `on_cadence`, at the round after, unless
    its work ends first); the policy is asked to decide at `start.now` first.
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
                runs[member].shared_since = now
    for job_id in start.remaining:
        run, alloc = runs[job_id], view.allocations[job_id]
        window_end = alloc.profiling_until
        if (alloc.pool is Pool.PROFILING and window_end is not None and run.remaining > window_end - now
                and not on_cadence):
            run.version += 1  # stopped at its window's end (see `Simulation._start_profiling`)
        else:
            plan_end(job_id, now)
        if window_end is not None:
            wake(max(window_end, now))
    wake(now)


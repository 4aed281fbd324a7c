"""Space-aware profiler (paper algorithm 1) and pool autoscaling from the load forecast.

Least-GPU-first: the profiling queue is sorted by GPU demand and the scan stops at the first
job that does not fit compactly, so one wide job cannot hold back many small ones. A job
is profiled in place on the main cluster instead when the main cluster still has a compact
fit after the main queue's scan (queued jobs go first): it then runs once, not twice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from lucid_core.config import ProfilerConfig
from lucid_core.domain import Job, Pool
from lucid_core.policy.decisions import Decision, Place, SetProfilerParams, StartProfiling, StopProfiling
from lucid_core.policy.placement import COMPACT, Placement
from lucid_core.policy.predictors import Forecast
from lucid_core.policy.view import ClusterView


class SpaceAwareProfiler:
    def __init__(self, config: ProfilerConfig, placement: Placement = COMPACT) -> None:
        self.config = config
        self.placement = placement  # the policy's, for jobs profiled in place on the main cluster

    def window_for(self, view: ClusterView, job: Job) -> float:
        return self.config.long_cold_start_tprof_s if job.long_cold_start else view.tprof_s

    def wants_profiling(self, view: ClusterView, job: Job) -> bool:
        return self.config.enabled and job.gpus <= view.nprof_gpus

    def expired(self, view: ClusterView) -> list[tuple[str, bool]]:
        """Pop windows that ended by now: (job id, True when it ran on the profiling pool)."""
        out = []
        while view.window_heap and view.window_heap[0][0] <= view.now:
            _, job_id = heapq.heappop(view.window_heap)
            alloc = view.allocations.get(job_id)
            if alloc is not None and alloc.profiling_until is not None and alloc.profiling_until <= view.now:
                alloc.profiling_until = None
                out.append((job_id, alloc.pool is Pool.PROFILING))
        return out

    def overdue(self, view: ClusterView) -> list[str]:
        """Jobs that have waited for the pool as long as their own window (arrival order). Least-GPU-
        first would let a stream of 1-GPU jobs hold a wide job back for ever; an overdue job goes
        first instead, and since pool runs last at most one window, it waits at most about one more."""
        return list(self._overdue(view))

    def _overdue(self, view: ClusterView) -> Iterator[str]:
        """`overdue`, lazily: the scan of `start_windows` usually stops after the first few."""
        now, jobs, tprof, cold = view.now, view.jobs, view.tprof_s, self.config.long_cold_start_tprof_s
        for job_id in list(view.profiling_queue):  # a copy: the caller starts jobs (leaving the queue) meanwhile
            job = jobs[job_id]
            if now - job.submit_time < (cold if job.long_cold_start else tprof):
                if not job.long_cold_start:
                    break  # arrival order: later jobs waited less
                continue
            yield job_id

    def next_overdue(self, view: ClusterView) -> float | None:
        """The next time a job of the profiling queue reaches its window (later than now)."""
        now, jobs, tprof, cold = view.now, view.jobs, view.tprof_s, self.config.long_cold_start_tprof_s
        for job_id in view.profiling_queue:
            job = jobs[job_id]
            due = job.submit_time + (cold if job.long_cold_start else tprof)
            if due > now:
                return due
        return None

    def stop_decision(self, job_id: str, profiled_s: float) -> StopProfiling:
        """Stop a job whose window is over; the reason gives how long it was profiled (at least its window: the
        first round after the window ends stops it)."""
        return StopProfiling(job_id, f"profiling window over after {profiled_s:.0f} s of profiling; job joins the "
                                     "main queue")

    def autoscale(self, view: ClusterView, forecast: Forecast) -> list[Decision]:
        """Shorter windows and borrowed idle main nodes during a forecast burst; back after."""
        if not self.config.autoscale:
            return []
        burst = forecast.jobs_per_slot >= self.config.burst_jobs_per_slot
        tprof = self.config.burst_tprof_s if burst else self.config.tprof_s
        changed = tprof != view.tprof_s
        view.tprof_s = tprof
        if burst and len(view.queue) == 0 and view.profiling_queue:
            for name in view.main.idle_nodes():
                if len(view.borrowed_nodes) >= self.config.max_borrowed_nodes:
                    break
                view.borrow_node(name)
                changed = True
        if not burst or len(view.queue) > 0:
            for name in list(view.borrowed_nodes):
                node = view.profiling.nodes[name]
                if node.free == node.gpus:
                    view.return_node(name)
                    changed = True
        if not changed:
            return []
        state = "burst" if burst else "normal load"
        return [SetProfilerParams(
            view.tprof_s, view.nprof_gpus, len(view.borrowed_nodes),
            f"{state}: forecast {forecast.jobs_per_slot:.1f} jobs per slot ({forecast.source}) vs burst "
            f"threshold {self.config.burst_jobs_per_slot:g}; Tprof {view.tprof_s:g} s, "
            f"{len(view.borrowed_nodes)} borrowed node(s)")]

    def start_windows(self, view: ClusterView) -> list[Decision]:
        """Algorithm 1 over the profiling queue, with in-place profiling when the main cluster has room."""
        decisions: list[Decision] = []
        if not view.profiling_queue:
            return decisions
        late: list[str] = []

        def order() -> Iterator[str]:
            """Overdue jobs first, then the rest least-GPU-first (sorted only if the scan gets that far)."""
            for job_id in self._overdue(view):
                late.append(job_id)
                yield job_id
            seen = set(late)
            yield from sorted((j for j in view.profiling_queue if j not in seen),
                              key=lambda j: (view.jobs[j].gpus, view.jobs[j].submit_time, j))

        for job_id in order():
            job = view.jobs[job_id]
            window = self.window_for(view, job)
            until = view.now + window
            if self.config.in_place:
                gpus = self.placement.place(view.main, job.gpus, view.placement_vc(job))
                if gpus is not None:
                    view.start(job_id, Pool.MAIN, gpus, profiling_until=until)
                    decisions.append(Place(job_id, gpus, (
                        f"main cluster has room after the queue's turn: start now, profiled in place "
                        f"during the first {window:g} s of its run"), profile_in_place=True))
                    continue
            gpus = view.profiling.place_compact(job.gpus)
            if gpus is None:
                break  # an overdue job waits for the pool to drain; least-GPU-first: the rest need as many
            view.start(job_id, Pool.PROFILING, gpus, profiling_until=until)
            decisions.append(StartProfiling(job_id, gpus, window, (
                f"smallest GPU demand ({job.gpus}) waiting for profiling that fits the pool; "
                f"window {window:g} s")))
        return decisions

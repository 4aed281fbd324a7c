"""LucidPolicy: profiler + binder + orchestrator behind the one SchedulingPolicy interface."""

from __future__ import annotations

from collections.abc import Sequence

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile
from lucid_core.policy.base import PolicyParts, SchedulingPolicy
from lucid_core.policy.binder import AffinityBinder
from lucid_core.policy.decisions import Decision, checkpoint_cost_s
from lucid_core.policy.orchestrator import (
    Orchestrator,
    Reserver,
    exclusive_reason,
    floored_prediction,
    place_queue,
    reservation_nodes,
)
from lucid_core.policy.packing_models import PackingModels
from lucid_core.policy.predictors import (
    DurationPredictor,
    HistoryDurationPredictor,
    PackingClassifier,
    RecentSlotsForecaster,
    ThroughputForecaster,
)
from lucid_core.policy.profiler import SpaceAwareProfiler
from lucid_core.policy.view import ClusterView
from lucid_core.policy.yielding import Seniority, YieldRule, yield_to_waiting


class LucidPolicy(SchedulingPolicy):
    name = "lucid"
    preemptive = True  # only by yielding (policy/yielding.py), only jobs that resume from checkpoints

    def __init__(self, config: LucidConfig, duration_model: DurationPredictor | None = None,
                 packing_model: PackingClassifier | None = None,
                 forecaster: ThroughputForecaster | None = None,
                 packing_models: PackingModels | None = None) -> None:
        self.config = config
        self.profiles = config.profiler.enabled
        self.model_sources: dict[str, str] = {}  # model kind -> where it came from (the live round fills it)
        self.duration_model = duration_model or HistoryDurationPredictor()
        self.forecaster = forecaster or RecentSlotsForecaster(config.forecast.slot_s)
        self.profiler = SpaceAwareProfiler(config.profiler, self.placement)
        self.binder = AffinityBinder(config.binder, packing_model, packing_models)
        self.orchestrator = Orchestrator(self.duration_model, config.orchestrator.estimator,
                                         config.orchestrator.aging, config.orchestrator.guard_slowdown,
                                         config.profiler.tprof_s, config.orchestrator.long_quantile,
                                         guard_tail=config.orchestrator.guard_tail)
        self.yield_rule = YieldRule(config.orchestrator.yield_margin, config.orchestrator.yield_min_run,
                                    config.orchestrator.yield_max, wide=config.orchestrator.yield_wide,
                                    interval_s=config.orchestrator.yield_interval_s)

    def describe(self) -> PolicyParts:
        return PolicyParts(self.duration_model, self.binder.packing_model, self.forecaster, dict(self.model_sources))

    # --- hooks ----------------------------------------------------------------------------
    def on_submit(self, view: ClusterView, job: Job) -> None:
        self.binder.attach(view)
        self.forecaster.observe_submission(view.now, job.gpus)
        # a job the profiling pool could never hold (wider than its nodes allow) is profiled in its run
        if self.profiler.wants_profiling(view, job) and view.profiling.could_hold(job.gpus):
            view.enqueue_profiling(job)
        else:
            self.orchestrator.enqueue(view, job)

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        self.orchestrator.enqueue(view, job)

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        self.binder.attach(view)
        job.profile = profile
        job.share_class = self.binder.classify(profile)
        alloc = view.allocations.get(job.job_id)
        if alloc is not None and alloc.pool is Pool.MAIN:  # profiled in place / online: keeps running
            view.set_profile_mem(job.job_id, profile.gpu_mem_mb)
            job.predicted_duration = floored_prediction(job, self.duration_model.predict_duration([job])[0])
            view.refresh_share_candidate(job.job_id)
        else:
            self.orchestrator.enqueue(view, job)

    def on_restored(self, view: ClusterView, jobs: Sequence[Job]) -> None:
        """Class and prediction as stored: straight back into the main queue, nothing re-predicted."""
        self.binder.attach(view)
        whole: list[Job] = []
        partial: list[Job] = []  # stored without a class or prediction: classified and predicted again
        for job in jobs:
            complete = job.share_class is not None and job.predicted_duration is not None and job.profile is not None
            (whole if complete else partial).append(job)
        super().on_restored(view, partial)
        self.orchestrator.requeue_many(view, whole)

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        self.duration_model.observe(job, run_time)
        if job.start_time is not None:
            self.orchestrator.observe_wait(job.start_time - job.submit_time)

    # --- the round ------------------------------------------------------------------------
    def schedule(self, view: ClusterView) -> list[Decision]:
        self.binder.attach(view)
        decisions: list[Decision] = []
        decisions.extend(self._end_windows(view))
        decisions.extend(self.binder.split_unstable(view))
        # predicted first: jobs submitted since the last round are in the main queue when the mode
        # check counts the GPUs queued (live, a burst can arrive between two rounds)
        self.orchestrator.predict_pending(view)
        interval = self.config.forecast.mode_check_interval_s
        if view.last_mode_check is None or view.now - view.last_mode_check >= interval:
            view.last_mode_check = view.now
            forecast = self.forecaster.forecast(view.now)
            change = self.binder.update_mode(view, forecast)
            if change is not None:
                decisions.append(change)
            decisions.extend(self.profiler.autoscale(view, forecast))
        self.orchestrator.promote_overdue(view)
        # the main queue first: profiled jobs waiting there have been waiting longest
        online = view.tprof_s if self.config.profiler.enabled else None
        guarded = self.orchestrator.guard_slowdown > 0 or self.orchestrator.guard_tail > 0
        reserve = reservation_nodes if guarded else None
        view.reserved_for = None
        decisions.extend(self._scan(view, online, reserve))
        last = view.last_yield_check  # in the view's saved state: live rounds keep the simulator's rhythm
        if last is None or view.now - last >= self.yield_rule.interval_s:
            view.last_yield_check = view.now
            decisions.extend(self._yield(view, online))
        return decisions

    def _scan(self, view: ClusterView, online: float | None, reserve: Reserver | None) -> list[Decision]:
        """The orchestrator's placement scan of the main queue, then the profiler's windows."""
        try:
            placed = place_queue(view, self._partner, online_window_s=online, reserve=reserve,
                                 backfill_reserved=self.config.orchestrator.backfill_reserved,
                                 backfill_margin=self.config.orchestrator.backfill_margin,
                                 placement=self.placement)
            return [*placed, *self.profiler.start_windows(view)]
        finally:
            view.main.release_holds()

    def _yield(self, view: ClusterView, online: float | None) -> list[Decision]:
        seniority = (Seniority(self.orchestrator.oldest_long, lambda job: self.orchestrator.is_long(view, job))
                     if self.config.orchestrator.yield_seniority else None)
        return yield_to_waiting(
            view, self.yield_rule, lambda job, left: self._requeue_stopped(view, job, left),
            self._checkpoint_cost, self._guard_started, lambda job, key: exclusive_reason(view, job, key),
            self.placement, online, seniority)

    def _checkpoint_cost(self, job: Job) -> float:
        return checkpoint_cost_s(self.config, job.gpus)

    def _guard_started(self, job: Job) -> bool:
        """The job started because the guard found it overdue: its allowed slowdown is spent."""
        due = self.orchestrator.overdue_at(job)
        return due is not None and job.start_time is not None and due <= job.start_time

    def _requeue_stopped(self, view: ClusterView, job: Job, work_left_s: float) -> None:
        """A job that yielded waits again, ordered by the work it has left. The guard's clock still runs
        from its submission (a slowdown bound over its whole stay: measured, BENCHMARKS, it keeps the
        queueing tail that a clock restarted at the stop loses)."""
        keep = self.config.orchestrator.yield_keep_place
        kept = self.orchestrator.sort_key(job, view.now, self.orchestrator.long_cap(view)) if keep else None
        job.predicted_duration = max(work_left_s, 1.0)
        self.orchestrator.requeue(view, job, key=kept)

    def next_wakeup(self, view: ClusterView) -> float | None:
        times = [t for t in (view.window_heap[0][0] if view.window_heap else None,
                             self.orchestrator.next_deadline(view), self.profiler.next_overdue(view))
                 if t is not None and t > view.now]
        return min(times) if times else None

    def _end_windows(self, view: ClusterView) -> list[Decision]:
        decisions: list[Decision] = []
        for job_id, on_pool in self.profiler.expired(view):
            job = view.jobs[job_id]
            alloc = view.allocations[job_id]
            elapsed = view.now - alloc.start
            profile = view.profile_of(job_id)
            if on_pool:
                view.stop(job_id)
                job.known_min_duration = max(job.known_min_duration, elapsed)
                decisions.append(self.profiler.stop_decision(job_id, elapsed))
            else:
                job.known_min_duration = max(job.known_min_duration, elapsed)
            if profile is not None:
                self.on_profiled(view, job, profile)
            elif on_pool:
                self.orchestrator.enqueue(view, job)
        return decisions

    def _partner(self, view: ClusterView, job: Job) -> tuple[str, str] | None:
        choice = self.binder.find_partner(view, job)
        return None if choice is None else (choice.partner, choice.reason)

"""The schedulers Lucid is compared with, behind the same interface, decided by the same scans.

FIFO (arrival order, no backfilling), SJF (true durations: the non-preemptive ideal, only for
simulation), QSSF (a black-box gradient-boosting duration prediction from history) and
Tiresias (2-queue discretized least-attained-service on GPU-time, preemptive).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.decisions import Decision, Place, Preempt
from lucid_core.policy.orchestrator import place_queue
from lucid_core.policy.view import ClusterView


class _QueueOnlyPolicy(SchedulingPolicy):
    """Shared by the non-preemptive baselines: no profiling, a key, one placement scan."""

    name = "base"
    preemptive = False
    profiles = False
    strict_order = False

    def __init__(self, config: LucidConfig) -> None:
        self.config = config

    def key(self, job: Job) -> tuple[float, float, str]:
        raise NotImplementedError

    def on_submit(self, view: ClusterView, job: Job) -> None:
        view.enqueue_main(job, self.key(job))

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        self.on_submit(view, job)

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        job.profile = profile

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        return None

    def schedule(self, view: ClusterView) -> list[Decision]:
        return place_queue(view, None, strict_order=self.strict_order)

    def next_wakeup(self, view: ClusterView) -> float | None:
        return None


class FifoPolicy(_QueueOnlyPolicy):
    name = "fifo"
    strict_order = True

    def key(self, job: Job) -> tuple[float, float, str]:
        return (job.submit_time, 0.0, job.job_id)


class SjfPolicy(_QueueOnlyPolicy):
    """Shortest job first with the TRUE durations: an oracle no live scheduler has."""

    name = "sjf"

    def __init__(self, config: LucidConfig, true_durations: Mapping[str, float]) -> None:
        super().__init__(config)
        self.true_durations = true_durations

    def key(self, job: Job) -> tuple[float, float, str]:
        return (self.true_durations[job.job_id], job.submit_time, job.job_id)


def _time_features(jobs: Sequence[Job], vc_codes: Mapping[str, int],
                   vc_history: Mapping[str, float]) -> np.ndarray:
    rows = []
    for job in jobs:
        hour = (job.submit_time / 3600.0) % 24.0
        day = (job.submit_time / 86400.0) % 7.0
        rows.append([float(vc_codes.get(job.vc, -1)), float(job.gpus), hour, day,
                     vc_history.get(job.vc, math.nan)])
    return np.asarray(rows, dtype=float).reshape(len(rows), 5)


class QssfPolicy(_QueueOnlyPolicy):
    """Quasi-shortest-service-first: GPUs x duration predicted by a gradient-boosting model
    trained on past jobs (VC, GPU demand, submit hour and weekday, the VC's mean log duration)."""

    name = "qssf"

    def __init__(self, config: LucidConfig, history: Sequence[Job], history_durations: Sequence[float],
                 random_state: int = 0) -> None:
        super().__init__(config)
        from sklearn.ensemble import HistGradientBoostingRegressor

        if len(history) < 10:
            raise ValueError(f"QSSF needs a training history of past jobs; got {len(history)}")
        self.vc_codes_ = {vc: i for i, vc in enumerate(sorted({j.vc for j in history}))}
        sums: dict[str, list[float]] = {}
        for job, d in zip(history, history_durations, strict=True):
            sums.setdefault(job.vc, []).append(math.log1p(d))
        self.vc_history_ = {vc: sum(v) / len(v) for vc, v in sums.items()}
        X = _time_features(history, self.vc_codes_, self.vc_history_)
        y = [math.log1p(d) for d in history_durations]
        self.model_ = HistGradientBoostingRegressor(max_iter=200, random_state=random_state,
                                                    categorical_features=[0]).fit(X, y)

        self.cache_: dict[str, float] = {}

    def precompute(self, jobs: Sequence[Job]) -> None:
        """Predict many jobs in one call. The model is fixed and reads only submission-time
        features, so predicting ahead gives the same values as predicting on arrival."""
        preds = self.model_.predict(_time_features(jobs, self.vc_codes_, self.vc_history_))
        self.cache_.update({job.job_id: max(1.0, math.expm1(float(p))) for job, p in zip(jobs, preds, strict=True)})

    def on_submit(self, view: ClusterView, job: Job) -> None:
        if job.job_id not in self.cache_:
            self.precompute([job])
        job.predicted_duration = self.cache_.pop(job.job_id)
        view.enqueue_main(job, (job.priority, job.submit_time, job.job_id))


class TiresiasPolicy(SchedulingPolicy):
    """Two-queue discretized LAS on attained GPU-time: new jobs in queue 1, demoted past the
    threshold; FIFO within a queue by entry time; higher queues preempt lower ones. Every
    preemption costs the job `checkpoint_cost_s` of extra run time (the driver applies it)."""

    name = "tiresias"
    preemptive = True
    profiles = False

    def __init__(self, config: LucidConfig) -> None:
        self.config = config
        self.threshold = config.tiresias.queue_threshold_gpu_s
        self.attained_: dict[str, float] = {}  # GPU-seconds served before the current run
        self.entered_: dict[str, tuple[int, float]] = {}  # (queue, time it entered that queue)
        self.crossings_: list[tuple[float, str]] = []

    def on_submit(self, view: ClusterView, job: Job) -> None:
        self.attained_[job.job_id] = 0.0
        self.entered_[job.job_id] = (0, job.submit_time)
        view.enqueue_main(job, (0.0, job.submit_time, job.job_id))

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        self.attained_.setdefault(job.job_id, 0.0)
        queue, since = self.entered_.setdefault(job.job_id, (0, job.submit_time))
        view.enqueue_main(job, (float(queue), since, job.job_id))

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        job.profile = profile

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        self.attained_.pop(job.job_id, None)
        self.entered_.pop(job.job_id, None)

    def _attained(self, view: ClusterView, job_id: str) -> float:
        alloc = view.allocations.get(job_id)
        base = self.attained_[job_id]
        if alloc is not None:
            base += (view.now - alloc.start) * view.jobs[job_id].gpus
        return base

    def _demote_due(self, view: ClusterView) -> None:
        while self.crossings_ and self.crossings_[0][0] <= view.now:
            _, job_id = heapq.heappop(self.crossings_)
            if job_id in view.allocations and self.entered_.get(job_id, (1, 0))[0] == 0 \
                    and self._attained(view, job_id) >= self.threshold - 1e-6:
                self.entered_[job_id] = (1, view.now)

    def schedule(self, view: ClusterView) -> list[Decision]:
        self._demote_due(view)
        running = list(view.allocations)
        order = sorted(running + view.queue.ordered(), key=lambda j: (*self.entered_[j], j))
        capacity = {vc: view.main.total_gpus_of(vc) for vc in view.main.vcs | {""}}
        used = dict.fromkeys(capacity, 0)
        admitted: set[str] = set()
        for job_id in order:
            job = view.jobs[job_id]
            vc = view.placement_vc(job)
            if used[vc] + job.gpus <= capacity[vc]:
                admitted.add(job_id)
                used[vc] += job.gpus
                if len(capacity) == 1 and used[vc] >= capacity[vc]:
                    break  # one pool, full: the rest waits
        decisions: list[Decision] = []
        for job_id in running:
            if job_id not in admitted:
                self.attained_[job_id] = self._attained(view, job_id)
                view.stop(job_id)
                queue, _ = self.entered_[job_id]
                view.enqueue_main(view.jobs[job_id], (float(queue), view.now, job_id))
                decisions.append(Preempt(job_id, f"a job of a higher queue needs its GPUs (queue {queue + 1})"))
        for job_id in order:
            if job_id in admitted and job_id not in view.allocations:
                job = view.jobs[job_id]
                gpus = view.main.place_compact(job.gpus, view.placement_vc(job))
                if gpus is None:
                    continue  # admitted but fragmented: waits for the next round
                view.start(job_id, Pool.MAIN, gpus)
                queue, _ = self.entered_[job_id]
                if queue == 0:
                    left = (self.threshold - self.attained_[job_id]) / job.gpus
                    heapq.heappush(self.crossings_, (view.now + max(left, 0.0), job_id))
                decisions.append(Place(job_id, gpus, f"queue {queue + 1}, attained "
                                       f"{self.attained_[job_id] / 3600:.2f} GPU-h; fits"))
        return decisions

    def next_wakeup(self, view: ClusterView) -> float | None:
        while self.crossings_ and self.crossings_[0][1] not in view.allocations:
            heapq.heappop(self.crossings_)
        return self.crossings_[0][0] if self.crossings_ else None

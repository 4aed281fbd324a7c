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
from lucid_core.policy.decisions import Decision, Place, Preempt, checkpoint_cost_s
from lucid_core.policy.orchestrator import place_queue
from lucid_core.policy.view import ClusterView, SortKey


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
        return place_queue(view, None, strict_order=self.strict_order, placement=self.placement)

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
    """Quasi-shortest-service-first (Helios, Hu et al. SC'21): priority = GPUs x duration predicted
    by a gradient-boosting model trained on past jobs (VC, GPU demand, submit hour and weekday, the
    VC's mean log duration); non-preemptive, and, as in both the Helios and the Lucid artifacts,
    the scan stops at the first job that does not fit (no backfilling). `backfill=True` is a
    stronger variant that skips such a job instead ("qssf-backfill" in the policy matrix)."""

    name = "qssf"
    strict_order = True

    def __init__(self, config: LucidConfig, history: Sequence[Job], history_durations: Sequence[float],
                 random_state: int = 0, backfill: bool = False) -> None:
        super().__init__(config)
        if backfill:
            self.name, self.strict_order = "qssf-backfill", False
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.cache_: dict[str, float] = {}
        self.model_: HistGradientBoostingRegressor | None = None
        if len(history) < 10:
            return  # too little to learn from: every job is predicted alike, so GPU demand orders them
        self.vc_codes_ = {vc: i for i, vc in enumerate(sorted({j.vc for j in history}))}
        sums: dict[str, list[float]] = {}
        for job, d in zip(history, history_durations, strict=True):
            sums.setdefault(job.vc, []).append(math.log1p(d))
        self.vc_history_ = {vc: sum(v) / len(v) for vc, v in sums.items()}
        X = _time_features(history, self.vc_codes_, self.vc_history_)
        y = [math.log1p(d) for d in history_durations]
        self.model_ = HistGradientBoostingRegressor(max_iter=200, random_state=random_state,
                                                    categorical_features=[0]).fit(X, y)

    def precompute(self, jobs: Sequence[Job]) -> None:
        """Predict many jobs in one call. The model is fixed and reads only submission-time
        features, so predicting ahead gives the same values as predicting on arrival."""
        if self.model_ is None:
            self.cache_.update({job.job_id: 3600.0 for job in jobs})
            return
        preds = self.model_.predict(_time_features(jobs, self.vc_codes_, self.vc_history_))
        self.cache_.update({job.job_id: max(1.0, math.expm1(float(p))) for job, p in zip(jobs, preds, strict=True)})

    def on_submit(self, view: ClusterView, job: Job) -> None:
        if job.job_id not in self.cache_:
            self.precompute([job])
        job.predicted_duration = self.cache_.pop(job.job_id)
        view.enqueue_main(job, (job.priority, job.submit_time, job.job_id))


class TiresiasPolicy(SchedulingPolicy):
    """Tiresias (Gu et al., NSDI'19) as the Lucid artifact simulates it: two-queue discretized
    least-attained-service on GPU-time. A job whose attained GPU-seconds exceed the threshold
    (18,000 by default) is in the low queue; within a queue jobs go in arrival (submit) order.
    Every `interval_s` (60 s) the scheduler walks high queue then low queue, admits each job
    whose GPUs still fit the cluster's total and preempts every running job that no longer
    does; admitted jobs are then placed compactly (one that does not fit compactly waits).
    A preempted job loses `checkpoint_cost_s` (wider than a node: `checkpoint_cost_wide_s`)."""

    name = "tiresias"
    preemptive = True
    assumes_checkpoints = True  # it preempts by design: every job is taken to resume from its checkpoints
    profiles = False

    def __init__(self, config: LucidConfig) -> None:
        self.config = config
        self.threshold = config.tiresias.queue_threshold_gpu_s
        self.interval = config.tiresias.interval_s
        self.attained_: dict[str, float] = {}  # GPU-seconds served before the current run

    def on_submit(self, view: ClusterView, job: Job) -> None:
        self.attained_[job.job_id] = 0.0
        view.enqueue_main(job, (0.0, job.submit_time, job.job_id))

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        attained = self.attained_.setdefault(job.job_id, 0.0)
        view.enqueue_main(job, (self.queue_of(attained), job.submit_time, job.job_id))

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        job.profile = profile

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        self.attained_.pop(job.job_id, None)

    def queue_of(self, attained_gpu_s: float) -> float:
        """0.0 (high queue) until attained service exceeds the threshold, then 1.0."""
        return 1.0 if attained_gpu_s > self.threshold else 0.0

    def _attained(self, view: ClusterView, job_id: str) -> float:
        alloc = view.allocations.get(job_id)
        base = self.attained_[job_id]
        if alloc is not None:
            base += (view.now - alloc.start) * view.jobs[job_id].gpus
        return base

    def _on_tick(self, now: float) -> bool:
        return abs(now - round(now / self.interval) * self.interval) < 1e-6

    def schedule(self, view: ClusterView) -> list[Decision]:
        if len(view.queue) == 0 or not self._on_tick(view.now):
            return []  # decisions only every interval_s, and only when someone waits
        running = [(self.queue_of(self._attained(view, j)), view.jobs[j].submit_time, j) for j in view.allocations]
        capacity = {vc: view.main.total_gpus_of(vc) for vc in view.main.vcs | {""}}
        if len(capacity) == 1 and (not running or min(i[0][0] for i in view.queue.parts().values()) > max(running)):
            return self._admit_behind_running(view)
        # a queued job's attained service does not change while it waits: its stored key is current.
        # Walk running jobs and queue parts in key order; a part whose head does not fit is dropped
        # whole (its jobs need as many GPUs of the same VC, and `used` only grows)
        ranked = sorted(running)  # `running` keeps allocation order: preemptions go out in that order
        parts = list(view.queue.parts().items())
        heads: list[tuple[SortKey, int, int]] = [(items[0][0], i, 0) for i, (_, items) in enumerate(parts)]
        if ranked:
            heads.append((ranked[0], -1, 0))  # type: ignore[arg-type]
        heapq.heapify(heads)
        used = dict.fromkeys(capacity, 0)
        admitted: set[str] = set()
        order: list[tuple[float, float, str]] = []
        vcs = view.main.vcs
        while heads:
            key, which, i = heapq.heappop(heads)
            job_id = key[2]
            job = view.jobs[job_id]
            vc = job.vc if job.vc and job.vc in vcs else ""
            fits = used[vc] + job.gpus <= capacity[vc]
            if fits:
                admitted.add(job_id)
                order.append(key)  # type: ignore[arg-type]
                used[vc] += job.gpus
            if which < 0:
                if i + 1 < len(ranked):
                    heapq.heappush(heads, (ranked[i + 1], -1, i + 1))  # type: ignore[arg-type]
            elif fits and i + 1 < len(parts[which][1]):
                heapq.heappush(heads, (parts[which][1][i + 1][0], which, i + 1))
            if len(capacity) == 1 and used[vc] >= capacity[vc]:
                break  # one pool, full: the rest waits
        decisions: list[Decision] = []
        for queue, _, job_id in running:
            if job_id not in admitted:
                self.attained_[job_id] = self._attained(view, job_id)
                view.stop(job_id)
                job = view.jobs[job_id]
                view.enqueue_main(job, (queue, job.submit_time, job_id))
                cost = checkpoint_cost_s(self.config, job.gpus)
                decisions.append(Preempt(job_id, f"jobs ahead of it in queue {int(queue) + 1} or a higher queue "
                                                 f"need its GPUs; it loses {cost:g} s"))
        for queue, _, job_id in order:
            if job_id in admitted and job_id not in view.allocations:
                decisions.extend(self._place_admitted(view, job_id, queue))
        return decisions

    def _place_admitted(self, view: ClusterView, job_id: str, queue: float) -> list[Decision]:
        """Start an admitted job compactly; one that does not fit compactly waits for the next round."""
        job = view.jobs[job_id]
        gpus = self.placement.place(view.main, job.gpus, view.placement_vc(job))
        if gpus is None:
            return []
        view.start(job_id, Pool.MAIN, gpus)
        return [Place(job_id, gpus, f"queue {int(queue) + 1} (attained {self.attained_[job_id] / 3600:.2f} GPU-h, "
                                    f"threshold {self.threshold / 3600:g}), in arrival order; fits")]

    def _admit_behind_running(self, view: ClusterView) -> list[Decision]:
        """The common case, every running job ahead of every queued one: nobody is preempted and
        queued jobs are admitted in order while their GPUs fit what is free. Jobs of one queue part
        need the same GPUs, so a part whose head does not fit is skipped whole."""
        free = view.main.free_gpus()
        parts = view.queue.parts()
        heads = [(items[0][0], part, 0) for part, items in parts.items()]
        heapq.heapify(heads)
        admitted: list[tuple[SortKey, str]] = []
        while heads and free > 0:
            key, part, i = heapq.heappop(heads)
            if part[1] > free:
                continue
            items = parts[part]
            admitted.append((key, items[i][1]))
            free -= part[1]
            if i + 1 < len(items):
                heapq.heappush(heads, (items[i + 1][0], part, i + 1))
        decisions: list[Decision] = []
        for key, job_id in admitted:
            decisions.extend(self._place_admitted(view, job_id, key[0]))
        return decisions

    def next_wakeup(self, view: ClusterView) -> float | None:
        """The next scheduling tick while jobs wait."""
        if len(view.queue) == 0:
            return None
        return (math.floor(view.now / self.interval + 1e-9) + 1) * self.interval

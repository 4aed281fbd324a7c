"""Resource Orchestrator (paper section 9, algorithm 2): priority order and placement.

priority = GPUs x predicted duration (less an aging credit for time waited), ascending. A scan
places every queued job that fits compactly (alone, or with an affine partner when the binder
allows), skipping the rest: no preemption, ever. The scan visits only the head of each (GPU demand, share class) part of
the queue, since jobs within a part fit or fail alike.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from lucid_core.domain import Job, Pool
from lucid_core.policy.decisions import Decision, Place
from lucid_core.policy.predictors import DurationPredictor
from lucid_core.policy.view import ClusterView, SortKey

PartnerFinder = Callable[[ClusterView, Job], "tuple[str, str] | None"]


def place_queue(view: ClusterView, find_partner: PartnerFinder | None = None,
                strict_order: bool = False, online_window_s: float | None = None) -> list[Decision]:
    """Scan the main queue in key order and place what fits.

    `find_partner(view, job)` returns (partner id, reason) for a job with no exclusive fit.
    `strict_order` stops at the first job that cannot start (FIFO without backfilling).
    `online_window_s`: a job placed without a profile is profiled during the first seconds of
    its run (jobs wider than Nprof, or no profiling pool).
    """
    decisions: list[Decision] = []
    parts = view.queue.parts()
    heads = [(items[0][0], part) for part, items in parts.items()]
    heapq.heapify(heads)
    queued_vcs = {part[0] for part in parts}
    smallest_unfit: dict[str, int] = {}  # per VC: a job this wide found no fit, so wider ones won't
    main = view.main
    while heads:
        key, part = heapq.heappop(heads)
        items = parts.get(part)
        if not items or items[0][0] != key:
            continue
        job_id = items[0][1]
        job = view.jobs[job_id]
        vc = part[0]
        placed = False
        if job.gpus < smallest_unfit.get(vc, 1 << 30):
            gpus = main.place_compact(job.gpus, vc)
            if gpus is not None:
                online = online_window_s is not None and job.profile is None
                view.start(job_id, Pool.MAIN, gpus,
                           profiling_until=view.now + online_window_s if online else None)  # type: ignore[operator]
                reason = _exclusive_reason(view, job, key)
                if online:
                    reason += f"; profiled online during its first {online_window_s:g} s"
                decisions.append(Place(job_id, gpus, reason, profile_in_place=online))
                placed = True
            else:
                smallest_unfit[vc] = job.gpus
        if not placed and find_partner is not None:
            found = find_partner(view, job)
            if found is not None:
                partner, reason = found
                gpus = view.allocations[partner].gpus
                view.start(job_id, Pool.MAIN, gpus, partner=partner)
                decisions.append(Place(job_id, gpus, reason, partner=partner))
                placed = True
        if placed:
            items = parts.get(part)
            if items:
                heapq.heappush(heads, (items[0][0], part))
        elif strict_order:
            break
        if find_partner is None and all(smallest_unfit.get(v) == 1 for v in queued_vcs):
            break  # nothing free in any queued job's VC and nothing to share: the rest waits
    return decisions


def _exclusive_reason(view: ClusterView, job: Job, key: SortKey) -> str:
    if job.predicted_duration is not None:
        return (f"priority {job.priority / 3600:.2f} GPU-h = {job.gpus} GPU(s) x predicted "
                f"{job.predicted_duration / 3600:.2f} h; compact exclusive fit")
    return "next in order; compact exclusive fit"


class Orchestrator:
    """Predicts durations in batches and keeps the main queue in priority order."""

    def __init__(self, duration_model: DurationPredictor, use_estimator: bool = True, aging: float = 0.0) -> None:
        self.duration_model = duration_model
        self.use_estimator = use_estimator
        self.aging = aging

    def enqueue(self, view: ClusterView, job: Job) -> None:
        """Queue for prediction; the job joins the main queue at the next `predict_pending`."""
        view.unpredicted.append(job.job_id)

    def predict_pending(self, view: ClusterView) -> None:
        """One batched model call for every job that joined since the last round."""
        if not view.unpredicted:
            return
        jobs = [view.jobs[j] for j in view.unpredicted]
        view.unpredicted = []
        predictions = self.duration_model.predict_duration(jobs)
        for job, pred in zip(jobs, predictions, strict=True):
            job.predicted_duration = max(float(pred), job.known_min_duration, 1.0)
            view.enqueue_main(job, self.sort_key(job))

    def sort_key(self, job: Job) -> SortKey:
        if self.use_estimator:
            # aging credits `aging` GPU-seconds of priority per second waited; adding it as
            # aging x submit time keeps the order static, since every waiting job gains alike
            return (job.priority + self.aging * job.submit_time, job.submit_time, job.job_id)
        return (job.submit_time, 0.0, job.job_id)

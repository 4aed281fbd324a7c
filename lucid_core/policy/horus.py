"""Horus (Yeung et al., TPDS 2021): interference-aware, prediction-based packing of DL jobs.

Horus reads a job's model graph before it runs and predicts its GPU utilization from it, so it
needs neither a profiling run nor a profiling pool; it then places jobs by predicted utilization,
co-locating jobs on a GPU only while the GPU is predicted not to be oversubscribed (its study
finds GPU utilization the proxy that tells good co-locations from interfering ones). Its rules
here, each named where it acts:

* `RULE_PROFILE_AT_SUBMISSION`: a job's utilization, memory-bandwidth use and GPU memory are
  known when it is submitted (in the simulator: its catalog workload's profile, standing in for
  the prediction from its graph; no profiling window, no profiling pool).
* `RULE_PREDICTED_ORDER`: the queue is ordered by predicted GPU-time (GPUs x a duration predicted
  from history, QSSF's model), shortest first; a job that cannot start is skipped (backfilling).
* `RULE_LEAST_LOADED`: a job goes where the predicted load is least: free GPUs (load 0, a compact
  exclusive placement) first, otherwise the GPUs of the running job with the least predicted
  utilization that passes the interference rule.
* `RULE_NO_OVERSUBSCRIPTION` (the interference rule): two jobs share GPUs only if their predicted
  utilizations sum to at most `utilization_cap` (100%) and their memory footprints fit the GPU.

Limits of the engine it runs in: a GPU holds at most two jobs, and a job shares only with a
running job of the same GPU count (it takes that job's GPUs). Horus is intrusive (it needs the
model graph) and so is a simulation baseline only: live, nothing gives a profile at submission.
"""

from __future__ import annotations

from collections.abc import Sequence

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.decisions import Decision
from lucid_core.policy.orchestrator import place_queue
from lucid_core.policy.predictors import DurationPredictor, UtilizationRuleClassifier
from lucid_core.policy.view import ClusterView

RULE_PROFILE_AT_SUBMISSION = "profile at submission"
RULE_PREDICTED_ORDER = "predicted GPU-time order"
RULE_LEAST_LOADED = "least predicted load"
RULE_NO_OVERSUBSCRIPTION = "no oversubscription"


class HorusPolicy(SchedulingPolicy):
    """Horus's ordering and packing rules behind the common policy interface."""

    name = "horus"
    preemptive = False
    profiles = False

    def __init__(self, config: LucidConfig, duration_model: DurationPredictor,
                 utilization_cap: float = 100.0) -> None:
        self.config = config
        self.duration_model = duration_model
        self.utilization_cap = utilization_cap
        self._classes = UtilizationRuleClassifier()
        self._predicted: dict[str, float] = {}

    def precompute(self, jobs: Sequence[Job]) -> None:
        """Predict many jobs in one model call (the model reads only submission-time features)."""
        if jobs:
            preds = self.duration_model.predict_duration(list(jobs))
            self._predicted.update({job.job_id: float(p) for job, p in zip(jobs, preds, strict=True)})

    def on_submit(self, view: ClusterView, job: Job) -> None:
        profile = view.profile_of(job.job_id)  # RULE_PROFILE_AT_SUBMISSION
        if profile is not None:
            job.profile = profile
            job.share_class = self._classes.classify([profile])[0]
        if job.job_id not in self._predicted:
            self.precompute([job])
        job.predicted_duration = max(1.0, self._predicted.pop(job.job_id))
        view.enqueue_main(job, (job.priority, job.submit_time, job.job_id))  # RULE_PREDICTED_ORDER

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        view.enqueue_main(job, (job.priority, job.submit_time, job.job_id))

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        job.profile = profile

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        self.duration_model.observe(job, run_time)

    def schedule(self, view: ClusterView) -> list[Decision]:
        return place_queue(view, self._least_loaded_partner, placement=self.placement)

    def next_wakeup(self, view: ClusterView) -> float | None:
        return None

    def can_share(self, view: ClusterView, job: Job, other: Job) -> bool:
        """RULE_NO_OVERSUBSCRIPTION: summed predicted utilization within the cap, memory fits."""
        if job.profile is None or other.profile is None:
            return False
        if job.profile.gpu_util + other.profile.gpu_util > self.utilization_cap:
            return False
        gpus = view.allocations[other.job_id].gpus
        return job.profile.gpu_mem_mb <= view.main.mem_free_on(gpus)

    def _least_loaded_partner(self, view: ClusterView, job: Job) -> tuple[str, str] | None:
        """RULE_LEAST_LOADED among running jobs that pass the interference rule."""
        if job.profile is None:
            return None
        vc = view.placement_vc(job)
        best: tuple[float, str] | None = None
        for other_id in view.share_candidates.get(job.gpus, {}):
            other = view.jobs[other_id]
            alloc = view.allocations[other_id]
            if alloc.pool is not Pool.MAIN or view.placement_vc(other) != vc:
                continue
            if not self.can_share(view, job, other):
                continue
            load = other.profile.gpu_util if other.profile is not None else 100.0
            if best is None or (load, other_id) < best:
                best = (load, other_id)
        if best is None:
            return None
        load, partner = best
        total = load + job.profile.gpu_util
        return partner, (f"{RULE_LEAST_LOADED}: shares {partner}'s GPUs, predicted utilization "
                         f"{load:.0f}% + {job.profile.gpu_util:.0f}% = {total:.0f}% <= {self.utilization_cap:.0f}% "
                         f"({RULE_NO_OVERSUBSCRIPTION}); memory fits")


class QssfDurations:
    """QSSF's gradient-boosting duration model as a `DurationPredictor` (Horus predicts so)."""

    def __init__(self, qssf) -> None:
        self.qssf = qssf

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        self.qssf.precompute(jobs)
        return [self.qssf.cache_.pop(job.job_id) for job in jobs]

    def observe(self, job: Job, duration: float) -> None:
        return None

"""Affine-jobpair Binder (paper section 8): sharing scores, GSS modes and the hard pairing rules.

Indolent packing: a job shares a GPU only when it could not start alone, and only with a
partner that passes every rule below; missing a pairing is cheaper than a bad one.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid_core.config import BinderConfig
from lucid_core.domain import Job, Profile, ShareClass, SharingMode
from lucid_core.policy.decisions import SetSharingMode, Unpair
from lucid_core.policy.predictors import Forecast, PackingClassifier, UtilizationRuleClassifier
from lucid_core.policy.view import Allocation, ClusterView


@dataclass(frozen=True, slots=True)
class PartnerChoice:
    partner: str
    reason: str


def choose_mode(config: BinderConfig, forecast: Forecast) -> tuple[SharingMode, str]:
    """GSS from the load forecast: sharing only pays when work is coming."""
    if config.sharing == "off":
        return SharingMode.OFF, "sharing disabled in the configuration"
    if config.sharing == "on":
        return SharingMode.DEFAULT, "sharing forced on in the configuration"
    gpus = forecast.gpus_per_slot
    if gpus < config.low_load_gpus_per_slot:
        return SharingMode.OFF, (f"forecast {gpus:.1f} GPUs requested per slot < "
                                 f"{config.low_load_gpus_per_slot:g} ({forecast.source}): load stays low")
    if gpus < config.apathetic_gpus_per_slot:
        return SharingMode.APATHETIC, (f"forecast {gpus:.1f} GPUs per slot < "
                                       f"{config.apathetic_gpus_per_slot:g}: apathetic mode (GSS 1)")
    return SharingMode.DEFAULT, f"forecast {gpus:.1f} GPUs per slot: default mode (GSS 2)"


class AffinityBinder:
    """Labels profiles and finds an affine partner for a job that cannot start alone."""

    def __init__(self, config: BinderConfig, packing_model: PackingClassifier | None = None) -> None:
        self.config = config
        self.packing_model = packing_model or UtilizationRuleClassifier()

    def classify(self, profile: Profile) -> ShareClass:
        return self.packing_model.classify([profile])[0]

    def update_mode(self, view: ClusterView, forecast: Forecast) -> SetSharingMode | None:
        mode, reason = choose_mode(self.config, forecast)
        if mode is view.sharing_mode:
            return None
        view.sharing_mode = mode
        return SetSharingMode(mode, reason)

    def split_unstable(self, view: ClusterView) -> list[Unpair]:
        """A pair observed running slower than `unstable_speed` is split: neither job may share
        again. Nothing is stopped (no preemption); the pair ends as its jobs end. A pair already
        split is not split again, however often a driver reports it."""
        decisions = []
        for job_id, speed in view.speed_reports:
            alloc = view.allocations.get(job_id)
            if (alloc is None or alloc.partner is None or speed >= self.config.unstable_speed
                    or (view.jobs[job_id].no_share and view.jobs[alloc.partner].no_share)):
                continue
            for member in (job_id, alloc.partner):
                view.jobs[member].no_share = True
                view.drop_share_candidate(member)
            decisions.append(Unpair(job_id, alloc.partner, (
                f"pair runs at {speed:.2f} of its exclusive speed, below {self.config.unstable_speed:g}: "
                f"neither job shares a GPU again")))
        view.speed_reports.clear()
        return decisions

    def _rule_failure(self, view: ClusterView, job: Job, alloc: Allocation, capacity: int) -> str | None:
        """Why `job` may not join the running `alloc`, or None when every rule passes."""
        partner = view.jobs[alloc.job_id]
        assert job.share_class is not None and partner.share_class is not None
        pool = view.pool(alloc.pool)
        if pool.held and any(ref.host in pool.held for ref in alloc.gpus):
            return "partner's node is reserved for an overdue job"
        if int(job.share_class) + int(partner.share_class) > capacity:
            return "sharing scores exceed GPU capacity"
        if partner.gpus != job.gpus:
            return "different GPU demand"
        pred = partner.predicted_duration  # the rules on durations first: arithmetic, where memory reads GPUs
        if pred is not None:
            remaining = pred - (view.now - alloc.start)
            if 0 < remaining < self.config.nearly_done_s:
                return "partner nearly done"
        if pred is not None and job.priority > self.config.pair_priority_ratio * partner.priority:
            return "job much longer than partner"
        need = (job.profile.gpu_mem_mb if job.profile else 0.0) + self.config.memory_headroom_mb
        if pool.mem_free_on(alloc.gpus) < need:
            return "memory would not fit"
        return None

    def find_partner(self, view: ClusterView, job: Job) -> PartnerChoice | None:
        """The lightest running job on which `job` may share, or None."""
        capacity = view.sharing_mode.capacity
        if (capacity < 0 or job.share_class is None or job.no_share
                or job.gpus > view.config.cluster.gpus_per_node):
            return None
        found: str | None = None
        for partner_class in range(capacity - int(job.share_class) + 1):  # lightest partners first
            key = (view.placement_vc(job), job.gpus, partner_class)
            for partner_id in view.share_candidates_by_class.get(key, ()):
                if self._rule_failure(view, job, view.allocations[partner_id], capacity) is None:
                    found = partner_id
                    break
            if found is not None:
                break
        if found is None:
            return None
        partner = view.jobs[found]
        assert job.share_class is not None and partner.share_class is not None
        reason = (f"no compact exclusive fit for {job.gpus} GPU(s); shares with {partner.job_id} "
                  f"({job.share_class.name.title()} + {partner.share_class.name.title()} = "
                  f"{int(job.share_class) + int(partner.share_class)} <= GSS {capacity}, same GPU demand, "
                  f"memory fits, partner not nearly done)")
        return PartnerChoice(partner.job_id, reason)

    def pending_reason(self, view: ClusterView, job: Job) -> str:
        """Why a queued job could not share, for explanations."""
        capacity = view.sharing_mode.capacity
        if capacity < 0:
            return f"sharing is {view.sharing_mode.value}"
        if job.share_class is None:
            return "not profiled yet, so it may not share"
        vc = view.placement_vc(job)
        candidates = [p for c in range(3) for p in view.share_candidates_by_class.get((vc, job.gpus, c), {})]
        if not candidates:
            return f"no running {job.gpus}-GPU job{f' of VC {vc}' if vc else ''} free to share"
        reasons = {self._rule_failure(view, job, view.allocations[p], capacity) for p in candidates}
        return "no affine partner: " + ", ".join(sorted(r for r in reasons if r))

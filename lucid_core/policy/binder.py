"""Affine-jobpair Binder (paper section 8): sharing scores, GSS modes and the hard pairing rules.

Indolent packing: a job shares a GPU only when it could not start alone, and only with a
partner that passes every rule below; missing a pairing is cheaper than a bad one.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid_core.config import BinderConfig
from lucid_core.domain import Job, Profile, ShareClass, SharingMode
from lucid_core.policy.decisions import SetSharingMode, Unpair
from lucid_core.policy.packing_models import PackingModels
from lucid_core.policy.predictors import Forecast, PackingClassifier, UtilizationRuleClassifier
from lucid_core.policy.view import Allocation, ClusterView


@dataclass(frozen=True, slots=True)
class PartnerChoice:
    partner: str
    reason: str


def choose_mode(config: BinderConfig, forecast: Forecast, queued_gpus: float = 0.0,
                profiling_gpus: float = 0.0) -> tuple[SharingMode, str]:
    """GSS from the load: sharing only pays when work is coming (the forecast) or already waiting (the
    queue's GPU demand, the jobs waiting for a profiling window included), whichever is more."""
    if config.sharing == "off":
        return SharingMode.OFF, "sharing disabled in the configuration"
    if config.sharing == "on":
        return SharingMode.DEFAULT, "sharing forced on in the configuration"
    waiting = queued_gpus + profiling_gpus
    gpus = max(forecast.gpus_per_slot, waiting)
    load = (f"forecast {forecast.gpus_per_slot:.1f} GPUs requested per slot ({forecast.source}), "
            f"{waiting:g} GPUs queued" + (f" ({profiling_gpus:g} of them waiting for profiling)"
                                          if profiling_gpus else ""))
    if gpus < config.low_load_gpus_per_slot:
        return SharingMode.OFF, f"{load}: both < {config.low_load_gpus_per_slot:g}, load stays low"
    if gpus < config.apathetic_gpus_per_slot:
        return SharingMode.APATHETIC, (f"{load}: both < {config.apathetic_gpus_per_slot:g}, apathetic mode "
                                       "(GSS 1)")
    return SharingMode.DEFAULT, f"{load}: default mode (GSS 2)"


class AffinityBinder:
    """Labels profiles and finds an affine partner for a job that cannot start alone."""

    def __init__(self, config: BinderConfig, packing_model: PackingClassifier | None = None,
                 packing_models: PackingModels | None = None) -> None:
        self.config = config
        self.packing_models = packing_models or PackingModels.uniform(packing_model or UtilizationRuleClassifier())
        self.packing_model = self.packing_models.any_model()
        self._classes: dict[tuple[str, int], ShareClass | None] = {}  # (job, id of the model) -> class

    @property
    def per_host(self) -> bool:
        """Whether classes depend on the host (keyed models), not one model for every host."""
        return self.packing_models.uniform_model is None

    def classify(self, profile: Profile) -> ShareClass | None:
        """The job's class where it shares best: with one model, that model's; with a model per key, the
        lightest among them (its class on a given host is `class_on`); None when no model exists."""
        uniform = self.packing_models.uniform_model
        if uniform is not None:
            return uniform.classify([profile])[0]
        models = [*self.packing_models.models.values(), *([self.packing_models.emulated]
                                                         if self.packing_models.emulated else [])]
        return min((m.classify([profile])[0] for m in models), default=None)

    def attach(self, view: ClusterView) -> None:
        """Let the view index running jobs by their class on their own host (keyed models, or hosts that
        never share)."""
        if self.per_host or any(h.mechanism == "none" for h in view.host_sharing.values()):
            view.share_class_on = lambda job, node: self.class_on(view, job, node)

    def class_on(self, view: ClusterView, job: Job, node: str) -> ShareClass | None:
        """The job's class on `node`, by the model of that host's GPU model and mechanism (None: no model)."""
        if not self.per_host:
            return job.share_class if view.sharing_of(node).mechanism != "none" else None
        if job.profile is None:
            return job.share_class
        model = self.packing_models.model_for(view.sharing_of(node))
        if model is None:
            return None
        cache_key = (job.job_id, id(model))
        if cache_key not in self._classes:
            self._classes[cache_key] = model.classify([job.profile])[0]
        return self._classes[cache_key]

    def update_mode(self, view: ClusterView, forecast: Forecast) -> SetSharingMode | None:
        mode, reason = choose_mode(self.config, forecast, view.queue.gpus(), view.profiling_gpus())
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
        pool = view.pool(alloc.pool)
        if pool.held and any(ref.host in pool.held for ref in alloc.gpus):
            return "partner's node is reserved for an overdue job"
        if view.closed_nodes and any(ref.host in view.closed_nodes for ref in alloc.gpus):
            return "partner's host takes no new work (draining, unreachable or cooling down)"
        if partner.gpus != job.gpus:
            return "different GPU demand"
        pred = partner.predicted_duration  # the rules on durations first: arithmetic, where classes and memory
        if pred is not None:              # look up models and GPUs (most refusals are these two)
            remaining = pred - (view.now - alloc.start)
            if 0 < remaining < self.config.nearly_done_s:
                return "partner nearly done"
            if job.priority > self.config.pair_priority_ratio * partner.priority:
                return "job much longer than partner"
        host = alloc.gpus[0].host
        job_class, partner_class = self.class_on(view, job, host), self.class_on(view, partner, host)
        if job_class is None or partner_class is None:
            return f"partner's host may not pair jobs: {self.packing_models.why_not(view.sharing_of(host))}"
        if view.sharing_of(host).same_user_only and job.user != partner.user:
            return "partner's host runs MPS with jobs as their submitters: one user's jobs pair there"
        if int(job_class) + int(partner_class) > capacity:
            return "sharing scores exceed GPU capacity"
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
        vc, candidates = view.placement_vc(job), view.share_candidates_by_class
        for partner_class in range(capacity - int(job.share_class) + 1):  # lightest partners first
            for partner_id in candidates.get((vc, job.gpus, partner_class), ()):
                if self._rule_failure(view, job, view.allocations[partner_id], capacity) is None:
                    found = partner_id
                    break
            if found is not None:
                break
        if found is None:
            return None
        partner = view.jobs[found]
        host = view.allocations[found].gpus[0].host
        job_class, partner_class = self.class_on(view, job, host), self.class_on(view, partner, host)
        assert job_class is not None and partner_class is not None
        sharing = view.sharing_of(host)
        where = f" on {sharing.key.describe()}" if self.per_host and sharing.key is not None else ""
        reason = (f"no compact exclusive fit for {job.gpus} GPU(s); shares with {partner.job_id}{where} "
                  f"(sharing scores {job_class.name.title()} {int(job_class)} + {partner_class.name.title()} "
                  f"{int(partner_class)} = {int(job_class) + int(partner_class)}, within the GPU's capacity "
                  f"{capacity} (GSS), same GPU demand, memory fits, partner not nearly done)")
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

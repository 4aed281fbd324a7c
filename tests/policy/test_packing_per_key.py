"""Packing labels per (GPU model, sharing mechanism): each host pairs by its own key's model, or not at all."""

from __future__ import annotations

import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile, ShareClass, SharingKey
from lucid_core.policy.binder import AffinityBinder
from lucid_core.policy.packing_models import HostSharing, PackingModels
from lucid_core.policy.view import ClusterView

H200_MPS = SharingKey("NVIDIA H200", "mps")
H200_SLICED = SharingKey("NVIDIA H200", "time-slice")
A100_SLICED = SharingKey("NVIDIA A100-SXM4-80GB", "time-slice")


class FixedClass:
    """A packing model that gives every profile one class (what a measured key's tree says of light jobs)."""

    def __init__(self, share_class: ShareClass) -> None:
        self.share_class = share_class

    def classify(self, profiles):
        return [self.share_class for _ in profiles]


LIGHT = Profile(12.0, 1.0, 900.0)


def _view(config: LucidConfig, hosts: dict[str, HostSharing]) -> ClusterView:
    view = ClusterView(config, now=100.0)
    for name, sharing in hosts.items():
        view.main.add_node(name, 1, 80000.0)
        view.host_sharing[name] = sharing
    return view


def _running(view: ClusterView, binder: AffinityBinder, job_id: str, host: str, user: str = "ann") -> Job:
    job = Job(job_id, user, "", 1, 0.0, profile=LIGHT, predicted_duration=3600.0)
    job.share_class = binder.classify(LIGHT)
    view.add_job(job)
    binder.attach(view)
    view.start(job_id, Pool.MAIN, view.main.place_compact(1, ""), at=0.0)
    assert view.allocations[job_id].gpus[0].host == host
    return job


def _waiting(view: ClusterView, binder: AffinityBinder, user: str = "ann") -> Job:
    job = Job("W", user, "", 1, 50.0, profile=LIGHT, predicted_duration=3600.0)
    job.share_class = binder.classify(LIGHT)
    view.add_job(job)
    return job


def test_a_job_pairs_on_the_host_whose_key_measured_it_safe_and_nowhere_else():
    config = LucidConfig()
    models = PackingModels({H200_MPS: FixedClass(ShareClass.TINY), H200_SLICED: FixedClass(ShareClass.JUMBO)})
    binder = AffinityBinder(config.binder, packing_models=models)
    # equally free hosts are filled first by name: the MPS host first, the time-sliced host second
    view = _view(config, {"sliced": HostSharing(H200_SLICED, "time-slice"), "mps": HostSharing(H200_MPS, "mps")})
    _running(view, binder, "on-mps", "mps")
    _running(view, binder, "on-sliced", "sliced")
    job = _waiting(view, binder)
    assert job.share_class is ShareClass.TINY  # its lightest class over the fleet's keys
    assert binder.class_on(view, job, "sliced") is ShareClass.JUMBO
    assert binder.class_on(view, job, "mps") is ShareClass.TINY
    found = binder.find_partner(view, job)
    assert found is not None and found.partner == "on-mps"
    assert "NVIDIA H200 shared by mps" in found.reason
    assert "sharing scores Tiny 0 + Tiny 0 = 0, within the GPU's capacity 2 (GSS)" in found.reason


def test_a_host_whose_key_has_no_model_shares_nothing_and_says_why():
    config = LucidConfig()
    binder = AffinityBinder(config.binder, packing_models=PackingModels({H200_MPS: FixedClass(ShareClass.TINY)}))
    view = _view(config, {"a100": HostSharing(A100_SLICED, "time-slice")})
    # the running job has no class on its host: it is no candidate at all
    runner = Job("R", "ann", "", 1, 0.0, profile=LIGHT, predicted_duration=3600.0, share_class=ShareClass.TINY)
    view.add_job(runner)
    binder.attach(view)
    view.start("R", Pool.MAIN, view.main.place_compact(1, ""), at=0.0)
    assert not any(view.share_candidates_by_class.values())
    job = _waiting(view, binder)
    assert binder.find_partner(view, job) is None
    why = models_why(binder, view, "a100")
    assert "no packing model was measured for NVIDIA A100-SXM4-80GB shared by time-slice" in why
    assert "lucid calibrate --sharing time-slice" in why


def models_why(binder: AffinityBinder, view: ClusterView, host: str) -> str:
    return binder.packing_models.why_not(view.sharing_of(host))


def test_hosts_registered_with_sharing_none_or_without_a_gpu_model_share_nothing():
    models = PackingModels({H200_MPS: FixedClass(ShareClass.TINY)}, emulated=FixedClass(ShareClass.TINY))
    assert models.model_for(HostSharing(H200_MPS, "none")) is None
    assert "sharing none" in models.why_not(HostSharing(H200_MPS, "none"))
    assert models.model_for(HostSharing(None, "mps")) is None
    assert "--gpu-model" in models.why_not(HostSharing(None, "mps"))
    # emulated telemetry (no GPU at all) keeps the emulation's rule, and only there
    assert models.model_for(HostSharing(None, "time-slice", emulated=True)) is not None


def test_mps_hosts_running_jobs_as_their_submitters_pair_one_users_jobs_only():
    config = LucidConfig()
    binder = AffinityBinder(config.binder, packing_models=PackingModels({H200_MPS: FixedClass(ShareClass.TINY)}))
    view = _view(config, {"mps": HostSharing(H200_MPS, "mps", same_user_only=True)})
    _running(view, binder, "R", "mps", user="ann")
    other_user = _waiting(view, binder, user="bob")
    assert binder.find_partner(view, other_user) is None
    assert "one user's jobs pair there" in binder.pending_reason(view, other_user)
    view.jobs.pop("W")
    same_user = _waiting(view, binder, user="ann")
    assert binder.find_partner(view, same_user) is not None


@pytest.mark.parametrize(("kind", "key"), [
    ("packing:nvidia-h200:mps", H200_MPS), ("packing:nvidia-h200:time-slice", H200_SLICED),
    ("packing", None), ("duration", None), ("packing:nvidia-h200:nvlink", None), ("packing::mps", None)])
def test_model_kinds_name_their_key_and_nothing_else(kind, key):
    assert SharingKey.from_kind(kind) == key
    if key is not None:
        assert key.model_kind == kind


def test_the_key_ignores_case_and_spacing_of_the_gpu_model():
    assert SharingKey("NVIDIA  H200", "mps") == SharingKey("nvidia h200", "mps")
    assert SharingKey("NVIDIA H200", "mps") != SharingKey("NVIDIA H200", "time-slice")
    with pytest.raises(ValueError, match="sharing mechanism"):
        SharingKey("NVIDIA H200", "mig")

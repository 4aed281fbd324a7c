"""Which packing model labels a job on which host: one model per (GPU model, sharing mechanism).

A pair may share a GPU only where that GPU model, shared that way, was measured safe: a host whose
key has no model shares nothing, and the words say why. The simulator hands one model for its
catalog's key; the live round hands the promoted model of each key its hosts have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lucid_core.domain import Profile, ShareClass, SharingKey
from lucid_core.policy.predictors import PackingClassifier


@dataclass(frozen=True, slots=True)
class HostSharing:
    """How one host may share: its key (None when its GPU model is not known) and its mechanism."""

    key: SharingKey | None
    mechanism: str = "time-slice"
    emulated: bool = False  # telemetry emulated: no real GPU, so no measurement can apply to it
    same_user_only: bool = False  # MPS with jobs run as their submitters: one MPS server per UNIX user


class PackingModels:
    """Packing classifiers by sharing key, with a reason for every host that may not share."""

    def __init__(self, models: Mapping[SharingKey, PackingClassifier] | None = None, *,
                 everywhere: PackingClassifier | None = None,
                 emulated: PackingClassifier | None = None) -> None:
        self.models = dict(models or {})
        self.everywhere = everywhere  # one model for every host (a simulation of one measured catalog)
        self.emulated = emulated  # hosts with emulated telemetry: their profiles come from no GPU anyway

    @classmethod
    def uniform(cls, model: PackingClassifier) -> PackingModels:
        """One model applied on every host that shares (the simulator: one catalog, one key)."""
        return cls(everywhere=model)

    @property
    def uniform_model(self) -> PackingClassifier | None:
        return self.everywhere

    def model_for(self, sharing: HostSharing) -> PackingClassifier | None:
        """The classifier for a host, or None when pairs may not form there."""
        if sharing.mechanism == "none":
            return None
        if self.everywhere is not None:
            return self.everywhere
        if sharing.key is not None and sharing.key in self.models:
            return self.models[sharing.key]
        return self.emulated if sharing.emulated else None

    def why_not(self, sharing: HostSharing) -> str:
        """Why a host shares nothing (for explanations), given `model_for` returned None."""
        if sharing.mechanism == "none":
            return "the host is registered with sharing none"
        if sharing.key is None:
            return ("the host's GPU model is not known (declare it with --gpu-model), so no measured packing "
                    "model applies")
        return (f"no packing model was measured for {sharing.key.describe()} (calibrate one of these GPUs with "
                f"lucid calibrate --sharing {sharing.mechanism}, then lucid models train-packing --promote)")

    def classify(self, profile: Profile, sharing: HostSharing) -> ShareClass | None:
        model = self.model_for(sharing)
        return None if model is None else model.classify([profile])[0]

    def any_model(self) -> PackingClassifier | None:
        """A model to show a job's class with when no host is named: the uniform one, else the first key's."""
        if self.everywhere is not None:
            return self.everywhere
        return next(iter(self.models.values()), self.emulated)

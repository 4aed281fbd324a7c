"""The models a live round's policy uses: promoted artifacts from `model_versions`, else history fallbacks.

A promoted duration model also learns the jobs that ended after it was made; nothing here touches the hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lucid_core.config import LucidConfig
from lucid_core.domain import SHARING_MECHANISMS, SharingKey
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.packing_models import HostSharing, PackingModels
from lucid_core.policy.predictors import (
    Forecast,
    HistoryDurationPredictor,
    RecentSlotsForecaster,
    UtilizationRuleClassifier,
)
from lucid_core.runtime.round.snapshot import Snapshot, job_of
from lucid_core.runtime.store.schema import HostRow


class ReplayForecaster:
    """Wraps a forecaster fed from the store's submissions; ignores the hooks' re-observations."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.muted = True

    def observe_submission(self, time: float, gpus: int) -> None:
        if not self.muted:
            self.inner.observe_submission(time, gpus)

    def forecast(self, now: float) -> Forecast:
        return self.inner.forecast(now)


def load_model(path: str, *, needs: tuple[str, ...], root: str | Path,
               refused: list[str] | None = None) -> Any | None:
    """A promoted model artifact (joblib), or the predictor it wraps, if it offers `needs`; else None.

    A path that lies outside `root` (through links) is not opened at all: the path comes from the store, and
    loading a joblib file runs its code. Why a path was not used is appended to `refused`."""
    from lucid_core.models.registry import artifact_within, load_artifact

    try:
        obj = load_artifact(artifact_within(path, root))
    except Exception as exc:  # a missing, unreadable, untrusted or not regular artifact must not stop scheduling
        if refused is not None:
            refused.append(str(exc)[:300])
        return None
    for candidate in (obj, getattr(obj, "predictor_", None), getattr(obj, "model_", None)):
        if candidate is not None and all(callable(getattr(candidate, n, None)) for n in needs):
            return candidate
    if refused is not None:
        refused.append(f"model artifact {path} offers no {', '.join(needs)}")
    return None


def policy_models(config: LucidConfig, snapshot: Snapshot) -> tuple[Any, PackingModels, Any, dict[str, str]]:
    """(duration model, packing models by key, forecaster, kind -> source) for this round.

    Promoted versions in `model_versions` (written by the Update Engine) win; the duration model
    then also learns the jobs that ended after it was trained. Without one, the fallbacks are
    refitted from the store's history. Only artifacts under the models root (LUCID_HOME/models) are loaded; why
    a promoted version was not used is listed under "refused".
    """
    from lucid_core.models.registry import models_root

    sources: dict[str, str] = {}
    root, refused = models_root(), []
    duration = None
    if "duration" in snapshot.models:
        version, path, _ = snapshot.models["duration"]
        duration = load_model(path, needs=("predict_duration", "observe"), root=root, refused=refused)
        if duration is not None:
            sources["duration"] = f"promoted version {version}"
            for row, seconds in snapshot.unlearned:  # read as the jobs that ended after the promotion
                try:
                    job = job_of(row)
                except (ValueError, TypeError):  # a row another writer broke: the model learns the others
                    continue
                duration.observe(job, seconds)
    if duration is None:
        duration = HistoryDurationPredictor()
        history = snapshot.finished_jobs()
        if history:  # grouped by the rows' own user and GPU demand: no Job built per finished job
            duration.fit([j for j, _ in history], [d for _, d in history])
        sources["duration"] = fallback_source(len(history))
    packing = packing_models(snapshot, sources, root=root, refused=refused)
    forecaster = None
    if "throughput_forecaster" in snapshot.models:
        version, path, _ = snapshot.models["throughput_forecaster"]
        forecaster = load_model(path, needs=("observe_submission", "forecast"), root=root, refused=refused)
        if forecaster is not None:
            sources["throughput"] = f"promoted version {version}"
    if forecaster is None:
        forecaster = RecentSlotsForecaster(config.forecast.slot_s)
        sources["throughput"] = "mean of recent slots"
    for t, gpus in snapshot.submissions:
        forecaster.observe_submission(t, gpus)
    if refused:
        sources["refused"] = "; ".join(refused)[:1000]
    return duration, packing, ReplayForecaster(forecaster), sources


def packing_models(snapshot: Snapshot, sources: dict[str, str], *, root: str | Path,
                   refused: list[str] | None = None) -> PackingModels:
    """One packing model per (GPU model, sharing mechanism): the promoted `packing:<key>` versions, the shipped
    tree for the key it was measured on (the artifact's RTX 3090s, time-sliced), and the utilization rule for
    hosts whose telemetry is emulated (no GPU, so nothing measured applies). Any other key shares nothing."""
    from lucid_core.models.packing import ARTIFACT_KEY, PackingTree, default_tree_path

    models: dict[SharingKey, Any] = {}
    words = []
    for kind, (version, path, _) in sorted(snapshot.models.items()):
        key = SharingKey.from_kind(kind)
        model = load_model(path, needs=("classify",), root=root, refused=refused) if key is not None else None
        if key is not None and model is not None:
            models[key] = model
            words.append(f"{key.slug} promoted version {version}")
    if ARTIFACT_KEY not in models and default_tree_path().is_file():
        try:
            models[ARTIFACT_KEY] = PackingTree.load_json(default_tree_path())
            words.append(f"{ARTIFACT_KEY.slug} shipped tree (Lucid artifact catalog)")
        except (OSError, ValueError, KeyError):  # a broken shipped file: that key shares nothing
            pass
    words.append("emulated hosts: utilization rule")
    sources["packing"] = "; ".join(words)
    return PackingModels(models, emulated=UtilizationRuleClassifier())


def host_sharing(row: HostRow) -> HostSharing:
    """How a host may share: its key from the GPU model it registered, its mechanism, emulated or not."""
    mechanism = row.sharing if row.sharing in SHARING_MECHANISMS else "none"  # an unknown word shares nothing
    model = (row.gpu_model or "").strip()
    key = SharingKey(model, mechanism) if model and model.lower() != "declared" else None
    return HostSharing(key, mechanism, emulated=row.telemetry == "emulated",
                       same_user_only=mechanism == "mps" and row.run_as == "submitter")


def fallback_source(finished: int) -> str:
    """How the history fallback is named among a round's model sources."""
    return f"history of {finished} finished job(s)"


def default_policy(config: LucidConfig, snapshot: Snapshot) -> SchedulingPolicy:
    """LucidPolicy with the promoted models, or history-fitted fallbacks when none is promoted."""
    from lucid_core.policy.lucid import LucidPolicy

    duration, packing, forecaster, sources = policy_models(config, snapshot)
    policy = LucidPolicy(config, duration_model=duration, packing_models=packing, forecaster=forecaster)
    policy.model_sources = sources
    return policy


PolicyFactory = Callable[[LucidConfig, Snapshot], SchedulingPolicy]

"""The binder's sharing mode (GSS) in `auto`: the load forecast or the waiting queue, whichever is more."""

from __future__ import annotations

import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, JobState, Pool, Profile, SharingMode
from lucid_core.policy.binder import AffinityBinder, choose_mode
from lucid_core.policy.decisions import SetSharingMode
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.predictors import Forecast
from lucid_core.policy.view import ClusterView


def _forecast(gpus_per_slot: float) -> Forecast:
    return Forecast(jobs_per_slot=gpus_per_slot, gpus_per_slot=gpus_per_slot, source="test")


@pytest.mark.parametrize(("forecast", "queued", "mode"), [
    (0.0, 0, SharingMode.OFF),            # nothing coming, nothing waiting
    (1.9, 1, SharingMode.OFF),
    (0.0, 2, SharingMode.APATHETIC),      # two GPUs waiting: GSS 1 although the forecast is quiet
    (5.0, 0, SharingMode.APATHETIC),
    (0.0, 8, SharingMode.DEFAULT),        # a backlog: GSS 2 whatever the forecast says
    (8.0, 0, SharingMode.DEFAULT),        # work coming: GSS 2 with an empty queue (the paper's rule)
])
def test_auto_mode_follows_the_forecast_or_the_queue_whichever_is_more(forecast, queued, mode):
    chosen, reason = choose_mode(LucidConfig().binder, _forecast(forecast), queued)
    assert chosen is mode
    assert f"{queued:g} GPUs queued" in reason and f"forecast {forecast:.1f}" in reason


@pytest.mark.parametrize(("setting", "mode"), [("on", SharingMode.DEFAULT), ("off", SharingMode.OFF)])
def test_a_fixed_setting_ignores_forecast_and_queue(setting, mode):
    config = LucidConfig().with_overrides({"binder.sharing": setting})
    assert choose_mode(config.binder, _forecast(0.0 if setting == "on" else 100.0), 0 if setting == "on" else 64)[0] \
        is mode


def test_update_mode_counts_the_gpus_of_the_main_queue():
    """A quiet forecast but 16 GPUs of jobs waiting in the main queue: the binder turns GSS 2 on."""
    config = LucidConfig()
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1)
    for k in range(2):
        job = Job(f"W{k}", "u", "vc", 8, 0.0, predicted_duration=3600.0)
        view.add_job(job)
        view.enqueue_main(job, (job.priority, job.submit_time, job.job_id))
    view.sharing_mode = SharingMode.OFF
    change = AffinityBinder(config.binder).update_mode(view, _forecast(0.5))
    assert change is not None and view.sharing_mode is SharingMode.DEFAULT
    assert "16 GPUs queued" in change.reason
    assert AffinityBinder(config.binder).update_mode(view, _forecast(0.5)) is None  # unchanged: no decision


def test_update_mode_counts_the_jobs_waiting_for_profiling_and_says_so():
    """A burst waiting for the profiling pool is work waiting too: with the main queue empty, twelve 1-GPU jobs
    waiting for a window turn GSS 2 on, and the reason does not say that nothing is queued."""
    config = LucidConfig()
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1)
    for k in range(12):
        job = Job(f"P{k}", "u", "vc", 1, 0.0)
        view.add_job(job)
        view.enqueue_profiling(job)
    view.sharing_mode = SharingMode.OFF
    change = AffinityBinder(config.binder).update_mode(view, _forecast(0.5))
    assert change is not None and view.sharing_mode is SharingMode.DEFAULT
    assert "12 GPUs queued (12 of them waiting for profiling)" in change.reason


class _QuietForecast:
    """A forecaster that always says almost nothing is coming (the submissions below arrive between rounds)."""

    def observe_submission(self, time: float, gpus: int) -> None:
        pass

    def forecast(self, now: float) -> Forecast:
        return _forecast(0.5)


def test_a_round_counts_jobs_submitted_since_the_last_round_as_queued():
    """Live, a burst arrives between two rounds: the round predicts the new jobs before its mode check, so
    they count as GPUs queued at once (not a mode-check interval later)."""
    config = LucidConfig().with_overrides({"profiler.enabled": "false"})
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1)
    busy = Job("busy", "u", "vc", 8, 0.0, predicted_duration=3600.0, state=JobState.QUEUED)
    view.add_job(busy)
    view.start("busy", Pool.MAIN, view.main.place_compact(8))
    view.sharing_mode = SharingMode.OFF
    policy = LucidPolicy(config, forecaster=_QuietForecast())
    for k in range(2):
        job = Job(f"W{k}", "u", "vc", 8, 0.0, state=JobState.QUEUED)
        view.add_job(job)
        policy.on_submit(view, job)
    assert len(view.queue) == 0 and len(view.unpredicted) == 2  # not predicted yet: outside the main queue
    changes = [d for d in policy.schedule(view) if isinstance(d, SetSharingMode)]
    assert [c.mode for c in changes] == [SharingMode.DEFAULT]
    assert "16 GPUs queued" in changes[0].reason


class _BurstForecast(_QuietForecast):
    def forecast(self, now: float) -> Forecast:
        return Forecast(jobs_per_slot=100.0, gpus_per_slot=100.0, source="test")


def test_a_burst_borrows_no_main_node_while_a_just_submitted_job_waits_for_it():
    """The profiler borrows idle main nodes in a burst only while the main queue is empty. A wide job submitted
    since the last round (too wide for the pool, so bound for the main queue) counts as queued in the same round:
    the idle nodes stay in the main cluster for it."""
    config = LucidConfig().with_overrides({"profiler.in_place": "false"})
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 3)
    view.add_nodes(Pool.PROFILING, 1)
    policy = LucidPolicy(config, forecaster=_BurstForecast())
    small = Job("small", "u", "vc", 1, 0.0, state=JobState.QUEUED)
    wide = Job("wide", "u", "vc", 16, 0.0, state=JobState.QUEUED, profile=Profile(50, 40, 1000))
    for job in (small, wide):
        view.add_job(job)
        policy.on_submit(view, job)
    assert "small" in view.profiling_queue and view.unpredicted == ["wide"]
    policy.schedule(view)
    assert view.borrowed_nodes == []
    assert view.jobs["wide"].state is JobState.RUNNING  # it started on two of the nodes a burst would have lent

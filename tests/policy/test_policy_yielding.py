"""Lucid's yielding rule (policy/yielding.py): exact JCTs on tiny traces."""

from __future__ import annotations

import pytest
from duration_stubs import FixedDurations

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.view import ClusterView
from lucid_core.policy.yielding import YieldRule, yield_to_waiting
from lucid_core.sim.engine import simulate
from lucid_core.sim.records import TraceRecord

_Predicted = FixedDurations  # fixed, possibly wrong, predictions


def _config(**knobs) -> LucidConfig:
    return LucidConfig().with_overrides({"cluster.gpus_per_node": 1, "profiler.enabled": False,
                                         "profiler.tprof_s": 1, "binder.sharing": "off",
                                         "orchestrator.guard_slowdown": 0, "tiresias.checkpoint_cost_s": 5,
                                         "orchestrator.yield_min_run": 10, "orchestrator.yield_max": 1,
                                         "orchestrator.long_quantile": 1.0, "orchestrator.yield_seniority": False,
                                         **knobs})


# one 1-GPU node; L is predicted to run 10 s but runs 1,000 s; S (20 s) arrives at 500, T (20 s) at 600
#: jobs that resume from their checkpoints (only such a job yields; a trace says so per job)
TRACE = [TraceRecord("L", 0, 1000, 1, preemptible=True), TraceRecord("S", 500, 20, 1, preemptible=True),
         TraceRecord("T", 600, 20, 1, preemptible=True)]
PREDICTED = {"L": 10.0, "S": 20.0, "T": 20.0}


@pytest.mark.parametrize(("knobs", "jcts", "preemptions"), [
    # off: nobody is stopped; S and T wait for L's end at 1,000
    ({"orchestrator.yield_margin": 0}, {"L": 1000, "S": 520, "T": 440}, 0),
    # margin 4, at most one stop: at 500 L has outlived its 10 s prediction, so its work left is
    # taken as 500 s (as long again), 500 GPU-s > 4 x 20: L yields to S (500..520) and resumes at 520
    # with 500 s + the 5 s checkpoint cost (ends 1,025); at 600 T may not take it again (one stop): T waits
    ({"orchestrator.yield_margin": 4, "orchestrator.yield_max": 1}, {"L": 1025, "S": 20, "T": 445}, 1),
    # two stops allowed: at 600 L (work left 500 - 80 s) yields to T too and resumes at 620 with 425 + 5 s
    ({"orchestrator.yield_margin": 4, "orchestrator.yield_max": 2}, {"L": 1050, "S": 20, "T": 20}, 2),
    # a margin above 500 / 20: S's 20 GPU-s are not small enough next to L's work left
    ({"orchestrator.yield_margin": 30}, {"L": 1000, "S": 520, "T": 440}, 0),
    # L must run 200 x 5 s before it may be stopped: still protected at 500 and at 600 (the checks
    # come at most once a minute, with the rounds that events bring)
    ({"orchestrator.yield_margin": 4, "orchestrator.yield_min_run": 200}, {"L": 1000, "S": 520, "T": 440}, 0),
])
def test_a_late_job_yields_to_a_much_shorter_one(knobs, jcts, preemptions):
    config = _config(**knobs)
    policy = LucidPolicy(config, duration_model=_Predicted(PREDICTED))
    result = simulate(TRACE, policy, config, main_nodes=1, check_invariants=True, keep_log=True)
    assert {o.job_id: o.jct for o in result.outcomes} == jcts
    assert sum(o.preemptions for o in result.outcomes) == preemptions
    stops = [entry for entry in result.decision_log if entry[1] == "Preempt"]
    assert len(stops) == preemptions and all(entry[2] == "L" and "yields its GPUs" in entry[3] for entry in stops)


def test_a_job_that_does_not_resume_from_checkpoints_is_never_stopped():
    config = _config(**{"orchestrator.yield_margin": 4})
    view = ClusterView(config, now=0.0)
    view.add_nodes(Pool.MAIN, 1)
    running = Job("L", "u", "", 1, 0.0, predicted_duration=10.0, preemptible=False)
    waiting = Job("S", "u", "", 1, 400.0, predicted_duration=20.0, preemptible=True)
    policy = LucidPolicy(config, duration_model=_Predicted({"S": 20.0}))
    for job in (running, waiting):
        view.add_job(job)
    gpus = view.main.place_compact(1, "")
    view.start("L", Pool.MAIN, gpus)
    view.now = 500.0
    policy.orchestrator.requeue(view, waiting)
    rule = YieldRule(margin=4, min_run=10)

    def run_rule():
        return yield_to_waiting(view, rule, lambda job, left: policy._requeue_stopped(view, job, left),
                                policy._checkpoint_cost, policy._guard_started, lambda job, key: "placed")

    assert run_rule() == []
    running.preemptible = True  # the same job, saying it resumes: it yields
    decisions = run_rule()
    assert [type(d).__name__ for d in decisions] == ["Preempt", "Place"]
    assert "L" in view.queue and view.allocations["S"].gpus == gpus
    assert running.yields == 1 and running.predicted_duration == 500.0  # its work left, as long again as it ran


def test_explain_names_yielding_for_a_job_started_on_given_back_gpus_and_for_the_job_that_yielded():
    from lucid_core.policy.orchestrator import ordering_rule

    taker = Job("S", "u", "", 1, 500.0, predicted_duration=20.0, start_time=500.0)
    placed = "priority ...; compact exclusive fit; took the GPUs of L"
    rule, words = ordering_rule(taker, 510.0, 8, 1, place_reason=placed)
    assert rule == "yielding" and words.startswith("yielding: L gave back its GPUs")
    stopped = Job("L", "u", "", 1, 0.0, predicted_duration=500.0, yields=1)
    rule, words = ordering_rule(stopped, 510.0, 8, 1)
    assert rule == "priority" and "yielded its GPUs 1 time(s)" in words


@pytest.mark.parametrize(("keep_place", "jcts"), [
    # ordered by its work left (default): at 520 L (500 s left) waits behind W (100 s), then T (20 s)
    # goes before it at 620: L runs 640..1,145
    (False, {"L": 1145, "S": 20, "W": 110, "T": 40}),
    # keeping its place: L's key is its original 10 s prediction, so it resumes first at 520 and ends at
    # 1,025 (it yielded once: T cannot take it at 600); T and W follow in key order
    (True, {"L": 1025, "S": 20, "W": 635, "T": 445}),
])
def test_a_job_that_yielded_waits_by_its_work_left_or_keeps_its_place(keep_place, jcts):
    config = _config(**{"orchestrator.yield_margin": 4, "orchestrator.yield_keep_place": keep_place})
    trace = [*TRACE, TraceRecord("W", 510, 100, 1, preemptible=True)]
    policy = LucidPolicy(config, duration_model=_Predicted({**PREDICTED, "W": 100.0}))
    result = simulate(trace, policy, config, main_nodes=1, check_invariants=True)
    assert {o.job_id: o.jct for o in result.outcomes} == jcts


def _two_hosts_view(config, policy, sizes=(8, 8, 4)):
    """Hosts of the given sizes; V (preemptible, predicted 10 s) on the first, B (not) on the second."""
    from lucid_core.domain import GpuRef

    view = ClusterView(config, now=0.0)
    for i, size in enumerate(sizes):
        view.main.add_node(f"h{i}", size)
    for job in (Job("V", "u", "", 8, 0.0, predicted_duration=10.0, preemptible=True),
                Job("B", "u", "", 8, 0.0, predicted_duration=1e7)):
        view.add_job(job)
    view.start("V", Pool.MAIN, tuple(GpuRef("h0", i) for i in range(8)))
    view.start("B", Pool.MAIN, tuple(GpuRef("h1", i) for i in range(8)))
    view.now = 5000.0
    return view


@pytest.mark.parametrize(("gpus", "closed", "stopped"), [
    (8, set(), ["V"]),  # V has outlived its 10 s prediction by far: it yields its host to T
    (16, set(), []),  # 16 GPUs need two whole 8-GPU hosts; the free 4-GPU host is not one: nobody is stopped
    (8, {"h0"}, []),  # V's host takes no new work (draining, unreachable): T could not start there
])
def test_a_job_yields_only_when_its_taker_can_start_on_what_it_frees(gpus, closed, stopped):
    config = LucidConfig().with_overrides({"profiler.enabled": False, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": 0})
    policy = LucidPolicy(config, duration_model=_Predicted({"T": 20.0}))
    view = _two_hosts_view(config, policy)
    view.closed_nodes = closed
    taker = Job("T", "u", "", gpus, 4990.0)
    view.add_job(taker)
    policy.on_submit(view, taker)
    decisions = policy.schedule(view)
    assert [d.job_id for d in decisions if type(d).__name__ == "Preempt"] == stopped
    assert ("T" in view.allocations) == bool(stopped) and ("V" in view.allocations) != bool(stopped)
    view.check_invariants()


# two 1-GPU nodes: X (1 GPU, 500 s) holds one; B (1 GPU, 1,000 s, submitted at 20) starts on the other, so
# A (2 GPUs, 1,000 s, submitted at 10, before B) cannot start; with long_quantile 0.5 A and B are long jobs
SENIOR_TRACE = [TraceRecord("X", 0, 500, 1, preemptible=True), TraceRecord("A", 10, 1000, 2, preemptible=True),
                TraceRecord("B", 20, 1000, 1, preemptible=True)]


@pytest.mark.parametrize(("knobs", "jcts"), [
    # shortest-first within the class: A waits for B's end at 1,020 and runs 1,020..2,020
    ({"orchestrator.long_quantile": 0.5}, {"X": 500, "A": 2010, "B": 1000}),
    # by seniority: at X's end (500) A takes B's GPU, as both are long and A came first; A runs 500..1,500,
    # B (520 s left, stopped once) resumes at 1,500 with its 5 s checkpoint cost and ends at 2,025
    ({"orchestrator.long_quantile": 0.5, "orchestrator.yield_seniority": True}, {"X": 500, "A": 1490, "B": 2005}),
    # no long class, no seniority: the knob alone changes nothing
    ({"orchestrator.yield_seniority": True}, {"X": 500, "A": 2010, "B": 1000}),
])
def test_the_oldest_long_job_takes_the_gpus_of_a_younger_long_one(knobs, jcts):
    config = _config(**{"orchestrator.yield_margin": 4, **knobs})
    policy = LucidPolicy(config, duration_model=_Predicted({"X": 500.0, "A": 1000.0, "B": 1000.0}))
    result = simulate(SENIOR_TRACE, policy, config, main_nodes=2, check_invariants=True, keep_log=True)
    assert {o.job_id: o.jct for o in result.outcomes} == jcts
    stops = [entry for entry in result.decision_log if entry[1] == "Preempt"]
    if jcts["B"] > 1000:
        assert [entry[2] for entry in stops] == ["B"] and "submitted first" in stops[0][3]
    else:
        assert stops == []


def test_the_long_class_cap_survives_between_live_rounds_and_bad_saved_state_is_ignored():
    """A live round builds a new view and policy from the store: the long class must come out the same
    as in the simulator's one long-lived view, so its cap travels in the saved policy state."""
    import json
    import math

    config = _config(**{"orchestrator.long_quantile": 0.5})
    policy = LucidPolicy(config, duration_model=_Predicted({f"j{i}": 100.0 * (i + 1) for i in range(6)}))
    view = ClusterView(config, now=0.0)
    view.add_nodes(Pool.MAIN, 1)
    for i in range(6):
        job = Job(f"j{i}", "u", "", 1, float(i))
        view.add_job(job)
        policy.on_submit(view, job)
    policy.orchestrator.predict_pending(view)
    assert view.long_cap == 400.0  # the median of 100..600 GPU-s, rounded up to a job's
    state = json.loads(json.dumps(view.policy_state()))
    later = ClusterView(config, now=10.0)
    later.restore_policy_state(state)
    assert later.recent_priorities == view.recent_priorities and later.long_cap == view.long_cap
    fresh = LucidPolicy(config, duration_model=_Predicted({}))
    assert [fresh.orchestrator.is_long(later, view.jobs[f"j{i}"]) for i in range(6)] == [False] * 3 + [True] * 3
    later.restore_policy_state({"recent_priorities": ["x", None, True, float("nan"), 7], "long_cap": "big"})
    assert later.recent_priorities == [7.0] and later.long_cap == math.inf


def test_explain_names_the_long_class_and_yielding_by_seniority():
    from lucid_core.policy.orchestrator import ordering_rule

    config = _config(**{"orchestrator.yield_margin": 4, "orchestrator.long_quantile": 0.5,
                        "orchestrator.yield_seniority": True})
    policy = LucidPolicy(config, duration_model=_Predicted({"X": 500.0, "A": 1000.0, "B": 1000.0}))
    result = simulate(SENIOR_TRACE, policy, config, main_nodes=2, keep_log=True)
    placed = next(entry[3] for entry in result.decision_log if entry[1] == "Place" and entry[2] == "A"
                  and "took the GPUs of" in entry[3])
    taker = Job("A", "u", "", 2, 10.0, predicted_duration=1000.0, start_time=500.0)
    rule, words = ordering_rule(taker, 510.0, 0, 1, place_reason=placed)
    assert rule == "yielding" and words.startswith("yielding by seniority: B gave back its GPUs")
    waiting = Job("A", "u", "", 2, 10.0, predicted_duration=1000.0)
    rule, words = ordering_rule(waiting, 20.0, 0, 1, long_cap=1000.0)
    assert rule == "priority" and "it is a long job: long jobs go in arrival order" in words
    assert "long job" not in ordering_rule(waiting, 20.0, 0, 1, long_cap=5000.0)[1]


def test_the_long_class_cap_kept_in_order_equals_the_quantile_of_the_window_sorted_afresh():
    """The cap is updated by insertion into the window kept in order (a round no longer sorts the whole
    window): over rounds that overflow the window, after a restore, and with a NaN prediction, it equals
    the quantile of the latest `long_window` values sorted afresh."""
    import math
    import random

    from lucid_core.policy.orchestrator import Orchestrator

    config = _config(**{"orchestrator.long_quantile": 0.7})
    orchestrator = LucidPolicy(config).orchestrator
    assert isinstance(orchestrator, Orchestrator)
    orchestrator.long_window = 50
    rng = random.Random(4)
    view = ClusterView(config, now=0.0)
    seen: list[float] = []
    for round_ in range(60):
        if round_ == 20:  # a live round: a new view from the saved state
            restored = ClusterView(config, now=0.0)
            restored.restore_policy_state(view.policy_state())
            view = restored
        jobs = [Job(f"r{round_}j{i}", "u", "", rng.choice([1, 2, 8]), 0.0,
                    predicted_duration=float(rng.choice([60, 600, 3600])) if rng.random() < 0.5
                    else rng.uniform(1, 1e5)) for i in range(rng.randint(1, 12))]
        if round_ == 30:
            jobs[0].predicted_duration = float("nan")
        orchestrator._update_long_cap(view, jobs)
        seen.extend(job.priority for job in jobs)
        window = seen[-50:]
        assert len(view.recent_priorities) == len(view.recent_sorted[1]) == len(window)
        if not any(math.isnan(p) for p in window):  # before the NaN came, and once it left the window
            assert view.recent_priorities == window
            assert view.recent_sorted[1] == sorted(window)
            assert view.long_cap == sorted(window)[min(len(window) - 1, int(0.7 * len(window)))]
    assert round_ > 30 and not any(math.isnan(p) for p in seen[-50:])  # the last rounds checked the recovery


def test_a_prediction_that_is_not_a_number_counts_as_an_hour():
    """A promoted model that answers NaN or infinity for a job: the job is queued as if predicted to run
    an hour (its key stays ordered, the long-class cap stays a number), the others as predicted."""
    import math

    config = _config(**{"orchestrator.long_quantile": 0.5})
    policy = LucidPolicy(config, duration_model=_Predicted({"nan": math.nan, "inf": math.inf, "ok": 600.0}))
    view = ClusterView(config, now=0.0)
    view.add_nodes(Pool.MAIN, 1)
    for job_id in ("nan", "inf", "ok"):
        job = Job(job_id, "u", "", 2, 0.0)
        view.add_job(job)
        policy.on_submit(view, job)
    policy.orchestrator.predict_pending(view)
    assert [view.jobs[j].predicted_duration for j in ("nan", "inf", "ok")] == [3600.0, 3600.0, 600.0]
    assert view.queue.ordered()[0] == "ok" and math.isfinite(view.long_cap)


def test_a_job_profiled_in_place_takes_its_prediction_through_the_same_floor():
    """Profiled online on the main pool, a job keeps running and is predicted there: NaN or infinity counts
    as an hour, a prediction below what it has already run is raised to that, as in the queue."""
    import math

    from lucid_core.domain import Profile

    config = _config()
    policy = LucidPolicy(config, duration_model=_Predicted({"nan": math.nan, "inf": math.inf, "short": 5.0}))
    view = ClusterView(config, now=0.0)
    view.add_nodes(Pool.MAIN, 3)  # whatever the test config gives a node, one free GPU per job
    for job_id in ("nan", "inf", "short"):
        job = Job(job_id, "u", "", 1, 0.0, known_min_duration=120.0)
        view.add_job(job)
        view.start(job_id, Pool.MAIN, view.main.place_compact(1, ""), at=0.0)
        policy.on_profiled(view, job, Profile(gpu_util=40.0, mem_util=10.0, gpu_mem_mb=2000.0))
    assert [view.jobs[j].predicted_duration for j in ("nan", "inf", "short")] == [3600.0, 3600.0, 120.0]


def test_a_running_job_is_expected_to_free_its_gpus_no_later_than_its_time_limit():
    """The round stops a job at its time limit: a job that outlived its prediction was expected to run as long
    again as it had, past its limit, and backfilling could not count on the GPUs it must free."""
    from lucid_core.policy.orchestrator import predicted_release

    view = ClusterView(_config(), now=0.0)
    view.add_nodes(Pool.MAIN, 2)
    for job in (Job("T", "u", "", 1, 0.0, predicted_duration=100.0, time_limit_s=600.0),
                Job("U", "u", "", 1, 0.0, predicted_duration=100.0)):
        view.add_job(job)
        view.start(job.job_id, Pool.MAIN, view.main.place_compact(1, ""))
    view.now = 50.0
    assert predicted_release(view, "T") == predicted_release(view, "U") == 100.0  # within its prediction
    view.now = 400.0  # both outlived it: as long again as they ran, but T is stopped at 600 s
    assert (predicted_release(view, "T"), predicted_release(view, "U")) == (600.0, 800.0)
    view.now = 700.0  # past the limit, the stop not read yet: now, never in the past
    assert predicted_release(view, "T") == 700.0

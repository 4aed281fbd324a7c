"""The engine from a cluster caught mid-run: a what-if from time T agrees with the full replay.

A trace is replayed to T and stopped; from the view it stopped in, `eta` (which runs the same
engine from a start state) must predict exactly when the full replay of the jobs submitted by T
starts and ends each waiting or running job. The policy's duration model is an oracle here, so
predicted and true durations agree; T comes before the first pair that slows down forms, so the
what-if's "ran at full speed so far" assumption is exact, while slowed pairs form after T.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.surfaces.eta import estimate_in_view
from lucid_core.sim.engine import default_speeds, simulate
from lucid_core.sim.records import TraceRecord, Workload
from lucid_core.sim.start import StartState, Until

CONFIG = LucidConfig().with_overrides({"cluster.gpus_per_node": 4, "profiler.tprof_s": 120,
                                       "profiler.autoscale": False, "binder.sharing": "on"})
T = 3200.0  # a queue, pairs and a profiling window then, and no slowed pair yet (checked below)


class OracleDurations:
    """A duration model that knows every job's true duration (as the SJF baseline does)."""

    def __init__(self, durations: dict[str, float]) -> None:
        self.durations = durations

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        return [self.durations[job.job_id] for job in jobs]

    def observe(self, job: Job, duration: float) -> None:
        return None


class CountingSpeeds:
    """The engine's default co-located speeds, counting the pairs that slow down."""

    def __init__(self) -> None:
        self.slowed = 0

    def __call__(self, a: Workload, b: Workload) -> tuple[float, float]:
        speeds = default_speeds(a, b)
        self.slowed += min(speeds) < 1.0
        return speeds


def _trace(n: int = 60, seed: int = 4) -> tuple[list[TraceRecord], list[Workload]]:
    rng = random.Random(seed)
    records, workloads, t = [], [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 150.0)
        gpus = rng.choice([1, 1, 1, 2, 2, 4])
        records.append(TraceRecord(f"j{i:02d}", round(t, 3), round(rng.uniform(60, 4000), 3), gpus))
        util = rng.uniform(10, 95)  # a pair slows down when the two sum to more than 100 %
        workloads.append(Workload(f"w{i}", util, util / 2, rng.uniform(500, 4000), False))
    return records, workloads


def _policy(records: Sequence[TraceRecord]) -> LucidPolicy:
    return LucidPolicy(CONFIG, duration_model=OracleDurations({r.job_id: r.duration for r in records}))


def _replay(records, workloads, until: Until | None = None, speeds: CountingSpeeds | None = None):
    return simulate(records, _policy(records), CONFIG, main_nodes=2, profiling_nodes=1, workloads=workloads,
                    speeds=speeds, until=until, check_invariants=True)


def _stopped_at_t(records, workloads):
    policy, speeds = _policy(records), CountingSpeeds()
    result = simulate(records, policy, CONFIG, main_nodes=2, profiling_nodes=1, workloads=workloads,
                      speeds=speeds, until=Until(time=T), check_invariants=True)
    assert result.stopped_by == "time" and result.view is not None
    assert speeds.slowed == 0  # every pair so far ran at full speed
    return result.view, policy


def _submitted_by_t() -> tuple[list[TraceRecord], list[Workload]]:
    records, workloads = _trace()
    submitted = [(r, w) for r, w in zip(records, workloads, strict=True) if r.submit_time <= T]
    return [r for r, _ in submitted], [w for _, w in submitted]


def test_eta_from_a_replay_stopped_at_t_matches_the_full_replay():
    records, workloads = _submitted_by_t()
    speeds = CountingSpeeds()
    full = {o.job_id: o for o in _replay(records, workloads, speeds=speeds).outcomes}
    assert speeds.slowed > 0  # after T some pairs slow down: the what-if must replay that too

    view, _ = _stopped_at_t(records, workloads)
    queued = set(view.queue.ordered()) | set(view.profiling_queue) | set(view.unpredicted)
    running = set(view.allocations)
    pairs = {j for j, a in view.allocations.items() if a.partner is not None}
    windows = {j for j, a in view.allocations.items() if a.profiling_until is not None}
    # the state at T has everything a what-if must carry on: a queue, a pair, a profiling window
    assert len(queued) >= 3 and pairs and windows, (queued, pairs, windows)

    for job_id in sorted(queued | running):
        view, policy = _stopped_at_t(records, workloads)  # each what-if changes the view it starts from
        eta = estimate_in_view(view, policy, job_id)
        expected = (full[job_id].start_time, full[job_id].end_time)
        assert (eta.start, eta.end) == pytest.approx(expected, abs=1e-6), (job_id, eta)  # float rounding only
        assert eta.predicted_duration == full[job_id].duration


def test_replay_resumed_from_its_own_stop_ends_like_the_full_replay():
    records, workloads = _submitted_by_t()
    full = {o.job_id: (o.start_time, o.end_time) for o in _replay(records, workloads).outcomes}
    view, policy = _stopped_at_t(records, workloads)
    ended = {j for j, job in view.jobs.items() if job.end_time is not None}
    start = StartState.from_view(view, lambda jobs: [policy.duration_model.durations[j.job_id] for j in jobs])
    assert {r.job_id for r in start.jobs} == set(full) - ended
    rest = simulate([], policy, CONFIG, start=start, check_invariants=True)
    assert rest.stopped_by is None and rest.view is None
    resumed = {o.job_id: (o.start_time, o.end_time) for o in rest.outcomes}
    assert resumed.keys() == set(full) - ended
    for job_id, times in resumed.items():
        assert times == pytest.approx(full[job_id], abs=1e-6), job_id


def test_until_stops_at_a_job_end_or_a_round_limit_and_a_start_state_brings_its_own_nodes():
    records, workloads = _trace(n=20)
    by_job = _replay(records, workloads, Until(job_finished="j05"))
    assert by_job.stopped_by == "job" and by_job.outcomes[-1].job_id == "j05"
    assert by_job.view is not None and len(by_job.outcomes) < len(records)
    by_rounds = _replay(records, workloads, Until(rounds=3))
    assert by_rounds.stopped_by == "rounds" and by_rounds.rounds == 3
    view = ClusterView(CONFIG, now=100.0)
    with pytest.raises(ValueError, match="start view's nodes"):
        simulate([], _policy(records), CONFIG, main_nodes=2, start=StartState(view, view.now, ()))


def test_measured_rates_slow_a_resumed_pair_and_leave_a_lone_job_alone():
    records, workloads = _submitted_by_t()
    view, policy = _stopped_at_t(records, workloads)
    durations = policy.duration_model.durations
    pairs = sorted((j, a.partner) for j, a in view.allocations.items()
                   if a.partner is not None and j < a.partner and a.profiling_until is None
                   and view.allocations[a.partner].profiling_until is None)
    lone = sorted(j for j, a in view.allocations.items() if a.partner is None and a.profiling_until is None)
    assert pairs and lone, (pairs, lone)
    (a, b), alone = pairs[0], lone[0]
    untouched = StartState.from_view(view, lambda jobs: [durations[j.job_id] for j in jobs])
    plain = {o.job_id: o.end_time for o in simulate([], policy, CONFIG, start=untouched).outcomes}

    view, policy = _stopped_at_t(records, workloads)
    rates = {a: 0.4, b: 0.5, alone: 0.3, "gone": 0.5}
    start = StartState.from_view(view, lambda jobs: [durations[j.job_id] for j in jobs], rates=rates)
    assert start.rates == {a: 0.4, b: 0.5, alone: 0.3}  # only jobs the state carries on
    ends = {o.job_id: o.end_time for o in simulate([], policy, CONFIG, start=start).outcomes}
    # the first of the pair to end does so after its remaining work at its measured rate
    first = min((a, b), key=lambda j: start.remaining[j] / rates[j])
    assert ends[first] == pytest.approx(start.now + start.remaining[first] / rates[first], abs=1e-6)
    assert ends[first] > plain[first] + 1.0  # the profiles' speeds (1.0 here) would end it sooner
    assert ends[alone] == pytest.approx(plain[alone], abs=1e-6)  # a rate slows pairs only


def test_a_start_state_refuses_a_rate_outside_zero_to_one():
    view = ClusterView(CONFIG, now=100.0)
    for rate in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rates must lie in"):
            StartState(view, view.now, (), rates={"j": rate})

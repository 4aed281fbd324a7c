"""The simulator on a round cadence: the policy decides only when a live deployment's round would."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lucid_core.cli import main
from lucid_core.config import LucidConfig
from lucid_core.policy.baselines import FifoPolicy
from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.engine import simulate
from lucid_core.sim.experiment import load_experiment, run_policy
from lucid_core.sim.records import TraceRecord
from lucid_core.sim.rounds import RoundCadence

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = LucidConfig().with_overrides({"cluster.gpus_per_node": 1})
THREE = [TraceRecord("A", 0, 100, 1), TraceRecord("B", 10, 50, 1), TraceRecord("C", 20, 10, 1)]


def _jcts(result) -> dict[str, float]:
    return {o.job_id: o.jct for o in result.outcomes}


def test_between_rounds_a_job_waits_for_the_next_one_and_its_end_is_kept_exact():
    result = simulate(THREE, FifoPolicy(ONE_GPU), ONE_GPU, main_nodes=1, check_invariants=True,
                      rounds=RoundCadence.every(30))
    # A starts at the round at 0 and ends at 100; the GPU idles until the round at 120 starts B (to 170);
    # C waits for the round at 180. Event-driven, FIFO gives A 100, B 140, C 140.
    assert _jcts(result) == {"A": 100, "B": 160, "C": 170}
    assert {o.job_id: o.end_time for o in result.outcomes} == {"A": 100, "B": 170, "C": 190}
    # the GPU is idle from each true end (100, 170), not from the round that saw it
    assert result.busy_timeline == [(0, 0), (0, 1), (100, 0), (120, 1), (170, 0), (180, 1), (190, 0)]


def test_given_round_instants_and_after_the_last_one_every_event():
    result = simulate(THREE, FifoPolicy(ONE_GPU), ONE_GPU, main_nodes=1, rounds=RoundCadence.at([0, 105]))
    # B is started by the round at 105 (A ended at 100); past the last round C starts at B's end (155)
    assert _jcts(result) == {"A": 100, "B": 145, "C": 145}
    assert result.rounds < simulate(THREE, FifoPolicy(ONE_GPU), ONE_GPU, main_nodes=1).rounds


@pytest.mark.parametrize("interval", [0.1, 0.7, 1 / 3, 60.0, 1e-3])
@pytest.mark.parametrize("origin", [0.0, 1.7e9 + 0.3, -12.5])
def test_the_next_round_is_at_or_after_the_time_and_a_rounds_own_instant_is_itself(interval: float, origin: float):
    cadence = RoundCadence.every(interval, origin)
    for k in range(0, 5000, 37):
        for t in (origin + k * interval, origin + k * interval + interval / 2, origin + k * interval - 1e-12,
                  origin + k * 0.37):
            at = cadence.next_round(t)
            assert t <= at < t + interval * 1.000001 + 1e-6
            assert cadence.next_round(at) == at


@pytest.mark.parametrize("kwargs", [{}, {"interval_s": 5.0, "instants": (1.0,)}, {"interval_s": -1.0},
                                    {"interval_s": float("inf")}, {"instants": (3.0, 1.0)},
                                    {"instants": (float("nan"),)}, {"interval_s": 1.0, "origin_s": float("nan")},
                                    {"interval_s": 1e-310}, {"interval_s": 9e-4}])
def test_a_cadence_is_one_finite_interval_or_sorted_instants(kwargs):
    with pytest.raises(ValueError):
        RoundCadence(**kwargs)


def test_lucid_on_the_sample_on_a_minute_cadence_ends_every_job_and_waits_longer(tmp_path: Path):
    catalog = WorkloadCatalog.from_artifact(REPO / "include" / "sample")
    exp, _ = load_experiment(REPO / "include" / "sample" / "trace.csv", nodes=3, catalog=catalog,
                             config=LucidConfig())
    events, _ = run_policy("lucid", exp, check_invariants=True)
    rounds, _ = run_policy("lucid", replace(exp, round_interval_s=60.0), check_invariants=True)
    assert len(rounds.outcomes) == len(exp.records)
    # every start on a round: a job never starts between two of them
    assert all(o.start_time % 60.0 == 0 for o in rounds.outcomes)
    assert sum(o.queue_delay for o in rounds.outcomes) > sum(o.queue_delay for o in events.outcomes)


def test_simulate_takes_a_round_interval_and_says_so(tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "--policy", "fifo", "--round-interval", "60", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "policies decide at rounds 60 s apart" in printed
    assert json.loads((out / "nodes3" / "metrics.json").read_text())["run"]["round_interval_s"] == 60.0


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon", "1e-310"])
def test_simulate_refuses_a_round_interval_that_is_not_seconds(tmp_path: Path, capsys, value: str):
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--policy", "fifo", "--round-interval", value, "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "--round-interval" in capsys.readouterr().err


@pytest.mark.parametrize(("bad", "said"), [
    (TraceRecord("B", float("nan"), 50, 1), "submit time nan"),
    (TraceRecord("B", 10, float("nan"), 1), "duration nan"),
    (TraceRecord("B", 10, float("inf"), 1), "duration inf"),
    (TraceRecord("B", 10, -5, 1), "duration -5"),
    (TraceRecord("B", 10, 5, 0), "GPU count 0"),
    (TraceRecord("B", 10, 5, 1.5), "GPU count 1.5"),  # type: ignore[arg-type]
])
def test_a_record_the_simulator_cannot_replay_is_refused_by_name(bad: TraceRecord, said: str):
    """A NaN submit time fed to the library directly looped for ever (the event heap cannot order it)."""
    with pytest.raises(ValueError, match=f"trace record 'B': {said}"):
        simulate([TraceRecord("A", 0, 100, 1), bad], FifoPolicy(ONE_GPU), ONE_GPU, main_nodes=1)


def test_numpy_numbers_are_replayable():
    import numpy as np

    result = simulate([TraceRecord("A", np.float64(0.0), np.float64(100.0), np.int64(1))], FifoPolicy(ONE_GPU),
                      ONE_GPU, main_nodes=1)
    assert _jcts(result) == {"A": 100.0}


def _profiled_alone(in_place: bool, rounds: RoundCadence | None):
    """One 320 s job, a 300 s profiling window on the pool or in place, one main and one pool node."""
    from lucid_core.policy.lucid import LucidPolicy
    from lucid_core.sim.records import Workload

    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 1, "profiler.tprof_s": 300,
                                           "profiler.in_place": in_place, "profiler.autoscale": False,
                                           "profiler.pool_nodes": 1})
    result = simulate([TraceRecord("J", 0.0, 320.0, 1)], LucidPolicy(config), config, main_nodes=1,
                      profiling_nodes=1, workloads=[Workload("J", 50.0, 30.0, 4000.0, False)], rounds=rounds)
    (outcome,) = result.outcomes
    return outcome


def test_a_pool_run_whose_work_ends_before_the_round_after_its_window_ends_there():
    """Window 0..300; rounds at 0, 70, ..., 350: the job's 320 s of work end in the pool at 320, as live (the pool
    run ends COMPLETED), not restarted from scratch on the main node at 350. At every event it is stopped at 300."""
    assert (_profiled_alone(False, RoundCadence.every(70)).end_time, _profiled_alone(False, None).end_time) == (
        320.0, 620.0)
    assert _profiled_alone(False, RoundCadence.every(70)).ended_in_profiling


def test_a_job_profiled_in_place_that_ends_a_round_after_its_window_did_not_end_in_profiling():
    """Live counts an end in profiling only up to PROFILING_END_SLACK_S after the window's end; a cadence leaves the
    window open until the next round (350), past the job's end at 320."""
    outcome = _profiled_alone(True, RoundCadence.every(70))
    assert outcome.end_time == 320.0 and not outcome.ended_in_profiling


@pytest.mark.parametrize(("interval", "origin", "t"), [(1e-3, -1e308, 1e308), (1.0, -1e308, 1e308)])
def test_times_at_the_ends_of_the_float_range_decide_at_once(interval: float, origin: float, t: float):
    assert RoundCadence.every(interval, origin).next_round(t) == t

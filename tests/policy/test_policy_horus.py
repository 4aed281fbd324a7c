"""Horus in the simulator: its packing rule and exact JCTs on tiny hand-computed traces."""

from __future__ import annotations

from collections.abc import Sequence

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.horus import RULE_LEAST_LOADED, HorusPolicy
from lucid_core.sim.engine import simulate
from lucid_core.sim.records import TraceRecord, Workload

ONE_GPU = LucidConfig().with_overrides({"cluster.gpus_per_node": 1})


class KnownDurations:
    """A duration model that predicts from a fixed table (Horus's predictor, made exact for tests)."""

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table
        self.seen: list[str] = []

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        return [self.table[job.job_id] for job in jobs]

    def observe(self, job: Job, duration: float) -> None:
        self.seen.append(job.job_id)


def _workload(util: float, mem_mb: float = 4000.0) -> Workload:
    return Workload(f"util{util:g}/mem{mem_mb:g}", util, util / 2, mem_mb, False)


def _half_speed(a: Workload, b: Workload) -> tuple[float, float]:
    return 0.5, 0.5


def _run(rows, utils, predicted, mems=None, nodes=1, gpus=1, config=ONE_GPU):
    records = [TraceRecord(job_id, submit, duration, gpus) for job_id, submit, duration in rows]
    mems = mems or {}
    workloads = [_workload(utils[r.job_id], mems.get(r.job_id, 4000.0)) for r in records]
    model = KnownDurations(predicted)
    policy = HorusPolicy(config, model)
    result = simulate(records, policy, config, main_nodes=nodes, workloads=workloads, speeds=_half_speed,
                      check_invariants=True, keep_log=True)
    return result, model


def test_packs_under_the_utilization_cap_and_gives_exact_jcts():
    # One GPU. A (60%) runs alone from 0; B (30%) shares at 1 (90% <= 100%): both at half speed,
    # B's 50 s take 100 s -> ends 101, A has done 1 + 50 = 51 of 100. C (50%) and D (20%) wait:
    # the GPU holds two jobs. At 101 C is first by predicted GPU-time but 60 + 50 > 100, so D
    # (60 + 20 = 80) backfills next to A: D's 10 s take 20 s -> 121, A does 10 more (61).
    # A alone ends at 121 + 39 = 160; C runs alone 160..170.
    rows = [("A", 0, 100), ("B", 1, 50), ("C", 2, 10), ("D", 3, 10)]
    utils = {"A": 60, "B": 30, "C": 50, "D": 20}
    result, model = _run(rows, utils, {"A": 100, "B": 50, "C": 10, "D": 20})
    jct = {o.job_id: o.jct for o in result.outcomes}
    assert jct == {"A": 160, "B": 100, "C": 168, "D": 118}
    shared = {o.job_id for o in result.outcomes if o.shared_seconds > 0}
    assert shared == {"A", "B", "D"}
    reasons = [reason for _, kind, job, reason in result.decision_log if kind == "Place" and job == "D"]
    assert reasons and RULE_LEAST_LOADED in reasons[0] and "60% + 20% = 80%" in reasons[0]
    assert sorted(model.seen) == ["A", "B", "C", "D"]  # the predictor learns from each end


def test_never_oversubscribes_even_when_it_means_waiting():
    # B would make 70 + 40 = 110% > 100%: it waits for A although the GPU has room for a second job.
    result, _ = _run([("A", 0, 100), ("B", 1, 10)], {"A": 70, "B": 40}, {"A": 100, "B": 10})
    jct = {o.job_id: o.jct for o in result.outcomes}
    assert jct == {"A": 100, "B": 109}
    assert all(o.shared_seconds == 0 for o in result.outcomes)


def test_memory_must_fit_as_well():
    # 10% + 10% is far under the cap, but 4,000 + 22,000 MB exceeds the 24,576 MB GPU.
    result, _ = _run([("A", 0, 100), ("B", 1, 10)], {"A": 10, "B": 10}, {"A": 100, "B": 10},
                     mems={"B": 22000.0})
    assert {o.job_id: o.jct for o in result.outcomes} == {"A": 100, "B": 109}


def test_least_loaded_gpu_is_chosen_among_those_that_pass():
    # Two one-GPU nodes run A (70%) and B (20%); C (25%) passes the cap on both and goes next to B,
    # the lesser predicted load. Both pairs at half speed: C's 10 s take 20 s.
    config = ONE_GPU
    result, _ = _run([("A", 0, 100), ("B", 0, 100), ("C", 5, 10)], {"A": 70, "B": 20, "C": 25},
                     {"A": 100, "B": 100, "C": 10}, nodes=2, config=config)
    place_c = [reason for _, kind, job, reason in result.decision_log if kind == "Place" and job == "C"]
    assert "shares B's GPUs" in place_c[0]
    jct = {o.job_id: o.jct for o in result.outcomes}
    # B: 5 alone, 20 s at half speed (10 work), then 85 alone -> 110; A untouched -> 100.
    assert jct == {"A": 100, "B": 110, "C": 20}


def test_free_gpus_come_before_sharing():
    # Two GPUs: B finds a free GPU and runs alone although A's GPU could take it (load 0 is least).
    result, _ = _run([("A", 0, 100), ("B", 1, 10)], {"A": 10, "B": 10}, {"A": 100, "B": 10}, nodes=2)
    assert {o.job_id: o.jct for o in result.outcomes} == {"A": 100, "B": 10}
    assert all(o.shared_seconds == 0 for o in result.outcomes)


def test_predicted_order_runs_the_shorter_predicted_job_first():
    # A holds the GPU (100% alone: nothing may share). B and C wait; C is predicted shorter.
    rows = [("A", 0, 50), ("B", 1, 30), ("C", 2, 30)]
    result, _ = _run(rows, {"A": 100, "B": 60, "C": 60}, {"A": 50, "B": 300, "C": 30})
    assert {o.job_id: o.jct for o in result.outcomes} == {"A": 50, "C": 78, "B": 109}

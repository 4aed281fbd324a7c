"""Elastic jobs: application model, pollux-format reader, exact progress, packing and Pollux's optimiser."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from lucid_core.cli import main
from lucid_core.policy.elastic_view import ElasticCluster, ElasticJob, ElasticJobSpec, compact_placement, pack
from lucid_core.policy.pollux import PolluxPolicy, _min_cost_counts, candidate_layouts
from lucid_core.sim.elastic import FixedGangPolicy, fixed_run_seconds, simulate_elastic
from lucid_core.sim.elastic_apps import load_application
from lucid_core.sim.pollux_trace import read_pollux_trace
from lucid_core.sim.traces import TraceFormatError

REPO = Path(__file__).resolve().parents[2]

# A toy application: seconds per step by placement and local batch size.
STEP = {("1", 32): 0.5, ("1", 64): 0.9, ("2", 32): 0.6, ("2", 64): 1.0, ("11", 32): 0.8, ("11", 64): 1.2,
        ("4", 32): 0.7, ("4", 64): 1.1, ("22", 32): 0.9, ("22", 64): 1.3, ("13", 32): 0.85, ("13", 64): 1.25}
SYNC = 0.1
EPOCHS = 3
PROGRESS = (100.0, 200.0, 300.0)  # progress at the end of each epoch (initial-batch steps)
GRAD = {32: [(1.0, 1.0), (1.0, 3.0), (1.0, 1.0)], 64: [(1.0, 1.0), (1.0, 3.0), (1.0, 1.0)],
        128: [(1.0, 1.0), (1.0, 3.0), (1.0, 1.0)]}


def write_app(root: Path, name: str = "toy") -> Path:
    folder = root / "traces" / name
    folder.mkdir(parents=True)
    lines = ["placement,local_bsz,step_time,sync_time"]
    lines += [f"{p},{b},{s},{SYNC}" for (p, b), s in STEP.items()]
    (folder / "placements.csv").write_text("\n".join(lines) + "\n")
    (folder / "scalability.csv").write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n"
                                           "6,6,32,1.5,0.9\n6,6,64,1.9,0.9\n6,12,32,1.8,1.2\n6,12,64,2.2,1.2\n"
                                           "8,8,32,1.6,1.0\n8,8,64,2.0,1.0\n8,16,32,2.0,1.3\n8,16,64,2.4,1.3\n")
    for batch, stats in GRAD.items():
        rows = ["progress,iteration,metric,grad_sqr,grad_var"]
        rows += [f"{PROGRESS[e]},{e},0.5,{sqr},{var}" for e, (sqr, var) in enumerate(stats)]
        (folder / f"validation-{batch}.csv").write_text("\n".join(rows) + "\n")
    return folder


def write_workload(root: Path, rows: list[str]) -> Path:
    folder = root / "workloads"
    folder.mkdir(exist_ok=True)
    path = folder / "workload-1.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def toy(tmp_path):
    write_app(tmp_path)
    return load_application(tmp_path / "traces" / "toy"), tmp_path


def _gain(batch: float, sqr: float, var: float, init: float = 32) -> float:
    scale = batch / init
    return (var + sqr) / (var / scale + sqr)


# --- application model -----------------------------------------------------------------------
def test_application_reads_measurements_and_interpolates(toy):
    app, _ = toy
    assert (app.init_batch_size, app.max_batch_size, app.max_epochs) == (32, 128, EPOCHS)
    assert app.total_progress == 300.0
    assert app.step_time((1,), 32) == (0.5, SYNC)
    assert app.step_time((1,), 48) == pytest.approx((0.7, SYNC))  # halfway between 0.5 and 0.9
    assert app.step_time((3, 1), 32) == app.step_time((1, 3), 32) == (0.85, SYNC)  # order of nodes is moot
    step, _ = app.step_time((4, 3), 32)  # 2 nodes, 7 replicas: not measured, from the shape fit
    assert 0.5 < step < 2.5
    assert app.grad_stats(48, 1) == pytest.approx((1.0, 3.0))
    assert app.gain(64, 1.0, 1.0) == pytest.approx(_gain(64, 1, 1))


def test_fixed_layout_splits_and_accumulates(toy):
    app, _ = toy
    assert app.fixed_layout(2, 64) == (32, 0)
    assert app.fixed_layout(1, 64) == (32, 1)  # one replica above the initial batch: accumulate once
    assert app.fixed_layout(1, 128) == (64, 1)  # 128 = 64 x 2 steps, 64 being the largest measured


# --- exact progress --------------------------------------------------------------------------
def test_job_alone_ends_when_its_step_times_say(toy):
    app, _ = toy
    # 1 GPU, batch 32: gain 1 in every epoch, 0.5 s a step: 100 progress = 50 s per epoch.
    job = ElasticJobSpec("a", 0.0, "toy", 1, 32)
    result = simulate_elastic([job], {"toy": app}, FixedGangPolicy(), nodes=1, gpus_per_node=4)
    (outcome,) = result.outcomes
    assert outcome.end_time == pytest.approx(30 + 3 * 50)
    assert outcome.start_time == 0.0
    assert fixed_run_seconds(app, (1,), 32, 30.0) == pytest.approx(180.0)


def test_job_waits_for_the_period_and_its_goodput_changes_by_epoch(toy):
    app, _ = toy
    # Submitted at 10: the next decision is at 60. Two GPUs on one node, batch 64 (32 each, no
    # accumulation), 0.6 s a step; gain 4/3 in epochs 0 and 2 (var 1), 8/5 in epoch 1 (var 3).
    job = ElasticJobSpec("b", 10.0, "toy", 2, 64)
    result = simulate_elastic([job], {"toy": app}, FixedGangPolicy(), nodes=1, gpus_per_node=4)
    (outcome,) = result.outcomes
    per_epoch = [100 / (_gain(64, 1, 1) / 0.6), 100 / (_gain(64, 1, 3) / 0.6), 100 / (_gain(64, 1, 1) / 0.6)]
    assert outcome.end_time == pytest.approx(60 + 30 + sum(per_epoch))
    assert outcome.jct == pytest.approx(outcome.end_time - 10)
    assert outcome.queue_delay == pytest.approx(50.0)


def test_accumulation_steps_cost_compute_not_sync(toy):
    app, _ = toy
    # One GPU, batch 64: two micro-batches of 32; a step is 0.5 + (0.5 - 0.1) = 0.9 s.
    job = ElasticJobSpec("c", 0.0, "toy", 1, 64)
    result = simulate_elastic([job], {"toy": app}, FixedGangPolicy(), nodes=1, gpus_per_node=4)
    expected = 30 + sum(100 / (_gain(64, 1, var) / 0.9) for var in (1, 3, 1))
    assert result.outcomes[0].end_time == pytest.approx(expected)


def test_second_job_waits_for_the_first_and_starts_at_the_next_period(toy):
    app, _ = toy
    jobs = [ElasticJobSpec("a", 0.0, "toy", 4, 128), ElasticJobSpec("b", 5.0, "toy", 1, 32)]
    result = simulate_elastic(jobs, {"toy": app}, FixedGangPolicy(), nodes=1, gpus_per_node=4)
    ends = {o.job_id: o.end_time for o in result.outcomes}
    first = fixed_run_seconds(app, (4,), 128, 30.0)
    assert ends["a"] == pytest.approx(first)
    start_b = math.ceil(first / 60) * 60
    assert ends["b"] == pytest.approx(start_b + 180.0)


# --- placement -------------------------------------------------------------------------------
def test_pack_best_fit_whole_nodes_and_one_distributed_job_per_node():
    free, dist = [4, 2, 3], [False] * 3
    assert pack(2, free, dist, 4) == (0, 2, 0)  # best fit: the node with 2 free
    assert pack(6, free, dist, 4) == (4, 0, 2)  # a whole node, then the rest best fit
    assert dist == [True, False, True]
    assert free == [0, 0, 1]
    assert pack(2, free, dist, 4) is None  # only node 2 has room, and it already holds a multi-node job
    assert compact_placement(6, 4) == (4, 2)


# --- Pollux ----------------------------------------------------------------------------------
def test_min_cost_counts_is_exact_against_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(30):
        jobs, total = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        costs = [np.concatenate([[1000.0], np.sort(rng.random(int(rng.integers(1, 5))) * 10)[::-1]])
                 for _ in range(jobs)]
        choice = _min_cost_counts(costs, total)
        assert sum(choice) <= total
        best = min(sum(c[k] for c, k in zip(costs, ks, strict=True))
                   for ks in itertools.product(*[range(len(c)) for c in costs]) if sum(ks) <= total)
        assert sum(c[k] for c, k in zip(costs, choice, strict=True)) == pytest.approx(best)


def test_candidate_batches_respect_the_per_gpu_limits(toy):
    app, _ = toy
    batch, atomic, accum = candidate_layouts(app, 2)
    assert batch.size and np.all(atomic >= 32) and np.all(atomic <= 64)
    assert np.all(batch == 2 * atomic * (accum + 1))
    assert candidate_layouts(app, 8)[0].size == 0  # 8 x 32 > 128: no usable batch size


def test_pollux_gives_every_job_a_gpu_before_growing_any(toy):
    app, _ = toy
    cluster = ElasticCluster(1, 4)
    jobs = [ElasticJob(ElasticJobSpec(f"j{i}", 0.0, "toy", 1, 32), app) for i in range(4)]
    for job in jobs:
        job.max_replicas_seen = 4  # no exploration cap in the way
    decision = PolluxPolicy().allocate(60.0, jobs, cluster)
    assert sorted(sum(c) for c in decision.values()) == [1, 1, 1, 1]


def test_pollux_grows_a_lone_job_no_faster_than_twice_its_largest_allocation(toy):
    app, _ = toy
    cluster = ElasticCluster(1, 4)
    job = ElasticJob(ElasticJobSpec("a", 0.0, "toy", 1, 32), app)
    policy = PolluxPolicy()
    assert sum(policy.allocate(60.0, [job], cluster)["a"]) == 1  # never ran: 1 GPU
    job.counts, job.max_replicas_seen, job.restarts = (1,), 1, 0  # it has run on 1 GPU
    assert sum(policy.allocate(600.0, [job], cluster)["a"]) <= 2


def test_pollux_run_ends_every_job_and_counts_restarts(toy):
    app, _ = toy
    jobs = [ElasticJobSpec(f"j{i}", 20.0 * i, "toy", 1, 32) for i in range(6)]
    result = simulate_elastic(jobs, {"toy": app}, PolluxPolicy(), nodes=2, gpus_per_node=4)
    assert sorted(o.job_id for o in result.outcomes) == [f"j{i}" for i in range(6)]
    assert result.restarts >= 6  # every first start counts
    fastest = 30.0 + sum(100 / max(app.goodput((4,), a, m, e) for a, m in [(32, 0)]) for e in range(3))
    for outcome in result.outcomes:
        # no job beats its first restart plus running every epoch on a whole node
        assert outcome.end_time - outcome.start_time >= min(fastest, 30.0 + 300 * 0.5 / 4)


# --- reader ----------------------------------------------------------------------------------
def test_reader_skips_bad_rows_with_clear_reasons(tmp_path):
    write_app(tmp_path)
    path = write_workload(tmp_path, [
        "ok-1,10,toy,2,64",
        "ok-2,20,toy,1,32",
        "bad-app,30,resnet,1,32",
        "bad-time,-5,toy,1,32",
        "bad-reps,40,toy,1.5,32",
        "bad-batch,50,toy,1,4096",
        "bad-small,60,toy,64,32",
        ",70,toy,1,32",
        "ok-1,80,toy,1,32",
        "bad-num,abc,toy,1,32",
    ])
    trace = read_pollux_trace(path)
    assert [j.name for j in trace.jobs] == ["ok-1", "ok-2"]
    reasons = {p.value: p.reason for p in trace.problems}
    assert "no profile folder" in reasons["resnet"]
    assert "0..366 days" in reasons["-5"]
    assert "whole number" in reasons["1.5"]
    assert "outside toy's measured batch sizes 32..128" in reasons["4096"]
    assert "smaller than num_replicas" in reasons["32"]
    assert "missing value" in reasons[""]
    assert "duplicate name" in reasons["ok-1"]
    assert "not a number" in reasons["abc"]
    assert len(trace.problems) == 8
    assert "8 skipped" in trace.problem_summary()


def test_reader_rejects_a_file_that_is_not_a_pollux_workload(tmp_path):
    write_app(tmp_path)
    path = tmp_path / "workloads" / "w.csv"
    path.parent.mkdir()
    path.write_text("job_id,submit_time,duration,gpus\n1,0,10,1\n")
    with pytest.raises(TraceFormatError, match="header lacks"):
        read_pollux_trace(path)
    path.write_text("name,time,application,num_replicas,batch_size\nx,0,nope,1,32\n")
    with pytest.raises(TraceFormatError, match="no valid pollux job rows"):
        read_pollux_trace(path)


def test_a_broken_profile_folder_fails_only_its_jobs(tmp_path):
    write_app(tmp_path)
    broken = tmp_path / "traces" / "broken"
    broken.mkdir()
    (broken / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n19,32,0.1,0.0\n")
    path = write_workload(tmp_path, ["a,0,toy,1,32", "b,0,broken,1,32"])
    trace = read_pollux_trace(path)
    assert [j.name for j in trace.jobs] == ["a"]
    assert "profile folder is unusable" in trace.problems[0].reason


def test_simulate_cli_runs_pollux_and_the_fixed_policies(tmp_path, capsys):
    write_app(tmp_path)
    path = write_workload(tmp_path, [f"j{i},{30 * i},toy,{1 + i % 2},{32 * (1 + i % 2)}" for i in range(8)])
    code = main(["simulate", "--trace", str(path), "--format", "pollux", "--policy", "pollux,tiresias,lucid,fifo",
                 "--nodes", "2", "--gpus-per-node", "4", "--catalog", str(REPO / "include" / "sample"),
                 "--out", str(tmp_path / "out"), "--no-progress", "--history", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    for name in ("pollux", "tiresias", "lucid", "fifo"):
        assert any(line.startswith(name) for line in out.splitlines())
    assert "on 2 nodes x 4 GPUs" in out
    assert (tmp_path / "out" / "nodes2" / "pollux_jobs.csv").exists()


def test_history_records_come_before_the_simulated_jobs(tmp_path):
    from lucid_core.sim.pollux_experiment import fixed_records, history_records

    write_app(tmp_path)
    trace = read_pollux_trace(write_workload(tmp_path, ["a,100,toy,1,32", "b,400,toy,2,64"]))
    past = history_records(trace, trace, 4)
    assert [r.job_id for r in past] == ["past-a", "past-b"]
    assert max(r.submit_time for r in past) < 100
    assert [r.duration for r in past] == [r.duration for r in fixed_records(trace, 4)]
    assert past[0].duration == pytest.approx(fixed_run_seconds(trace.applications["toy"], (1,), 32, 30.0))


def test_fixed_config_takes_the_artifact_tiresias_settings_unless_the_user_set_them():
    from lucid_core.config import LucidConfig
    from lucid_core.sim.pollux_experiment import fixed_config

    config = fixed_config(LucidConfig())
    assert config.tiresias.queue_threshold_gpu_s == 16 * 3600
    assert config.tiresias.checkpoint_cost_s == 30
    mine = LucidConfig().with_overrides({"tiresias.queue_threshold_gpu_s": 100})
    kept = fixed_config(mine, {"tiresias.queue_threshold_gpu_s": "100"})
    assert kept.tiresias.queue_threshold_gpu_s == 100


def test_pollux_job_alone_on_one_gpu_ends_when_its_best_batch_says(toy):
    app, _ = toy
    # One GPU in the cluster: Pollux can only choose the batch size. In each epoch it takes the
    # searched layout of best goodput; the job ends after one restart and three epochs at those rates.
    _, atomic, accum = candidate_layouts(app, 1)
    best = [max(app.goodput((1,), int(a), int(m), e) for a, m in zip(atomic, accum, strict=True)) for e in range(3)]
    # Submitted at 10, first decided at 60 (age 50: the restart penalty 50/80 leaves it worth starting).
    result = simulate_elastic([ElasticJobSpec("p", 10.0, "toy", 1, 32)], {"toy": app}, PolluxPolicy(),
                              nodes=1, gpus_per_node=1)
    assert result.outcomes[0].start_time == 60.0
    assert result.outcomes[0].end_time == pytest.approx(60 + 30 + sum(100 / rate for rate in best))
    assert result.restarts == 1


def test_pollux_does_not_start_a_job_of_age_zero(toy):
    app, _ = toy
    # The restart penalty max(age - restarts x 30, 0) / (age + 30) is 0 for a job submitted on the
    # decision's second: starting it gains nothing yet, so it starts one period later.
    result = simulate_elastic([ElasticJobSpec("p", 0.0, "toy", 1, 32)], {"toy": app}, PolluxPolicy(),
                              nodes=1, gpus_per_node=1)
    assert result.outcomes[0].start_time == 60.0


def test_check_trace_reports_pollux_rows(tmp_path, capsys):
    write_app(tmp_path)
    path = write_workload(tmp_path, ["a,0,toy,1,32", "b,0,toy,0,32"])
    assert main(["check-trace", str(path), "--format", "pollux"]) == 1
    out = capsys.readouterr().out
    assert "1 jobs kept of 2 rows" in out and "num_replicas='0': must be >= 1" in out

"""Policy core and simulator: exact JCTs on tiny hand-computed traces, and invariants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from duration_stubs import FixedDurations

from lucid_core.config import ConfigError, LucidConfig, load_config
from lucid_core.domain import GpuRef, Job, JobState, Pool, Profile, ShareClass, SharingMode
from lucid_core.policy.baselines import FifoPolicy, SjfPolicy, TiresiasPolicy
from lucid_core.policy.binder import AffinityBinder
from lucid_core.policy.decisions import Place
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.placement import GpuPool
from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.policy.view import ClusterView
from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.engine import simulate
from lucid_core.sim.experiment import POLICIES, load_experiment, run_policy
from lucid_core.sim.records import TraceRecord, Workload

REPO = Path(__file__).resolve().parents[2]
ONE_GPU_NODES = {"cluster.gpus_per_node": 1}


def _records(*rows: tuple[str, float, float]) -> list[TraceRecord]:
    return [TraceRecord(job_id, submit, duration, 1) for job_id, submit, duration in rows]


def _jcts(result) -> dict[str, float]:
    return {o.job_id: o.jct for o in result.outcomes}


THREE = _records(("A", 0, 100), ("B", 10, 50), ("C", 20, 10))


def test_fifo_runs_in_arrival_order():
    config = LucidConfig().with_overrides(ONE_GPU_NODES)
    result = simulate(THREE, FifoPolicy(config), config, main_nodes=1, check_invariants=True)
    assert _jcts(result) == {"A": 100, "B": 140, "C": 140}


def test_sjf_uses_true_durations_without_preempting():
    config = LucidConfig().with_overrides(ONE_GPU_NODES)
    policy = SjfPolicy(config, {r.job_id: r.duration for r in THREE})
    result = simulate(THREE, policy, config, main_nodes=1, check_invariants=True)
    assert _jcts(result) == {"A": 100, "C": 90, "B": 150}


def test_tiresias_demotes_preempts_and_pays_checkpoint_cost():
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "tiresias.queue_threshold_gpu_s": 30,
                                           "tiresias.checkpoint_cost_s": 5, "tiresias.interval_s": 10})
    result = simulate(THREE, TiresiasPolicy(config), config, main_nodes=1, check_invariants=True)
    # Ticks every 10 s. A's attained 40 > 30 at t=40: low queue, B (high) preempts it. B passes 30
    # by t=80: C (high) preempts it and ends at 90. Low queue in submit order: A resumes at 90 with
    # 60 s + 5 s restore -> 155; B waits for the tick at 160, runs 10 s + 5 s -> 175.
    assert _jcts(result) == {"A": 155, "B": 165, "C": 70}
    assert {o.job_id: o.preemptions for o in result.outcomes} == {"A": 1, "B": 1, "C": 0}
    assert result.decision_counts["Preempt"] == 2


def test_tiresias_defaults_follow_the_lucid_artifact():
    from lucid_core.policy.decisions import checkpoint_cost_s

    config = LucidConfig()
    assert (config.tiresias.queue_threshold_gpu_s, config.tiresias.interval_s) == (18000.0, 60.0)
    assert checkpoint_cost_s(config, 8) == 40.0 and checkpoint_cost_s(config, 16) == 60.0
    # a job arriving between ticks waits for the next one: 1 GPU, arrival at 61 s, start at 120 s
    config1 = LucidConfig().with_overrides(ONE_GPU_NODES)
    result = simulate(_records(("A", 61, 100)), TiresiasPolicy(config1), config1, main_nodes=1)
    assert _jcts(result) == {"A": 159}
    # demoted only strictly past the threshold (attained > 18,000 GPU-s), as in the artifact
    policy = TiresiasPolicy(config)
    assert policy.queue_of(18000.0) == 0.0 and policy.queue_of(18000.5) == 1.0


def test_tiresias_wide_preemption_costs_the_wide_checkpoint():
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "tiresias.queue_threshold_gpu_s": 10,
                                           "tiresias.checkpoint_cost_s": 5, "tiresias.checkpoint_cost_wide_s": 20,
                                           "tiresias.interval_s": 10})
    records = [TraceRecord("W", 0, 100, 2), TraceRecord("S", 5, 10, 1)]
    result = simulate(records, TiresiasPolicy(config), config, main_nodes=2, check_invariants=True)
    # W (2 GPUs) passes 10 GPU-s at t=10 (20 attained): S (high queue) preempts it and runs 10..20 on
    # one GPU while W cannot fit; W restarts at 20 with 90 s + 20 s (wide checkpoint) -> 130.
    assert _jcts(result) == {"W": 130, "S": 15}


def _light(key: str = "w") -> Workload:
    return Workload(key, gpu_util=20.0, mem_util=10.0, gpu_mem_mb=1000.0, amp=False)


def test_lucid_short_job_ends_in_profiling_long_one_is_profiled_then_placed():
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "profiler.tprof_s": 20, "profiler.pool_nodes": 1,
                                           "profiler.autoscale": False, "binder.sharing": "off"})
    records = _records(("A", 0, 10), ("B", 0, 100))
    result = simulate(records, LucidPolicy(config), config, main_nodes=1, profiling_nodes=1,
                      workloads=[_light(), _light()], check_invariants=True)
    # A is profiled in place on the free main GPU and ends inside its window; B is profiled
    # on the pool for 20 s, evicted, queued, and runs its whole 100 s from t=20.
    assert _jcts(result) == {"A": 10, "B": 120}
    ended = {o.job_id: o.ended_in_profiling for o in result.outcomes}
    assert ended == {"A": True, "B": False}
    assert result.decision_counts == {"Place": 2, "StartProfiling": 1, "StopProfiling": 1, "SetSharingMode": 1}


def test_lucid_pairs_two_tiny_jobs_on_one_gpu_and_never_preempts():
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "profiler.tprof_s": 20, "profiler.pool_nodes": 1,
                                           "profiler.autoscale": False, "binder.sharing": "on"})
    records = _records(("A", 0, 100), ("B", 0, 100))
    result = simulate(records, LucidPolicy(config), config, main_nodes=1, profiling_nodes=1,
                      workloads=[_light("a"), _light("b")], speeds=lambda a, b: (0.5, 0.5),
                      check_invariants=True)
    # t=20: A's in-place window ends (Tiny); B leaves the pool and shares A's GPU at speed 0.5.
    # A: 80 s of work at 0.5 -> ends 180. B: 80 done by 180, last 20 alone -> ends 200.
    assert _jcts(result) == {"A": 180, "B": 200}
    assert all(o.preemptions == 0 for o in result.outcomes)
    assert result.decision_counts["Unpair"] == 1  # 0.5 < unstable_speed 0.7: split, but nobody is stopped
    assert {o.job_id: o.shared_seconds for o in result.outcomes} == {"A": 160, "B": 160}


def test_a_pair_measured_at_full_speed_still_counts_as_shared_time():
    """Shared time is time with a partner on the GPU, not time slowed down: a pair the catalog measured at full
    speed (many of the artifact's pairs read 1.0 or more) counted as no sharing at all before."""
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "profiler.tprof_s": 20, "profiler.pool_nodes": 1,
                                           "profiler.autoscale": False, "binder.sharing": "on"})
    records = _records(("A", 0, 100), ("B", 0, 100))
    result = simulate(records, LucidPolicy(config), config, main_nodes=1, profiling_nodes=1,
                      workloads=[_light("a"), _light("b")], speeds=lambda a, b: (1.2, 1.0),
                      check_invariants=True)
    # t=20: B shares A's GPU at full speed (1.2 capped at 1): A ends at 100, B's last 80 s of work end at 100
    assert _jcts(result) == {"A": 100, "B": 120}
    assert {o.job_id: o.shared_seconds for o in result.outcomes} == {"A": 80, "B": 80}


def test_unstable_pair_is_split_and_its_jobs_never_share_again():
    config = LucidConfig()
    view = _view_with_running(config, 1, ShareClass.TINY, 1000)
    job = Job("J", "u", "vc", 1, 10.0, profile=Profile(20, 5, 1000), share_class=ShareClass.TINY,
              predicted_duration=3600.0)
    view.add_job(job)
    view.start("J", Pool.MAIN, view.allocations["P"].gpus, partner="P")
    binder = AffinityBinder(config.binder)
    view.speed_reports.append(("J", 0.9))
    assert binder.split_unstable(view) == [] and not job.no_share  # a healthy pair stays as it is
    view.speed_reports.append(("J", 0.55))
    [unpair] = binder.split_unstable(view)
    assert (unpair.job_id, unpair.partner) == ("J", "P") and "0.55" in unpair.reason
    assert job.no_share and view.jobs["P"].no_share and "J" in view.allocations  # still running
    view.speed_reports.append(("P", 0.5))
    assert binder.split_unstable(view) == []  # reported again: the pair was split once, that stands
    view.stop("J")
    assert "P" not in view.share_candidates.get(1, {})  # alone again, but may not take a partner


def _view_with_running(config: LucidConfig, gpus: int, share: ShareClass, mem: float) -> ClusterView:
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1)
    partner = Job("P", "u", "vc", gpus, 0.0, profile=Profile(50, 20, mem), share_class=share,
                  predicted_duration=7200.0)
    view.add_job(partner)
    view.start("P", Pool.MAIN, view.main.place_compact(gpus))
    view.main.place_compact(8 - gpus)  # no reservation: the rest stays free
    return view


@pytest.mark.parametrize(("mode", "job_class", "partner_class", "pairs"), [
    (SharingMode.DEFAULT, ShareClass.MEDIUM, ShareClass.MEDIUM, True),
    (SharingMode.DEFAULT, ShareClass.JUMBO, ShareClass.MEDIUM, False),
    (SharingMode.APATHETIC, ShareClass.TINY, ShareClass.MEDIUM, True),
    (SharingMode.APATHETIC, ShareClass.MEDIUM, ShareClass.MEDIUM, False),
    (SharingMode.OFF, ShareClass.TINY, ShareClass.TINY, False),
])
def test_binder_respects_gpu_sharing_capacity(mode, job_class, partner_class, pairs):
    config = LucidConfig()
    view = _view_with_running(config, 2, partner_class, 4000)
    view.sharing_mode = mode
    job = Job("J", "u", "vc", 2, 10.0, profile=Profile(30, 10, 4000), share_class=job_class,
              predicted_duration=3600.0)
    view.add_job(job)
    found = AffinityBinder(config.binder).find_partner(view, job)
    assert (found is not None) == pairs
    if pairs:
        assert found.partner == "P" and "GSS" in found.reason


def test_binder_hard_rules_memory_demand_and_duration():
    config = LucidConfig()
    binder = AffinityBinder(config.binder)
    view = _view_with_running(config, 2, ShareClass.TINY, 20000)
    too_big = Job("M", "u", "vc", 2, 0.0, profile=Profile(10, 5, 6000), share_class=ShareClass.TINY,
                  predicted_duration=3600.0)
    other_width = Job("W", "u", "vc", 1, 0.0, profile=Profile(10, 5, 100), share_class=ShareClass.TINY,
                      predicted_duration=3600.0)
    ratio = config.binder.pair_priority_ratio  # the partner is predicted at 7200 s
    much_longer = Job("L", "u", "vc", 2, 0.0, profile=Profile(10, 5, 100), share_class=ShareClass.TINY,
                      predicted_duration=7200.0 * (ratio + 0.5))
    for job in (too_big, other_width, much_longer):
        view.add_job(job)
        assert binder.find_partner(view, job) is None, job.job_id
    assert "memory would not fit" in binder.pending_reason(view, too_big)
    assert "job much longer than partner" in binder.pending_reason(view, much_longer)
    within = Job("K", "u", "vc", 2, 0.0, profile=Profile(10, 5, 100), share_class=ShareClass.TINY,
                 predicted_duration=7200.0 * (ratio - 0.5))
    view.add_job(within)
    assert binder.find_partner(view, within).partner == "P"  # just within the ratio: it pairs


def test_compact_placement_prefers_fullest_node_and_whole_nodes_for_wide_jobs():
    pool = GpuPool("main", 8, 24576)
    for name in ("n0", "n1", "n2"):
        pool.add_node(name)
    pool.occupy("x", tuple(GpuRef("n1", i) for i in range(6)), 0)
    assert {r.host for r in pool.place_compact(2)} == {"n1"}  # best fit keeps whole nodes free
    wide = pool.place_compact(16)
    assert sorted({r.host for r in wide}) == ["n0", "n2"] and len(wide) == 16
    assert pool.place_compact(24) is None
    with pytest.raises(ValueError, match="already holds two jobs"):
        pool.occupy("y", (GpuRef("n1", 0),), 0)
        pool.occupy("z", (GpuRef("n1", 0),), 0)


def test_history_predictor_falls_back_and_conditions_on_what_is_known():
    jobs = [Job(f"h{i}", "alice", "vc", 1, 0.0) for i in range(4)] + [Job("g", "bob", "vc", 2, 0.0)]
    model = HistoryDurationPredictor(min_samples=2, recent=0).fit(jobs, [10, 10, 1000, 1000, 500])
    alice = Job("new", "alice", "vc", 1, 1.0)
    short_pred, source = model.predict_one(alice)
    assert source.startswith("user-gpus") and short_pred == pytest.approx(100, rel=0.05)  # geometric mean
    alice.known_min_duration = 200  # it outlived a 200 s profiling window
    assert model.predict_one(alice)[0] == pytest.approx(1000)  # only the long ones remain
    assert model.predict_one(Job("c", "carol", "vc", 2, 1.0))[1].startswith("gpus") is False  # 1 sample < 2
    assert model.predict_one(Job("c", "carol", "vc", 2, 1.0))[1].startswith("all")


def test_config_rejects_bad_values_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"profiler\.tprof_s"):
        load_config(env={"LUCID__PROFILER__TPROF_S": "-1"})
    with pytest.raises(ConfigError, match=r"binder\.sharing"):
        LucidConfig().with_overrides({"binder.sharing": "sometimes"})
    with pytest.raises(ConfigError, match="unknown knob"):
        LucidConfig().with_overrides({"binder.nonsense": 1})
    with pytest.raises(ConfigError, match="must not exceed"):
        LucidConfig().with_overrides({"binder.medium_threshold": 0.99})
    for inf in ("inf", float("inf"), "-inf"):  # no knob means "never" by infinity: it made the clock NaN
        with pytest.raises(ConfigError, match=r"orchestrator\.guard_slowdown: expected float"):
            LucidConfig().with_overrides({"orchestrator.guard_slowdown": inf})
    for huge in (10**400, 10**5000):  # past a float's range (OverflowError), past what Python will print
        with pytest.raises(ConfigError, match=r"orchestrator\.guard_slowdown: expected float, got (1000|an integer)"):
            LucidConfig().with_overrides({"orchestrator.guard_slowdown": huge})
    with pytest.raises(ConfigError, match=r"tiresias\.checkpoint_cost_s: .* above the maximum"):
        LucidConfig().with_overrides({"tiresias.checkpoint_cost_s": 1e8})  # hung Tiresias's simulation
    path = tmp_path / "lucid.toml"
    path.write_text("[profiler]\ntprof_s = 300\n[binder]\nsharing = 'off'\n")
    config = load_config(path, env={"LUCID__PROFILER__NPROF_GPUS": "4"})
    assert (config.profiler.tprof_s, config.binder.sharing, config.profiler.nprof_gpus) == (300, "off", 4)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    (tmp_path / "bad.toml").write_text("[profiler\n")
    with pytest.raises(ConfigError, match="not valid"):
        load_config(tmp_path / "bad.toml")


@pytest.mark.parametrize("policy", [*POLICIES, "lucid-nosharing", "lucid-noprofiler", "lucid-noestimator"])
def test_every_policy_keeps_invariants_on_the_sample(policy):
    catalog = WorkloadCatalog.from_artifact(REPO / "include" / "sample")
    exp, _ = load_experiment(REPO / "include" / "sample" / "trace.csv", "generic", "2024-03-04T12:00", None,
                             nodes=3, catalog=catalog, config=LucidConfig())
    result, metrics = run_policy(policy, exp, check_invariants=True)
    ids = [o.job_id for o in result.outcomes]
    assert len(ids) == len(set(ids)) == len(exp.records)  # every job ends exactly once
    for o in result.outcomes:
        assert o.end_time - o.submit_time >= o.duration - 1e-6  # no job beats its own run time
        assert o.queue_delay >= 0
    if policy.startswith("lucid"):  # Lucid stops a job only to yield, at most yield_max times each
        assert all(o.preemptions <= LucidConfig().orchestrator.yield_max for o in result.outcomes)
        assert metrics["preemptions"] == result.decision_counts.get("Preempt", 0)
    assert metrics["total_gpus"] + metrics["profiling_pool_gpus"] == 3 * 8  # same GPUs for every policy


def test_profiling_pool_is_carved_only_from_clusters_of_ten_nodes_or_more():
    from lucid_core.sim.experiment import profiling_pool_nodes

    assert [profiling_pool_nodes(2, n) for n in (1, 3, 9, 10, 19, 20, 108)] == [0, 0, 0, 1, 1, 2, 2]
    assert profiling_pool_nodes(0, 108) == 0


def test_lucid_on_the_small_sample_beats_the_baselines_on_average_and_bounds_its_tail():
    """On 3 nodes a profiling pool would take a third of the GPUs and wide jobs starved (P99.9
    queueing 9.5 h vs Tiresias 3.3 h); profiling online keeps Lucid's tail near the baselines'.
    The sample says nothing of checkpoints, so by default no job yields: Lucid stops nobody, its avg JCT
    is at most QSSF's and its P99.9 queueing at most QSSF's and within 5% of the preemptive Tiresias's.
    Where every job resumes from checkpoints (share 1), yielding brings the avg JCT within 2% of the
    artifact-faithful Tiresias's; a job stopped at most once keeps the tail within 1.35x of QSSF's."""
    catalog = WorkloadCatalog.from_artifact(REPO / "include" / "sample")
    trace = REPO / "include" / "sample" / "trace.csv"
    exp, _ = load_experiment(trace, "generic", "2024-03-04T12:00", None, nodes=3, catalog=catalog,
                             config=LucidConfig())
    _, lucid = run_policy("lucid", exp)
    _, tiresias = run_policy("tiresias", exp)
    _, qssf = run_policy("qssf", exp)
    assert lucid["profiling_pool_gpus"] == 0
    assert lucid["preemptions"] == 0 and lucid["preemptible_jobs"] == 0
    assert tiresias["preemptions"] > 0 and tiresias["assumes_checkpoints"] == 1.0
    assert lucid["avg_jct_s"] <= qssf["avg_jct_s"]
    assert lucid["p999_queue_s"] <= min(qssf["p999_queue_s"], 1.05 * tiresias["p999_queue_s"])
    every, _ = load_experiment(trace, "generic", "2024-03-04T12:00", None, nodes=3, catalog=catalog,
                               config=LucidConfig(), preemptible_share=1.0)
    _, yielding = run_policy("lucid", every)
    assert yielding["preemptions"] > 0 and yielding["preemptible_jobs"] == len(every.records)
    assert yielding["avg_jct_s"] <= min(qssf["avg_jct_s"], 1.02 * tiresias["avg_jct_s"])
    assert yielding["p999_queue_s"] <= 1.35 * qssf["p999_queue_s"]


def test_simulator_rejects_a_job_wider_than_the_cluster():
    config = LucidConfig()
    with pytest.raises(ValueError, match="more GPUs than"):
        simulate([TraceRecord("w", 0, 10, 16)], FifoPolicy(config), config, main_nodes=1)


def test_virtual_clusters_keep_jobs_on_their_own_nodes(tmp_path):
    from lucid_core.sim.experiment import _merge_timelines, read_vc_config

    vc_file = tmp_path / "vc.csv"
    vc_file.write_text(",num\nnlp,2\nspeech,1\nvision,1\nrl,1\n")
    vc_nodes = read_vc_config(vc_file)
    assert vc_nodes == {"nlp": 2, "speech": 1, "vision": 1, "rl": 1}
    catalog = WorkloadCatalog.from_artifact(REPO / "include" / "sample")
    exp, _ = load_experiment(REPO / "include" / "sample" / "trace.csv", "generic", "2024-03-04T12:00", None,
                             nodes=99, catalog=catalog, config=LucidConfig(), vc_nodes=vc_nodes)
    split, _ = run_policy("lucid", exp, check_invariants=True)
    assert len({o.job_id for o in split.outcomes}) == len(exp.records)
    assert split.total_gpus == 5 * 8  # no VC here has 10 nodes, so no profiling pool is carved out
    pooled, _ = run_policy("lucid", replace(exp, vc_nodes=None, nodes=5), check_invariants=True)
    # one VC's burst cannot spill onto another VC's idle nodes: splitting can only add waiting
    assert sum(o.queue_delay for o in split.outcomes) > sum(o.queue_delay for o in pooled.outcomes)
    assert _merge_timelines([[(0, 0), (5, 2), (9, 0)], [(0, 0), (5, 1), (7, 3)]]) == [(0, 0), (5, 3), (7, 5), (9, 3)]
    vc_file.write_text("nlp,2\n")
    with pytest.raises(ValueError, match="missing from the VC config"):
        run_policy("fifo", replace(exp, vc_nodes=read_vc_config(vc_file)))
    # a VC with no jobs in the window still owns its GPUs: they count, idle, in utilization
    idle, _ = run_policy("fifo", replace(exp, vc_nodes={**vc_nodes, "ghost": 95}))
    assert idle.total_gpus == 100 * 8
    vc_file.write_text("nlp,2\nvision,1\nnlp,3\n")  # which size is nlp's? The last one won, silently
    with pytest.raises(ValueError, match="line 3: VC 'nlp' is listed twice"):
        read_vc_config(vc_file)
    vc_file.write_text("nlp,-3\nvision,1\n")  # no header: a negative size was taken for one
    with pytest.raises(ValueError, match="line 1: VC 'nlp' needs at least one node, got -3"):
        read_vc_config(vc_file)


def test_jobs_are_placed_only_on_nodes_of_their_own_vc():
    """Live hosts carry a VC: a job waits rather than run on another team's idle nodes."""
    config = LucidConfig().with_overrides({"binder.sharing": "on"})
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1, prefix="a-", vc="team-a")
    view.add_nodes(Pool.MAIN, 1, prefix="b-", vc="team-b")
    policy = LucidPolicy(config)
    for i in range(3):  # 3 x 4 GPUs of team-a on its one 8-GPU node: the third must wait
        job = Job(f"a{i}", "ana", "team-a", 4, 0.0, profile=Profile(95, 60, 20000), share_class=ShareClass.JUMBO,
                  state=JobState.QUEUED)
        view.add_job(job)
        policy.on_requeue(view, job)
    decisions = policy.schedule(view)
    placed = {d.job_id: {r.host for r in d.gpus} for d in decisions if isinstance(d, Place)}
    assert placed == {"a0": {"a-0000"}, "a1": {"a-0000"}}
    assert view.main.free_gpus("team-b") == 8 and "a2" in view.queue
    # its only possible partners are team-a's two Jumbo jobs, never team-b's
    assert AffinityBinder(config.binder).pending_reason(view, view.jobs["a2"]) == (
        "no affine partner: sharing scores exceed GPU capacity")
    view.check_invariants()


def test_per_vc_replay_keeps_the_duration_model_and_counts_progress_over_every_vc():
    """Each VC runs on its own nodes; before, this path dropped the duration model and the progress callback."""
    from lucid_core.sim.experiment import Experiment

    asked: list[str] = []

    class Recording(HistoryDurationPredictor):
        def predict_duration(self, jobs):
            asked.extend(j.job_id for j in jobs)
            return [600.0] * len(jobs)

    records = [TraceRecord(f"{vc}{i}", 10.0 * i, 300.0 + 50 * i, 1, vc=vc) for vc in ("a", "b") for i in range(4)]
    exp = Experiment(records, [], WorkloadCatalog.synthetic(), LucidConfig(), nodes=2, vc_nodes={"a": 1, "b": 1})
    seen: list[tuple[int, int]] = []
    result, _ = run_policy("lucid", exp, duration_model=Recording(),
                           progress=lambda done, total: seen.append((done, total)))
    assert len(result.outcomes) == 8
    assert {j[0] for j in asked} == {"a", "b"}  # the given model predicted the jobs of both VCs
    assert seen[-1] == (8, 8) and all(total == 8 for _, total in seen)  # one count over both VCs
    wide = [*records, TraceRecord("b-wide", 0.0, 60.0, 16, vc="b")]  # 16 GPUs: VC b has one 8-GPU node
    with pytest.raises(ValueError, match=r"VC b \(1 nodes\): 1 job\(s\) need more GPUs than the 8"):
        run_policy("fifo", replace(exp, records=wide))


_KnownDurations = FixedDurations  # a model that knows each job's run time: isolates the ordering rules


def _guard_trace() -> list[TraceRecord]:
    # one 2-GPU node: L holds one GPU 0..100, a stream of 1-GPU 20 s jobs keeps the other busy,
    # and W needs both GPUs at once
    return [TraceRecord("L", 0, 100, 1), TraceRecord("W", 1, 30, 2),
            *(TraceRecord(f"S{t}", t, 20, 1) for t in (2, 22, 42, 62, 82, 102))]


@pytest.mark.parametrize(("slowdown", "expected"), [
    # guard 2: W is overdue at 1 + 2 x 30 = 61 s and the node is reserved for it: S62 and S82 wait,
    # L ends at 100, W runs 100..130, then S62 + S82 run 130..150 and S102 150..170
    (2.0, {"L": 100, "W": 129, "S2": 20, "S22": 20, "S42": 20, "S62": 88, "S82": 68, "S102": 68}),
    # no guard: shorter S jobs keep taking the free GPU; W starts only when both are free at 122
    (0.0, {"L": 100, "W": 151, "S2": 20, "S22": 20, "S42": 20, "S62": 20, "S82": 20, "S102": 20}),
])
def test_starvation_guard_reserves_the_node_for_an_overdue_wide_job(slowdown, expected):
    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.enabled": False,
                                           "profiler.tprof_s": 1, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": slowdown,
                                           # the plain reservation (EASY backfilling has its own test below)
                                           "orchestrator.backfill_reserved": False})
    records = _guard_trace()
    policy = LucidPolicy(config, duration_model=_KnownDurations({r.job_id: r.duration for r in records}))
    result = simulate(records, policy, config, main_nodes=1, check_invariants=True, keep_log=True)
    assert _jcts(result) == expected
    if slowdown:
        [place_w] = [entry for entry in result.decision_log if entry[2] == "W"]
        assert place_w[0] == 100 and "starvation guard" in place_w[3]


_PLAIN_RESERVATION = {"L": 100, "W": 129, "S2": 20, "S22": 20, "S42": 20, "S62": 88, "S82": 68, "S102": 68}


@pytest.mark.parametrize(("backfill", "margin", "expected"), [
    # EASY: W is reserved at 61 and predicted to start when L ends at 100; S62 (20 s) is predicted to
    # end at 82, before that, so it runs on the reserved node; S82 would end at 102 and waits for W
    (True, 1.0, {"L": 100, "W": 129, "S2": 20, "S22": 20, "S42": 20, "S62": 20, "S82": 68, "S102": 48}),
    # margin 2: S62 at twice its prediction would end at 102, after W's predicted start: it waits
    (True, 2.0, _PLAIN_RESERVATION),
    # plain reservation: the held node takes no job until W starts
    (False, 1.0, _PLAIN_RESERVATION),
])
def test_easy_backfill_uses_reserved_nodes_only_for_jobs_ending_before_the_reserved_start(backfill, margin, expected):
    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.enabled": False,
                                           "profiler.tprof_s": 1, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": 2.0,
                                           "orchestrator.backfill_reserved": backfill,
                                           "orchestrator.backfill_margin": margin})
    records = _guard_trace()
    policy = LucidPolicy(config, duration_model=_KnownDurations({r.job_id: r.duration for r in records}))
    result = simulate(records, policy, config, main_nodes=1, check_invariants=True, keep_log=True)
    assert _jcts(result) == expected
    backfilled = [entry[2] for entry in result.decision_log if "backfilled" in str(entry[3])]
    assert backfilled == (["S62"] if backfill and margin == 1.0 else [])


def test_by_default_a_job_backfills_when_it_ends_in_time_even_at_twice_its_prediction():
    """The default (EASY backfilling, margin 2): S62, predicted at 19 s, would end by 100 even at 38 s, when W is
    predicted to start; it runs on the node held for W. S82 (20 s, 122 at twice that) waits."""
    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.enabled": False,
                                           "profiler.tprof_s": 1, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": 2.0})
    records = [r if r.job_id != "S62" else TraceRecord("S62", 62, 19, 1) for r in _guard_trace()]
    policy = LucidPolicy(config, duration_model=_KnownDurations({r.job_id: r.duration for r in records}))
    result = simulate(records, policy, config, main_nodes=1, check_invariants=True, keep_log=True)
    backfilled = [entry for entry in result.decision_log if "backfilled" in str(entry[3])]
    assert [entry[2] for entry in backfilled] == ["S62"]
    assert "held for W" in backfilled[0][3] and "even at 2x" in backfilled[0][3]
    assert _jcts(result)["S62"] == 19 and _jcts(result)["W"] == 129


@pytest.mark.parametrize(("tail", "expected"), [
    # tail guard 3: A and B end at 10 having waited 0 s, so the bound is 3 x max(P99 wait 0, Tprof 1)
    # = 3 s; W (waited 9 s) and both S jobs are overdue, oldest first: W runs 10..40, S2 and S5 40..60
    (3.0, {"A": 10, "B": 10, "W": 39, "S2": 58, "S5": 55}),
    # off: shortest first, W waits for both S jobs
    (0.0, {"A": 10, "B": 10, "W": 59, "S2": 28, "S5": 25}),
])
def test_tail_guard_bounds_waits_by_the_recent_p99_wait(tail, expected):
    from collections import deque

    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.enabled": False,
                                           "profiler.tprof_s": 1, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": 0, "orchestrator.guard_tail": tail})
    records = _records(("A", 0, 10), ("B", 0, 10), ("W", 1, 30), ("S2", 2, 20), ("S5", 5, 20))
    records = [replace(r, gpus=2) if r.job_id == "W" else r for r in records]
    policy = LucidPolicy(config, duration_model=_KnownDurations({r.job_id: r.duration for r in records}))
    policy.orchestrator.recent_waits_ = deque(maxlen=2)  # a tiny window: two finished jobs give the P99
    result = simulate(records, policy, config, main_nodes=1, check_invariants=True)
    assert _jcts(result) == expected


def test_guard_floor_is_the_profiling_window_and_a_reservation_holds_until_its_job_starts():
    from lucid_core.policy.orchestrator import Orchestrator

    job = Job("J", "u", "vc", 1, 100.0, predicted_duration=5.0)
    assert Orchestrator(_KnownDurations({}), guard_slowdown=8, guard_floor_s=200).overdue_at(job) == 1700.0
    assert Orchestrator(_KnownDurations({}), guard_slowdown=0).overdue_at(job) is None
    pool = GpuPool("main", 2, 1000.0)
    pool.add_node("a")
    pool.add_node("b")
    pool.hold(["a"])
    assert pool.place_compact(2) == (GpuRef("b", 0), GpuRef("b", 1))
    pool.occupy("x", (GpuRef("b", 0),), 0.0)
    assert pool.place_compact(2) is None and pool.free_gpus() == 1  # a held node offers nothing
    pool.check_invariants()
    pool.release_holds()
    assert pool.place_compact(2) == (GpuRef("a", 0), GpuRef("a", 1))
    pool.check_invariants()


def test_profiling_pool_serves_a_job_first_once_it_waited_its_window():
    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.tprof_s": 10,
                                           "profiler.in_place": False, "profiler.autoscale": False,
                                           "binder.sharing": "off"})
    records = [TraceRecord("A", 0, 3, 1), TraceRecord("W", 0, 5, 2),
               *(TraceRecord(f"S{t}", t, 3, 1) for t in range(1, 9))]
    result = simulate(records, LucidPolicy(config), config, main_nodes=1, profiling_nodes=1,
                      workloads=[_light(r.job_id) for r in records], check_invariants=True)
    # least-GPU-first keeps one pool GPU busy with 1-GPU jobs; at t=10 W has waited its 10 s window,
    # goes first and the scan stops at it: S5 ends at 10, S6 at 12, W runs 12..17, then S7 and S8
    assert _jcts(result) == {"A": 3, "S1": 3, "S2": 4, "S3": 4, "S4": 5, "S5": 5, "S6": 6,
                             "W": 17, "S7": 13, "S8": 12}
    assert all(o.ended_in_profiling for o in result.outcomes)


def test_qssf_stops_at_the_first_job_that_does_not_fit_and_the_backfill_variant_skips_it():
    from lucid_core.policy.baselines import QssfPolicy

    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 4})
    history = [Job(f"h{i}", "u", "short" if i % 2 else "long", 1, float(i)) for i in range(40)]
    durations = [10.0 if i % 2 else 10000.0 for i in range(40)]
    records = [TraceRecord("A", 0, 100, 2, vc="long"), TraceRecord("B", 1, 10, 4, vc="short"),
               TraceRecord("C", 2, 50, 1, vc="long")]
    # B (4 GPUs x ~10 s) is ahead of C (1 GPU x ~10,000 s) but cannot start while A holds 2 GPUs
    strict = simulate(records, QssfPolicy(config, history, durations), config, main_nodes=1, check_invariants=True)
    assert _jcts(strict) == {"A": 100, "B": 109, "C": 158}
    backfill = simulate(records, QssfPolicy(config, history, durations, backfill=True), config, main_nodes=1)
    assert _jcts(backfill) == {"A": 100, "B": 109, "C": 50}


def test_ordering_rule_names_priority_guard_or_sharing_in_words():
    from lucid_core.policy.orchestrator import ordering_rule

    job = Job("J", "u", "vc", 2, 0.0, predicted_duration=3600.0)
    rule, words = ordering_rule(job, now=1800.0, guard_slowdown=8, floor_s=200)
    assert rule == "priority" and "2 GPU(s) x predicted 1.0 h = 2.0 GPU-h" in words and "after 8.0 h" in words
    rule, words = ordering_rule(job, now=8 * 3600.0, guard_slowdown=8, floor_s=200)
    assert rule == "guard" and "waited 8.0 h, at least 8 x its predicted 1.0 h" in words
    assert ordering_rule(job, now=9e9, guard_slowdown=0, floor_s=200)[0] == "priority"  # guard off
    job.start_time = 60.0  # placed: the decision's reason says which rule it was
    assert ordering_rule(job, 9e9, 8, 200, place_reason="priority 2.00 GPU-h = ...; compact exclusive fit")[0] \
        == "priority"
    assert ordering_rule(job, 9e9, 8, 200, place_reason="starvation guard: waited ...")[0] == "guard"
    rule, words = ordering_rule(job, 9e9, 8, 200, place_reason="no compact exclusive fit", partner="P")
    assert rule == "sharing" and "GPUs of P" in words


@pytest.mark.parametrize(("quantile", "expected"), [
    # cap at the smallest recent prediction: A (300 s) and B (200 s) are both "long" and go in
    # arrival order after C (5 s): R 0..100, C 100..105, A 105..405, B 405..605
    (0.0, {"R": 100, "C": 102, "A": 404, "B": 603}),
    # no cap: shortest predicted first, C, B, A
    (1.0, {"R": 100, "C": 102, "B": 303, "A": 604}),
])
def test_long_job_class_is_served_in_arrival_order(quantile, expected):
    config = LucidConfig().with_overrides({**ONE_GPU_NODES, "profiler.enabled": False, "binder.sharing": "off",
                                           "orchestrator.guard_slowdown": 0, "orchestrator.long_quantile": quantile})
    records = _records(("R", 0, 100), ("A", 1, 300), ("B", 2, 200), ("C", 3, 5))
    policy = LucidPolicy(config, duration_model=_KnownDurations({r.job_id: r.duration for r in records}))
    result = simulate(records, policy, config, main_nodes=1, check_invariants=True)
    assert _jcts(result) == expected


def test_policy_state_round_trips_through_the_view():
    """What a live round saves of the policy's state, a new view restores (the store keeps it as JSON)."""
    import json

    config = LucidConfig()
    view = ClusterView(config, now=10.0)
    burst = config.profiler.burst_tprof_s  # a window this configuration sets (a burst's)
    view.sharing_mode, view.tprof_s, view.nprof_gpus, view.last_mode_check = SharingMode.APATHETIC, burst, 4, 7.0
    view.borrowed_nodes = ["n1"]
    saved = json.loads(json.dumps(view.policy_state()))
    fresh = ClusterView(config, now=20.0)
    assert fresh.restore_policy_state(saved) == {"n1"}
    assert (fresh.sharing_mode, fresh.tprof_s, fresh.nprof_gpus, fresh.last_mode_check) == (
        SharingMode.APATHETIC, burst, 4, 7.0)
    assert ClusterView(config).restore_policy_state({}) == set()  # nothing saved yet: the config's defaults
    # a window no setting of this configuration gives (saved under another one) yields to its Tprof
    assert ClusterView(config).restore_policy_state({**saved, "tprof_s": 123.0}) == {"n1"}
    other = ClusterView(config)
    other.restore_policy_state({**saved, "tprof_s": 123.0})
    assert other.tprof_s == config.profiler.tprof_s


def test_a_policy_declares_its_placement_once_and_every_scan_uses_it():
    """Placement is one small protocol (policy/placement.py): a policy that swaps it places its jobs
    through the one it declares; compact is the default."""
    from lucid_core.policy.placement import COMPACT

    class LastNodeFirst:
        name = "last-node-first"

        def place(self, pool, gpus, vc=""):
            for node in reversed(list(pool.nodes.values())):
                if node.vc == vc and node.free >= gpus and not node.held and gpus <= node.gpus:
                    return tuple(GpuRef(node.name, i) for i in node.empty_gpus()[:gpus])
            return None

    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.enabled": False})
    for placement, host in ((None, "node0000"), (LastNodeFirst(), "node0002")):
        policy = FifoPolicy(config)
        assert policy.placement is COMPACT
        if placement is not None:
            policy.placement = placement
        view = ClusterView(config)
        view.add_nodes(Pool.MAIN, 3)
        job = Job("A", "u", "", 1, 0.0)
        view.add_job(job)
        policy.on_submit(view, job)
        [decision] = policy.schedule(view)
        assert isinstance(decision, Place) and {g.host for g in decision.gpus} == {host}
        records = _records(("A", 0, 10), ("B", 1, 10))
        result = simulate(records, policy, config, main_nodes=3, check_invariants=True)
        assert _jcts(result) == {"A": 10, "B": 10}


def _restorable_jobs(n: int, now: float) -> list[Job]:
    """Queued jobs as a live round reads them back: profiled, classed and predicted, some long and overdue."""
    jobs = []
    for i in range(n):
        gpus = (1, 2, 4, 8, 16)[i % 5]
        predicted = 600.0 * (1 + (i * 7919) % 97)
        jobs.append(Job(job_id=f"j{i:03d}", user="ann", vc="", gpus=gpus, submit_time=now - 40.0 * (i % 31) * predicted,
                        profile=Profile(50.0, 20.0, 4000.0), share_class=(ShareClass.TINY, ShareClass.MEDIUM)[i % 2],
                        predicted_duration=predicted))
    return jobs


@pytest.mark.parametrize("guard_tail", [0.0, 2.0])
def test_restoring_a_queue_in_one_call_equals_restoring_it_job_by_job(guard_tail):
    """`on_restored` takes the whole queue at once (one sort per part, one heapify per heap); what the next
    scan sees must be what one `requeue` per job builds: the same order, keys and guard/long heaps."""
    now = 1_000_000.0
    config = LucidConfig().with_overrides({"orchestrator.guard_tail": guard_tail})
    views = []
    for batched in (False, True):
        policy = LucidPolicy(config, duration_model=FixedDurations({}))
        view = ClusterView(config, now=now)
        view.add_nodes(Pool.MAIN, 4)
        view.recent_priorities = [600.0 * k for k in range(1, 200)]
        view.long_cap = 600.0 * 150
        policy.orchestrator.tail_bound_ = 3600.0 if guard_tail else policy.orchestrator.tail_bound_
        jobs = _restorable_jobs(120, now)
        for job in jobs:
            view.add_job(job)
        if batched:
            policy.on_restored(view, jobs)
        else:
            for job in jobs:
                policy.orchestrator.requeue(view, job)
        views.append(view)
    one_by_one, batched_view = views
    assert batched_view.queue.ordered() == one_by_one.queue.ordered()
    assert batched_view.queue.parts() == one_by_one.queue.parts()  # each part sorted, as the scan reads heads
    assert {j: batched_view.queue.key_of(j) for j in batched_view.queue.ordered()} == \
        {j: one_by_one.queue.key_of(j) for j in one_by_one.queue.ordered()}
    assert any(k[0] < 0 for k in (batched_view.queue.key_of(j) for j in batched_view.queue.ordered())), \
        "the case should hold overdue jobs"
    for heap in ("guard_heap", "arrival_heap", "long_heap"):
        assert sorted(getattr(batched_view, heap)) == sorted(getattr(one_by_one, heap)), heap
        assert getattr(batched_view, heap)[:1] == sorted(getattr(one_by_one, heap))[:1], heap
    assert len(batched_view.long_heap) > 0
    assert all(batched_view.jobs[j].state is JobState.QUEUED for j in batched_view.queue.ordered())

"""Pollux-format workloads under every policy: Pollux elastic, the others on fixed-size jobs.

Pollux runs in the elastic engine (`sim.elastic`). The fixed-size policies (Tiresias, Lucid, FIFO,
SJF) run the same jobs in the usual engine, each job as its row asks (GPUs and total batch size),
with its exclusive run time computed from the same measurements on a compact placement: the
30 s start (the artifact's restart delay, which every first start pays too) plus, epoch by
epoch, the epoch's work over the job's goodput at that batch size. A Tiresias preemption costs
its `checkpoint_cost_s` (30 s by default, the same restart delay).

Lucid needs co-located speeds and profiles: each application is mapped to the catalog workload
of the same model family (`APP_FAMILIES`) at the catalog batch size nearest the job's per-GPU
batch (no mixed precision); an application with no family in the catalog takes the catalog's
heaviest workload (highest GPU utilization, so the packing model rarely shares it).

Tiresias here uses the artifact's queue threshold of 16 GPU-hours (57,600 GPU-s, the
"TunedJobs" setting the published figures ran with) and its 30 s restart as the preemption cost,
unless a `--set` gives them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from lucid_core.config import LucidConfig
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.baselines import FifoPolicy, SjfPolicy, TiresiasPolicy
from lucid_core.policy.elastic_view import compact_placement
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.pollux import PolluxPolicy
from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.elastic import fixed_run_seconds, simulate_elastic
from lucid_core.sim.engine import SimResult, simulate
from lucid_core.sim.experiment import checkpoint_metrics, history_jobs, profiling_pool_nodes
from lucid_core.sim.metrics import compute_metrics
from lucid_core.sim.pollux_trace import PolluxTrace
from lucid_core.sim.records import TraceRecord, Workload

#: Pollux application -> (model, dataset) of the catalog workload it runs as.
#: cifar10 is ResNet-18 on CIFAR-10, imagenet ResNet-50, bert BERT fine-tuning on SQuAD and ncf
#: NeuMF on MovieLens in both papers' testbeds; deepspeech2 (a recurrent speech model) has no
#: speech workload in the catalog and runs as its recurrent LSTM; yolov3 (a Darknet-53 conv
#: detector at 416 px, GPU-bound) as ResNet-50 on ImageNet.
APP_FAMILIES: dict[str, tuple[str, str]] = {
    "cifar10": ("ResNet18", "CIFAR-10"),
    "imagenet": ("ResNet50", "ImageNet"),
    "bert": ("BERT", "SQuAD"),
    "ncf": ("NeuMF", "MovieLens"),
    "deepspeech2": ("LSTM", "Wikitext2"),
    "yolov3": ("ResNet50", "ImageNet"),
}
ARTIFACT_TIRESIAS_THRESHOLD_GPU_S = 16 * 3600.0
FIXED_POLICIES = ("fifo", "sjf", "tiresias", "lucid")
POLLUX_POLICIES = ("pollux", *FIXED_POLICIES)
RESTART_DELAY_S = 30.0


def catalog_workload(catalog: WorkloadCatalog, application: str, local_batch: int) -> Workload:
    """The catalog workload an application runs as at this per-GPU batch (see `APP_FAMILIES`)."""
    family = APP_FAMILIES.get(application)
    entries = [e for e in catalog.entries if family is not None and (e.model, e.dataset) == family]
    if not entries:
        heaviest = max(catalog.entries, key=lambda e: (e.gpu_util, e.gmem_mb))
        return catalog.workloads[catalog.index_[heaviest.key]]
    plain = [e for e in entries if not e.amp] or entries
    chosen = min(plain, key=lambda e: (abs(math.log(e.batchsize / max(local_batch, 1))), e.batchsize))
    return catalog.workloads[catalog.index_[chosen.key]]


def fixed_records(trace: PolluxTrace, gpus_per_node: int) -> list[TraceRecord]:
    """Each job as a fixed-size trace record: its GPUs and its exclusive run time at its batch size."""
    records = []
    for job in trace.jobs:
        app = trace.applications[job.application]
        duration = fixed_run_seconds(app, compact_placement(job.replicas, gpus_per_node), job.batch_size,
                                     RESTART_DELAY_S)
        records.append(TraceRecord(job_id=job.name, submit_time=job.submit_time, duration=duration,
                                   gpus=job.replicas, vc="default", user=job.application, name=job.application))
    return records


def history_records(past: PolluxTrace, trace: PolluxTrace, gpus_per_node: int) -> list[TraceRecord]:
    """Jobs of an earlier workload as history: ids prefixed, submitted before the simulated ones."""
    records = fixed_records(past, gpus_per_node)
    shift = max(r.submit_time for r in records) + 1.0 - min(j.submit_time for j in trace.jobs)
    return [TraceRecord(f"past-{r.job_id}", r.submit_time - shift, r.duration, r.gpus, r.vc, r.user, r.name)
            for r in records]


@dataclass
class PolluxExperiment:
    trace: PolluxTrace
    catalog: WorkloadCatalog
    config: LucidConfig  # with gpus_per_node set to the cluster's
    nodes: int
    interval_s: float = 60.0
    #: past jobs (fixed-size records) that train the predicting policies' duration model; a pollux
    #: workload has no history of its own, so without one Lucid starts cold
    history: list[TraceRecord] = field(default_factory=list)


def fixed_config(config: LucidConfig, user_overrides: dict[str, str] | None = None) -> LucidConfig:
    """The run's config: the artifact's Tiresias threshold and its 30 s restart as the cost of a
    preemption (for every width), except where the user set a knob."""
    wanted = {"tiresias.queue_threshold_gpu_s": ARTIFACT_TIRESIAS_THRESHOLD_GPU_S,
              "tiresias.checkpoint_cost_s": RESTART_DELAY_S}
    if hasattr(config.tiresias, "checkpoint_cost_wide_s"):
        wanted["tiresias.checkpoint_cost_wide_s"] = RESTART_DELAY_S
    chosen = {k: v for k, v in wanted.items() if k not in (user_overrides or {})}
    return config.with_overrides(chosen) if chosen else config


def _fixed_policy(name: str, config: LucidConfig, records: list[TraceRecord],
                  history: list[TraceRecord]) -> SchedulingPolicy:
    if name == "fifo":
        return FifoPolicy(config)
    if name == "sjf":
        return SjfPolicy(config, {r.job_id: r.duration for r in records})
    if name == "tiresias":
        return TiresiasPolicy(config)
    if name == "lucid":
        jobs, durations = history_jobs(history)
        return LucidPolicy(config, duration_model=HistoryDurationPredictor().fit(jobs, durations))
    raise ValueError(f"policy {name!r} does not run pollux workloads; choose from {', '.join(POLLUX_POLICIES)}")


def run_pollux_policy(name: str, exp: PolluxExperiment,
                      progress: Callable[[int, int], None] | None = None) -> tuple[SimResult, dict]:
    """Simulate one policy on the workload; metrics as `compute_metrics` gives them, plus wall time."""
    gpn = exp.config.cluster.gpus_per_node
    too_wide = [j.name for j in exp.trace.jobs if j.replicas > exp.nodes * gpn]
    if too_wide:
        raise ValueError(f"{len(too_wide)} job(s) ask for more GPUs than the cluster's {exp.nodes * gpn} "
                         f"(e.g. {too_wide[:3]})")
    if name == "pollux":
        elastic = simulate_elastic(exp.trace.jobs, exp.trace.applications, PolluxPolicy(), nodes=exp.nodes,
                                   gpus_per_node=gpn, interval=exp.interval_s, restart_delay=RESTART_DELAY_S,
                                   progress=progress)
        result = SimResult(name, elastic.outcomes, elastic.busy_timeline, elastic.total_gpus,
                           elastic.decision_counts, elastic.wall_seconds, elastic.rounds, rounds=elastic.rounds)
        metrics = compute_metrics(result.outcomes, result.busy_timeline, result.total_gpus)
        metrics.update(wall_s=result.wall_seconds, profiling_pool_gpus=0, restarts=elastic.restarts,
                       **checkpoint_metrics(PolluxPolicy, []))
        return result, metrics
    records = fixed_records(exp.trace, gpn)
    policy = _fixed_policy(name, exp.config, records, exp.history)
    pool = profiling_pool_nodes(exp.config.profiler.pool_nodes, exp.nodes) if policy.profiles else 0
    workloads = [catalog_workload(exp.catalog, j.application, math.ceil(j.batch_size / j.replicas))
                 for j in exp.trace.jobs]
    result = simulate(records, policy, exp.config, main_nodes=exp.nodes - pool, profiling_nodes=pool,
                      workloads=workloads, speeds=exp.catalog.colocated_speeds, progress=progress)
    metrics = compute_metrics(result.outcomes, result.busy_timeline, result.total_gpus)
    metrics.update(wall_s=result.wall_seconds, profiling_pool_gpus=pool * gpn, **checkpoint_metrics(policy, records))
    return result, metrics


def simulate_pollux_cli(args, config: LucidConfig, user_overrides: dict[str, str], catalog: WorkloadCatalog,
                        node_counts: list[int], policies: list[str], out) -> int:
    """`lucid simulate --format pollux`: every policy on the workload, the usual table and files."""
    from lucid_core.sim.pollux_trace import read_pollux_trace
    from lucid_core.sim.report import jct_cdf_plot, side_by_side, utilization_plot, write_results

    unknown = [p for p in policies if p not in POLLUX_POLICIES]
    if unknown:
        raise ValueError(f"policies {unknown} do not run pollux workloads; choose from {', '.join(POLLUX_POLICIES)}")
    trace = read_pollux_trace(args.trace, args.profiles)
    if catalog.synthetic and any(p in policies for p in ("lucid", "fifo", "sjf", "tiresias")):
        print(f"note: catalog {catalog.source} is synthetic: applications map to its heaviest workload for "
              "profiles and co-located speeds; give --catalog ../shared/data/lucid_artifact for measured ones")
    history = []
    if args.history:
        past = read_pollux_trace(args.history, args.profiles)
        history = history_records(past, trace, config.cluster.gpus_per_node)
    config = fixed_config(config, user_overrides)
    for nodes in node_counts:
        exp = PolluxExperiment(trace, catalog, config, nodes, history=history)
        print(f"{trace.problem_summary()}\nsimulating {len(trace.jobs)} jobs of "
              f"{', '.join(sorted(trace.applications))} on {nodes} nodes x {config.cluster.gpus_per_node} GPUs")
        metrics, outcomes, timelines = {}, {}, {}
        for name in policies:
            result, m = run_pollux_policy(name, exp)
            metrics[name], outcomes[name] = m, result.outcomes
            timelines[name] = (result.busy_timeline, result.total_gpus)
        print(side_by_side(metrics))
        print("avg JCT s: " + ", ".join(f"{name} {m['avg_jct_h'] * 3600:,.0f}" for name, m in metrics.items())
              + "; wall s: " + ", ".join(f"{name} {m['wall_s']:.2f}" for name, m in metrics.items()))
        target = out / f"nodes{nodes}"
        write_results(target, outcomes, metrics, {"trace": args.trace, "format": "pollux", "nodes": nodes,
                                                  "catalog": args.catalog, "config": config.to_dict()})
        jct_cdf_plot(outcomes, target / "jct_cdf.png")
        utilization_plot(timelines, target / "gpu_utilization.png")
        print(f"results, per-job CSVs and plots in {target}/")
    return 0

"""Compare policies on one trace: build each policy, replay the trace, summarize.

History for the predicting policies (Lucid's fallback model, QSSF) is the jobs of the same
file submitted before the simulated window; the simulated jobs' own durations are never used
except by SJF, the oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.baselines import FifoPolicy, QssfPolicy, SjfPolicy, TiresiasPolicy
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.models import DurationPredictor, HistoryDurationPredictor, PackingClassifier
from lucid_core.sim.engine import SimResult, simulate
from lucid_core.sim.metrics import compute_metrics
from lucid_core.sim.records import TraceRecord
from lucid_core.sim.traces import read_trace
from lucid_core.sim.workloads import WorkloadCatalog

POLICIES = ("fifo", "sjf", "qssf", "tiresias", "lucid")

#: Lucid ablations: name -> config overrides
ABLATIONS = {
    "lucid-nosharing": {"binder.sharing": "off"},
    "lucid-noprofiler": {"profiler.enabled": False},
    "lucid-noestimator": {"orchestrator.estimator": False},
    "lucid-fixedtprof": {"profiler.autoscale": False},
}


@dataclass
class Experiment:
    records: list[TraceRecord]
    history: list[TraceRecord]
    catalog: WorkloadCatalog
    config: LucidConfig
    nodes: int
    seed: int = 0


def history_jobs(history: Sequence[TraceRecord]) -> tuple[list[Job], list[float]]:
    jobs = [Job(job_id=r.job_id, user=r.user or r.vc, vc=r.vc, gpus=r.gpus, submit_time=r.submit_time, name=r.name)
            for r in history]
    return jobs, [r.duration for r in history]


def build_policy(name: str, exp: Experiment, duration_model: DurationPredictor | None = None,
                 packing_model: PackingClassifier | None = None) -> tuple[SchedulingPolicy, LucidConfig]:
    """A fresh policy object (policies keep state) and the config it runs with."""
    config = exp.config
    if name in ABLATIONS:
        config = config.with_overrides(ABLATIONS[name])
    if name == "fifo":
        return FifoPolicy(config), config
    if name == "sjf":
        return SjfPolicy(config, {r.job_id: r.duration for r in exp.records}), config
    if name == "qssf":
        jobs, durations = history_jobs(exp.history)
        return QssfPolicy(config, jobs, durations, random_state=exp.seed), config
    if name == "tiresias":
        return TiresiasPolicy(config), config
    if name == "lucid" or name in ABLATIONS:
        if duration_model is None:
            jobs, durations = history_jobs(exp.history)
            duration_model = HistoryDurationPredictor().fit(jobs, durations)
        return LucidPolicy(config, duration_model=duration_model, packing_model=packing_model), config
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES + tuple(ABLATIONS))}")


def run_policy(name: str, exp: Experiment, *, check_invariants: bool = False, keep_log: bool = False,
               duration_model: DurationPredictor | None = None, packing_model: PackingClassifier | None = None,
               progress: Callable[[int, int], None] | None = None) -> tuple[SimResult, dict]:
    """Simulate one policy. A profiling pool is carved out of the same nodes, so every policy
    gets the same number of GPUs."""
    policy, config = build_policy(name, exp, duration_model, packing_model)
    pool = config.profiler.pool_nodes if getattr(policy, "profiles", False) else 0
    if pool >= exp.nodes:
        raise ValueError(f"profiling pool of {pool} nodes leaves no main cluster out of {exp.nodes}")
    workloads = exp.catalog.assign(exp.records, seed=exp.seed)
    result = simulate(exp.records, policy, config, main_nodes=exp.nodes - pool, profiling_nodes=pool,
                      workloads=workloads, speeds=exp.catalog.colocated_speeds,
                      check_invariants=check_invariants, keep_log=keep_log, progress=progress)
    metrics = compute_metrics(result.outcomes, result.busy_timeline, result.total_gpus)
    metrics["wall_s"] = result.wall_seconds
    metrics["profiling_pool_gpus"] = pool * config.cluster.gpus_per_node
    return result, metrics


def load_experiment(trace: str | Path, fmt: str = "auto", start: date | datetime | str | None = None,
                    end: date | datetime | str | None = None, *, nodes: int, catalog: WorkloadCatalog,
                    config: LucidConfig, seed: int = 0) -> tuple[Experiment, str]:
    """Read the window and, as history, every job of the same file submitted before it."""
    window = read_trace(trace, fmt, start, end)
    history: list[TraceRecord] = []
    if start is not None:
        before = read_trace(trace, fmt, None, start)
        shift = (before.epoch - window.epoch).total_seconds()
        history = [replace(r, submit_time=r.submit_time + shift) for r in before.records]
    if not window.records:
        raise ValueError(f"{trace}: no valid jobs submitted in the window [{start}, {end})")
    return Experiment(window.records, history, catalog, config, nodes, seed), window.problem_summary()

"""Compare policies on one trace: build each policy, replay the trace, summarize.

History for the predicting policies (Lucid's fallback model, QSSF) is the jobs of the same
file submitted before the simulated window; the simulated jobs' own durations are never used
except by SJF, the oracle.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.baselines import FifoPolicy, QssfPolicy, SjfPolicy, TiresiasPolicy
from lucid_core.policy.horus import HorusPolicy, QssfDurations
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.packing_models import PackingModels
from lucid_core.policy.predictors import DurationPredictor, HistoryDurationPredictor, PackingClassifier
from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.engine import SimResult, simulate
from lucid_core.sim.metrics import compute_metrics
from lucid_core.sim.records import TraceRecord, with_preemptible_share
from lucid_core.sim.rounds import RoundCadence
from lucid_core.sim.traces import ParsedTrace, parse_trace

POLICIES = ("fifo", "sjf", "qssf", "horus", "tiresias", "lucid")

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
    vc_nodes: dict[str, int] | None = None  # virtual clusters: each VC's jobs run on its own nodes
    round_interval_s: float = 0.0  # > 0: the policy decides only at rounds this far apart, as live (sim/rounds.py)


def read_vc_config(path: str | Path) -> dict[str, int]:
    """Virtual clusters from a two-column CSV (name, nodes), e.g. Venus' vc_config.csv."""
    out: dict[str, int] = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for line_no, row in enumerate(csv.reader(handle), start=1):
            if len(row) < 2 or not row[0].strip() or (line_no == 1 and not _integer_text(row[1])):
                continue  # a header (its second cell names the column), or no VC on the line
            try:
                nodes = int(row[1])
            except ValueError:
                raise ValueError(f"{path} line {line_no}: nodes {row[1]!r} is not an integer") from None
            if nodes < 1:
                raise ValueError(f"{path} line {line_no}: VC {row[0]!r} needs at least one node, got {nodes}")
            if row[0].strip() in out:  # which of the two sizes is the VC's? The last one won, silently
                raise ValueError(f"{path} line {line_no}: VC {row[0].strip()!r} is listed twice")
            out[row[0].strip()] = nodes
    if not out:
        raise ValueError(f"{path}: no virtual clusters found (expected rows 'name,nodes')")
    return out


def _integer_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def profiling_pool_nodes(config_pool: int, nodes: int) -> int:
    """Profiling pool carved out of a cluster (or VC): one node per 10, at most the configured size.
    Under 10 nodes a whole node is too large a share to set aside (on the 3-node sample it tripled
    Lucid's P99.9 queueing), so such clusters profile jobs online on their own nodes."""
    return min(config_pool, nodes // 10)


def history_jobs(history: Sequence[TraceRecord]) -> tuple[list[Job], list[float]]:
    jobs = [r.to_job() for r in history]
    return jobs, [r.duration for r in history]


def build_policy(name: str, exp: Experiment, duration_model: DurationPredictor | None = None,
                 packing_model: PackingClassifier | None = None, *,
                 packing_models: PackingModels | None = None) -> tuple[SchedulingPolicy, LucidConfig]:
    """A fresh policy object (policies keep state) and the config it runs with."""
    config = exp.config
    if name in ABLATIONS:
        config = config.with_overrides(ABLATIONS[name])
    if name == "fifo":
        return FifoPolicy(config), config
    if name == "sjf":
        return SjfPolicy(config, {r.job_id: r.duration for r in exp.records}), config
    if name in ("qssf", "qssf-backfill"):
        jobs, durations = history_jobs(exp.history)
        return QssfPolicy(config, jobs, durations, random_state=exp.seed, backfill=name == "qssf-backfill"), config
    if name == "horus":
        jobs, durations = history_jobs(exp.history)
        qssf = QssfPolicy(config, jobs, durations, random_state=exp.seed)
        return HorusPolicy(config, QssfDurations(qssf)), config
    if name == "tiresias":
        return TiresiasPolicy(config), config
    if name == "lucid" or name in ABLATIONS:
        if duration_model is None:
            jobs, durations = history_jobs(exp.history)
            duration_model = HistoryDurationPredictor().fit(jobs, durations)
        # classes from the tree trained on the catalog the jobs run on: what that GPU, shared its way, measured
        if packing_models is None and packing_model is None:
            packing_model = exp.catalog.packing_tree()
        return LucidPolicy(config, duration_model=duration_model, packing_model=packing_model,
                           packing_models=packing_models), config
    raise ValueError(f"unknown policy {name!r}; choose from "
                     f"{', '.join((*POLICIES, 'qssf-backfill', *ABLATIONS))}")


def run_policy(name: str, exp: Experiment, *, check_invariants: bool = False, keep_log: bool = False,
               duration_model: DurationPredictor | None = None, packing_model: PackingClassifier | None = None,
               progress: Callable[[int, int], None] | None = None) -> tuple[SimResult, dict]:
    """Simulate one policy. A profiling pool is carved out of the same nodes, so every policy
    gets the same number of GPUs. With virtual clusters, each VC is its own cluster."""
    if exp.vc_nodes:
        return _run_per_vc(name, exp, check_invariants=check_invariants, keep_log=keep_log,
                           duration_model=duration_model, packing_model=packing_model, progress=progress)
    policy, config = build_policy(name, exp, duration_model, packing_model)
    pool = profiling_pool_nodes(config.profiler.pool_nodes, exp.nodes) if policy.profiles else 0
    workloads = exp.catalog.assign(exp.records, seed=exp.seed)
    result = simulate(exp.records, policy, config, main_nodes=exp.nodes - pool, profiling_nodes=pool,
                      workloads=workloads, speeds=exp.catalog.colocated_speeds,
                      check_invariants=check_invariants, keep_log=keep_log, progress=progress,
                      rounds=RoundCadence.every(exp.round_interval_s) if exp.round_interval_s > 0 else None)
    metrics = compute_metrics(result.outcomes, result.busy_timeline, result.total_gpus)
    metrics["wall_s"] = result.wall_seconds
    metrics["profiling_pool_gpus"] = pool * config.cluster.gpus_per_node
    metrics.update(checkpoint_metrics(policy, exp.records))
    return result, metrics


def checkpoint_metrics(policy: object, records: Sequence[TraceRecord]) -> dict[str, float]:
    """What a run assumed of checkpoints: the policy preempts every job regardless (1.0) or only the jobs
    marked preemptible, and how many of those there were."""
    return {"assumes_checkpoints": float(bool(getattr(policy, "assumes_checkpoints", False))),
            "preemptible_jobs": float(sum(1 for r in records if r.preemptible))}


def _merge_timelines(timelines: Sequence[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Sum of step functions given as change points."""
    deltas: list[tuple[float, int]] = []
    for timeline in timelines:
        previous = 0
        for t, busy in timeline:
            deltas.append((t, busy - previous))
            previous = busy
    deltas.sort()
    merged: list[tuple[float, int]] = []
    level = 0
    for t, delta in deltas:
        level += delta
        if merged and merged[-1][0] == t:
            merged[-1] = (t, level)
        else:
            merged.append((t, level))
    return merged


def _run_per_vc(name: str, exp: Experiment, progress: Callable[[int, int], None] | None = None,
                **kwargs: Any) -> tuple[SimResult, dict]:
    """Each VC on its own nodes, one after another, with the same models; progress counts over all VCs."""
    assert exp.vc_nodes is not None
    unknown = sorted({r.vc for r in exp.records} - set(exp.vc_nodes))
    if unknown:
        raise ValueError(f"jobs of virtual clusters missing from the VC config: {unknown[:5]}")
    results, pool_gpus, assumes, idle_gpus = [], 0, 0.0, 0
    for vc, nodes in sorted(exp.vc_nodes.items()):
        records = [r for r in exp.records if r.vc == vc]
        if not records:  # nothing to simulate, but its GPUs are the cluster's: they count, idle, in utilization
            idle_gpus += nodes * exp.config.cluster.gpus_per_node
            continue
        sub = replace(exp, records=records, nodes=nodes, vc_nodes=None)
        done_before = sum(len(r.outcomes) for r in results)
        overall = (None if progress is None else
                   lambda done, _total, before=done_before: progress(before + done, len(exp.records)))
        try:
            result, metrics = run_policy(name, sub, progress=overall, **kwargs)
        except ValueError as error:  # e.g. a job wider than its VC: say which VC's cluster it is
            raise ValueError(f"VC {vc} ({nodes} nodes): {error}") from None
        results.append(result)
        pool_gpus += int(metrics["profiling_pool_gpus"])
        assumes = metrics["assumes_checkpoints"]
    outcomes = [o for r in results for o in r.outcomes]
    counts: dict[str, int] = {}
    for r in results:
        for key, value in r.decision_counts.items():
            counts[key] = counts.get(key, 0) + value
    merged = SimResult(name, outcomes, _merge_timelines([r.busy_timeline for r in results]),
                       sum(r.total_gpus for r in results) + idle_gpus, counts, sum(r.wall_seconds for r in results),
                       sum(r.events for r in results), [e for r in results for e in r.decision_log])
    metrics = compute_metrics(merged.outcomes, merged.busy_timeline, merged.total_gpus)
    metrics["wall_s"] = merged.wall_seconds
    metrics["profiling_pool_gpus"] = pool_gpus
    metrics["assumes_checkpoints"] = assumes
    metrics["preemptible_jobs"] = float(sum(1 for r in exp.records if r.preemptible))
    return merged, metrics


def load_experiment(trace: str | Path | ParsedTrace, fmt: str = "auto", start: date | datetime | str | None = None,
                    end: date | datetime | str | None = None, *, nodes: int, catalog: WorkloadCatalog,
                    config: LucidConfig, seed: int = 0, vc_nodes: dict[str, int] | None = None,
                    preemptible_share: float | None = None) -> tuple[Experiment, str]:
    """Read the window and, as history, every job of the same file submitted before it (the file is parsed
    once; pass a `ParsedTrace` to reuse one). `preemptible_share`: mark a seeded share of the window's jobs
    preemptible and the rest not, whatever the trace says (None: each job as the trace says, no when silent)."""
    parsed = trace if isinstance(trace, ParsedTrace) else parse_trace(trace, fmt)
    window = parsed.window(start, end)
    history: list[TraceRecord] = []
    if start is not None:
        before = parsed.window(None, start)
        shift = (before.epoch - window.epoch).total_seconds()
        history = [replace(r, submit_time=r.submit_time + shift) for r in before.records]
    if not window.records:
        raise ValueError(f"{parsed.path}: no valid jobs submitted in the window [{start}, {end})")
    records = window.records
    if preemptible_share is not None:
        records = with_preemptible_share(records, preemptible_share, seed)
    if vc_nodes:
        nodes = sum(vc_nodes.values())
    return Experiment(records, history, catalog, config, nodes, seed, vc_nodes), window.problem_summary()

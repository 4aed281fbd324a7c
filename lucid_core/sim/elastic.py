"""Event-driven simulator for elastic jobs: GPUs and batch size may change while a job runs.

Jobs are measured applications (`elastic_apps`) with work in progress units. A policy re-decides
every `interval` seconds (the Pollux period, 60 s) which GPUs each job holds; between decisions
nothing changes but epoch boundaries (where the job's gradient statistics, so its goodput, and an
elastic job's batch size change) and job ends, so time jumps from event to event and a job's end
is exact, not rounded to a period. Jobs submitted between two decisions wait for the next one, as
in the Pollux system and its simulator. Every change of a job's GPUs (its first start included)
costs it `restart_delay` seconds without progress (checkpoint, restart, re-load), counted as
attained service.

The policy sees `ElasticJob`s and the `ElasticCluster` and answers with GPUs per node for each job
(`ElasticPolicy`); `pack` places a GPU count on nodes so policies share one placement rule.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from lucid_core.policy.elastic_view import (
    Counts,
    ElasticCluster,
    ElasticJob,
    ElasticJobSpec,
    ElasticPolicy,
    compact_placement,
    pack,
)
from lucid_core.policy.goodput import Application
from lucid_core.sim.records import JobOutcome


@dataclass
class ElasticResult:
    policy: str
    outcomes: list[JobOutcome]
    busy_timeline: list[tuple[float, int]]
    total_gpus: int
    wall_seconds: float
    rounds: int
    restarts: int
    decision_counts: dict[str, int] = field(default_factory=dict)


def fixed_run_seconds(app: Application, placement: tuple[int, ...], batch_size: int, restart_delay: float) -> float:
    """Exclusive run time of a job that keeps `placement` and `batch_size` from start to end."""
    atomic, accum = app.fixed_layout(sum(placement), batch_size)
    seconds = restart_delay
    done = 0.0
    for epoch in range(app.max_epochs):
        end = app.epoch_end(epoch)
        seconds += (end - done) / app.goodput(placement, atomic, accum, epoch)
        done = end
    return seconds


def _advance(job: ElasticJob, start: float, stop: float, layout: Callable[[ElasticJob], tuple[int, int]]) -> None:
    """Run `job` from `start` to `stop` on its GPUs: restart delay, then progress epoch by epoch."""
    if job.counts is None:
        job.waited_s += stop - max(start, job.spec.submit_time)
        return
    replicas = job.replicas
    now = start
    delay = min(job.restart_left, stop - now)
    job.restart_left -= delay
    job.attained_gpu_s += delay * replicas
    now += delay
    app = job.app
    while now < stop and job.end_time is None:
        rate = app.goodput(job.placement, job.atomic_bsz, job.accum_steps, job.epoch)
        target = app.epoch_end(job.epoch)
        if job.progress + rate * (stop - now) < target:
            job.progress += rate * (stop - now)
            job.attained_gpu_s += (stop - now) * replicas
            now = stop
            break
        spent = (target - job.progress) / rate
        job.attained_gpu_s += spent * replicas
        now += spent
        job.progress = target
        job.epoch += 1
        if job.epoch >= app.max_epochs:
            job.end_time = now
        else:
            job.atomic_bsz, job.accum_steps = layout(job)


def simulate_elastic(specs: Sequence[ElasticJobSpec], apps: Mapping[str, Application], policy: ElasticPolicy, *,
                     nodes: int, gpus_per_node: int, interval: float = 60.0, restart_delay: float = 30.0,
                     progress: Callable[[int, int], None] | None = None) -> ElasticResult:
    """Replay `specs` under an elastic `policy` on `nodes` x `gpus_per_node` GPUs."""
    started = wallclock.perf_counter()
    if interval <= 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval}")
    cluster = ElasticCluster(nodes, gpus_per_node)
    jobs = [ElasticJob(spec, apps[spec.application]) for spec in sorted(specs, key=lambda s: s.submit_time)]
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError("duplicate job names in the workload")

    def relayout(job: ElasticJob) -> tuple[int, int]:
        return policy.layout(job, job.placement)

    pending = list(jobs)  # not yet submitted, in submission order
    active: list[ElasticJob] = []
    finished: list[ElasticJob] = []
    timeline: list[tuple[float, int]] = [(jobs[0].spec.submit_time if jobs else 0.0, 0)]
    now = math.ceil(jobs[0].spec.submit_time / interval) * interval if jobs else 0.0
    last = now
    rounds = restarts = 0
    while pending or active:
        ended: list[ElasticJob] = []
        for job in active:
            _advance(job, last, now, relayout)
            if job.end_time is not None:
                ended.append(job)
        if ended:
            busy = sum(j.replicas for j in active)
            for job in sorted(ended, key=lambda j: j.end_time or 0.0):
                busy -= job.replicas
                timeline.append((job.end_time or now, busy))
            finished.extend(ended)
            active = [j for j in active if j.end_time is None]
            if progress is not None:
                progress(len(finished), len(jobs))
        while pending and pending[0].spec.submit_time <= now:
            job = pending.pop(0)
            job.waited_s += now - job.spec.submit_time  # waited for the period's decision
            active.append(job)
        if active:
            wanted = policy.allocate(now, active, cluster)
            rounds += 1
            restarts += _apply(active, wanted, cluster, now, restart_delay, policy)
            busy = sum(j.replicas for j in active)
            if timeline[-1][1] != busy:
                timeline.append((now, busy))
            last, now = now, now + interval
        else:
            if pending:
                now = math.ceil(pending[0].spec.submit_time / interval) * interval
            last = now
    outcomes = [_outcome(j, cluster, restart_delay) for j in finished]
    return ElasticResult(policy.name, outcomes, timeline, cluster.total_gpus, wallclock.perf_counter() - started,
                         rounds, restarts, {"Reallocate": restarts})


def _apply(active: list[ElasticJob], wanted: Mapping[str, Counts], cluster: ElasticCluster, now: float,
           restart_delay: float, policy: ElasticPolicy) -> int:
    """Carry out a decision: check it fits, restart every job whose GPUs changed. Returns restarts."""
    used = [0] * cluster.nodes
    for job in active:
        counts = wanted.get(job.name)
        if counts is None:
            continue
        if len(counts) != cluster.nodes or any(c < 0 for c in counts):
            raise ValueError(f"policy {policy.name} gave {job.name} an allocation of the wrong shape: {counts}")
        for i, c in enumerate(counts):
            used[i] += c
    if any(u > cluster.gpus_per_node for u in used):
        raise ValueError(f"policy {policy.name} over-allocated a node: {used}")
    changed = 0
    for job in active:
        counts = wanted.get(job.name)
        if counts is not None and sum(counts) == 0:
            counts = None
        if counts == job.counts:
            continue
        if counts is None:
            job.counts = None
            job.preemptions += 1
            job.restart_left = 0.0
            continue
        job.counts = tuple(counts)
        job.restart_left = restart_delay
        job.restarts = 0 if job.restarts is None else job.restarts + 1
        job.max_replicas_seen = max(job.max_replicas_seen, job.replicas)
        if job.start_time is None:
            job.start_time = now
        job.atomic_bsz, job.accum_steps = policy.layout(job, job.placement)
        changed += 1
    return changed


def _outcome(job: ElasticJob, cluster: ElasticCluster, restart_delay: float) -> JobOutcome:
    assert job.end_time is not None
    spec = job.spec
    duration = fixed_run_seconds(job.app, compact_placement(spec.replicas, cluster.gpus_per_node),
                                 spec.batch_size, restart_delay)
    return JobOutcome(job_id=spec.name, vc="default", gpus=spec.replicas, submit_time=spec.submit_time,
                      duration=duration, start_time=job.start_time if job.start_time is not None else job.end_time,
                      end_time=job.end_time, queue_delay=job.waited_s, preemptions=job.preemptions)


class FixedGangPolicy:
    """Fixed-size jobs in arrival order: each gets the GPUs and batch size its row asks for, compact,
    when they fit, and keeps them to the end (no backfilling past a job that does not fit)."""

    name = "fifo"

    def allocate(self, now: float, jobs: Sequence[ElasticJob], cluster: ElasticCluster) -> dict[str, Counts]:
        free = [cluster.gpus_per_node] * cluster.nodes
        distributed = [False] * cluster.nodes
        out: dict[str, Counts] = {}
        for job in jobs:
            if job.counts is not None:
                out[job.name] = job.counts
                for i, c in enumerate(job.counts):
                    free[i] -= c
                if len(job.placement) > 1:
                    for i, c in enumerate(job.counts):
                        distributed[i] = distributed[i] or c > 0
        for job in jobs:
            if job.counts is None:
                counts = pack(job.spec.replicas, free, distributed, cluster.gpus_per_node)
                if counts is None:
                    break
                out[job.name] = counts
        return out

    def layout(self, job: ElasticJob, placement: tuple[int, ...]) -> tuple[int, int]:
        return job.app.fixed_layout(sum(placement), job.spec.batch_size)

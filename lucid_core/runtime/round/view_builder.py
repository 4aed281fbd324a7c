"""Rebuild the policy's ClusterView (and a policy with its learned state) from the store.

The live round is a fresh process each time, so everything the policy knows comes from rows:
hosts become pool nodes, active runs become allocations, waiting jobs re-enter their queue
through the policy's own hooks, and models are refitted from the store's history. GPUs that
must not get new work (unreachable or draining hosts, runs still being stopped) are held by
placeholder jobs whose ids start with HOLD_PREFIX.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lucid_core.config import LucidConfig
from lucid_core.domain import (
    ACTIVE_RUN_STATES,
    GpuRef,
    Job,
    JobState,
    Pool,
)
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.view import ClusterView, saved_number
from lucid_core.runtime.round.live_models import PolicyFactory, ReplayForecaster, fallback_source, host_sharing
from lucid_core.runtime.round.snapshot import Snapshot, job_of, profile_of_row
from lucid_core.runtime.store.schema import RunRow
from lucid_core.units import duration_words, one_line

HOLD_PREFIX = "~hold:"
UNREACHABLE = "unreachable"  # how `BuiltView.closed` starts the reason of a host that does not answer


def requeue(policy: SchedulingPolicy, view: ClusterView, job: Job) -> None:
    """Put an unprofiled job that already had its chance at profiling back in the main queue."""
    policy.on_requeue(view, job)


@dataclass
class BuiltView:
    view: ClusterView
    policy: SchedulingPolicy
    available_hosts: set[str]
    # jobs left out of the view this round (a stop is still pending for them)
    frozen: set[str]
    # the models and history this round classifies and predicts with (None: the policy does not say)
    prediction_key: str | None = None
    # job id -> why its stored row could not be read (the job is left out of the round, its GPUs held)
    unreadable: dict[str, str] = field(default_factory=dict)
    # host -> why it takes no new work this round (unreachable, draining, cooling down)
    closed: dict[str, str] = field(default_factory=dict)
    # hosts drained to be removed (`lucid hosts drain --remove`): gone once their runs end
    leaving: set[str] = field(default_factory=set)

    def never_ending(self) -> list[str]:
        """Allocations a what-if must never end: the placeholders, and every run on an unreachable host
        (whether and when it ends is not known until its host answers)."""
        lost = {host for host, why in self.closed.items() if why.startswith(UNREACHABLE)}
        return [job_id for job_id, alloc in self.view.allocations.items()
                if job_id.startswith(HOLD_PREFIX) or any(ref.host in lost for ref in alloc.gpus)]


def _gpu_memory(host: Any, configured: float) -> float:
    """A host's stored GPU memory in MB; where it is not a positive number (text a hand edit left on SQLite, NaN),
    the configured per-GPU memory (`cluster.gpu_memory_mb`): the text failed every round."""
    memory = host.gpu_memory_mb
    return float(memory) if saved_number(memory) and memory > 0 else configured


def prediction_key(policy: SchedulingPolicy, snapshot: Snapshot) -> str | None:
    """Names the models behind a round's classes and predictions. A queued job stored with the same key
    keeps them (nothing re-predicted), as a job in the simulator keeps the prediction it joined the queue
    with: a promotion changes the key, and so does the history fallback's history doubling (a job predicted
    from 3 finished jobs is predicted again from 6, not again on every job that ends, which in a busy fleet
    is every round). The history read stops at HISTORY_LIMIT, so past 32,768 finished jobs the fallback's key
    stays as it is: its window slides, and queued jobs keep what they were predicted, as in the simulator.
    None when the policy does not name its duration model (every round predicts afresh)."""
    sources = policy.describe().model_sources
    if "duration" not in sources:
        return None
    duration = sources["duration"]
    finished = len(snapshot.history or ())  # read by the fallback, the only model that names it
    if duration == fallback_source(finished):
        duration = f"history fallback of {1 << (finished.bit_length() - 1) if finished else 0}+ finished job(s)"
    return f"duration: {duration}; packing: {sources.get('packing', 'rules')}"[:300]


def fleet_node_size(gpu_counts: Iterable[int]) -> int | None:
    """The policy's node size on a live fleet: its largest host's GPU count (None without hosts).

    `cluster.gpus_per_node` describes a simulated cluster; live, every host holds what it really has,
    and a job wider than one host takes whole hosts of that size (the paper's compact placement)."""
    return max((n for n in gpu_counts if n > 0), default=None)


def fleet_config(config: LucidConfig, gpu_counts: Iterable[int]) -> LucidConfig:
    """`config` with the fleet's node size (see `fleet_node_size`)."""
    size = fleet_node_size(gpu_counts)
    if size is None or size == config.cluster.gpus_per_node:
        return config
    return config.with_overrides({"cluster.gpus_per_node": size})


def run_problem(run: RunRow, host_gpus: int | None) -> str | None:
    """Why an active run's stored row cannot be rebuilt as an allocation (None when it can). Another
    controller or a hand edit may have written it: a bad one makes its own job sit out, not the round fail."""
    if run.state not in ACTIVE_RUN_STATES:
        return f"state {run.state!r} is none this version knows"
    if run.pool not in (Pool.MAIN.value, Pool.PROFILING.value):
        return f"pool {run.pool!r} is neither main nor profiling"
    indices = run.gpu_indices
    if not isinstance(indices, list) or not indices or any(type(i) is not int for i in indices):
        return f"GPU indices {str(indices)[:60]!r} are not a list of integers"
    if host_gpus is not None and any(not 0 <= i < host_gpus for i in indices):
        return f"GPU indices {indices[:8]} are not all among the host's {host_gpus} GPUs"
    if len(set(indices)) != len(indices):
        return f"GPU indices {indices[:8]} repeat"
    if not saved_number(run.planned_at) or (run.started_at is not None and not saved_number(run.started_at)):
        return "its planned or start time is not a finite number"
    if run.profiling_until is not None and not saved_number(run.profiling_until):
        return "its profiling deadline is not a finite number"
    if type(run.node_rank) is not int:
        return f"node rank {run.node_rank!r} is not an integer"
    return None


def held_indices(run: RunRow, host_gpus: int) -> list[int]:
    """The GPUs a frozen run holds: its own where they read as GPUs of the host, else all of the host's."""
    indices = run.gpu_indices
    if isinstance(indices, list) and indices and all(type(i) is int and 0 <= i < host_gpus for i in indices):
        return list(indices)
    return list(range(host_gpus))


def build_view(snapshot: Snapshot, config: LucidConfig, now: float, policy_factory: PolicyFactory) -> BuiltView:
    config = fleet_config(config, snapshot.gpu_counts.values())
    policy = policy_factory(config, snapshot)
    jobs: dict[str, Job] = {}
    unreadable: dict[str, str] = {}  # job id -> why its row could not be read; the job sits this round out
    for job_id, row in snapshot.jobs.items():
        try:
            jobs[job_id] = job_of(row)
        except (ValueError, TypeError) as exc:
            unreadable[job_id] = f"job {job_id}: its stored row cannot be read ({exc}); left out of this round"
    profiles = snapshot.profiles
    view = ClusterView(config, now=now, profile_of=lambda job_id: (
        profile_of_row(profiles[job_id], jobs[job_id].amp) if job_id in profiles and job_id in jobs else None))
    # a node that runs a main-pool run is not the profiling pool's, whatever the saved state says
    borrowed = view.restore_policy_state(snapshot.state) - {
        run.host for run in [*snapshot.runs, *snapshot.unknown_runs] if run.pool == Pool.MAIN.value}
    available: set[str] = set()
    closed: dict[str, str] = {}
    for host in snapshot.hosts:
        count = snapshot.gpu_counts.get(host.name, 0)
        if count == 0:
            continue
        pool = Pool.PROFILING if host.pool == Pool.PROFILING.value or host.name in borrowed else Pool.MAIN
        # main nodes carry their VC so jobs are placed only on their own VC's hosts
        view.pool(pool).add_node(host.name, count, _gpu_memory(host, config.cluster.gpu_memory_mb),
                                 borrowed=host.name in borrowed, vc=host.vc if pool is Pool.MAIN else "")
        view.host_sharing[host.name] = host_sharing(host)
        if host.name in borrowed:
            view.borrowed_nodes.append(host.name)
        cooling = saved_number(host.cooldown_until) and host.cooldown_until > now
        if host.reachable and not host.draining and not cooling:
            available.add(host.name)
        else:
            view.closed_nodes.add(host.name)
            closed[host.name] = closed_reason(host, now)

    runs_by_job: dict[str, list[RunRow]] = {}
    for run in [*snapshot.runs, *snapshot.unknown_runs]:
        runs_by_job.setdefault(run.job_id, []).append(run)
        problem = run_problem(run, snapshot.gpu_counts.get(run.host))
        if problem is not None and run.job_id not in unreadable:
            unreadable[run.job_id] = (f"job {run.job_id}: its run {run.run_id} on host {run.host} cannot be read "
                                      f"({problem}); the job sits this round out and the run's GPUs are held")
    placed_on = {name for pool in (view.main, view.profiling) for name in pool.nodes}
    # frozen: a stop is pending, or a run sits on a host the inventory no longer has (the round repairs it)
    frozen = {j for j, runs in runs_by_job.items() if any(r.stop_reason or r.host not in placed_on for r in runs)}
    # a run whose job this round cannot see (a row it cannot read, or a state none of the active ones) keeps
    # its GPUs all the same: nothing is placed on them while it may be running
    frozen |= unreadable.keys() | {j for j in runs_by_job if j not in jobs}

    held: dict[tuple[str, str], list[int]] = {}  # (pool, host) -> GPU indices held
    # running jobs become allocations: lone runs and pair founders first, then partners
    ordered = sorted(runs_by_job.items(),
                     key=lambda kv: min(r.planned_at if saved_number(r.planned_at) else math.inf for r in kv[1]))
    started: set[str] = set()
    pending_partners = []
    for job_id, runs in ordered:
        if job_id in frozen:
            for run in runs:
                held.setdefault((run.pool, run.host), []).extend(
                    held_indices(run, snapshot.gpu_counts.get(run.host, 0)))
            continue
        partner = runs[0].partner
        if partner is not None and partner in started:
            pending_partners.append((job_id, runs))
            continue
        _start(view, jobs[job_id], runs, None)
        started.add(job_id)
    for job_id, runs in pending_partners:
        partner = runs[0].partner
        _start(view, jobs[job_id], runs, partner if partner in view.allocations else None)

    # free GPUs of hosts that take no new work are held, so the policy places nothing there
    for pool_name, pool in (("main", view.main), ("profiling", view.profiling)):
        for name, node in pool.nodes.items():
            if name not in available:
                free = [i for i, occupants in enumerate(node.occupants) if not occupants]
                if free:
                    held.setdefault((pool_name, name), []).extend(free)
    for (pool_name, host), indices in held.items():
        pool = Pool(pool_name) if pool_name in {"main", "profiling"} else Pool.MAIN
        if host in borrowed:
            pool = Pool.PROFILING
        node = view.pool(pool).nodes.get(host)
        if node is None:
            continue
        free = sorted({i for i in indices if i < node.gpus and not node.occupants[i]})
        if not free:
            continue
        hold_id = f"{HOLD_PREFIX}{pool.value}:{host}"
        view.add_job(Job(job_id=hold_id, user="~", vc="~", gpus=len(free), submit_time=now, no_share=True))
        view.start(hold_id, pool, tuple(GpuRef(host, i) for i in free))

    # observed speeds go to the binder, whose rule judges them (pairs only, each split once)
    view.speed_reports.extend(snapshot.speed_reports)

    # waiting jobs re-enter their queues through the policy's own hooks; a queued job classified and
    # predicted by an earlier round with the same models keeps what it was given
    key = prediction_key(policy, snapshot)
    restored: list[Job] = []  # given back in one call: no other hook reads the main queue they go to
    for job_id, job in jobs.items():
        if job_id in view.jobs or job_id in frozen:
            continue
        view.add_job(job)
        if job.state is JobState.SUBMITTED:
            policy.on_submit(view, job)
        elif job.state is JobState.QUEUED:
            if key is not None and job.profile is not None and snapshot.jobs[job_id].predicted_by == key:
                restored.append(job)
            elif job.profile is not None:
                policy.on_profiled(view, job, job.profile)
            else:
                requeue(policy, view, job)
        else:  # PROFILING/RUNNING without an active run: its run ended unnoticed; let it wait again
            job.state = JobState.QUEUED if job.profile is not None or job.known_min_duration else JobState.SUBMITTED
            if job.state is JobState.SUBMITTED:
                policy.on_submit(view, job)
            elif job.profile is not None:
                policy.on_profiled(view, job, job.profile)
            else:
                requeue(policy, view, job)
    policy.on_restored(view, restored)
    forecaster = policy.describe().forecaster
    if isinstance(forecaster, ReplayForecaster):
        forecaster.muted = False
    leaving = {h.name for h in snapshot.hosts if h.remove_when_empty and snapshot.gpu_counts.get(h.name)}
    return BuiltView(view, policy, available, frozen, key, unreadable, closed, leaving)


def closed_reason(host: Any, now: float) -> str:
    """Why a host takes no new work, in words (its last error, clipped, for one that does not answer)."""
    if not host.reachable:
        error = one_line(host.last_error)
        return f"{UNREACHABLE}{f' ({error})' if error else ''}"
    if host.draining:
        return "being removed (drained with --remove)" if host.remove_when_empty else "draining"
    return f"cooling down for {duration_words(max(0.0, host.cooldown_until - now))} after a failed launch"


def _start(view: ClusterView, job: Job, runs: Sequence[RunRow], partner: str | None) -> None:
    """Re-create a running job's allocation as it was (start time, window, partner)."""
    first = runs[0]
    pool = Pool(first.pool)
    gpus = tuple(GpuRef(r.host, i) for r in sorted(runs, key=lambda r: r.node_rank) for i in r.gpu_indices)
    view.add_job(job)
    started = first.started_at if first.started_at is not None else first.planned_at
    until = first.profiling_until
    view.start(job.job_id, pool, gpus, partner=partner, profiling_until=until, at=started)
    if job.profile is not None and pool is Pool.MAIN:
        view.set_profile_mem(job.job_id, job.profile.gpu_mem_mb)
        view.refresh_share_candidate(job.job_id)

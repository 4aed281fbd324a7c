"""Prometheus metrics of the live scheduler, read from the store on each scrape.

Served at `GET /metrics` of the HTTP API (so at `/lucid/api/metrics` behind Airflow's auth) and
printed by `lucid metrics` (for node_exporter's textfile collector). Each scrape builds a fresh
registry from the store, so any number of API processes agree and nothing is kept in memory.
The ones to alert on: `lucid_oldest_wait_seconds` (a starving queue), `lucid_last_round_age_seconds`
(rounds stopped), `lucid_hosts{state="unreachable"}`; `lucid_shared_speed_min` shows how much the
worst-hit sharing job of a VC is slowed.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import func, select

from lucid_core.domain import ACTIVE_RUN_STATES, JobState, RunState
from lucid_core.policy.view import saved_float, saved_indices
from lucid_core.runtime.store.schema import GpuRow, HostRow, JobRow, ModelVersionRow, RoundRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.queries import shared_speeds

__all__ = ["CONTENT_TYPE_LATEST", "build_registry", "render"]

_WAITING = (JobState.SUBMITTED.value, JobState.PROFILING.value, JobState.QUEUED.value)


def build_registry(store: Store, now: float | None = None) -> CollectorRegistry:
    """One registry holding the store's current figures."""
    now = store.now() if now is None else now
    registry = CollectorRegistry()
    gauge = partial(Gauge, registry=registry)

    with store.session() as s:
        by_state = dict(s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
        waiting = s.execute(select(JobRow.vc, JobRow.gpus, JobRow.submit_time)
                            .where(JobRow.state.in_(_WAITING))).all()
        hosts = s.scalars(select(HostRow)).all()
        gpus = s.execute(select(GpuRow.host, GpuRow.index)).all()
        runs = s.execute(select(RunRow.host, RunRow.gpu_indices, RunRow.state)
                         .where(RunRow.state.in_(ACTIVE_RUN_STATES))).all()
        last_round = s.scalars(select(RoundRow).where(RoundRow.ended_at.is_not(None))
                               .order_by(RoundRow.id.desc()).limit(1)).first()
        rounds = s.scalar(select(func.count()).select_from(RoundRow)) or 0
        failed_rounds = s.scalar(select(func.count()).select_from(RoundRow).where(RoundRow.error.is_not(None))) or 0
        models = s.execute(select(ModelVersionRow.kind, ModelVersionRow.version)
                           .where(ModelVersionRow.active.is_(True))).all()
        shared = list(shared_speeds(s).values())

    jobs = gauge("lucid_jobs", "Jobs in the store by state (terminal states count every job ever ended)",
                 ["state"])
    for state in JobState:
        jobs.labels(state.value).set(by_state.get(state.value, 0))

    queued = gauge("lucid_queue_jobs", "Jobs waiting (submitted, profiling or queued) per VC", ["vc"])
    queued_gpus = gauge("lucid_queue_gpus", "GPUs asked for by waiting jobs per VC", ["vc"])
    oldest = gauge("lucid_oldest_wait_seconds", "Longest time a waiting job of the VC has waited", ["vc"])
    by_vc: dict[str, list[Any]] = {}
    for row in waiting:
        by_vc.setdefault(row.vc, []).append(row)
    for vc, mine in by_vc.items():
        queued.labels(vc).set(len(mine))
        queued_gpus.labels(vc).set(sum(g for row in mine if (g := saved_float(row.gpus)) is not None))
        submitted = [t for row in mine if (t := saved_float(row.submit_time)) is not None]  # text: a hand edit
        if submitted:
            oldest.labels(vc).set(max(0.0, now - min(submitted)))

    host_pool = {h.name: (h.pool, h.vc) for h in hosts}
    jobs_on_gpu: Counter[tuple[str, int]] = Counter()
    running_on_gpu: Counter[tuple[str, int]] = Counter()
    for host, indices, state in runs:
        for index in saved_indices(indices):
            jobs_on_gpu[(host, index)] += 1
            running_on_gpu[(host, index)] += state == RunState.RUNNING
    gpu_state = gauge("lucid_gpus", "GPUs by pool, VC and occupancy (idle; busy: held by a job, or planned for a "
                      "second that has not started; shared: two jobs running on it)", ["pool", "vc", "state"])
    counts: Counter[tuple[str, str, str]] = Counter()
    for host, index in gpus:
        pool, vc = host_pool.get(host, ("", ""))
        n = jobs_on_gpu[(host, index)]
        two_running = running_on_gpu[(host, index)] > 1
        counts[(pool, vc, "idle" if n == 0 else "shared" if two_running else "busy")] += 1
    for pool, vc in set(host_pool.values()):
        for state in ("idle", "busy", "shared"):
            gpu_state.labels(pool, vc, state).set(counts[(pool, vc, state)])

    # per VC, not per job: job ids as labels would grow the series without bound
    shared_jobs = gauge("lucid_shared_jobs", "Running jobs sharing their GPUs with a running partner, per VC", ["vc"])
    lowest = gauge("lucid_shared_speed_min", "Lowest measured speed (relative to running alone) among the VC's "
                   "sharing jobs; absent until one has been measured", ["vc"])
    for vc in {x.vc for x in shared} | {h.vc for h in hosts}:  # 0, not missing, for a VC with none
        mine = [x for x in shared if x.vc == vc]
        shared_jobs.labels(vc).set(len(mine))
        measured = [x.speed for x in mine if x.speed is not None]
        if measured:
            lowest.labels(vc).set(min(measured))

    host_state = gauge("lucid_hosts", "GPU hosts by state", ["state"])
    host_state.labels("reachable").set(sum(1 for h in hosts if h.reachable))
    host_state.labels("unreachable").set(sum(1 for h in hosts if not h.reachable))
    host_state.labels("draining").set(sum(1 for h in hosts if h.draining))
    host_state.labels("cooling_down").set(sum(1 for h in hosts if (until := saved_float(h.cooldown_until)) is not None
                                                  and until > now))

    gauge("lucid_rounds", "Scheduling rounds recorded in the store").set(rounds)
    gauge("lucid_rounds_failed", "Scheduling rounds that recorded an error").set(failed_rounds)
    if last_round is not None and last_round.ended_at is not None:
        gauge("lucid_last_round_age_seconds", "Seconds since the last finished scheduling round").set(
            max(0.0, now - last_round.ended_at))
        gauge("lucid_last_round_seconds", "Wall time of the last finished round").set(
            last_round.ended_at - last_round.started_at)
        if last_round.decide_ms is not None:
            gauge("lucid_last_round_decide_seconds", "Policy decision time of the last round").set(
                last_round.decide_ms / 1000)
        gauge("lucid_last_round_decisions", "Decisions made by the last round").set(last_round.decisions)
    active = gauge("lucid_model_active", "1 for the promoted version of each model", ["kind", "version"])
    for kind, version in models:
        active.labels(kind, version).set(1)
    return registry


def render(store: Store, now: float | None = None) -> bytes:
    """The Prometheus text exposition of `build_registry`."""
    return generate_latest(build_registry(store, now))

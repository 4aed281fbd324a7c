"""Rebuild the policy's ClusterView (and a policy with its learned state) from the store.

The live round is a fresh process each time, so everything the policy knows comes from rows:
hosts become pool nodes, active runs become allocations, waiting jobs re-enter their queue
through the policy's own hooks, and models are refitted from the store's history. GPUs that
must not get new work (unreachable or draining hosts, runs still being stopped) are held by
placeholder jobs whose ids start with HOLD_PREFIX.
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from lucid_core.config import LucidConfig
from lucid_core.domain import (
    ACTIVE_RUN_STATES,
    TERMINAL_STATES,
    GpuRef,
    Job,
    JobState,
    Pool,
    Profile,
    ShareClass,
)
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.predictors import Forecast, HistoryDurationPredictor, RecentSlotsForecaster
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.schema import GpuRow, HostRow, JobRow, ProfileRow, RunRow
from lucid_core.runtime.store import Store

HOLD_PREFIX = "~hold:"
ACTIVE_RUNS = ACTIVE_RUN_STATES
HISTORY_LIMIT = 50000
#: the job columns a round reads: all but what only a launch (from its own row) or a reader needs
JOB_COLUMNS = tuple(c for c in JobRow.__table__.columns
                    if c.name not in ("command", "env", "workload", "idempotency_key", "exit_code", "end_reason"))
#: a job row as a round reads it: a plain tuple with JobRow's column names as fields (a SQLAlchemy
#: Row's attribute access costs several times a tuple's, and a round reads tens of thousands)
JobRecord = namedtuple("JobRecord", [c.name for c in JOB_COLUMNS])  # type: ignore[misc]
#: a finished job as the history fallback reads it: what it groups by and how long the job ran
HISTORY_COLUMNS = (JobRow.job_id, JobRow.user, JobRow.gpus, JobRow.start_time, JobRow.end_time)
HistoryRecord = namedtuple("HistoryRecord", [c.key for c in HISTORY_COLUMNS])  # type: ignore[misc]


@dataclass
class Snapshot:
    """Everything one round reads from the store, loaded in one session (the fallback's history aside: it
    is read on demand, in a session of its own, by the round that needs it)."""

    hosts: list[HostRow]
    gpu_counts: dict[str, int]
    # non-terminal jobs, and finished ones in history: read-only rows with JobRow's columns as attributes
    # (plain result rows, not ORM objects: a round reads tens of thousands and changes them by UPDATEs)
    jobs: dict[str, JobRow]
    runs: list[RunRow]  # active runs
    profiles: dict[str, ProfileRow]  # latest profile per job
    state: dict[str, Any]
    # finished jobs (their keys and times only) with their run time, in end order: the fallback's history,
    # None until `finished_jobs` reads it (a round whose promoted model loads never needs it)
    history: list[tuple[HistoryRecord, float]] | None = None
    # finished jobs in full that ended after the promoted duration model was made: what it must still learn
    unlearned: list[tuple[JobRow, float]] = field(default_factory=list)
    submissions: list[tuple[float, int]] = field(default_factory=list)  # (time, gpus), recent, sorted
    models: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # kind -> (version, path, created)
    # (job id, speed relative to running alone) of running pairs, as their telemetry shows (pair_speed)
    speed_reports: list[tuple[str, float]] = field(default_factory=list)
    history_reader: Callable[[], list[tuple[HistoryRecord, float]]] | None = None

    def finished_jobs(self) -> list[tuple[HistoryRecord, float]]:
        """The fallback's history, read from the store the first time it is asked for."""
        if self.history is None:
            self.history = self.history_reader() if self.history_reader is not None else []
        return self.history


def load_snapshot(store: Store, now: float, history_window_s: float = 2 * 86400.0) -> Snapshot:
    from lucid_core.runtime.schema import ModelVersionRow, SchedulerStateRow

    active = [s.value for s in JobState if s not in TERMINAL_STATES]
    with store.session() as s:
        hosts = list(s.scalars(select(HostRow).order_by(HostRow.name)))
        counts: dict[str, int] = {}
        for host, _ in s.execute(select(GpuRow.host, GpuRow.index)):
            counts[host] = counts.get(host, 0) + 1
        make = JobRecord._make
        # plain rows through the session's connection: the ORM's row loading would cost as much as the read
        core = s.connection()
        # in submission order, sorted here: SQLite's sort of the read cost a tenth of it
        jobs = {j.job_id: j for j in sorted(map(make, core.execute(
            select(*JOB_COLUMNS).where(JobRow.state.in_(active)))), key=_submission_order)}
        runs = list(s.scalars(select(RunRow).where(RunRow.state.in_(ACTIVE_RUNS)).order_by(RunRow.planned_at)))
        profiles: dict[str, ProfileRow] = {}
        if jobs:
            # joined on the state rather than an IN list of every job id (tens of thousands of parameters)
            for p in s.scalars(select(ProfileRow).join(JobRow, JobRow.job_id == ProfileRow.job_id)
                               .where(JobRow.state.in_(active)).order_by(ProfileRow.id)):
                if p.job_id in jobs:  # a job that moved between the two reads keeps what the first saw
                    profiles[p.job_id] = p
        state = {row.key: row.value for row in s.scalars(select(SchedulerStateRow))}
        models = {m.kind: (m.version, m.path, m.created_at) for m in s.scalars(
            select(ModelVersionRow).where(ModelVersionRow.active.is_(True)).order_by(ModelVersionRow.created_at))}
        unlearned: list[tuple[JobRow, float]] = []
        history = None
        if "duration" in models:  # a promoted model learns, in full, only what ended after it was made
            unlearned = _with_run_times(reversed(list(map(make, core.execute(
                select(*JOB_COLUMNS).where(*_FINISHED, JobRow.end_time > models["duration"][2])
                .order_by(*_NEWEST_FIRST).limit(HISTORY_LIMIT))))))
        else:  # the fallback will learn from the history: read it with the rest
            history = _read_history(core)
        subs = core.execute(select(JobRow.submit_time, JobRow.gpus)  # core rows: the ORM's cost 5x the read
                            .where(JobRow.submit_time >= now - history_window_s)
                            .order_by(JobRow.submit_time)).all()

    def read_history() -> list[tuple[HistoryRecord, float]]:
        with store.session() as s:  # a promoted model that did not load: the fallback needs the history
            return _read_history(s.connection())

    # recent submissions feed the load forecast; a row whose time or width is not a number is left out
    submissions = [(t, g) for t, g in subs if type(t) in (float, int) and type(g) is int]
    return Snapshot(hosts, counts, jobs, runs, profiles, state, history, unlearned, submissions, models,
                    history_reader=read_history)


_FINISHED = (JobRow.state == JobState.COMPLETED.value, JobRow.start_time.is_not(None), JobRow.end_time.is_not(None))
#: newest end first, ties broken by the rest of ix_jobs_finished down to the job id: deterministic, and the
#: index's own order, so neither store sorts
_NEWEST_FIRST = tuple(c.desc() for c in (JobRow.end_time, JobRow.start_time, JobRow.user, JobRow.gpus, JobRow.job_id))


def _read_history(core: Any) -> list[tuple[HistoryRecord, float]]:
    """The latest finished jobs with their run times, in end order. Read narrow, newest first through the
    covering index ix_jobs_finished: a store holds tens of thousands, and the fallback needs only its keys."""
    rows = list(map(HistoryRecord._make, core.execute(
        select(*HISTORY_COLUMNS).where(*_FINISHED).order_by(*_NEWEST_FIRST).limit(HISTORY_LIMIT))))
    return _with_run_times(reversed(rows))


def _with_run_times(rows: Iterable[Any]) -> list[tuple[Any, float]]:
    """(row, how long the job ran) for finished jobs whose stored start and end are finite numbers and whose
    width is a whole number: a value hand-edited into text (SQLite keeps it) leaves that job out of the
    history instead of failing every round."""
    out = []
    for row in rows:
        start, end = row.start_time, row.end_time
        if (type(start) in (float, int) and type(end) in (float, int) and math.isfinite(start - end)
                and type(row.gpus) is int):
            out.append((row, max(0.0, end - start)))
    return out


def _submission_order(row: JobRow) -> tuple[int, float]:
    """Sort key by `seq`; a value gone bad (text, NULL: a hand edit) sorts last instead of failing the sort."""
    seq = row.seq
    return (0, seq) if type(seq) is int else (1, 0.0)


_JOB_STATES = {state.value: state for state in JobState}
_SHARE_CLASSES = {int(c): c for c in ShareClass}


def _share_class(value: int | None) -> ShareClass | None:
    """The stored class (a dict lookup: a round converts tens of thousands). A value that names no class is
    a cache entry gone bad (a hand edit, another controller): None, so the policy classifies the job again."""
    return None if value is None else _SHARE_CLASSES.get(value)


def _prediction(value: float | None) -> float | None:
    """A stored predicted duration, or None (predicted again) where it is not a positive finite number:
    a negative or NaN one would put the job ahead of every queue."""
    return value if value is not None and 0.0 < value < math.inf else None


def _percent(value: float) -> float:
    """A stored utilization clamped to [0, 100] (NaN -> 0); the common in-range value costs one compare."""
    return value if 0.0 <= value <= 100.0 else min(100.0, max(0.0, value))


def job_of(row: JobRow) -> Job:
    """The policy's Job for a store row (state and learned fields included)."""
    profile = None
    if row.profiled and row.gpu_util is not None:
        profile = Profile(_percent(row.gpu_util), _percent(row.mem_util or 0.0), max(0.0, row.gpu_mem_mb or 0.0),
                          row.amp, row.profile_emulated)
    state = _JOB_STATES.get(row.state) or JobState(row.state)  # a dict lookup; a bad value raises as JobState does
    return Job(job_id=row.job_id, user=row.user, vc=row.vc, gpus=row.gpus, submit_time=row.submit_time,
               name=row.name, amp=row.amp, long_cold_start=row.long_cold_start, state=state,
               profile=profile, share_class=_share_class(row.share_class),
               predicted_duration=_prediction(row.predicted_duration), known_min_duration=row.known_min_duration,
               start_time=row.start_time, end_time=row.end_time, no_share=row.no_share,
               preemptible=row.preemptible, yields=row.yields)


def profile_of_row(row: ProfileRow, amp: bool) -> Profile:
    return Profile(_percent(row.gpu_util), _percent(row.mem_util), max(0.0, row.gpu_mem_mb), amp, row.emulated)


class ReplayForecaster:
    """Wraps a forecaster fed from the store's submissions; ignores the hooks' re-observations."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.muted = True

    def observe_submission(self, time: float, gpus: int) -> None:
        if not self.muted:
            self.inner.observe_submission(time, gpus)

    def forecast(self, now: float) -> Forecast:
        return self.inner.forecast(now)


def load_model(path: str, *, needs: tuple[str, ...]) -> Any | None:
    """A promoted model artifact (joblib), or the predictor it wraps, if it offers `needs`; else None."""
    import joblib

    try:
        obj = joblib.load(path)
    except Exception:  # a missing or unreadable artifact must not stop scheduling
        return None
    for candidate in (obj, getattr(obj, "predictor_", None), getattr(obj, "model_", None)):
        if candidate is not None and all(callable(getattr(candidate, n, None)) for n in needs):
            return candidate
    return None


def policy_models(config: LucidConfig, snapshot: Snapshot) -> tuple[Any, Any, Any, dict[str, str]]:
    """(duration model, packing model or None, forecaster, kind -> source) for this round.

    Promoted versions in `model_versions` (written by the Update Engine) win; the duration model
    then also learns the jobs that ended after it was trained. Without one, the fallbacks are
    refitted from the store's history.
    """
    sources: dict[str, str] = {}
    duration = None
    if "duration" in snapshot.models:
        version, path, _ = snapshot.models["duration"]
        duration = load_model(path, needs=("predict_duration", "observe"))
        if duration is not None:
            sources["duration"] = f"promoted version {version}"
            for row, seconds in snapshot.unlearned:  # read as the jobs that ended after the promotion
                try:
                    job = job_of(row)
                except (ValueError, TypeError):  # a row another writer broke: the model learns the others
                    continue
                duration.observe(job, seconds)
    if duration is None:
        duration = HistoryDurationPredictor()
        history = snapshot.finished_jobs()
        if history:  # grouped by the rows' own user and GPU demand: no Job built per finished job
            duration.fit([j for j, _ in history], [d for _, d in history])
        sources["duration"] = fallback_source(len(history))
    packing = None
    if "packing" in snapshot.models:
        version, path, _ = snapshot.models["packing"]
        packing = load_model(path, needs=("classify",))
        if packing is not None:
            sources["packing"] = f"promoted version {version}"
    forecaster = None
    if "throughput_forecaster" in snapshot.models:
        version, path, _ = snapshot.models["throughput_forecaster"]
        forecaster = load_model(path, needs=("observe_submission", "forecast"))
        if forecaster is not None:
            sources["throughput"] = f"promoted version {version}"
    if forecaster is None:
        forecaster = RecentSlotsForecaster(config.forecast.slot_s)
        sources["throughput"] = "mean of recent slots"
    for t, gpus in snapshot.submissions:
        forecaster.observe_submission(t, gpus)
    return duration, packing, ReplayForecaster(forecaster), sources


def fallback_source(finished: int) -> str:
    """How the history fallback is named among a round's model sources."""
    return f"history of {finished} finished job(s)"


def default_policy(config: LucidConfig, snapshot: Snapshot) -> SchedulingPolicy:
    """LucidPolicy with the promoted models, or history-fitted fallbacks when none is promoted."""
    from lucid_core.policy.lucid import LucidPolicy

    duration, packing, forecaster, sources = policy_models(config, snapshot)
    policy = LucidPolicy(config, duration_model=duration, packing_model=packing, forecaster=forecaster)
    policy.model_sources = sources
    return policy


PolicyFactory = Callable[[LucidConfig, Snapshot], SchedulingPolicy]


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
    borrowed = view.restore_policy_state(snapshot.state)
    available: set[str] = set()
    for host in snapshot.hosts:
        count = snapshot.gpu_counts.get(host.name, 0)
        if count == 0:
            continue
        pool = Pool.PROFILING if host.pool == Pool.PROFILING.value or host.name in borrowed else Pool.MAIN
        # main nodes carry their VC so jobs are placed only on their own VC's hosts
        view.pool(pool).add_node(host.name, count, host.gpu_memory_mb, borrowed=host.name in borrowed,
                                 vc=host.vc if pool is Pool.MAIN else "")
        if host.name in borrowed:
            view.borrowed_nodes.append(host.name)
        if host.reachable and not host.draining and (host.cooldown_until is None or host.cooldown_until <= now):
            available.add(host.name)
        else:
            view.closed_nodes.add(host.name)

    runs_by_job: dict[str, list[RunRow]] = {}
    for run in snapshot.runs:
        runs_by_job.setdefault(run.job_id, []).append(run)
    placed_on = {name for pool in (view.main, view.profiling) for name in pool.nodes}
    # frozen: a stop is pending, or a run sits on a host the inventory no longer has (the round repairs it)
    frozen = {j for j, runs in runs_by_job.items() if any(r.stop_reason or r.host not in placed_on for r in runs)}
    # a run whose job this round cannot see (a row it cannot read, or a state none of the active ones) keeps
    # its GPUs all the same: nothing is placed on them while it may be running
    frozen |= unreadable.keys() | {j for j in runs_by_job if j not in jobs}

    held: dict[tuple[str, str], list[int]] = {}  # (pool, host) -> GPU indices held
    # running jobs become allocations: lone runs and pair founders first, then partners
    ordered = sorted(runs_by_job.items(), key=lambda kv: min(r.planned_at for r in kv[1]))
    started: set[str] = set()
    pending_partners = []
    for job_id, runs in ordered:
        if job_id in frozen:
            for run in runs:
                held.setdefault((run.pool, run.host), []).extend(run.gpu_indices)
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
    return BuiltView(view, policy, available, frozen, key, unreadable)


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

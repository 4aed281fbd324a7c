"""What one round reads from the store (`Snapshot`, `load_snapshot`) and the policy's records of its rows.

Rows are read as plain tuples and checked as they become `Job`s: a value another writer broke leaves that job
or that history entry out, never the round.
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from lucid_core.domain import (
    ACTIVE_RUN_STATES,
    JOB_STATES_BY_VALUE,
    TERMINAL_STATES,
    Job,
    JobState,
    Profile,
    RunState,
    ShareClass,
)
from lucid_core.policy.view import saved_float, saved_time_limit
from lucid_core.runtime.store.schema import GpuRow, HostRow, JobRow, ProfileRow, RunRow
from lucid_core.runtime.store.store import Store

ACTIVE_RUNS = ACTIVE_RUN_STATES
KNOWN_RUNS = [state.value for state in RunState]
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
    # runs of non-terminal jobs in a state this version does not know (another controller's, a hand edit's):
    # they may be running, so their GPUs are held and their jobs sit out, never placed a second time
    unknown_runs: list[RunRow] = field(default_factory=list)

    def finished_jobs(self) -> list[tuple[HistoryRecord, float]]:
        """The fallback's history, read from the store the first time it is asked for."""
        if self.history is None:
            self.history = self.history_reader() if self.history_reader is not None else []
        return self.history


def load_snapshot(store: Store, now: float, history_window_s: float = 2 * 86400.0) -> Snapshot:
    from lucid_core.runtime.store.schema import ModelVersionRow, SchedulerStateRow

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
        unknown_runs: list[RunRow] = []
        if jobs:
            unknown_runs = [r for r in s.scalars(select(RunRow).join(JobRow, JobRow.job_id == RunRow.job_id)
                                                 .where(JobRow.state.in_(active), RunRow.state.not_in(KNOWN_RUNS))
                                                 .order_by(RunRow.planned_at)) if r.job_id in jobs]
            # joined on the state rather than an IN list of every job id (tens of thousands of parameters)
            for p in s.scalars(select(ProfileRow).join(JobRow, JobRow.job_id == ProfileRow.job_id)
                               .where(JobRow.state.in_(active)).order_by(ProfileRow.id)):
                if p.job_id in jobs:  # a job that moved between the two reads keeps what the first saw
                    profiles[p.job_id] = p
        state = {row.key: row.value for row in s.scalars(select(SchedulerStateRow))}
        active = list(s.scalars(select(ModelVersionRow).where(ModelVersionRow.active.is_(True))
                                .order_by(ModelVersionRow.created_at)))
        models = {m.kind: (m.version, m.path, m.created_at) for m in active}
        learned_until = {m.kind: trained_until(m) for m in active}
        unlearned: list[tuple[JobRow, float]] = []
        history = None
        if "duration" in models:  # a promoted model learns, in full, only what ended after its training data
            unlearned = _with_run_times(reversed(list(map(make, core.execute(
                select(*JOB_COLUMNS).where(*_FINISHED, JobRow.end_time >= learned_until["duration"])
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
    submissions = [(t, g) for t, g in subs if type(t) in (float, int) and math.isfinite(t) and type(g) is int]
    return Snapshot(hosts, counts, jobs, runs, profiles, state, history, unlearned, submissions, models,
                    history_reader=read_history, unknown_runs=unknown_runs)


def trained_until(version: Any) -> float:
    """Where a promoted model's training data ends: the end of its training window, which holds the jobs that
    ended before it (`update.extract_batch`); the jobs that end from then on are the model's to learn live. A
    version without a readable window (promoted by hand, or before windows were kept) counts from its promotion,
    as before: jobs that ended while it trained were then learned by neither."""
    metrics = version.metrics if isinstance(version.metrics, dict) else {}
    window = metrics.get("training_window")
    end = saved_float(window[1]) if isinstance(window, list | tuple) and len(window) == 2 else None
    created = saved_float(version.created_at)
    if end is not None and (created is None or end <= created):
        return end
    return created if created is not None else math.inf


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


_SHARE_CLASSES = {int(c): c for c in ShareClass}


def _share_class(value: int | None) -> ShareClass | None:
    """The stored class (a dict lookup: a round converts tens of thousands). A value that names no class is
    a cache entry gone bad (a hand edit, another controller): None, so the policy classifies the job again."""
    return None if value is None else _SHARE_CLASSES.get(value)


def _prediction(value: float | None) -> float | None:
    """A stored predicted duration, or None (predicted again) where it is not a positive finite number:
    a negative or NaN one would put the job ahead of every queue."""
    return value if value is not None and 0.0 < value < math.inf else None


def _known_run(value: float) -> float:
    """A stored run time the job is known to have had, or 0 (nothing known) where it is not a finite number >= 0:
    an infinite one would predict the job to run for ever, and its priority would break the saved policy state."""
    return value if 0.0 <= value < math.inf else 0.0


def _percent(value: float) -> float:
    """A stored utilization clamped to [0, 100] (NaN -> 0); the common in-range value costs one compare."""
    return value if 0.0 <= value <= 100.0 else min(100.0, max(0.0, value))


def job_of(row: JobRow) -> Job:
    """The policy's Job for a store row (state and learned fields included)."""
    profile = None
    if row.profiled and row.gpu_util is not None:
        profile = Profile(_percent(row.gpu_util), _percent(row.mem_util or 0.0), max(0.0, row.gpu_mem_mb or 0.0),
                          row.amp, row.profile_emulated)
    state = JOB_STATES_BY_VALUE.get(row.state) or JobState(row.state)  # a bad value raises as JobState does
    if type(row.submit_time) not in (float, int) or not math.isfinite(row.submit_time):
        raise ValueError(f"submit time {str(row.submit_time)[:40]!r} is not a finite number")
    return Job(job_id=row.job_id, user=row.user, vc=row.vc, gpus=row.gpus, submit_time=row.submit_time,
               name=row.name, amp=row.amp, long_cold_start=row.long_cold_start, state=state,
               profile=profile, share_class=_share_class(row.share_class),
               predicted_duration=_prediction(row.predicted_duration),
               known_min_duration=_known_run(row.known_min_duration),
               start_time=row.start_time, end_time=row.end_time, no_share=row.no_share,
               preemptible=row.preemptible, yields=row.yields, time_limit_s=saved_time_limit(row.time_limit_s))


def profile_of_row(row: ProfileRow, amp: bool) -> Profile:
    return Profile(_percent(row.gpu_util), _percent(row.mem_util), max(0.0, row.gpu_mem_mb), amp, row.emulated)

"""The read side of the store: every view the CLI, the HTTP API and the plugin's pages show (queue, job
status and history, logs, the GPU map, model versions), and what the Update Engine reads (the finished-job
log, a promoted version's drift reference), is a query here; the round and the store write."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lucid_core.domain import TERMINAL_STATES, JobState, RunState
from lucid_core.runtime.store.schema import DecisionRow, GpuRow, HostRow, JobEventRow, JobRow, ModelVersionRow, RunRow
from lucid_core.runtime.surfaces.shared_time import shared_spans, shared_words
from lucid_core.runtime.surfaces.submission import UNSTORABLE, UnknownJob, storable

if TYPE_CHECKING:  # imported where used: `lucid queue`, `status` and `history` start without the fleet and the round
    from lucid_core.runtime.hosts.executor import HostExecutor
    from lucid_core.runtime.store.store import Store

_STATE_ORDER = {JobState.RUNNING.value: 0, JobState.PROFILING.value: 1, JobState.QUEUED.value: 2,
                JobState.SUBMITTED.value: 3}


@dataclass(frozen=True)
class SharedSpeed:
    """A running job sharing its GPUs with a running partner, and the speed the round last measured
    for it there (relative to running alone; None until the pair has settled and been measured)."""

    job_id: str
    partner: str
    vc: str
    speed: float | None
    measured_at: float | None
    samples: int | None
    emulated: bool | None


def shared_speeds(session: Session, job_ids: list[str] | None = None) -> dict[str, SharedSpeed]:
    """Running jobs whose rank-0 main run shares GPUs with a running partner (of `job_ids` if given).

    A stored speed belongs to the current pair: a new partner clears it (round.py), and a run whose
    partner has ended is not listed, so what is shown is never a past pair's figure.
    """
    from lucid_core.runtime.round.pair_speed import mutual_pairs

    query = (select(RunRow, JobRow.vc).join(JobRow, JobRow.job_id == RunRow.job_id)
             .where(RunRow.kind == "main", RunRow.node_rank == 0, RunRow.state == RunState.RUNNING,
                    RunRow.partner.is_not(None)))
    rows = session.execute(query).all()
    vc_of = {run.job_id: vc for run, vc in rows}
    out = {}
    for pair in mutual_pairs(run for run, _ in rows):
        for run, other in (pair, pair[::-1]):
            if job_ids is None or run.job_id in job_ids:
                out[run.job_id] = SharedSpeed(run.job_id, other.job_id, vc_of[run.job_id], run.observed_speed,
                                              run.observed_speed_at, run.observed_speed_samples,
                                              run.observed_speed_emulated)
    return out


def _number_or_zero(value: Any) -> int:
    """A stored position for sorting; anything but an int (NULL, or text a hand edit stored) sorts first."""
    return value if type(value) is int else 0


def queue(store: Store, *, priority_in_reason: bool = True) -> list[dict[str, Any]]:
    """Waiting and running jobs: running first, then each queue in the policy's order. Without
    `priority_in_reason`, the pending reason leaves the priority out (`lucid queue` prints it in a column)."""
    from lucid_core.runtime.round.pending import describe_pending  # with the policy's modules: not for `history`

    active = [s.value for s in JobState if s not in TERMINAL_STATES]
    with store.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.state.in_(active))).all()
    rows = sorted(rows, key=lambda r: (_STATE_ORDER.get(r.state, 9), _number_or_zero(r.queue_position),
                                       _number_or_zero(r.seq)))
    return [{"job_id": r.job_id, "state": r.state, "name": r.name, "user": r.user, "vc": r.vc, "gpus": r.gpus,
             "position": r.queue_position, "predicted_duration_s": r.predicted_duration,
             "priority_gpu_s": r.gpus * r.predicted_duration if isinstance(r.predicted_duration, float | int) else None,
             "share_class": r.share_class,
             "pending_reason": describe_pending(r.state, r.queue_position, r.pending_reason, r.gpus,
                                                r.predicted_duration if priority_in_reason else None),
             "submit_time": r.submit_time}
            for r in rows]


def _job_row(session: Session, job_id: str) -> JobRow:
    """The job's row; `UnknownJob` when there is none, or when no job could have the id (a NUL: PostgreSQL
    refuses such text even in a lookup)."""
    row = session.get(JobRow, job_id) if storable(job_id) else None
    if row is None:
        raise UnknownJob(job_id)
    return row


def status(store: Store, job_id: str) -> dict[str, Any]:
    """A job's row and runs, its pending reason in words, and its measured speed while it shares GPUs."""
    from lucid_core.runtime.round.pending import pending_text

    now = store.now()
    with store.session() as s:
        r = _job_row(s, job_id)
        runs = s.scalars(select(RunRow).where(RunRow.job_id == job_id).order_by(RunRow.planned_at)).all()
        pairs = any(x.state == RunState.RUNNING and x.partner is not None for x in runs)
        shared = shared_speeds(s, [job_id]).get(job_id) if pairs else None
        spans = shared_spans(s, now, [job_id]).get(job_id, [])
        planned = next((x.partner for x in reversed(runs) if x.partner), None)
    return {"job_id": r.job_id, "state": r.state, "name": r.name, "user": r.user, "vc": r.vc, "gpus": r.gpus,
            "command": r.command, "submit_time": r.submit_time, "start_time": r.start_time, "end_time": r.end_time,
            "exit_code": r.exit_code, "end_reason": r.end_reason, "ended_in_profiling": r.ended_in_profiling,
            "cancel_requested": r.cancel_requested, "pending_reason": pending_text(r),
            "runs": [{"run_id": x.run_id, "host": x.host, "kind": x.kind, "gpus": x.gpu_indices, "state": x.state,
                      "pid": x.pid, "exit_code": x.exit_code, "outcome": x.outcome} for x in runs],
            # the speed measured while it shares GPUs with `partner` (null: running alone or not yet measured)
            "shared": asdict(shared) if shared is not None else None,
            # when it really shared a GPU, from the run records (a planned partner that never ran beside it: none)
            "shared_spans": [{**asdict(x), "seconds": x.seconds} for x in spans],
            "sharing": shared_words(spans, planned, r.state in {x.value for x in TERMINAL_STATES})}


def latest_run(store: Store, job_id: str) -> tuple[RunRow, HostRow] | None:
    """The job's latest launched rank-0 run and its host, whose files hold its logs (None before its first
    launch); `UnknownJob` when there is no such job."""
    with store.session() as s:
        _job_row(s, job_id)
        run = s.scalars(select(RunRow).where(RunRow.job_id == job_id, RunRow.node_rank == 0,
                                             RunRow.state != RunState.PLANNED)
                        .order_by(RunRow.planned_at.desc()).limit(1)).first()
        host = s.get(HostRow, run.host) if run is not None else None
    return None if run is None or host is None else (run, host)


def logs(store: Store, executor: HostExecutor, job_id: str, stream: str = "stdout",
         max_bytes: int = 65536) -> str:
    """The tail of the job's latest run's stdout or stderr, read from its host."""
    from lucid_core.runtime.hosts.inventory import host_address

    if stream not in ("stdout", "stderr"):
        raise ValueError("stream must be stdout or stderr")
    found = latest_run(store, job_id)
    if found is None:
        return ""
    run, host = found
    try:
        return executor.read(host_address(host), run.run_id, f"{stream}.log", max_bytes)
    finally:
        executor.close()


#: What `history` can show per job, and the columns `lucid history` prints by default.
HISTORY_FIELDS = ("job_id", "name", "user", "vc", "gpus", "state", "submit_time", "start_time", "end_time",
                  "queued_s", "elapsed_s", "exit_code", "end_reason", "ended_in_profiling")
HISTORY_DEFAULT_FIELDS = ("job_id", "name", "user", "vc", "gpus", "state", "end_time", "elapsed_s", "exit_code")
#: The largest history limit and offset: more jobs than any store holds, and within the stores' 64-bit integers.
MAX_HISTORY_ROWS = 2**31 - 1


@dataclass(frozen=True)
class HistoryQuery:
    """Which finished jobs to list: by user, VC, end state and end time, newest first, one page."""

    user: str | None = None
    vc: str | None = None
    states: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    limit: int = 50
    offset: int = 0

    def __post_init__(self) -> None:
        problem = self._states_problem() or self._page_problem() or self._filter_problem()
        if problem:
            raise ValueError(problem)

    def _states_problem(self) -> str | None:
        """Why `states` holds a state that is not a finished one (None when all are)."""
        terminal = {s.value for s in TERMINAL_STATES}
        unknown = [s for s in self.states if s not in terminal]
        if unknown:
            return f"state {', '.join(unknown)} is not a finished state; use {', '.join(sorted(terminal))}"
        return None

    def _page_problem(self) -> str | None:
        """Why `limit` or `offset` is out of range (a huge one overflows the stores' integers: a 500)."""
        if self.limit < 1 or self.offset < 0:
            return f"limit must be >= 1 and offset >= 0, got {self.limit} and {self.offset}"
        for name in ("limit", "offset"):
            if getattr(self, name) > MAX_HISTORY_ROWS:
                return f"{name} must be at most {MAX_HISTORY_ROWS}, got {getattr(self, name)}"
        return None

    def _filter_problem(self) -> str | None:
        """Why a user, VC or time filter is no value a stored job could have (NUL text; a NaN or infinite time)."""
        for name in ("user", "vc"):
            value = getattr(self, name)
            if value is not None and not storable(value):
                return f"{name} {UNSTORABLE}, got {value!r}"
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                return f"{name} must be a finite time (epoch seconds), got {value}"
        return None


@dataclass(frozen=True)
class HistoryPage:
    rows: list[dict[str, Any]]
    total: int
    query: HistoryQuery


def history(session: Session, query: HistoryQuery) -> HistoryPage:
    """Finished, failed and cancelled jobs matching `query`, latest end first (the web page and `lucid history`)."""
    from sqlalchemy import func

    states = list(query.states) or [s.value for s in TERMINAL_STATES]
    where = [JobRow.state.in_(states)]
    if query.user:
        where.append(JobRow.user == query.user)
    if query.vc:
        where.append(JobRow.vc == query.vc)
    if query.since is not None:
        where.append(JobRow.end_time >= query.since)
    if query.until is not None:
        where.append(JobRow.end_time < query.until)
    total = session.scalar(select(func.count()).select_from(JobRow).where(*where)) or 0
    jobs = session.scalars(select(JobRow).where(*where).order_by(JobRow.end_time.desc(), JobRow.seq.desc())
                           .limit(query.limit).offset(query.offset)).all()
    rows = [{"job_id": j.job_id, "name": j.name, "user": j.user, "vc": j.vc, "gpus": j.gpus, "state": j.state,
             "submit_time": j.submit_time, "start_time": j.start_time, "end_time": j.end_time,
             "queued_s": None if j.start_time is None else max(0.0, j.start_time - j.submit_time),
             "elapsed_s": None if j.start_time is None or j.end_time is None else max(0.0, j.end_time - j.start_time),
             "exit_code": j.exit_code, "end_reason": j.end_reason, "ended_in_profiling": j.ended_in_profiling}
            for j in jobs]
    return HistoryPage(rows, int(total), query)


def waiting(store: Store) -> list[dict[str, Any]]:
    """The jobs still waiting (submitted, profiling, queued), in `queue`'s order: the queue page's rows."""
    return [row for row in queue(store) if row["state"] != JobState.RUNNING.value]


@dataclass(frozen=True)
class GpuMap:
    """What runs where: active runs, the hosts and their GPUs, job names, and measured shared speeds."""

    runs: list[RunRow]
    hosts: list[HostRow]
    gpus: list[GpuRow]
    names: dict[str, str]
    shared: dict[str, SharedSpeed]


def gpu_map(store: Store) -> GpuMap:
    """Runs not ended yet, every host and GPU, in one read (the running page)."""
    with store.session() as s:
        runs = list(s.scalars(select(RunRow).where(RunRow.ended_at.is_(None))))
        shared = shared_speeds(s)
        hosts = list(s.scalars(select(HostRow).order_by(HostRow.name)))
        gpus = list(s.scalars(select(GpuRow).order_by(GpuRow.host, GpuRow.index)))
        names = {job_id: name for job_id, name in s.execute(select(JobRow.job_id, JobRow.name).where(
            JobRow.job_id.in_([r.job_id for r in runs])))} if runs else {}
    return GpuMap(runs, hosts, gpus, names, shared)


@dataclass(frozen=True)
class JobRecord:
    """A job's row with its events and decisions, oldest first (the job page)."""

    job: JobRow
    events: list[JobEventRow]
    decisions: list[DecisionRow]


def job_record(store: Store, job_id: str) -> JobRecord:
    """A job with its history; `UnknownJob` when there is none."""
    with store.session() as s:
        job = _job_row(s, job_id)
        events = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.time)))
        decisions = list(s.scalars(select(DecisionRow).where(DecisionRow.job_id == job_id).order_by(DecisionRow.id)))
    return JobRecord(job, events, decisions)


def model_versions(store: Store) -> list[ModelVersionRow]:
    """Every registered model version, by kind, newest first."""
    with store.session() as s:
        return list(s.scalars(select(ModelVersionRow).order_by(ModelVersionRow.kind,
                                                               ModelVersionRow.created_at.desc())))


def active_model_version(store: Store, kind: str) -> str | None:
    """The version of the active `model_versions` row of `kind` (the newest, as the live round reads them), or
    None: the promoted model the live round serves."""
    with store.session() as s:
        return s.scalars(select(ModelVersionRow.version)
                         .where(ModelVersionRow.kind == kind, ModelVersionRow.active.is_(True))
                         .order_by(ModelVersionRow.created_at.desc()).limit(1)).first()


#: The columns of the finished-job log, in the order `finished_job_log` returns them.
JOB_LOG_FIELDS = ("job_id", "user", "vc", "name", "gpus", "submit_time", "start_time", "end_time", "state",
                  "gpu_util", "mem_util", "gpu_mem_mb", "amp", "preemptible")


def finished_job_log(store: Store, since: float | None = None, until: float | None = None) -> list[tuple[Any, ...]]:
    """Finished (completed, failed, cancelled) jobs submitted in [since, until) with their profile, one
    `JOB_LOG_FIELDS` tuple per job, by submit time then job id: what the Update Engine trains on and the
    tuner replays."""
    where = [JobRow.state.in_(sorted(s.value for s in TERMINAL_STATES))]
    if since is not None:
        where.append(JobRow.submit_time >= since)
    if until is not None:
        where.append(JobRow.submit_time < until)
    query = (select(*(getattr(JobRow, field) for field in JOB_LOG_FIELDS)).where(*where)
             .order_by(JobRow.submit_time, JobRow.job_id))
    with store.session() as s:
        return [tuple(row) for row in s.execute(query)]


def model_version_metrics(store: Store, kind: str, version: str) -> dict[str, Any]:
    """The metrics of the newest `model_versions` row of `kind` at `version` ({} when there is none): the
    drift reference (errors and inputs) the Update Engine stored when it promoted that version."""
    with store.session() as s:
        metrics = s.scalars(select(ModelVersionRow.metrics)
                            .where(ModelVersionRow.kind == kind, ModelVersionRow.version == version)
                            .order_by(ModelVersionRow.created_at.desc()).limit(1)).first()
    return metrics if isinstance(metrics, dict) else {}

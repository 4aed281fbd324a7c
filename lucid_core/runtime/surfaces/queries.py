"""The read side of the store: every view the CLI, the HTTP API and the plugin's pages show (queue, job
status and history, logs, the GPU map, model versions), and what the Update Engine reads (the finished-job
log, a promoted version's drift reference), is a query here; the round and the store write. `lucid queue`,
`status` and `history` read the same rows through `plain_views` (no SQLAlchemy to import), shaped by the same
`job_views`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lucid_core.domain import TERMINAL_STATES, JobState, RunState
from lucid_core.policy.view import saved_float
from lucid_core.runtime.store.schema import DecisionRow, GpuRow, HostRow, JobEventRow, JobRow, ModelVersionRow, RunRow
from lucid_core.runtime.surfaces.job_views import (  # noqa: F401  (re-exported: the names readers import from here)
    ACTIVE_STATES,
    HISTORY_DEFAULT_FIELDS,
    HISTORY_FIELDS,
    ID_CHUNK,
    MAX_HISTORY_ROWS,
    HistoryPage,
    HistoryQuery,
    QueueQuery,
    SharedSpeed,
    UnknownJob,
    history_row,
    host_down_words,
    queue_rows,
    run_facts,
    shares_now,
    speeds_of_pairs,
    status_view,
    storable,
    yielded,
)
from lucid_core.runtime.surfaces.shared_time import shared_spans

if TYPE_CHECKING:  # imported where used: `lucid queue`, `status` and `history` start without the fleet and the round
    from lucid_core.runtime.hosts.executor import FileTail, HostExecutor
    from lucid_core.runtime.store.store import Store


def shared_speeds(session: Session, job_ids: list[str] | None = None) -> dict[str, SharedSpeed]:
    """Running jobs whose rank-0 main run shares GPUs with a running partner (of `job_ids` if given).

    A stored speed belongs to the current pair: a new partner clears it (round.py), and a run whose
    partner has ended is not listed, so what is shown is never a past pair's figure.
    """
    query = (select(RunRow, JobRow.vc).join(JobRow, JobRow.job_id == RunRow.job_id)
             .where(RunRow.kind == "main", RunRow.node_rank == 0, RunRow.state == RunState.RUNNING,
                    RunRow.partner.is_not(None)))
    return speeds_of_pairs([tuple(row) for row in session.execute(query).all()], job_ids)


def queue(store: Store, query: QueueQuery | None = None, *, priority_in_reason: bool = True
          ) -> list[dict[str, Any]]:
    """Waiting and running jobs in `queue_rows`' order and words; those `query` asks for when given."""
    with store.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))).all()
    shown = queue_rows(rows, priority_in_reason=priority_in_reason)
    return shown if query is None else query.select(shown)


def _job_row(session: Session, job_id: str) -> JobRow:
    """The job's row; `UnknownJob` when there is none, or when no job could have the id (a NUL: PostgreSQL
    refuses such text even in a lookup)."""
    row = session.get(JobRow, job_id) if storable(job_id) else None
    if row is None:
        raise UnknownJob(job_id)
    return row


def status(store: Store, job_id: str) -> dict[str, Any]:
    """A job's row and runs, its pending reason in words, and its measured speed while it shares GPUs
    (`status_view`)."""
    now = store.now()
    with store.session() as s:
        job = _job_row(s, job_id)
        runs = s.scalars(select(RunRow).where(RunRow.job_id == job_id).order_by(RunRow.planned_at)).all()
        shared = shared_speeds(s, [job_id]).get(job_id) if shares_now(runs) else None
        spans = shared_spans(s, now, [job_id]).get(job_id, [])
        names = {r.host for r in runs if isinstance(r.host, str)}
        hosts = s.scalars(select(HostRow).where(HostRow.name.in_(names))).all() if names else []
        down = {h.name: words for h in hosts if (words := host_down_words(h, now))}
    return status_view(job, runs, shared, spans, down, now)


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
         max_bytes: int = 65536) -> FileTail:
    """The tail of the job's latest run's stdout or stderr, read from its host, with the log's whole size."""
    from lucid_core.runtime.hosts.executor import FileTail
    from lucid_core.runtime.hosts.inventory import host_address

    if stream not in ("stdout", "stderr"):
        raise ValueError("stream must be stdout or stderr")
    found = latest_run(store, job_id)
    if found is None:
        return FileTail("")
    run, host = found
    try:
        return executor.read_tail(host_address(host), run.run_id, f"{stream}.log", max_bytes)
    finally:
        executor.close()


#: the run columns `run_facts` reads
_FACT_COLUMNS = (RunRow.job_id, RunRow.run_id, RunRow.kind, RunRow.host, RunRow.state, RunRow.started_at,
                 RunRow.ended_at)


def history(session: Session, query: HistoryQuery) -> HistoryPage:
    """Finished, failed and cancelled jobs matching `query`, latest end first (the web page and `lucid history`)."""
    from sqlalchemy import func

    where = [JobRow.state.in_(query.states_listed())]
    if query.users:
        where.append(JobRow.user.in_(query.users))
    if query.vcs:
        where.append(JobRow.vc.in_(query.vcs))
    if query.since is not None:
        where.append(JobRow.end_time >= query.since)
    if query.until is not None:
        where.append(JobRow.end_time < query.until)
    total = session.scalar(select(func.count()).select_from(JobRow).where(*where)) or 0
    jobs = session.scalars(select(JobRow).where(*where).order_by(JobRow.end_time.desc(), JobRow.seq.desc())
                           .limit(query.limit).offset(query.offset)).all()
    ids = [j.job_id for j in jobs]
    runs = [r for chunk in range(0, len(ids), ID_CHUNK) for r in session.execute(
        select(*_FACT_COLUMNS).where(RunRow.job_id.in_(ids[chunk:chunk + ID_CHUNK]))).all()]
    facts = run_facts(runs, {j.job_id: saved_float(j.end_time) for j in jobs})
    return HistoryPage([history_row(j, facts.get(j.job_id)) for j in jobs], int(total), query)


def waiting(store: Store, query: QueueQuery | None = None) -> list[dict[str, Any]]:
    """The jobs still waiting (submitted, profiling, queued), in `queue`'s order (those `query` asks for): the
    queue page's rows."""
    return [row for row in queue(store, query) if row["state"] != JobState.RUNNING.value]


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
                  "gpu_util", "mem_util", "gpu_mem_mb", "amp", "preemptible", "time_limit_s")


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

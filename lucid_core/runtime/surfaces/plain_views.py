"""`lucid queue`, `status` and `history` read through a `PlainReader` (no SQLAlchemy to import): the same rows
`queries` reads through the ORM, selected by the same conditions in SQL, and shaped by the same `job_views`.
A test holds each of the three to its `queries` twin on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from lucid_core.domain import RunState
from lucid_core.policy.view import saved_float
from lucid_core.runtime.store.plain_read import PlainReader
from lucid_core.runtime.surfaces.job_views import (
    ACTIVE_STATES,
    ID_CHUNK,
    HistoryPage,
    HistoryQuery,
    QueueQuery,
    UnknownJob,
    history_row,
    host_down_words,
    queue_rows,
    run_facts,
    shares_now,
    speeds_of_pairs,
    status_view,
    storable,
)
from lucid_core.runtime.surfaces.shared_time import spans_by_job

#: The job columns `queue_rows` reads, and those `history_row` reads.
_QUEUE_COLUMNS = ("job_id", "seq", "state", "name", "user", "vc", "gpus", "queue_position", "predicted_duration",
                  "share_class", "pending_reason", "submit_time")
_HISTORY_COLUMNS = ("job_id", "name", "user", "vc", "gpus", "state", "submit_time", "start_time", "end_time",
                    "exit_code", "end_reason", "ended_in_profiling", "yields", "time_limit_s")


def _marks(values: tuple[Any, ...] | list[Any]) -> str:
    return ", ".join("?" for _ in values)


def _columns(names: tuple[str, ...]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def queue(reader: PlainReader, query: QueueQuery | None = None, *, priority_in_reason: bool = True
          ) -> list[dict[str, Any]]:
    """`queries.queue`: waiting and running jobs in the policy's order (those `query` asks for)."""
    jobs = reader.records("jobs", f"SELECT {_columns(_QUEUE_COLUMNS)} FROM jobs WHERE state IN "
                                  f"({_marks(ACTIVE_STATES)})", ACTIVE_STATES)
    shown = queue_rows(jobs, priority_in_reason=priority_in_reason)
    return shown if query is None else query.select(shown)


def status(reader: PlainReader, job_id: str) -> dict[str, Any]:
    """`queries.status`: a job's row and runs, its pending reason, its shared speed and shared spans."""
    now = reader.now()
    found = reader.records("jobs", "SELECT * FROM jobs WHERE job_id = ?", (job_id,)) if storable(job_id) else []
    if not found:
        raise UnknownJob(job_id)
    runs = reader.records("runs", "SELECT * FROM runs WHERE job_id = ? ORDER BY planned_at", (job_id,))
    shared = None
    if shares_now(runs):
        pairs = reader.records(
            "runs", 'SELECT runs.*, jobs.vc AS "job_vc" FROM runs JOIN jobs ON jobs.job_id = runs.job_id '
                    "WHERE runs.kind = 'main' AND runs.node_rank = 0 AND runs.state = ? AND runs.partner IS NOT NULL",
            (RunState.RUNNING.value,))
        shared = speeds_of_pairs([(run, run.job_vc) for run in pairs], [job_id]).get(job_id)
    near = reader.records(
        "runs", "SELECT * FROM runs WHERE started_at IS NOT NULL AND (job_id = ? OR partner = ? OR job_id IN "
                "(SELECT partner FROM runs WHERE job_id = ? AND partner IS NOT NULL))", (job_id, job_id, job_id))
    spans = spans_by_job(near, now, [job_id]).get(job_id, [])
    names = sorted({r.host for r in runs if isinstance(r.host, str)})
    hosts = reader.records("hosts", f"SELECT name, reachable, last_seen, last_error FROM hosts WHERE name IN "
                                    f"({_marks(names)})", names) if names else []
    down = {h.name: words for h in hosts if (words := host_down_words(h, now))}
    return status_view(found[0], runs, shared, spans, down, now)


def history(reader: PlainReader, query: HistoryQuery) -> HistoryPage:
    """`queries.history`: finished jobs matching `query`, latest end first, one page and the total."""
    states = query.states_listed()
    where, params = [f"state IN ({_marks(states)})"], list(states)
    for column, values in (('"user"', query.users), ("vc", query.vcs)):
        if values:
            where.append(f"{column} IN ({_marks(values)})")
            params.extend(values)
    for sql, value, given in (("end_time >= ?", query.since, query.since is not None),
                              ("end_time < ?", query.until, query.until is not None)):
        if given:
            where.append(sql)
            params.append(value)
    condition = " AND ".join(where)
    total = reader.scalar(f"SELECT count(*) FROM jobs WHERE {condition}", params) or 0
    jobs = reader.records("jobs", f"SELECT {_columns(_HISTORY_COLUMNS)} FROM jobs WHERE {condition} "
                                  "ORDER BY end_time DESC, seq DESC LIMIT ? OFFSET ?",
                          [*params, query.limit, query.offset])
    ids = [j.job_id for j in jobs]
    runs = [r for chunk in range(0, len(ids), ID_CHUNK) for r in reader.records(
        "runs", "SELECT job_id, run_id, kind, host, state, started_at, ended_at FROM runs WHERE job_id IN "
                f"({_marks(ids[chunk:chunk + ID_CHUNK])})", ids[chunk:chunk + ID_CHUNK])]
    facts = run_facts(runs, {j.job_id: saved_float(j.end_time) for j in jobs})
    return HistoryPage([history_row(j, facts.get(j.job_id)) for j in jobs], int(total), query)

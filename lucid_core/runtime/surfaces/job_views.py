"""What readers show of jobs (the queue, one job's status, a page of history), shaped from job and run rows.

Two read paths feed it the same rows: the ORM sessions of `queries` (the HTTP API, the plugin's pages) and the
plain DB-API reads of `plain_views` (`lucid queue`, `status` and `history`, which answer before SQLAlchemy
could be imported). A row is anything with its table's columns as attributes. Nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lucid_core.domain import TERMINAL_STATES, JobState, RunState
from lucid_core.policy.view import saved_float
from lucid_core.runtime.round.pairs import mutual_pairs
from lucid_core.runtime.surfaces.shared_time import SharedSpan, shared_words

_STATE_ORDER = {JobState.RUNNING.value: 0, JobState.PROFILING.value: 1, JobState.QUEUED.value: 2,
                JobState.SUBMITTED.value: 3}
#: The states `queue` lists, and those `history` lists when asked for none.
ACTIVE_STATES = tuple(s.value for s in JobState if s not in TERMINAL_STATES)
FINISHED_STATES = tuple(s.value for s in TERMINAL_STATES)

#: What `history` can show per job, and the columns `lucid history` prints by default.
HISTORY_FIELDS = ("job_id", "name", "user", "vc", "gpus", "state", "submit_time", "start_time", "end_time",
                  "queued_s", "elapsed_s", "exit_code", "end_reason", "ended_in_profiling", "time_limit_s",
                  "ran_s", "hosts")
HISTORY_DEFAULT_FIELDS = ("job_id", "name", "user", "vc", "gpus", "state", "end_time", "elapsed_s", "exit_code")
#: How many job ids one IN list of a history page's run read holds (SQLite takes 32,766 parameters at most).
ID_CHUNK = 500
#: The largest history limit and offset: more jobs than any store holds, and within the stores' 64-bit integers.
MAX_HISTORY_ROWS = 2**31 - 1

UNSTORABLE = "must be UTF-8 encodable text without NUL characters"
_NOT_ENDED_RUNS = (RunState.PLANNED.value, RunState.RUNNING.value)


#: Why a round stops a run (`runs.stop_reason`), in words.
STOP_REASON_WORDS = {"peer_ended": "another node of its job ended", "cancel": "its job was cancelled",
                     "preempt": "it yields its GPUs to other work", "profiling_window": "its profiling window is over",
                     "unreadable": "its status stayed unreadable on its host",
                     "time_limit": "its job reached its time limit"}


def stopping_words(run: Any) -> str | None:
    """Why a run that has not ended is being stopped, or None when no stop is pending. A run with no start time
    is one whose launch went out unanswered: it may or may not have started, and its job waits for the stop."""
    if run.state != RunState.RUNNING or not run.stop_reason:
        return None
    reason = run.stop_reason if isinstance(run.stop_reason, str) else str(run.stop_reason)
    words = f"stopping: {STOP_REASON_WORDS.get(reason, reason)}"
    return words + ("; its launch went unanswered, so it may not have started" if run.started_at is None else "")


class UnknownJob(KeyError):
    def __str__(self) -> str:
        return f"no job {self.args[0]!r}"


def storable(text: str) -> bool:
    """True when a store (SQLite or PostgreSQL) and a host shell can take the text as given; a job id, user
    or VC failing it can name no stored job (PostgreSQL refuses such text even in a query: a 500)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number_or_zero(value: Any) -> int:
    """A stored position for sorting; anything but an int (NULL, or text a hand edit stored) sorts first."""
    return value if type(value) is int else 0


def _priority(gpus: Any, predicted: Any) -> float | None:
    """GPUs x predicted seconds, the main queue's order; None unless both are stored numbers (a hand edit can
    leave text in either on SQLite: `'many' * 300.0` failed `lucid queue`, the API's queue and the queue page)."""
    count, seconds = saved_float(gpus), saved_float(predicted)
    return None if count is None or seconds is None else count * seconds


def queue_rows(jobs: Iterable[Any], *, priority_in_reason: bool = True) -> list[dict[str, Any]]:
    """Waiting and running jobs: running first, then each queue in the policy's order. Without
    `priority_in_reason`, the pending reason leaves the priority out (`lucid queue` prints it in a column)."""
    from lucid_core.runtime.round.pending import describe_pending  # with the policy's modules: not for `history`

    rows = sorted(jobs, key=lambda r: (_STATE_ORDER.get(r.state, 9), _number_or_zero(r.queue_position),
                                       _number_or_zero(r.seq)))
    return [{"job_id": r.job_id, "state": r.state, "name": r.name, "user": r.user, "vc": r.vc, "gpus": r.gpus,
             "position": r.queue_position, "predicted_duration_s": r.predicted_duration,
             "priority_gpu_s": _priority(r.gpus, r.predicted_duration),
             "share_class": r.share_class,
             "pending_reason": describe_pending(r.state, r.queue_position, r.pending_reason, r.gpus,
                                                r.predicted_duration if priority_in_reason else None),
             "submit_time": r.submit_time}
            for r in rows]


#: Slurm's short names (and spellings) of the finished states, as `sacct -s` takes them.
FINISHED_STATE_ALIASES = {"CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED", "COMPLETE": "COMPLETED",
                          "CANCELED": "CANCELLED"}
#: Slurm's short names for the states `squeue -t` takes, each with the states it stands for here (pending: not
#: yet on the main cluster, as the queue page counts waiting, profiling included; PR, profiling alone, is ours).
QUEUE_STATE_ALIASES = {"PD": ("SUBMITTED", "PROFILING", "QUEUED"), "PENDING": ("SUBMITTED", "PROFILING", "QUEUED"),
                       "R": ("RUNNING",), "PR": ("PROFILING",)}


@dataclass(frozen=True)
class QueueQuery:
    """Which waiting and running jobs to list: any of `users`, of `vcs`, in any of `states` (each empty: all).
    It filters the queue in the policy's order, so a job's position stays its place among every job's."""

    users: tuple[str, ...] = ()
    vcs: tuple[str, ...] = ()
    states: tuple[str, ...] = ()

    @classmethod
    def of_text(cls, users: str | None = None, vcs: str | None = None, states: str | None = None) -> QueueQuery:
        """A query from comma-separated lists as `squeue -u alice,bob -t PD,R` takes them (states in any case,
        Slurm's short names too)."""
        named = [QUEUE_STATE_ALIASES.get(s.upper(), (s.upper(),)) for s in _listed(states)]
        return cls(users=tuple(_listed(users)), vcs=tuple(_listed(vcs)),
                   states=tuple(dict.fromkeys(s for g in named for s in g)))

    def __post_init__(self) -> None:
        unknown = [s for s in self.states if s not in ACTIVE_STATES]
        if unknown:
            finished = [s for s in unknown if FINISHED_STATE_ALIASES.get(s, s) in FINISHED_STATES]
            raise ValueError(f"state {', '.join(unknown)} is not a waiting or running state; use "
                             f"{', '.join(ACTIVE_STATES)} (or PD, R, PR)"
                             + ("; finished jobs: lucid history" if finished else ""))
        for name in ("users", "vcs"):
            bad = [x for x in getattr(self, name) if not storable(x)]
            if bad:
                raise ValueError(f"{name[:-1]} {UNSTORABLE}, got {bad[0]!r}")

    def select(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows (`queue_rows`' dicts) this query asks for, in their order."""
        return [r for r in rows if (not self.users or r["user"] in self.users)
                and (not self.vcs or r["vc"] in self.vcs) and (not self.states or r["state"] in self.states)]

    @property
    def narrows(self) -> bool:
        """Whether it leaves any job out."""
        return bool(self.users or self.vcs or self.states)


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


def _count(value: Any) -> int | None:
    """A stored sample count as an int; None for anything else."""
    return value if type(value) is int else None


def speeds_of_pairs(runs_with_vc: Sequence[tuple[Any, str]], job_ids: Sequence[str] | None = None,
                    ) -> dict[str, SharedSpeed]:
    """`SharedSpeed` of each job (of `job_ids` if given) whose rank-0 main run, given with its job's VC, shares
    GPUs with a running partner naming it back (`mutual_pairs`). Its figures are read as untrusted: text a hand
    edit left in one reads as not measured (it failed the running page, the metrics and the job's API answer)."""
    vc_of = {run.job_id: vc for run, vc in runs_with_vc}
    out = {}
    for pair in mutual_pairs(run for run, _ in runs_with_vc):
        for run, other in (pair, pair[::-1]):
            if job_ids is None or run.job_id in job_ids:
                out[run.job_id] = SharedSpeed(run.job_id, other.job_id, vc_of[run.job_id],
                                              saved_float(run.observed_speed), saved_float(run.observed_speed_at),
                                              _count(run.observed_speed_samples), run.observed_speed_emulated)
    return out


def shares_now(runs: Iterable[Any]) -> bool:
    """Whether one of a job's runs is running beside a named partner (only then is its shared speed read)."""
    return any(x.state == RunState.RUNNING and x.partner is not None for x in runs)


def host_down_words(host: Any, now: float) -> str | None:
    """What a run's status says of its host when the host does not answer (None when it does): the run's
    state is then only its last known one. Read as untrusted (a hand edit can leave text in any column)."""
    if host is None or type(host.reachable) not in (bool, int) or host.reachable:
        return None
    from lucid_core.units import duration_words, one_line

    seen = saved_float(host.last_seen)
    ago = f", last answered {duration_words(max(0.0, now - seen))} ago" if seen is not None else ""
    said = one_line(host.last_error)
    error = f": {said}" if said else ""
    return f"host {host.name} unreachable{ago}{error}; the run is as last seen there"


def status_view(job: Any, runs: Sequence[Any], shared: SharedSpeed | None,
                spans: Sequence[SharedSpan], hosts_down: Mapping[str, str] | None = None,
                now: float | None = None) -> dict[str, Any]:
    """A job's row and runs (oldest first), its pending reason in words, and its measured speed while it shares
    GPUs: what `lucid status` and the API's job status show. `hosts_down`: words for the hosts of its runs that
    do not answer (`host_down_words`), said on its runs not ended."""
    down = hosts_down or {}
    facts = run_facts(runs, now).get(job.job_id) if now is not None else None
    from lucid_core.runtime.round.pending import pending_text

    planned = next((x.partner for x in reversed(runs) if x.partner), None)
    return {"job_id": job.job_id, "state": job.state, "name": job.name, "user": job.user, "vc": job.vc,
            "gpus": job.gpus, "command": job.command, "submit_time": job.submit_time, "start_time": job.start_time,
            "end_time": job.end_time, "exit_code": job.exit_code, "end_reason": job.end_reason,
            "ended_in_profiling": job.ended_in_profiling, "cancel_requested": job.cancel_requested,
            # the longest it may run, all its runs together (null: no limit); past it the round stops it
            "time_limit_s": getattr(job, "time_limit_s", None),
            # when it first started on the main cluster (`start_time` is its latest run's: later after a yield)
            # and its runs' time in all, profiling included (what its time limit counts)
            "first_start_time": facts.first_start if facts is not None else None,
            "ran_s": facts.ran_s if facts is not None else None,
            "pending_reason": pending_text(job),
            "runs": [{"run_id": x.run_id, "host": x.host, "kind": x.kind, "gpus": x.gpu_indices, "state": x.state,
                      "pid": x.pid, "exit_code": x.exit_code, "outcome": x.outcome, "stopping": stopping_words(x),
                      "host_down": down.get(x.host) if x.state in _NOT_ENDED_RUNS else None}
                     for x in runs],
            # the speed measured while it shares GPUs with `partner` (null: running alone or not yet measured)
            "shared": asdict(shared) if shared is not None else None,
            # when it really shared a GPU, from the run records (a planned partner that never ran beside it: none)
            "shared_spans": [{**asdict(x), "seconds": x.seconds} for x in spans],
            "sharing": shared_words(spans, planned, job.state in FINISHED_STATES)}


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
        unknown = [s for s in self.states if s not in FINISHED_STATES]
        if unknown:
            return f"state {', '.join(unknown)} is not a finished state; use {', '.join(sorted(FINISHED_STATES))}"
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

    @property
    def users(self) -> list[str]:
        """The users asked for (`user` may list several, comma-separated, as `lucid queue -u` takes them)."""
        return _listed(self.user)

    @property
    def vcs(self) -> list[str]:
        """The VCs asked for (comma-separated, as `users`)."""
        return _listed(self.vc)

    def states_listed(self) -> list[str]:
        """The end states asked for, or every finished state."""
        return list(self.states) or list(FINISHED_STATES)


def _listed(text: str | None) -> list[str]:
    """The comma-separated items of a filter, blanks dropped, each once."""
    return list(dict.fromkeys(x.strip() for x in (text or "").split(",") if x.strip()))


@dataclass(frozen=True)
class HistoryPage:
    rows: list[dict[str, Any]]
    total: int
    query: HistoryQuery


def _span(start: Any, end: Any) -> float | None:
    """`end - start`, at least 0, when both are stored numbers; None otherwise (not yet, or text a hand edit left
    in a time column of a SQLite store: it failed `lucid history` and the history page whole)."""
    first, last = saved_float(start), saved_float(end)
    return None if first is None or last is None else max(0.0, last - first)


def yielded(jobs: Iterable[Any]) -> list[str]:
    """The ids of the jobs that yielded their GPUs at least once: their stored start is their last run's."""
    return [j.job_id for j in jobs if isinstance(j.yields, int) and not isinstance(j.yields, bool) and j.yields > 0]


@dataclass(frozen=True)
class RunFacts:
    """What a job's runs say of it: when it first started on the main cluster (its stored start is its last
    run's), how long its runs ran in all (profiling included: what its time limit counts) and the hosts its
    main runs ran on, in the order it used them."""

    first_start: float | None
    ran_s: float
    hosts: tuple[str, ...]


def run_facts(runs: Iterable[Any], now: float | Mapping[str, float | None]) -> dict[str, RunFacts]:
    """`RunFacts` per job of `runs` (rows with job_id, run_id, kind, host, state, started_at and ended_at), its
    run time counted up to `now`: one time, or each job's own (a finished job's end: the same figure on every
    clock; a job without one is left out). Read as untrusted: a time that is no number counts as none."""
    from lucid_core.runtime.round.run_time import time_run

    by_job: dict[str, list[Any]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    out = {}
    for job_id, mine in by_job.items():
        until = now.get(job_id) if isinstance(now, Mapping) else now
        if until is None:
            continue
        main = [r for r in mine if r.kind == "main" and saved_float(r.started_at) is not None]
        main.sort(key=lambda r: saved_float(r.started_at) or 0.0)
        out[job_id] = RunFacts(saved_float(main[0].started_at) if main else None, time_run(mine, until),
                               tuple(dict.fromkeys(r.host for r in main if isinstance(r.host, str))))
    return out


def history_row(j: Any, facts: RunFacts | None = None) -> dict[str, Any]:
    """One finished job as `history` lists it (`HISTORY_FIELDS`), with what its runs say (`facts`: None when
    its runs are not kept). Its start is its first on the main cluster (its stored start is its last run's:
    counted from there, the runs before a yield read as time queued and were left out of its elapsed time)."""
    first_start = facts.first_start if facts is not None and yielded([j]) else None
    start = first_start if first_start is not None else j.start_time
    return {"job_id": j.job_id, "name": j.name, "user": j.user, "vc": j.vc, "gpus": j.gpus, "state": j.state,
            "submit_time": j.submit_time, "start_time": start, "end_time": j.end_time,
            "queued_s": _span(j.submit_time, start), "elapsed_s": _span(start, j.end_time),
            "exit_code": j.exit_code, "end_reason": j.end_reason, "ended_in_profiling": j.ended_in_profiling,
            "time_limit_s": getattr(j, "time_limit_s", None),
            # its runs' time in all (profiling and each run after a yield: what --time-limit counts); the hosts
            # its main runs ran on (sacct's NodeList)
            "ran_s": facts.ran_s if facts is not None else None,
            "hosts": ",".join(facts.hosts) if facts is not None and facts.hosts else None}

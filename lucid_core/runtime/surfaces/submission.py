"""Submitting and cancelling jobs: validation with errors that name the field, then a store row."""

from __future__ import annotations

import math
import shlex
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError

from lucid_core.domain import TERMINAL_STATES, JobState
from lucid_core.runtime.hosts.inputs import ENV_NAME_PATTERN
from lucid_core.runtime.store.schema import HostRow, JobEventRow, JobRow
from lucid_core.runtime.surfaces.job_views import UNSTORABLE, UnknownJob, storable

if TYPE_CHECKING:  # the queries read `UnknownJob` from here: they start faster without the fleet's modules
    from lucid_core.runtime.store.store import Store

MAX_NAME = 256
MAX_USER = 128
MAX_VC = 128
MAX_COMMAND = 65536
MAX_ENV_VARS = 64
MAX_ENV_VALUE = 4096
MAX_IDEMPOTENCY_KEY = 128
MAX_TIME_LIMIT_S = 366 * 86400.0  # a year: past that a limit is a typo, not a plan
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES",)
RESERVED_ENV_PREFIX = "LUCID_"
SEQ_LOCK_KEY = 0x6C756369_6A6F6273  # PostgreSQL advisory lock held while a job id is allocated


class SubmissionError(ValueError):
    """A submission was refused; `errors` maps each bad field to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))


@dataclass(frozen=True)
class JobRequest:
    """What a user submits. `command` is a shell command line, or an argv list joined with quoting."""

    command: str | Sequence[str]
    gpus: int
    user: str
    vc: str
    name: str = ""
    amp: bool = False
    long_cold_start: bool = False
    preemptible: bool = False  # the job resumes from its own checkpoints: Lucid may stop and restart it
    env: Mapping[str, str] = field(default_factory=dict)
    workload: str | None = None  # catalog key for hosts with emulated telemetry
    # the longest it may run, all its runs together (seconds); past it the round stops it and it fails
    time_limit_s: float | None = None
    # a client-chosen key: submitting again with the same key (same user) returns the first job
    idempotency_key: str | None = None


def only_vc(store: Store, asked_as: str = "vc") -> str:
    """The VC of a cluster whose main hosts all have one (what a submission naming none goes to); ValueError
    listing them when there are several (naming the option as the caller takes it), or saying there is none."""
    vcs = sorted(vc_capacity(store))
    if len(vcs) == 1:
        return vcs[0]
    if not vcs:
        raise ValueError("no VC to submit to: the store has no main host (lucid hosts add NAME --vc VC ...)")
    raise ValueError(f"{asked_as} is needed: this cluster has {len(vcs)} VCs: {', '.join(vcs)}")


def command_line(command: str | Sequence[str]) -> str:
    """The shell command to run: a single string as given, an argv list shell-joined."""
    if isinstance(command, str):
        return command
    parts = list(command)
    return parts[0] if len(parts) == 1 else shlex.join(parts)


def vc_capacity(store: Store) -> dict[str, int]:
    """GPUs per VC on main-pool hosts that are not being removed."""
    from lucid_core.runtime.store.schema import GpuRow

    with store.session() as s:
        rows = s.execute(
            select(HostRow.vc, func.count(GpuRow.index))
            .join(GpuRow, GpuRow.host == HostRow.name)
            .where(HostRow.pool == "main")
            .group_by(HostRow.vc)).all()
    return {vc: int(n) for vc, n in rows}


#: Sequence numbers are read below this, the largest PostgreSQL's integer column holds: SQLite orders text above
#: every number, so a job whose `seq` a hand edit set to text is not the maximum (it was, and `'x' + 1` failed every
#: submission after it), nor is one edited to the column's largest value (every next number overflowed).
MAX_SEQ = 2**31 - 1


def next_seq(highest: object) -> int:
    """The sequence number after the highest stored one (a float a hand edit left rounds down); 1 for none."""
    if isinstance(highest, bool) or not isinstance(highest, int | float) or not math.isfinite(highest):
        return 1
    return math.floor(highest) + 1


def control_character_problem(text: str) -> str | None:
    """Why `text` may not be a job's name, user or VC when it holds a control character (Unicode category Cc):
    a newline or an escape sequence printed raw by `lucid queue` forges rows or recolours the terminal."""
    found = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    if found is None:
        return None
    where = text.index(found) + 1
    return f"must not contain control characters (newlines, tabs, escapes), got {found!r} at character {where}"


def validate(request: JobRequest, capacity: Mapping[str, int]) -> dict[str, str]:
    """Field -> problem for everything wrong with the request (empty when it is fine)."""
    errors: dict[str, str] = {}
    command = command_line(request.command) if request.command is not None else ""
    if not command.strip():
        errors["command"] = "must not be empty"
    elif len(command) > MAX_COMMAND:
        errors["command"] = f"is {len(command)} characters; at most {MAX_COMMAND}"
    elif "\x00" in command:
        errors["command"] = "must not contain NUL characters"
    elif not storable(command):
        errors["command"] = UNSTORABLE
    gpus = request.gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        errors["gpus"] = f"must be a whole number, got {gpus!r}"
    elif gpus < 1:
        errors["gpus"] = f"must be positive, got {gpus}"
    for name, value, limit in (("user", request.user, MAX_USER), ("vc", request.vc, MAX_VC),
                               ("name", request.name, MAX_NAME)):
        if not isinstance(value, str):
            errors[name] = f"must be text, got {type(value).__name__}"
        elif name != "name" and not value.strip():
            errors[name] = "must not be empty"
        elif len(value) > limit:
            errors[name] = f"is {len(value)} characters; at most {limit}"
        elif not storable(value):
            errors[name] = UNSTORABLE
        elif (problem := control_character_problem(value)) is not None:  # the command may hold newlines
            errors[name] = problem
    if "vc" not in errors:
        if request.vc not in capacity:
            known = ", ".join(sorted(capacity)) or "none: add main hosts first"
            errors["vc"] = f"unknown VC {request.vc!r}; known: {known}"
        elif "gpus" not in errors:
            largest_vc, largest = max(capacity.items(), key=lambda kv: kv[1])
            if gpus > largest:
                errors["gpus"] = (f"{gpus} GPUs is more than any VC has "
                                  f"(largest: {largest_vc} with {largest})")
            elif gpus > capacity[request.vc]:
                errors["gpus"] = f"{gpus} GPUs is more than VC {request.vc} has ({capacity[request.vc]})"
    env = request.env or {}
    if len(env) > MAX_ENV_VARS:
        errors["env"] = f"has {len(env)} variables; at most {MAX_ENV_VARS}"
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME_PATTERN.match(key):
            errors[f"env.{key}"] = "is not a valid environment variable name"
        elif key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX):
            errors[f"env.{key}"] = "is set by the scheduler and may not be given"
        elif not isinstance(value, str) or len(value) > MAX_ENV_VALUE or not storable(value):
            errors[f"env.{key}"] = f"value must be text of at most {MAX_ENV_VALUE} characters"
    if request.workload is not None and (not isinstance(request.workload, str) or len(request.workload) > 256
                                         or not storable(request.workload)):
        errors["workload"] = "must be a catalog key of at most 256 characters"
    limit = request.time_limit_s
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not 1 <= limit <= MAX_TIME_LIMIT_S):  # NaN fails the comparison too
        errors["time_limit_s"] = f"must be seconds from 1 to {MAX_TIME_LIMIT_S:.0f} (366 days), got {limit!r}"
    if request.idempotency_key is not None and not _usable_key(request.idempotency_key):
        errors["idempotency_key"] = f"must be non-empty text of at most {MAX_IDEMPOTENCY_KEY} characters"
    return errors


def _usable_key(key: object) -> bool:
    """Whether an idempotency key is one the store can hold (non-empty text, at most MAX_IDEMPOTENCY_KEY)."""
    return isinstance(key, str) and bool(key.strip()) and len(key) <= MAX_IDEMPOTENCY_KEY and storable(key)


def keyed_job(store: Store, request: JobRequest) -> str | None:
    """The job the request's user submitted with its idempotency key (keys are scoped by user: a pair of
    columns); SubmissionError when that job was asked for with other fields (a key reused for another job: the
    IETF Idempotency-Key draft's 422, not the first job silently). A request without a VC matches the VC the
    first one was given. Looked up before the request is checked against the fleet, so a retry finds its job
    whatever changed since (a host removed, a second VC added)."""
    if not _usable_key(request.idempotency_key) or not isinstance(request.user, str) or not storable(request.user):
        return None  # `validate` says what is wrong with it
    with store.session() as s:
        row = s.scalar(select(JobRow).where(JobRow.user == request.user,
                                            JobRow.idempotency_key == request.idempotency_key))
        if row is None:
            return None
        stored = (row.command, row.gpus, row.vc, row.name, row.env, row.workload, row.amp, row.long_cold_start,
                  row.preemptible, row.time_limit_s)
    asked = (command_line(request.command), request.gpus, request.vc, request.name, dict(request.env or {}),
             request.workload, request.amp, request.long_cold_start, request.preemptible,
             None if request.time_limit_s is None else float(request.time_limit_s))
    differ = [name for name, a, b in zip(KEYED_FIELDS, stored, asked, strict=True)
              if a != b and not (name == "vc" and b == "")]
    if differ:
        raise SubmissionError({"idempotency_key": f"already used for job {row.job_id}, which was submitted with "
                                                  f"another {', '.join(differ)}: use a new key for a new job"})
    return row.job_id


#: The fields a submission again with the same idempotency key must repeat (JobRequest's, in `keyed_job`).
KEYED_FIELDS = ("command", "gpus", "vc", "name", "env", "workload", "amp", "long_cold_start", "preemptible",
                "time_limit_s")


@dataclass(frozen=True)
class KeyedJob:
    """A job found by its idempotency key."""

    job_id: str
    state: str
    idempotency_key: str
    cancel_note: str | None = None  # the message of its first cancel request (who asked), None when none
    vc: str = ""  # the VC it was submitted to


def latest_job_with_key_prefix(store: Store, user: str, prefix: str) -> KeyedJob | None:
    """The last job `user` submitted with an idempotency key starting with `prefix`; None when there is none.
    A client that keys each try of one task alike (Airflow's operator: one prefix per task instance and run)
    finds what an earlier try left running."""
    if not isinstance(prefix, str) or not prefix or not storable(prefix) or len(prefix) > MAX_IDEMPOTENCY_KEY:
        raise ValueError(f"key prefix must be text of 1 to {MAX_IDEMPOTENCY_KEY} characters")
    with store.session() as s:  # substr, not LIKE: a prefix holding % or _ matches only itself
        row = s.execute(select(JobRow.job_id, JobRow.state, JobRow.idempotency_key, JobRow.vc)
                        .where(JobRow.user == user,
                               func.substr(JobRow.idempotency_key, 1, len(prefix)) == prefix)
                        .order_by(JobRow.seq.desc()).limit(1)).first()
        note = None if row is None else s.scalar(
            select(JobEventRow.message).where(JobEventRow.job_id == row[0], JobEventRow.kind == "cancel_requested")
            .order_by(JobEventRow.id).limit(1))
    return None if row is None else KeyedJob(str(row[0]), str(row[1]), str(row[2]), note, str(row[3] or ""))


def fleet_problem(store: Store, gpus: int, vc: str) -> str | None:
    """Why no set of VC `vc`'s main hosts could ever hold a `gpus`-GPU job (None when some could).

    The rule is the policy's own (GpuPool.could_hold): one host with room, or, for a job wider than the
    fleet's node size (its largest host), whole hosts of that size and one more for the rest."""
    from lucid_core.policy.placement import fleet_could_hold
    from lucid_core.runtime.round.view_builder import fleet_node_size
    from lucid_core.runtime.store.schema import GpuRow

    with store.session() as s:
        rows = s.execute(select(HostRow.name, HostRow.vc, HostRow.pool, func.count(GpuRow.index))
                         .join(GpuRow, GpuRow.host == HostRow.name)
                         .group_by(HostRow.name, HostRow.vc, HostRow.pool)).all()
    size = fleet_node_size(int(n) for _, _, _, n in rows)
    mine = sorted((int(n) for _, host_vc, pool, n in rows if host_vc == vc and pool == "main"), reverse=True)
    if size is None or not mine or fleet_could_hold(gpus, mine, size):
        return None
    whole = sum(1 for n in mine if n == size)
    return (f"{gpus} GPUs can never be placed in VC {vc}: its hosts have {', '.join(map(str, mine))} GPUs; "
            f"a job fits on one host, or takes whole {size}-GPU hosts ({whole} in this VC) and one more "
            f"for the rest")


def submit(store: Store, request: JobRequest, *, now: float | None = None) -> str:
    """Validate and record a job; returns its id. Raises SubmissionError naming each bad field."""
    from lucid_core.runtime.hosts.inventory import submitter_user_problem

    existing = keyed_job(store, request)
    if existing is not None:
        return existing  # the same submission again: nothing new is written, whatever the fleet is now
    errors = validate(request, vc_capacity(store))
    if "user" not in errors and "vc" not in errors:  # hosts that run jobs as their user need an OS user name
        problem = submitter_user_problem(store, request.user, request.vc)
        if problem is not None:
            errors["user"] = problem
    if "gpus" not in errors and "vc" not in errors:
        problem = fleet_problem(store, request.gpus, request.vc)
        if problem is not None:
            errors["gpus"] = problem
    if errors:
        raise SubmissionError(errors)
    now = store.now() if now is None else now
    key = request.idempotency_key
    floor = 1
    for _ in range(20):
        try:
            with store.session() as s:
                if store.dialect == "postgresql":  # serialize id allocation: no retry storm under bursts
                    s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SEQ_LOCK_KEY})
                seq = max(floor, next_seq(s.scalar(select(func.max(JobRow.seq)).where(JobRow.seq < MAX_SEQ))))
                job_id = f"j{seq:06d}"
                s.add(JobRow(
                    job_id=job_id, seq=seq, name=request.name, user=request.user, vc=request.vc,
                    gpus=request.gpus, command=command_line(request.command), env=dict(request.env or {}),
                    workload=request.workload, idempotency_key=key, amp=request.amp,
                    long_cold_start=request.long_cold_start, preemptible=request.preemptible,
                    time_limit_s=None if request.time_limit_s is None else float(request.time_limit_s),
                    state=JobState.SUBMITTED.value, submit_time=now))
                s.flush()
                s.add(JobEventRow(job_id=job_id, time=now, kind="submitted",
                                  message=f"{request.gpus} GPU(s) in VC {request.vc} by {request.user}"))
            return job_id
        except IntegrityError:  # another submitter took the same number, or the same key, or a job whose seq a
            existing = keyed_job(store, request)  # hand edit moved still holds this id: try past it
            if existing is not None:
                return existing  # the same submission, made at the same moment by another caller
            floor = seq + 1
            continue
    raise RuntimeError("could not allocate a job id after 20 tries")


@dataclass(frozen=True)
class CancelAnswer:
    """A cancel request's outcome: the job's state after it, and `requested` (asked now), `already_requested`
    (asked before: the next round stops it) or `ended` (it had ended: nothing to cancel)."""

    job_id: str
    state: str
    outcome: str

    @property
    def pending(self) -> bool:
        """Whether a cancel is now waiting for the next round."""
        return self.outcome != "ended"


def request_cancel(store: Store, job_id: str, *, now: float | None = None,
                   message: str = "cancel requested") -> CancelAnswer:
    """Ask for a job to be cancelled; the next round stops it. `message` is its cancel_requested event's (who
    asked)."""
    now = store.now() if now is None else now
    with store.session() as s:
        job = s.get(JobRow, job_id) if storable(job_id) else None
        if job is None:
            raise UnknownJob(job_id)
        if JobState(job.state) in TERMINAL_STATES:
            return CancelAnswer(job_id, job.state, "ended")
        if job.cancel_requested:
            return CancelAnswer(job_id, job.state, "already_requested")
        job.cancel_requested = True
        s.add(JobEventRow(job_id=job_id, time=now, kind="cancel_requested", message=message))
        return CancelAnswer(job_id, job.state, "requested")


def cancel(store: Store, job_id: str, *, now: float | None = None, message: str = "cancel requested") -> str:
    """`request_cancel`, answering the job's state after the request."""
    return request_cancel(store, job_id, now=now, message=message).state

"""Records that flow through the simulator: trace rows in, per-job outcomes out."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

from lucid_core.domain import Job


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One job of a trace. `duration` is its exclusive run time: known to the simulator only."""

    job_id: str
    submit_time: float  # seconds since the trace's epoch (see Trace.epoch)
    duration: float
    gpus: int
    vc: str = "default"
    user: str = ""
    name: str = ""
    state: str = ""  # the trace's final state when it has one (COMPLETED, FAILED, ...)
    # the job resumes from its own checkpoints (a `preemptible` column, or `--preemptible-share`): only such
    # a job may yield under Lucid, as live; Tiresias and Pollux preempt every job, as they assume checkpoints
    preemptible: bool = False
    # the longest it could run (a stored job's `--time-limit`, replayed by the System Tuner; traces have none):
    # the policy predicts no longer, as live
    time_limit_s: float | None = None

    def to_job(self) -> Job:
        """The job a policy sees: what a submission says (never the duration); a user-less trace's VC as user."""
        return Job(job_id=self.job_id, user=self.user or self.vc, vc=self.vc, gpus=self.gpus,
                   submit_time=self.submit_time, name=self.name, preemptible=self.preemptible,
                   time_limit_s=self.time_limit_s)


def replay_problem(record: TraceRecord) -> str | None:
    """Why the simulator cannot replay `record` (a non-finite time, a negative duration, no GPU), or None."""
    if not (isinstance(record.submit_time, Real) and math.isfinite(record.submit_time)):
        return f"submit time {record.submit_time!r} is not a finite number"
    if not (isinstance(record.duration, Real) and math.isfinite(record.duration) and record.duration >= 0):
        return f"duration {record.duration!r} is not a finite number of seconds >= 0"
    if not (isinstance(record.gpus, Integral) and not isinstance(record.gpus, bool) and record.gpus >= 1):
        return f"GPU count {record.gpus!r} is not a positive integer"
    return None


@dataclass(frozen=True, slots=True)
class Workload:
    """The model configuration a trace job is mapped to, with its exclusive profile."""

    key: str  # e.g. "ResNet18/CIFAR-10/bs64/amp0"
    gpu_util: float
    mem_util: float
    gpu_mem_mb: float
    amp: bool
    label: int | None = None  # measured sharing score when the catalog has one


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job in a simulated run. Times are seconds on the trace clock."""

    job_id: str
    vc: str
    gpus: int
    submit_time: float
    duration: float
    start_time: float  # start of the run that finished it (profiling run for jobs ended there)
    end_time: float
    queue_delay: float  # all waiting: profiling queue + main queue (+ time preempted)
    ended_in_profiling: bool = False
    shared_seconds: float = 0.0  # time spent co-located with a partner
    preemptions: int = 0
    profiled: bool = False

    @property
    def jct(self) -> float:
        return self.end_time - self.submit_time


def with_preemptible_share(records: Sequence[TraceRecord], share: float, seed: int = 0) -> list[TraceRecord]:
    """`records` with a seeded share of them marked preemptible and the rest not (a what-if for a trace
    that says nothing of checkpoints). A job's draw hangs on its id and the seed only, so the same job is
    drawn in every window and cluster size, and the jobs drawn at a share are among those drawn at a larger one."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the preemptible share must be between 0 and 1, got {share}")
    return [replace(r, preemptible=share >= 1.0 or _draw(seed, r.job_id) < share) for r in records]


def _draw(seed: int, job_id: str) -> float:
    """A number in [0, 1) fixed by (seed, job id): stable across runs and processes (no hash salt)."""
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def stored_flag(value: Any) -> bool:
    """A stored yes/no column as a replay reads it: only a real yes is yes (NULL, NaN, 0 and text are no)."""
    if value is None or isinstance(value, str | bytes):
        return False
    try:
        return bool(value == 1)  # True, 1, 1.0 and NumPy's true (pandas rows)
    except (TypeError, ValueError):
        return False


def records_from_frame(frame: Any) -> list[TraceRecord]:
    """A job log frame (job_id, submit_time, duration, gpus, vc, user, name columns) as trace rows."""
    return [TraceRecord(job_id=r.job_id, submit_time=float(r.submit_time), duration=float(r.duration),
                        gpus=int(r.gpus), vc=str(r.vc), user=str(r.user), name=str(r.name))
            for r in frame.itertuples(index=False)]

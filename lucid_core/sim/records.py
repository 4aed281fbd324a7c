"""Records that flow through the simulator: trace rows in, per-job outcomes out."""

from __future__ import annotations

from dataclasses import dataclass
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

    def to_job(self) -> Job:
        """The job a policy sees: what a submission says (never the duration); a user-less trace's VC as user.
        Trace jobs are taken to resume from checkpoints, as every preemptive simulator (Tiresias's, the
        Lucid artifact's) takes them; a preemption costs them the configured checkpoint cost."""
        return Job(job_id=self.job_id, user=self.user or self.vc, vc=self.vc, gpus=self.gpus,
                   submit_time=self.submit_time, name=self.name, preemptible=True)


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


def records_from_frame(frame: Any) -> list[TraceRecord]:
    """A job log frame (job_id, submit_time, duration, gpus, vc, user, name columns) as trace rows."""
    return [TraceRecord(job_id=r.job_id, submit_time=float(r.submit_time), duration=float(r.duration),
                        gpus=int(r.gpus), vc=str(r.vc), user=str(r.user), name=str(r.name))
            for r in frame.itertuples(index=False)]

"""What a policy decides. Each decision carries the reason a person reads in the log."""

from __future__ import annotations

from dataclasses import dataclass

from lucid_core.config import LucidConfig
from lucid_core.domain import GpuRef, SharingMode


@dataclass(frozen=True, slots=True)
class StartProfiling:
    job_id: str
    gpus: tuple[GpuRef, ...]
    window_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class StopProfiling:
    """The profiling window is over: stop the run; the job joins the main queue."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Place:
    """Start a job on the main cluster, alone or on the GPUs of `partner`."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str
    partner: str | None = None
    profile_in_place: bool = False  # sample its profile during this run instead of a separate window


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job and put it back in the queue: Tiresias's demotions, Lucid's yielding (only jobs
    that resume from checkpoints). The job loses `checkpoint_cost_s` of run time."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Unpair:
    """A pair turned unstable: the job may not share again."""

    job_id: str
    partner: str
    reason: str


@dataclass(frozen=True, slots=True)
class SetSharingMode:
    mode: SharingMode
    reason: str


@dataclass(frozen=True, slots=True)
class SetProfilerParams:
    tprof_s: float
    nprof_gpus: int
    borrowed_nodes: int
    reason: str


Decision = StartProfiling | StopProfiling | Place | Preempt | Unpair | SetSharingMode | SetProfilerParams


def checkpoint_cost_s(config: LucidConfig, gpus: int) -> float:
    """Run time a preemption costs a job (checkpoint + cold restart): the Lucid artifact charges
    40 s for a job within one node and 60 s for a wider one (Tiresias measured 62 s on average)."""
    tiresias = config.tiresias
    return tiresias.checkpoint_cost_s if gpus <= config.cluster.gpus_per_node else tiresias.checkpoint_cost_wide_s

"""The one small interface every scheduling policy implements (Lucid and the baselines).

Drivers (the simulator, the live round) call the hooks as things happen and `schedule`
once per round; the same object decides in both. Everything a driver may ask of a policy is
declared here, with defaults, so neither driver looks for attributes by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lucid_core.domain import Job, Profile
from lucid_core.policy.decisions import Decision
from lucid_core.policy.placement import COMPACT, Placement
from lucid_core.policy.view import ClusterView


@dataclass(frozen=True)
class PolicyParts:
    """What explanations and what-ifs read from a policy: its models and where each came from.
    None where the policy has no such part (FIFO has no duration model)."""

    duration_model: Any = None  # predict_duration(jobs) -> seconds; contributions for explanations
    packing_model: Any = None  # the packing classifier behind the binder
    forecaster: Any = None  # the throughput forecaster
    model_sources: dict[str, str] = field(default_factory=dict)  # model kind -> "promoted v3", "history", ...


class SchedulingPolicy:
    """Base of every policy: the hooks a policy must implement, and the optional parts with defaults."""

    name: str = "policy"
    #: True when the policy may stop running jobs (Tiresias; Lucid only to yield, only jobs that resume).
    preemptive: bool = False
    #: True when the policy stops jobs whether or not they said they resume from checkpoints (Tiresias):
    #: its figures hold only for jobs that do, and reports say so
    assumes_checkpoints: bool = False
    #: True when new jobs go through a profiling window before the main queue.
    profiles: bool = False
    #: where the policy's main-cluster starts go (placement.py); compact unless a policy says otherwise
    placement: Placement = COMPACT

    def on_submit(self, view: ClusterView, job: Job) -> None:
        """A job arrived: put it in the profiling queue or the main queue."""
        raise NotImplementedError

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        """A job that already had its profiling chance waits again (its run was lost or stopped)."""
        raise NotImplementedError

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        """A profiling window ended (on the pool or in place) with this profile."""
        raise NotImplementedError

    def on_restored(self, view: ClusterView, jobs: Sequence[Job]) -> None:
        """Queued, profiled jobs come back with the class and prediction an earlier round gave them from
        the same models (the live store keeps them): put them back in their queue, all in one call (a live
        round restores tens of thousands). Default: each as if just profiled."""
        for job in jobs:
            assert job.profile is not None
            self.on_profiled(view, job, job.profile)

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        """A job ended; `run_time` is how long its last run lasted (for history models)."""
        raise NotImplementedError

    def schedule(self, view: ClusterView) -> list[Decision]:
        """Decide what to start, stop, pair or retune now; reserve what it starts in `view`."""
        raise NotImplementedError

    def precompute(self, jobs: Sequence[Job]) -> None:
        """A replay's whole job list before it starts, for policies that predict in one batch (default: none)."""

    def next_wakeup(self, view: ClusterView) -> float | None:
        """When the policy wants to decide again with nothing else happening (a timer); None: never."""
        return None

    def describe(self) -> PolicyParts:
        """Its models, for `lucid explain` and `lucid eta` (default: none)."""
        return PolicyParts()

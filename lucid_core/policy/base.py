"""The one small interface every scheduling policy implements (Lucid and the baselines).

Drivers (the simulator, the live round) call the hooks as things happen and `schedule`
once per round; the same object decides in both.
"""

from __future__ import annotations

from typing import Protocol

from lucid_core.domain import Job, Profile
from lucid_core.policy.decisions import Decision
from lucid_core.policy.view import ClusterView


class SchedulingPolicy(Protocol):
    name: str
    #: True when the policy may stop running jobs (Tiresias); Lucid never does.
    preemptive: bool
    #: True when new jobs go through a profiling window before the main queue.
    profiles: bool

    def on_submit(self, view: ClusterView, job: Job) -> None:
        """A job arrived: put it in the profiling queue or the main queue."""

    def on_requeue(self, view: ClusterView, job: Job) -> None:
        """A job that already had its profiling chance waits again (its run was lost or stopped)."""

    def on_profiled(self, view: ClusterView, job: Job, profile: Profile) -> None:
        """A profiling window ended (on the pool or in place) with this profile."""

    def on_finish(self, view: ClusterView, job: Job, run_time: float) -> None:
        """A job ended; `run_time` is how long its last run lasted (for history models)."""

    def schedule(self, view: ClusterView) -> list[Decision]:
        """Decide what to start, stop, pair or retune now; reserve what it starts in `view`."""
        ...

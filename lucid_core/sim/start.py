"""Where a simulation starts when it does not start from an empty cluster, and when it may stop.

`lucid eta` asks "what if the policy kept deciding from here?": the engine then starts from a
cluster caught mid-run (jobs running, some paired, some in a profiling window, others queued)
instead of replaying a trace from time zero. The same engine runs both, so a what-if and a
replay agree on how pairs slow down, how profiling windows end and when queued jobs start.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from lucid_core.domain import Job
from lucid_core.policy.view import ClusterView
from lucid_core.sim.records import TraceRecord

DurationsOf = Callable[[Sequence[Job]], Sequence[float]]


@dataclass(frozen=True)
class StartState:
    """A cluster at time `now`, with the true work of every job the engine should carry on.

    `view` holds the allocations (pool, GPUs, partner, start, profiling window) and the queues
    exactly as the policy keeps them; the engine continues from it and changes it in place
    (so a state starts one run only).
    `jobs` has one record per running or waiting job, its `duration` the job's whole work in
    exclusive seconds; `remaining` the work left of each running one. Allocations with no record
    (GPUs held out of service) keep their GPUs for the whole run.
    `rates` holds measured speeds (exclusive seconds of work per second, in (0, 1]) of running
    pair members: such a member runs at its rate until the pair changes, instead of the engine's
    co-located speed of the two workloads; a rate of a job running alone is ignored.
    `closed` names nodes that take no new work for the whole run (live: unreachable, draining or
    cooling-down hosts): the engine holds each GPU that is or comes free there, as every live round
    holds them, so a job ending on such a node frees nothing for the queue.
    """

    view: ClusterView
    now: float
    jobs: tuple[TraceRecord, ...]
    remaining: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    closed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        bad = {job_id: rate for job_id, rate in self.rates.items() if not 0.0 < rate <= 1.0}
        if bad:
            raise ValueError(f"rates must lie in (0, 1] (a job at rate 0 never ends): {bad}")

    @classmethod
    def from_view(cls, view: ClusterView, durations_of: DurationsOf, *, held: Collection[str] = (),
                  rates: Mapping[str, float] | None = None) -> StartState:
        """The start state of `view`: every running job (but `held`) and every waiting one.

        `durations_of(jobs)` gives each job's whole work (a what-if takes predicted durations); a
        running job is assumed to have run at full speed so far, so it has its duration less
        the time since its run started left (never below zero). `rates`: measured pair speeds
        (see the class), kept for the running jobs carried. The view's closed nodes stay closed.
        """
        waiting = set(view.profiling_queue) | set(view.unpredicted)
        carried = [job for job_id, job in view.jobs.items()
                   if (job_id in view.allocations and job_id not in held)
                   or job_id in waiting or job_id in view.queue]
        durations = [float(d) for d in durations_of(carried)] if carried else []
        if len(durations) != len(carried):
            raise ValueError(f"{len(durations)} durations for {len(carried)} jobs")
        records = tuple(TraceRecord(job.job_id, job.submit_time, d, job.gpus, job.vc, job.user, job.name,
                                    preemptible=job.preemptible)
                        for job, d in zip(carried, durations, strict=True))
        remaining = {}
        for rec in records:
            alloc = view.allocations.get(rec.job_id)
            if alloc is not None:
                remaining[rec.job_id] = max(0.0, rec.duration - max(0.0, view.now - alloc.start))
        kept = {job_id: float(rate) for job_id, rate in (rates or {}).items() if job_id in remaining}
        return cls(view, view.now, records, remaining, kept, frozenset(view.closed_nodes))


@dataclass(frozen=True)
class Until:
    """When a run may stop before every job has finished; the first condition met ends it.

    `job_finished`: once this job has finished. `time`: before any event later than this.
    `rounds`: after this many scheduling rounds (calls of the policy's `schedule`).
    """

    job_finished: str | None = None
    time: float | None = None
    rounds: int | None = None

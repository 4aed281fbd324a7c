"""Yielding: a running job whose remaining GPU-time dwarfs a waiting job's gives its GPUs back.

Lucid orders the queue by predicted GPU-time and never stops a job in the usual case. Without
any preemption, two kinds of job hold the cluster for everyone: a job the model underestimated
(it runs on long past its prediction) and a job that is long by nature and started while the
queue was short. Preemptive peers (Tiresias) bound both by attained service; the literature on
size-based scheduling with estimates (SRPT on estimates, PSBS's "late" jobs) bounds them by an
estimate of the work left, which is what this rule uses:

- a running job's work left is its predicted end minus now, or, once it has outlived its
  prediction, as long again as it has run (the doubling guess `predicted_release` makes);
- a waiting job may take a node's GPUs from running jobs whose work left, in GPU-seconds, is more
  than `yield_margin` times its own predicted GPU-time (a job the guard found overdue takes them
  from any job whose work left is over that margin times the checkpoint cost's worth);
- never from a shared pair, a job in a profiling window, a job the guard started (its slowdown is
  already spent), one that has run less than `yield_min_run` times its checkpoint cost in this
  run (so no job pays more than a small share of its run in restarts), or a job that did not
  say it resumes from its checkpoints (live: the job's `preemptible` flag).

A stopped job goes back to the queue keyed by its work left, so it returns when that is the least
left; each stop raises the estimate of a late job, so churn is bounded by the margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lucid_core.domain import GpuRef, Job, Pool
from lucid_core.policy.decisions import Decision, Place, Preempt
from lucid_core.policy.orchestrator import is_overdue_key, predicted_release
from lucid_core.policy.placement import COMPACT, Placement
from lucid_core.policy.view import Allocation, ClusterView, SortKey
from lucid_core.units import duration_words

#: a guard's overdue job competes as if its own GPU-time were this many checkpoint costs
OVERDUE_AS_COSTS = 1.0
#: what a taker's placement reason says when it took GPUs by seniority (`lucid explain` reads it)
SENIORITY_WORDS = "long jobs submitted after it: long jobs run in arrival order"


@dataclass(frozen=True, slots=True)
class YieldRule:
    """The knobs of yielding (`orchestrator.yield_margin`, `orchestrator.yield_min_run`)."""

    margin: float
    min_run: float
    max_yields: int = 1
    wide: bool = True
    interval_s: float = 60.0  # checked at most this often (the first round after), like Tiresias's rounds
    max_takers: int = 8  # waiting jobs that may claim GPUs in one round (bounds a round's work)

    @property
    def enabled(self) -> bool:
        return self.margin > 0


@dataclass(frozen=True, slots=True)
class Seniority:
    """Yielding by arrival within the long class: `oldest(view)` is the waiting long job submitted first,
    `is_long(job)` tells whether a job is in the long class."""

    oldest: Callable[[ClusterView], str | None]
    is_long: Callable[[Job], bool]


def work_left_gpu_s(view: ClusterView, job_id: str) -> float:
    """GPU-seconds a running job is expected to still need (`predicted_release`'s estimate)."""
    return max(0.0, predicted_release(view, job_id) - view.now) * view.jobs[job_id].gpus


def _may_stop(view: ClusterView, job_id: str, rule: YieldRule, cost_s: Callable[[Job], float],
              guard_started: Callable[[Job], bool]) -> bool:
    """Whether a running job may be stopped at all (whatever the waiting job)."""
    alloc = view.allocations[job_id]
    job = view.jobs[job_id]
    if alloc.pool is not Pool.MAIN or alloc.partner is not None or not job.preemptible or job.yields >= rule.max_yields:
        return False
    if alloc.profiling_until is not None and alloc.profiling_until > view.now:
        return False
    if not rule.wide and job.gpus > view.main.gpus_per_node:
        return False
    return view.now - alloc.start >= rule.min_run * cost_s(job) and not guard_started(job)


def stoppable_jobs(view: ClusterView, rule: YieldRule, cost_s: Callable[[Job], float],
                   guard_started: Callable[[Job], bool]) -> dict[str, float]:
    """Running jobs that may yield, with their work left in GPU-seconds (one pass over the running set)."""
    jobs = view.jobs  # the flag first: where no job resumes from checkpoints (the default) that is all it reads
    return {job_id: work_left_gpu_s(view, job_id) for job_id in view.allocations
            if jobs[job_id].preemptible and _may_stop(view, job_id, rule, cost_s, guard_started)}


def _node_victims(view: ClusterView, name: str, need: int, whole: bool,
                  eligible: dict[str, float]) -> list[str] | None:
    """Running jobs to stop on one node so that `need` GPUs (every GPU when `whole`) are free;
    None when that is not possible. Most work left first, so the fewest jobs are stopped.
    `eligible`: the jobs this taker may stop, with their work left."""
    node = view.main.nodes[name]
    free = node.free
    if whole:
        need = node.gpus
    if free >= need:
        return []
    occupants: dict[str, int] = {}
    for slot in node.occupants:
        for job_id in slot:
            occupants[job_id] = occupants.get(job_id, 0) + 1
    candidates = [j for j in occupants if j in eligible]
    if whole and len(candidates) < len(occupants):
        return None
    candidates.sort(key=lambda j: -eligible[j])
    chosen: list[str] = []
    for job_id in candidates:
        if free >= need:
            break
        chosen.append(job_id)
        free += occupants[job_id]
    return chosen if free >= need else None


def _claim(view: ClusterView, job: Job, eligible: dict[str, float]) -> list[str] | None:
    """The running jobs whose GPUs let `job` start compactly (the fewest GPUs stopped), or None.
    Only nodes where a stoppable job runs are looked at (a node with room would have taken the job).
    A stopped job may span other nodes too: all of its GPUs come free."""
    size = view.main.gpus_per_node
    vc = view.placement_vc(job)
    names = dict.fromkeys(ref.host for j in eligible for ref in view.allocations[j].gpus)
    closed = view.closed_nodes
    nodes = [n for n in view.main.nodes.values()  # pool order: ties go to the first node
             if n.name in names and n.vc == vc and n.gpus >= min(job.gpus, size) and not n.held
             and n.name not in closed]
    if job.gpus <= size:
        best: tuple[int, list[str]] | None = None
        for node in nodes:
            victims = _node_victims(view, node.name, job.gpus, False, eligible)
            if victims:
                stopped = sum(view.jobs[v].gpus for v in victims)
                if best is None or stopped < best[0]:
                    best = (stopped, victims)
        return None if best is None else best[1]
    count = -(-job.gpus // size)
    options = []
    for node in nodes:
        victims = _node_victims(view, node.name, 0, True, eligible)
        if victims is not None:
            options.append((sum(view.jobs[v].gpus for v in victims), node.name, victims))
    empty = [n for n in view.main.nodes.values() if n.vc == vc and n.free == n.gpus == size and not n.held
             and n.name not in names and n.name not in closed]
    options.extend((0, n.name, []) for n in empty)  # whole free nodes count too
    if len(options) < count:
        return None
    options.sort()
    return list(dict.fromkeys(v for _, _, victims in options[:count] for v in victims)) or None


def _own_gpu_s(job: Job, key: SortKey, cost_s: Callable[[Job], float]) -> float:
    """What a waiting job competes with: its predicted GPU-time; an overdue job, a checkpoint's worth."""
    return OVERDUE_AS_COSTS * cost_s(job) * job.gpus if is_overdue_key(key) else job.priority


def _eligible(view: ClusterView, taker: Job, left: dict[str, float], bound_gpu_s: float,
              seniority: Seniority | None) -> dict[str, float]:
    """The stoppable jobs a waiting job may take GPUs from, with their work left: those with more than
    `bound_gpu_s` left, and, for the oldest waiting long job, long jobs submitted after it."""
    is_long = seniority.is_long if seniority is not None and seniority.is_long(taker) else None
    return {j: w for j, w in left.items()
            if w > bound_gpu_s or (is_long is not None and view.jobs[j].submit_time > taker.submit_time
                                   and is_long(view.jobs[j]))}


def _take_gpus(view: ClusterView, job: Job, key: SortKey, rule: YieldRule, left: dict[str, float],
               requeue: Callable[[Job, float], None], cost_s: Callable[[Job], float],
               reason_of: Callable[[Job, SortKey], str], placement: Placement,
               online_window_s: float | None, seniority: Seniority | None = None) -> list[Decision]:
    bound = rule.margin * _own_gpu_s(job, key, cost_s)
    victims = _claim(view, job, _eligible(view, job, left, bound, seniority))
    if not victims:
        return []
    stopped = {victim_id: view.stop(victim_id) for victim_id in victims}
    gpus: tuple[GpuRef, ...] | None = placement.place(view.main, job.gpus, view.placement_vc(job))
    if gpus is None:  # the freed GPUs do not make a fit after all: nobody is stopped
        _restore(view, stopped)
        return []
    decisions: list[Decision] = []
    by_seniority = False
    for victim_id in stopped:
        victim = view.jobs[victim_id]
        left_gpu_s = left.pop(victim_id)
        left_s = left_gpu_s / victim.gpus
        victim.yields += 1
        requeue(victim, left_s)
        by_seniority |= left_gpu_s <= bound
        why = (f"about {duration_words(left_s)} of its run left x {victim.gpus} GPU(s) is more than {rule.margin:g} x "
               "the waiting job's predicted GPU-time" if left_gpu_s > bound else
               "both are long jobs and that one was submitted first (long jobs run in arrival order)")
        decisions.append(Preempt(victim_id, (
            f"yields its GPUs to {job.job_id}: {why}; it resumes from its checkpoint when its turn comes again")))
    online = online_window_s is not None and job.profile is None
    view.start(job.job_id, Pool.MAIN, gpus, profiling_until=view.now + online_window_s if online else None)  # type: ignore[operator]
    reason = reason_of(job, key) + f"; took the GPUs of {', '.join(victims)}"
    if by_seniority:
        reason += f" ({SENIORITY_WORDS})"
    if online:
        reason += f"; profiled online during its first {online_window_s:g} s"
    decisions.append(Place(job.job_id, gpus, reason, profile_in_place=online))
    return decisions


def _restore(view: ClusterView, stopped: dict[str, Allocation]) -> None:
    """Put stopped runs back exactly as they were (start time, GPUs, window)."""
    for job_id, alloc in stopped.items():
        view.start(job_id, alloc.pool, alloc.gpus, profiling_until=alloc.profiling_until, at=alloc.start)
        if alloc.mem_mb:
            view.set_profile_mem(job_id, alloc.mem_mb)


def yield_to_waiting(view: ClusterView, rule: YieldRule, requeue: Callable[[Job, float], None],
                     cost_s: Callable[[Job], float], guard_started: Callable[[Job], bool],
                     reason_of: Callable[[Job, SortKey], str], placement: Placement = COMPACT,
                     online_window_s: float | None = None, seniority: Seniority | None = None) -> list[Decision]:
    """After the placement scan (holds released): let the first waiting jobs in key order take GPUs
    from running jobs with far more work left, stop those (Preempt) and start the takers (Place).
    The guard's reserved nodes stay held for every job but the one they are reserved for; nodes the
    driver closed (draining, unreachable hosts) give nothing. `requeue(job, work_left_s)` puts a
    stopped job back in the queue; `online_window_s`: a taker without a profile is profiled in its run;
    `seniority`: the oldest waiting long job also takes GPUs from younger long jobs."""
    if not rule.enabled or len(view.queue) == 0:
        return []
    heads = sorted((items[0][0], items[0][1]) for items in view.queue.parts().values())[:rule.max_takers]
    left = stoppable_jobs(view, rule, cost_s, guard_started)
    most = max(left.values(), default=0.0)
    heads = [(k, j) for k, j in heads if rule.margin * _own_gpu_s(view.jobs[j], k, cost_s) < most]
    oldest = seniority.oldest(view) if seniority is not None and left else None
    if oldest is not None and all(j != oldest for _, j in heads):
        heads.append((view.queue.key_of(oldest), oldest))
    if not heads:
        return []  # nothing running has that much work left: the usual case, one pass to find out
    decisions: list[Decision] = []
    reservation = view.reservation
    for key, job_id in heads:
        job = view.jobs[job_id]
        if job_id not in view.queue or job.predicted_duration is None:
            continue
        if reservation is not None and reservation[0] != job_id and reservation[0] in view.queue:
            view.main.hold([n for n in reservation[1] if n in view.main.nodes])
        # what a stop frees on a closed node (a wide victim's other hosts) is no taker's either
        view.main.hold([n for n in view.closed_nodes if n in view.main.nodes])
        try:
            decisions.extend(_take_gpus(view, job, key, rule, left, requeue, cost_s, reason_of, placement,
                                        online_window_s, seniority if job_id == oldest else None))
        finally:
            view.main.release_holds()
    return decisions

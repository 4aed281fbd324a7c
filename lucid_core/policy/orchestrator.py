"""Resource Orchestrator (paper section 9, algorithm 2): priority order and placement.

priority = GPUs x predicted duration, ascending. A scan places every queued job that fits
compactly (alone, or with an affine partner when the binder allows), skipping the rest; the scan
itself stops nothing (yielding, policy/yielding.py, runs after it). The scan visits only the
head of each (GPU demand, share class) part of the queue, since jobs within a part fit or fail alike.

Starvation guard (bounded slowdown): a job that has waited `guard_slowdown` times its own
predicted run time (at least the profiling window) is *overdue*. Overdue jobs go ahead of every
other job, oldest deadline first, and the first overdue job that cannot start gets a
reservation: the nodes that running jobs are predicted to free first for it take no other job
until it starts. The bound is relative to the job's own size, so it needs no constant in
GPU-seconds and means the same on any trace and cluster size; the reservation is what makes it
work for wide jobs, which greedy backfilling would otherwise pass over for ever.

Tail guard (`guard_tail`): a slowdown bound lets a job predicted to run for days wait days times
the bound. The tail guard bounds the wait by the queue's own state instead: a job that has waited
`guard_tail` times the P99 queueing of recently finished jobs is overdue too (its deadline is its
submit time plus that bound, so such jobs go oldest first, with the same reservation). The bound
is a multiple of what the cluster currently makes its unluckiest 1% wait, so it needs no constant
in seconds either.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable

from lucid_core.domain import GpuRef, Job, Pool
from lucid_core.policy.decisions import Decision, Place
from lucid_core.policy.placement import COMPACT, GpuPool, Placement
from lucid_core.policy.predictors import DEFAULT_DURATION_S, DurationPredictor
from lucid_core.policy.view import ClusterView, SortKey
from lucid_core.units import duration_words, gpu_time_words

PartnerFinder = Callable[[ClusterView, Job], "tuple[str, str] | None"]
Reserver = Callable[[ClusterView, Job], "list[str]"]

#: overdue keys sit this far below every priority (GPU-seconds), ordered by their deadline
OVERDUE_OFFSET = 1e12


def is_overdue_key(key: SortKey) -> bool:
    return key[0] < 0.0


def predicted_release(view: ClusterView, job_id: str) -> float:
    """When a running job is expected to free its GPUs: its predicted end, or, once it has
    outlived the prediction (or has none yet), as long again as it has run so far; never after its time
    limit (the round stops it there: what backfilling may count on, as Slurm's does)."""
    alloc = view.allocations[job_id]
    job = view.jobs[job_id]
    elapsed = view.now - alloc.start
    if job.predicted_duration is not None and alloc.start + job.predicted_duration > view.now:
        release = alloc.start + job.predicted_duration
    else:
        release = view.now + max(elapsed, view.tprof_s)
    if job.time_limit_s is not None:
        release = min(release, max(view.now, alloc.start + job.time_limit_s))
    return release


def _node_ready_at(view: ClusterView, name: str, job: Job, release: dict[str, float]) -> float:
    """When a node is predicted to have room for the job: `gpus` free GPUs for a job within a node,
    every GPU free for a wider one (`release` caches running jobs' predicted releases)."""
    node = view.main.nodes[name]
    now = view.now
    times = []
    for slot in node.occupants:
        ready = now  # a free GPU is ready now, a busy one when its last occupant leaves
        for occupant in slot:
            at = release.get(occupant)
            if at is None:
                at = release[occupant] = predicted_release(view, occupant)
            if at > ready:
                ready = at
        times.append(ready)
    times.sort()
    need = min(job.gpus, node.gpus)
    return times[need - 1] if job.gpus <= view.main.gpus_per_node else times[-1]


def reservation_nodes(view: ClusterView, job: Job) -> list[str]:
    """The main nodes of the job's VC that running jobs are predicted to free soonest for it:
    one node with `gpus` GPUs free for a job within a node, whole nodes for a wider one."""
    size = view.main.gpus_per_node
    vc = view.placement_vc(job)
    release: dict[str, float] = {}
    ranked = sorted((_node_ready_at(view, name, job, release), name) for name, node in view.main.nodes.items()
                    if node.vc == vc and node.gpus >= min(job.gpus, size))
    count = 1 if job.gpus <= size else -(-job.gpus // size)
    return [name for _, name in ranked[:count]]


def reservation_start(view: ClusterView, job: Job, names: list[str]) -> float:
    """When the reserved job is predicted to start on its nodes (the shadow time of EASY backfilling)."""
    release: dict[str, float] = {}
    return max((_node_ready_at(view, n, job, release) for n in names if n in view.main.nodes), default=view.now)


def place_queue(view: ClusterView, find_partner: PartnerFinder | None = None,
                strict_order: bool = False, online_window_s: float | None = None,
                reserve: Reserver | None = None, backfill_reserved: bool = False, backfill_margin: float = 1.0,
                placement: Placement = COMPACT) -> list[Decision]:
    """Scan the main queue in key order and place what fits.

    `find_partner(view, job)` returns (partner id, reason) for a job with no exclusive fit.
    `strict_order` stops at the first job that cannot start (FIFO without backfilling).
    `online_window_s`: a job placed without a profile is profiled during the first seconds of
    its run (jobs wider than Nprof, or no profiling pool).
    `reserve(view, job)`: nodes to hold for the first overdue job that cannot start; they stay
    out of every fit test until the caller's `view.main.release_holds()`.
    `backfill_reserved` (EASY backfilling): a job predicted to end before the reserved job is
    predicted to start may still use the reserved nodes; `backfill_margin`: it must end before then even
    if it runs this many times its prediction (an underestimate delays the reserved job, an overestimate
    only forgoes a backfill). `placement`: the policy's (compact by default).
    """
    decisions: list[Decision] = []
    parts = view.queue.parts()
    heads = [(items[0][0], part) for part, items in parts.items()]
    heapq.heapify(heads)
    queued_vcs = {part[0] for part in parts}
    smallest_unfit: dict[str, int] = {}  # per VC: a job this wide found no fit, so wider ones won't
    main = view.main
    shadow: float | None = None  # predicted start of the reserved job, once nodes are held
    while heads:
        key, part = heapq.heappop(heads)
        items = parts.get(part)
        if not items or items[0][0] != key:
            continue
        job_id = items[0][1]
        job = view.jobs[job_id]
        vc = part[0]
        placed = False
        if job.gpus < smallest_unfit.get(vc, 1 << 30):
            gpus = placement.place(main, job.gpus, vc)
            if gpus is not None:
                online = online_window_s is not None and job.profile is None
                view.start(job_id, Pool.MAIN, gpus,
                           profiling_until=view.now + online_window_s if online else None)  # type: ignore[operator]
                reason = exclusive_reason(view, job, key)
                if online:
                    reason += f"; profiled online during its first {online_window_s:g} s"
                decisions.append(Place(job_id, gpus, reason, profile_in_place=online))
                placed = True
            else:
                smallest_unfit[vc] = job.gpus
        if (not placed and shadow is not None and job.predicted_duration is not None
                and view.now + backfill_margin * job.predicted_duration <= shadow):
            gpus = _fit_ignoring_holds(main, job.gpus, vc, placement)
            if gpus is not None:
                view.start(job_id, Pool.MAIN, gpus)
                at = f", even at {backfill_margin:g}x its predicted run time" if backfill_margin != 1 else ""
                decisions.append(Place(job_id, gpus, exclusive_reason(view, job, key) + (
                    f"; backfilled on nodes held for {view.reserved_for}: predicted to end before that job's "
                    f"predicted start in {duration_words(shadow - view.now)}{at}")))
                placed = True
        if not placed and find_partner is not None:
            found = find_partner(view, job)
            if found is not None:
                partner, reason = found
                gpus = view.allocations[partner].gpus
                view.start(job_id, Pool.MAIN, gpus, partner=partner)
                decisions.append(Place(job_id, gpus, reason, partner=partner))
                placed = True
        if placed:
            items = parts.get(part)
            if items:
                heapq.heappush(heads, (items[0][0], part))
        elif strict_order:
            break
        elif reserve is not None and is_overdue_key(key) and not view.main.held:
            kept = view.reservation
            if kept is None or kept[0] != job_id or not all(n in main.nodes for n in kept[1]):
                # a reservation stays on its nodes until its job starts: they only drain meanwhile
                kept = view.reservation = (job_id, reserve(view, job))
            main.hold(kept[1])
            view.reserved_for = job_id
            if backfill_reserved:
                start = reservation_start(view, job, kept[1])
                shadow = start if math.isfinite(start) else None  # an unknowable start: nothing backfills
            smallest_unfit.clear()  # fewer nodes now: fit knowledge starts again
        if find_partner is None and all(smallest_unfit.get(v) == 1 for v in queued_vcs):
            break  # nothing free in any queued job's VC and nothing to share: the rest waits
    return decisions


def _fit_ignoring_holds(main: GpuPool, gpus: int, vc: str, placement: Placement) -> tuple[GpuRef, ...] | None:
    """A fit that may use held nodes (the holds stay afterwards)."""
    held = list(main.held)
    main.release_holds()
    try:
        return placement.place(main, gpus, vc)
    finally:
        main.hold(held)


def ordering_rule(job: Job, now: float, guard_slowdown: float, floor_s: float,
                  place_reason: str | None = None, partner: str | None = None,
                  long_cap: float = math.inf) -> tuple[str, str]:
    """Which rule put the job where it is, as (rule, words): "sharing" when it started on a partner's
    GPUs, "yielding" when it started on GPUs a longer job gave back, "guard" when the starvation guard
    moved it ahead, else "priority" (GPU-time order); a job that yielded says so after its rule.
    A started job is judged by the reason of the decision that placed it; a waiting one by now.
    `long_cap`: the long class's cap in GPU-seconds (the scheduler state's `long_cap`)."""
    if partner is not None:
        return "sharing", (f"sharing: it could not start alone, so it runs on the GPUs of {partner}, "
                           "an affine partner the binder allowed")
    rule, words = _ordering_rule(job, now, guard_slowdown, floor_s, place_reason, long_cap)
    if job.yields:
        words += (f"; it yielded its GPUs {job.yields} time(s) to much shorter jobs and is ordered by the work "
                  "it has left")
    return rule, words


def _ordering_rule(job: Job, now: float, guard_slowdown: float, floor_s: float,
                   place_reason: str | None, long_cap: float) -> tuple[str, str]:
    if place_reason is not None and "took the GPUs of" in place_reason:
        taken = place_reason.rsplit("took the GPUs of ", 1)[1]
        if "run in arrival order" in taken:
            return "yielding", (f"yielding by seniority: {taken.split(' (', 1)[0]} gave back its GPUs; both are long "
                                "jobs and this one was submitted first (long jobs run in arrival order)")
        return "yielding", (f"yielding: {taken} gave back its GPUs, having far more predicted work left than this "
                            "job's whole predicted GPU-time")
    pred = job.predicted_duration
    if pred is None:
        return "priority", "not ordered yet: it waits for profiling or for its duration estimate"
    waited = (job.start_time if place_reason is not None and job.start_time is not None else now) - job.submit_time
    bound = guard_slowdown * max(pred, floor_s)
    guarded = "starvation guard" in place_reason if place_reason is not None else (
        guard_slowdown > 0 and waited >= bound)
    if guarded:
        return "guard", (f"starvation guard: it waited {duration_words(waited)}, at least {guard_slowdown:g} x its "
                         f"predicted {duration_words(max(pred, floor_s))}, so it goes ahead of every shorter job "
                         "and the first such job gets nodes reserved until it starts")
    words = (f"priority: {job.gpus} GPU(s) x predicted {duration_words(pred)} = {gpu_time_words(job.priority)}; "
             "jobs with less predicted GPU-time go first")
    if job.priority >= long_cap:
        words += (f"; at or above the long class's {gpu_time_words(long_cap)} it is a long job: long jobs go in "
                  "arrival order, and the oldest waiting one may take the GPUs of younger long jobs")
    if guard_slowdown > 0 and place_reason is None:
        words += f"; the starvation guard moves it ahead after {duration_words(bound)} of waiting"
    return "priority", words


def exclusive_reason(view: ClusterView, job: Job, key: SortKey) -> str:
    if is_overdue_key(key) and job.predicted_duration is not None:
        waited = view.now - job.submit_time
        return (f"starvation guard: waited {duration_words(waited)}, over its allowed slowdown of its predicted "
                f"{duration_words(job.predicted_duration)}, so it goes ahead of shorter jobs; compact exclusive fit")
    if job.predicted_duration is not None:
        return (f"priority {gpu_time_words(job.priority)} = {job.gpus} GPU(s) x predicted "
                f"{duration_words(job.predicted_duration)}; compact exclusive fit")
    return "next in order; compact exclusive fit"


def _usable_prediction(value: object) -> float:
    """A model's prediction, or DEFAULT_DURATION_S where it is not a finite number: a NaN would make the
    job's key unordered and the long-class cap arbitrary, an infinity would never let it run (a small or
    negative one is raised to the floor by the caller)."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_DURATION_S
    return seconds if math.isfinite(seconds) else DEFAULT_DURATION_S


def floored_prediction(job: Job, value: object) -> float:
    """A model's prediction for `job` as every caller takes it: a usable number, at least what the job
    is known to have run already and at least a second; never past the job's time limit, where it is stopped."""
    floored = max(_usable_prediction(value), job.known_min_duration, 1.0)
    return floored if job.time_limit_s is None else max(1.0, min(floored, job.time_limit_s))


class Orchestrator:
    """Predicts durations in batches and keeps the main queue in priority order, overdue jobs first."""

    def __init__(self, duration_model: DurationPredictor, use_estimator: bool = True, aging: float = 0.0,
                 guard_slowdown: float = 0.0, guard_floor_s: float = 0.0, long_quantile: float = 1.0,
                 long_window: int = 1000, guard_tail: float = 0.0, tail_window: int = 4000,
                 tail_quantile: float = 0.99) -> None:
        self.duration_model = duration_model
        self.use_estimator = use_estimator
        self.aging = aging
        self.guard_slowdown = guard_slowdown
        self.guard_floor_s = guard_floor_s
        self.long_quantile = long_quantile
        self.long_window = long_window
        self.guard_tail = guard_tail
        self.tail_quantile = tail_quantile
        self.recent_waits_: deque[float] = deque(maxlen=tail_window)
        self.tail_bound_: float = math.inf  # seconds of waiting past which a job is overdue
        self._waits_since_update = 0

    def observe_wait(self, wait_s: float) -> None:
        """Record a finished job's queueing; the tail bound follows the recent waits' quantile."""
        if self.guard_tail <= 0:
            return
        self.recent_waits_.append(max(0.0, wait_s))
        self._waits_since_update += 1
        n = len(self.recent_waits_)
        if n < self.recent_waits_.maxlen // 2 or self._waits_since_update < max(1, n // 20):
            return  # too few waits to read a P99 from; then re-read every 5% of the window
        self._waits_since_update = 0
        ranked = sorted(self.recent_waits_)
        quantile = ranked[min(n - 1, int(self.tail_quantile * n))]
        self.tail_bound_ = self.guard_tail * max(quantile, self.guard_floor_s)

    def _update_long_cap(self, view: ClusterView, jobs: list[Job]) -> None:
        """The long-job cap: the `long_quantile` quantile of the latest `long_window` jobs' predicted
        GPU-time. Both live in the view's saved state, so a live round starts from the last one's."""
        if self.long_quantile >= 1.0:
            return
        recent = view.recent_priorities
        kept_for, ordered = view.recent_sorted
        if kept_for is not recent or len(ordered) != len(recent):  # a restored or replaced window
            ordered = sorted(recent)
        added = [job.priority for job in jobs]
        recent.extend(added)
        for priority in added:
            bisect.insort(ordered, priority)
        for priority in recent[:-self.long_window]:
            at = bisect.bisect_left(ordered, priority)
            if at == len(ordered) or ordered[at] != priority:  # a NaN breaks the order: sort afresh
                ordered = sorted(recent[-self.long_window:])
                break
            del ordered[at]
        del recent[:-self.long_window]
        view.recent_sorted = (recent, ordered)
        view.long_cap = ordered[min(len(ordered) - 1, int(self.long_quantile * len(ordered)))]

    def long_cap(self, view: ClusterView) -> float:
        """The cap keys are made with: the view's (saved) cap while the long class is on, else none."""
        return view.long_cap if self.long_quantile < 1.0 else math.inf

    def is_long(self, view: ClusterView, job: Job) -> bool:
        """The job is in the long class: predicted GPU-time at or above the recent `long_quantile` cap."""
        return self.long_quantile < 1.0 and job.predicted_duration is not None and job.priority >= view.long_cap

    def oldest_long(self, view: ClusterView) -> str | None:
        """The waiting long-class job submitted first (a heap of arrivals, so O(log n) per round)."""
        heap = view.long_heap
        while heap and (heap[0][1] not in view.queue or not self.is_long(view, view.jobs[heap[0][1]])):
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def overdue_at(self, job: Job) -> float | None:
        """When the job's wait reaches `guard_slowdown` x max(predicted run time, floor); None: never."""
        if self.guard_slowdown <= 0 or job.predicted_duration is None:
            return None
        return job.submit_time + self.guard_slowdown * max(job.predicted_duration, self.guard_floor_s)

    def promote_overdue(self, view: ClusterView) -> None:
        """Re-key queued jobs whose guard deadline has passed (a heap of deadlines, so O(due) per round)."""
        heap = view.guard_heap
        while heap and heap[0][0] <= view.now:
            _, job_id = heapq.heappop(heap)
            if job_id in view.queue:
                job = view.jobs[job_id]
                view.queue.remove(job_id)
                view.enqueue_main(job, self.sort_key(job, view.now, self.long_cap(view)))
        arrivals = view.arrival_heap
        while arrivals and arrivals[0][0] + self.tail_bound_ <= view.now:
            submit, job_id = heapq.heappop(arrivals)
            if job_id in view.queue and not is_overdue_key(view.queue.key_of(job_id)):
                job = view.jobs[job_id]
                view.queue.remove(job_id)
                view.enqueue_main(job, (submit + self.tail_bound_ - OVERDUE_OFFSET, submit, job_id))

    def next_deadline(self, view: ClusterView) -> float | None:
        """The next guard deadline of a job still queued (a wake-up for the driver)."""
        heap = view.guard_heap
        while heap and heap[0][1] not in view.queue:
            heapq.heappop(heap)
        arrivals = view.arrival_heap
        while arrivals and (arrivals[0][1] not in view.queue or is_overdue_key(view.queue.key_of(arrivals[0][1]))):
            heapq.heappop(arrivals)
        times = [t for t in (heap[0][0] if heap else None,
                             arrivals[0][0] + self.tail_bound_ if arrivals and self.tail_bound_ < math.inf else None)
                 if t is not None]
        return min(times) if times else None

    def enqueue(self, view: ClusterView, job: Job) -> None:
        """Queue for prediction; the job joins the main queue at the next `predict_pending`."""
        view.unpredicted.append(job.job_id)

    def predict_pending(self, view: ClusterView) -> None:
        """One batched model call for every job that joined since the last round."""
        if not view.unpredicted:
            return
        jobs = [view.jobs[j] for j in view.unpredicted]
        view.unpredicted = []
        predictions = self.duration_model.predict_duration(jobs)
        for job, pred in zip(jobs, predictions, strict=True):
            job.predicted_duration = floored_prediction(job, pred)
        self._update_long_cap(view, jobs)
        for job in jobs:
            self.requeue(view, job)

    def requeue(self, view: ClusterView, job: Job, key: SortKey | None = None) -> None:
        """Into the main queue with the prediction it has (just predicted, restored from the store, or a
        stopped job's work left), with its guard deadlines; `key` keeps a key it had before."""
        key = key if key is not None else self.sort_key(job, view.now, self.long_cap(view))
        view.enqueue_main(job, key)
        for heap, entry in self._heap_entries(view, job, key):
            heapq.heappush(heap, entry)

    def requeue_many(self, view: ClusterView, jobs: list[Job]) -> None:
        """`requeue` for many jobs at once (a live round restoring its queue): the same queue and heaps,
        each part sorted and each heap rebuilt once instead of one insertion per job."""
        cap = self.long_cap(view)
        keys = [self.sort_key(job, view.now, cap) for job in jobs]
        view.enqueue_main_many(jobs, keys)
        grown: dict[int, list[tuple[float, str]]] = {}
        for job, key in zip(jobs, keys, strict=True):
            for heap, entry in self._heap_entries(view, job, key):
                heap.append(entry)
                grown[id(heap)] = heap
        for heap in grown.values():
            heapq.heapify(heap)

    def _heap_entries(self, view: ClusterView, job: Job, key: SortKey) -> list[tuple[list, tuple[float, str]]]:
        """The (heap, entry) pairs a queued job adds: its guard deadline and arrival (unless already
        overdue), and its arrival among the long class."""
        entries: list[tuple[list, tuple[float, str]]] = []
        if not is_overdue_key(key):
            due = self.overdue_at(job)
            if due is not None:
                entries.append((view.guard_heap, (due, job.job_id)))
            if self.guard_tail > 0:
                entries.append((view.arrival_heap, (job.submit_time, job.job_id)))
        if self.is_long(view, job):
            entries.append((view.long_heap, (job.submit_time, job.job_id)))
        return entries

    def sort_key(self, job: Job, now: float | None = None, long_cap: float = math.inf) -> SortKey:
        if self.use_estimator:
            due = self.overdue_at(job)
            if due is not None and now is not None and due <= now:
                return (due - OVERDUE_OFFSET, job.submit_time, job.job_id)
            # aging credits `aging` GPU-seconds of priority per second waited; adding it as
            # aging x submit time keeps the order static, since every waiting job gains alike
            # jobs longer than the recent quantile are one class, served in arrival order: ranking
            # them by noisy predictions only starves the unluckiest of them
            priority = min(job.priority, long_cap)
            return (priority + self.aging * job.submit_time, job.submit_time, job.job_id)
        return (job.submit_time, 0.0, job.job_id)

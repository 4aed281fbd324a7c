"""ClusterView: what a policy reads (jobs, queues, pools, running set, clock).

Both drivers keep one: the simulator for the whole run, the live round rebuilt from the
store each round. A policy reserves GPUs in the view as it decides (so a round's later
decisions see its earlier ones) and returns the decisions; the driver carries them out.
"""

from __future__ import annotations

import bisect
import heapq
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lucid_core.config import LucidConfig
from lucid_core.domain import GpuRef, Job, JobState, Pool, Profile, ShareClass, SharingMode
from lucid_core.policy.packing_models import HostSharing
from lucid_core.policy.placement import GpuPool

SortKey = tuple[float, float, str]
DEFAULT_SHARING = HostSharing(None)  # a host the driver said nothing of: shares by time slicing
QueueKey = tuple[str, int, int]  # (placement VC, gpus, share class or -1 when unprofiled)


@dataclass(slots=True)
class Allocation:
    job_id: str
    pool: Pool
    gpus: tuple[GpuRef, ...]
    start: float
    mem_mb: float
    partner: str | None = None
    profiling_until: float | None = None  # end of a profiling window (pool or in place)


class MainQueue:
    """Queued jobs split by (VC, GPU demand, share class), each part sorted by a policy's key.

    Jobs with the same VC, demand and class are interchangeable for placement, so a scheduling
    pass only needs the head of each part: O(parts), not O(queue), per blocked attempt.
    """

    def __init__(self) -> None:
        self._parts: dict[QueueKey, list[tuple[SortKey, str]]] = {}
        self._where: dict[str, tuple[QueueKey, SortKey]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def push(self, job_id: str, part: QueueKey, key: SortKey) -> None:
        if job_id in self._where:
            raise ValueError(f"job {job_id} is already queued")
        bisect.insort(self._parts.setdefault(part, []), (key, job_id))
        self._where[job_id] = (part, key)

    def push_many(self, entries: list[tuple[str, QueueKey, SortKey]]) -> None:
        """`push` for many jobs: each touched part sorted once (a live round restores its whole queue)."""
        where = self._where
        touched: set[QueueKey] = set()
        for job_id, part, key in entries:
            if job_id in where:
                raise ValueError(f"job {job_id} is already queued")
            self._parts.setdefault(part, []).append((key, job_id))
            where[job_id] = (part, key)
            touched.add(part)
        for part in touched:
            self._parts[part].sort()

    def remove(self, job_id: str) -> None:
        part, key = self._where.pop(job_id)
        items = self._parts[part]
        i = bisect.bisect_left(items, (key, job_id))
        del items[i]
        if not items:
            del self._parts[part]

    def parts(self) -> dict[QueueKey, list[tuple[SortKey, str]]]:
        return self._parts

    def gpus(self) -> int:
        """GPUs asked for by the queued jobs (one sum per part: its jobs ask alike)."""
        return sum(gpus * len(items) for (_, gpus, _), items in self._parts.items())

    def key_of(self, job_id: str) -> SortKey:
        """The sort key a queued job sits under."""
        return self._where[job_id][1]

    def ordered(self) -> list[str]:
        """All queued job ids in the policy's order."""
        merged = [item for items in self._parts.values() for item in items]
        merged.sort()
        return [job_id for _, job_id in merged]


def _part_of(vc: str, job: Job) -> QueueKey:
    """(placement VC, GPU demand, share class or -1): the main-queue part of a job whose partition is `vc`."""
    return (vc, job.gpus, int(job.share_class) if job.share_class is not None else -1)


class ClusterView:
    def __init__(self, config: LucidConfig, now: float = 0.0,
                 profile_of: Callable[[str], Profile | None] | None = None) -> None:
        self.config = config
        self.now = now
        size, mem = config.cluster.gpus_per_node, config.cluster.gpu_memory_mb
        self.main = GpuPool("main", size, mem)
        self.profiling = GpuPool("profiling", size, mem)
        self.jobs: dict[str, Job] = {}
        self.profiling_queue: dict[str, None] = {}  # arrival order; the profiler sorts by demand
        self.queue = MainQueue()
        self.allocations: dict[str, Allocation] = {}
        # running main-cluster jobs that could take a partner, by GPU demand
        self.share_candidates: dict[int, dict[str, None]] = {}
        # the same, split by (placement VC, GPU demand, share class), so the lightest partner of the
        # job's own VC is found without a full scan
        self.share_candidates_by_class: dict[tuple[str, int, int], dict[str, None]] = {}
        self.sharing_mode = SharingMode.DEFAULT
        self.tprof_s = config.profiler.tprof_s
        self.nprof_gpus = config.profiler.nprof_gpus
        self.borrowed_nodes: list[str] = []
        self._borrowed_vc: dict[str, str] = {}
        # (window end, job id): profiling windows running on the pool or in place
        self.window_heap: list[tuple[float, str]] = []
        # jobs whose duration the policy still has to predict (batched once per round)
        self.unpredicted: list[str] = []
        # (starvation-guard deadline, job id) of queued jobs not yet overdue
        self.guard_heap: list[tuple[float, str]] = []
        # (submit time, job id) of queued jobs the tail guard has not promoted yet (arrival order)
        self.arrival_heap: list[tuple[float, str]] = []
        # (submit time, job id) of queued jobs in the long class (arrival order), for yielding by seniority
        self.long_heap: list[tuple[float, str]] = []
        # predicted GPU-time of the latest jobs and its quantile, the long class's cap (the orchestrator's)
        self.recent_priorities: list[float] = []
        # (the window it was kept for, its values in order): the orchestrator's, not saved
        self.recent_sorted: tuple[list[float], list[float]] = (self.recent_priorities, [])
        self.long_cap = math.inf
        # the overdue job the current round holds nodes for, if any (for explanations)
        self.reserved_for: str | None = None
        # nodes that take no new work now (live: draining, unreachable or cooling-down hosts): nothing is
        # stopped on them for a waiting job, since it could not start there
        self.closed_nodes: set[str] = set()
        # (job id, node names) of the standing reservation, kept across rounds until the job starts
        self.reservation: tuple[str, list[str]] | None = None
        # the driver's way to read a job's measured profile (telemetry live, catalog in simulation)
        self.profile_of: Callable[[str], Profile | None] = profile_of or (lambda job_id: None)
        self.last_mode_check: float | None = None
        self.last_yield_check: float | None = None  # when Lucid last looked for jobs to yield
        # (job id, normalized speed) of running pairs, as the driver observes them; the binder
        # reads and clears them (the simulator knows co-located speeds; live telemetry may report)
        self.speed_reports: list[tuple[str, float]] = []
        # how each host may share (its GPU model and mechanism); hosts not named share as DEFAULT_SHARING
        self.host_sharing: dict[str, HostSharing] = {}
        # a running job's class on its host (set by a binder whose models are per host); None: its one class
        self.share_class_on: Callable[[Job, str], ShareClass | None] | None = None

    # --- building -------------------------------------------------------------------------
    def add_nodes(self, pool: Pool, count: int, prefix: str | None = None, vc: str = "") -> None:
        target = self.pool(pool)
        prefix = prefix or ("prof" if pool is Pool.PROFILING else "node")
        start = len(target.nodes)
        for i in range(start, start + count):
            target.add_node(f"{prefix}{i:04d}", vc=vc)

    def sharing_of(self, node: str) -> HostSharing:
        """How host `node` may share a GPU (a simulated node: as the simulation's one catalog)."""
        return self.host_sharing.get(node, DEFAULT_SHARING)

    def placement_vc(self, job: Job) -> str:
        """The main-cluster partition a job may use: its VC when nodes are tagged with it, else the
        untagged nodes (a single pool, as in a trace replay without VCs)."""
        return job.vc if job.vc and self.main.has_vc(job.vc) else ""

    def pool(self, pool: Pool) -> GpuPool:
        return self.main if pool is Pool.MAIN else self.profiling

    def add_job(self, job: Job) -> None:
        if job.job_id in self.jobs:
            raise ValueError(f"job {job.job_id} was already submitted")
        self.jobs[job.job_id] = job

    # --- queues ---------------------------------------------------------------------------
    def enqueue_profiling(self, job: Job) -> None:
        job.state = JobState.SUBMITTED
        self.profiling_queue[job.job_id] = None

    def profiling_gpus(self) -> int:
        """GPUs asked for by the jobs waiting for a profiling window (the main queue's are `queue.gpus()`)."""
        return sum(self.jobs[job_id].gpus for job_id in self.profiling_queue)

    def queue_part(self, job: Job) -> QueueKey:
        """The main-queue part a job waits in: (placement VC, GPU demand, share class or -1)."""
        return _part_of(self.placement_vc(job), job)

    def enqueue_main(self, job: Job, key: SortKey) -> None:
        job.state = JobState.QUEUED
        self.queue.push(job.job_id, self.queue_part(job), key)

    def enqueue_main_many(self, jobs: list[Job], keys: list[SortKey]) -> None:
        """`enqueue_main` for many jobs at once (one sort per queue part)."""
        placement_vc: dict[str, str] = {}  # job VC -> its partition, asked once per VC, not once per job
        entries = []
        for job, key in zip(jobs, keys, strict=True):
            job.state = JobState.QUEUED
            vc = placement_vc.get(job.vc)
            if vc is None:
                vc = placement_vc[job.vc] = self.placement_vc(job)
            entries.append((job.job_id, _part_of(vc, job), key))
        self.queue.push_many(entries)

    def dequeue(self, job_id: str) -> None:
        self.profiling_queue.pop(job_id, None)
        if job_id in self.queue:
            self.queue.remove(job_id)

    # --- running set ----------------------------------------------------------------------
    def start(self, job_id: str, pool: Pool, gpus: tuple[GpuRef, ...], *, partner: str | None = None,
              profiling_until: float | None = None, at: float | None = None) -> Allocation:
        """Start a job now, or re-create a run that started `at` (a live run rebuilt, a stop undone)."""
        job = self.jobs[job_id]
        started = self.now if at is None else at
        mem = job.profile.gpu_mem_mb if job.profile else 0.0
        self.dequeue(job_id)
        self.pool(pool).occupy(job_id, gpus, mem)
        alloc = Allocation(job_id, pool, gpus, started, mem, partner, profiling_until)
        self.allocations[job_id] = alloc
        if profiling_until is not None:
            heapq.heappush(self.window_heap, (profiling_until, job_id))
        if pool is Pool.MAIN:
            job.state = JobState.RUNNING
            job.start_time = started
            if partner is not None:
                self.allocations[partner].partner = job_id
                self.drop_share_candidate(partner)
            else:
                self.refresh_share_candidate(job_id)
        else:
            job.state = JobState.PROFILING
        return alloc

    def stop(self, job_id: str) -> Allocation:
        """Release a running job's GPUs; its partner (if any) runs alone from now on."""
        alloc = self.allocations.pop(job_id)
        self.pool(alloc.pool).release(job_id, alloc.gpus, alloc.mem_mb)
        self.drop_share_candidate(job_id)
        if alloc.partner is not None and alloc.partner in self.allocations:
            self.allocations[alloc.partner].partner = None
            self.refresh_share_candidate(alloc.partner)
        return alloc

    def set_profile_mem(self, job_id: str, mem_mb: float) -> None:
        """Account a running job's measured memory footprint (learned during its run)."""
        alloc = self.allocations[job_id]
        pool = self.pool(alloc.pool)
        for ref in alloc.gpus:
            pool.nodes[ref.host].mem_used_mb[ref.index] += mem_mb - alloc.mem_mb
        alloc.mem_mb = mem_mb

    def refresh_share_candidate(self, job_id: str) -> None:
        alloc = self.allocations.get(job_id)
        job = self.jobs[job_id]
        share_class = job.share_class
        if alloc is not None and self.share_class_on is not None and alloc.gpus:
            share_class = self.share_class_on(job, alloc.gpus[0].host)
        ok = (alloc is not None and alloc.pool is Pool.MAIN and alloc.partner is None
              and share_class is not None and not job.no_share
              and job.gpus <= self.config.cluster.gpus_per_node)
        if ok:
            assert share_class is not None
            self._add_in_start_order(self.share_candidates.setdefault(job.gpus, {}), job_id)
            key = (self.placement_vc(job), job.gpus, int(share_class))
            self._add_in_start_order(self.share_candidates_by_class.setdefault(key, {}), job_id)
        else:
            self.drop_share_candidate(job_id)

    def _add_in_start_order(self, candidates: dict[str, None], job_id: str) -> None:
        """Keep `candidates` in the order their runs started (then by id), whenever each was added: the binder
        takes the first admissible one. A live round adds them in that order as it rebuilds its view; the
        simulator adds a job profiled in place when its window ends and a pair's job again when its partner
        leaves, so by insertion alone the two drivers would pair a job with different ones of equal partners."""
        if job_id in candidates:
            return
        previous = next(reversed(candidates), None)
        candidates[job_id] = None
        if previous is not None and self._start_key(previous) > self._start_key(job_id):
            order = sorted(candidates, key=self._start_key)
            candidates.clear()
            candidates.update(dict.fromkeys(order))

    def _start_key(self, job_id: str) -> tuple[float, str]:
        alloc = self.allocations.get(job_id)
        return (alloc.start if alloc is not None else math.inf, job_id)

    def drop_share_candidate(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.gpus in self.share_candidates:
            self.share_candidates[job.gpus].pop(job_id, None)
            vc = self.placement_vc(job)
            for share_class in range(3):
                self.share_candidates_by_class.get((vc, job.gpus, share_class), {}).pop(job_id, None)

    # --- the policy's own state, kept between live rounds ----------------------------------
    def policy_state(self) -> dict[str, Any]:
        """What a later view must start from (the live store keeps it between rounds): sharing mode,
        profiler parameters, the nodes borrowed into the profiling pool, the last mode check."""
        return {"sharing_mode": self.sharing_mode.value, "tprof_s": self.tprof_s, "nprof_gpus": self.nprof_gpus,
                "borrowed_nodes": list(self.borrowed_nodes), "last_mode_check": self.last_mode_check,
                "last_yield_check": self.last_yield_check, "recent_priorities": list(self.recent_priorities),
                "long_cap": self.long_cap if math.isfinite(self.long_cap) else None}

    def restore_policy_state(self, state: Mapping[str, Any]) -> set[str]:
        """Take back what `policy_state` saved; returns the borrowed nodes, which the caller places in the
        profiling pool as it adds nodes (a node's pool is known only when it is added)."""
        mode = state.get("sharing_mode")
        if mode in {m.value for m in SharingMode}:
            self.sharing_mode = SharingMode(mode)
        # another controller or a hand edit may have written any of these: a value of the wrong kind is
        # not restored (the default stands), so one bad key cannot stop every round
        tprof, nprof = state.get("tprof_s"), state.get("nprof_gpus")
        # only a window this configuration can set (its Tprof, or its burst Tprof while autoscaling): one saved
        # under another configuration gives way to this one's at once, not at the next mode check
        profiler = self.config.profiler
        allowed = {profiler.tprof_s, *((profiler.burst_tprof_s,) if profiler.autoscale else ())}
        if saved_number(tprof) and tprof in allowed:
            self.tprof_s = float(tprof)
        if saved_number(nprof) and nprof >= 0 and float(nprof).is_integer():
            self.nprof_gpus = int(nprof)
        self.last_mode_check = _saved_time(state.get("last_mode_check"))
        self.last_yield_check = _saved_time(state.get("last_yield_check"))
        recent = state.get("recent_priorities")
        self.recent_priorities = [float(p) for p in recent if saved_number(p)] if isinstance(recent, list) else []
        self.recent_sorted = (self.recent_priorities, sorted(self.recent_priorities))
        cap = state.get("long_cap")
        self.long_cap = float(cap) if saved_number(cap) else math.inf
        borrowed = state.get("borrowed_nodes")
        return {n for n in borrowed if isinstance(n, str)} if isinstance(borrowed, list) else set()

    def borrow_node(self, name: str) -> None:
        """Move an idle main node into the profiling pool (a burst)."""
        node = self.main.remove_node(name)
        self.profiling.add_node(name, node.gpus, node.gpu_memory_mb, borrowed=True)
        self.borrowed_nodes.append(name)
        self._borrowed_vc[name] = node.vc

    def return_node(self, name: str) -> None:
        node = self.profiling.remove_node(name)
        self.main.add_node(name, node.gpus, node.gpu_memory_mb, vc=self._borrowed_vc.pop(name, ""))
        self.borrowed_nodes.remove(name)

    def check_invariants(self) -> None:
        self.main.check_invariants()
        self.profiling.check_invariants()
        for alloc in self.allocations.values():
            if alloc.partner is not None:
                other = self.allocations.get(alloc.partner)
                assert other is not None and other.partner == alloc.job_id, f"pair of {alloc.job_id} broken"
                assert set(other.gpus) == set(alloc.gpus), f"pair {alloc.job_id} on different GPUs"


def _saved_time(value: Any) -> float | None:
    """A saved round time, or None (never) when what was saved is not a finite number."""
    return float(value) if saved_number(value) else None


def saved_time_limit(value: Any) -> float | None:
    """A stored time limit (`--time-limit`, seconds) as every reader takes it: a positive finite number, else
    none (text, NaN, an infinity or a value at or below zero another writer left limits nothing)."""
    limit = saved_float(value)
    return limit if limit is not None and limit > 0 else None


def saved_float(value: Any) -> float | None:
    """A stored number as a finite float, else None: text, a flag, NaN, an infinity, or an integer past a float's
    range (JSON keeps 10**400, and float() of it raises OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def saved_indices(value: Any) -> list[int]:
    """A stored list of GPU indices as its integers, in order; none for anything else (a hand edit can leave text,
    null or a mapping there, and text's characters were read as GPUs)."""
    return [i for i in value if type(i) is int] if isinstance(value, list) else []


def saved_number(value: Any) -> bool:
    """A finite int or float (saved state read back from the store)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

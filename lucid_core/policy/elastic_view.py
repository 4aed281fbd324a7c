"""What an elastic policy sees and answers with: jobs and their GPUs per node, the cluster, one placement rule.

The simulator (`lucid_core.sim.elastic`) keeps `ElasticJob`s and moves time; a policy (`ElasticPolicy`, e.g.
`lucid_core.policy.pollux`) answers GPUs per node for each job; `pack` places a GPU count so policies share one rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from lucid_core.policy.goodput import Application


@dataclass(frozen=True, slots=True)
class ElasticJobSpec:
    """One job of a Pollux-format workload."""

    name: str
    submit_time: float
    application: str
    replicas: int  # what a user asks for (fixed-size policies)
    batch_size: int


Counts = tuple[int, ...]  # GPUs a job holds on each node, one entry per node


@dataclass(slots=True)
class ElasticJob:
    """A job's state as the engine keeps it and policies read it."""

    spec: ElasticJobSpec
    app: Application
    progress: float = 0.0
    epoch: int = 0
    counts: Counts | None = None  # GPUs per node now; None while it holds none
    atomic_bsz: int = 0
    accum_steps: int = 0
    restart_left: float = 0.0
    restarts: int | None = None  # None until its first start, then re-allocations after it
    attained_gpu_s: float = 0.0
    max_replicas_seen: int = 0
    start_time: float | None = None
    end_time: float | None = None
    waited_s: float = 0.0
    preemptions: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def replicas(self) -> int:
        return sum(self.counts) if self.counts else 0

    @property
    def placement(self) -> tuple[int, ...]:
        return tuple(c for c in self.counts if c) if self.counts else ()

    @property
    def batch_size(self) -> int:
        return self.replicas * self.atomic_bsz * (self.accum_steps + 1)


@dataclass(frozen=True, slots=True)
class ElasticCluster:
    nodes: int
    gpus_per_node: int

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class ElasticPolicy(Protocol):
    name: str

    def allocate(self, now: float, jobs: Sequence[ElasticJob], cluster: ElasticCluster) -> dict[str, Counts]:
        """GPUs per node for each active job from now on; a job left out holds none."""
        ...

    def layout(self, job: ElasticJob, placement: tuple[int, ...]) -> tuple[int, int]:
        """(per-GPU batch, gradient accumulation steps) of `job` on `placement` (GPUs per used node)."""
        ...


def pack(gpus: int, free: list[int], distributed: list[bool], gpus_per_node: int) -> Counts | None:
    """Place `gpus` replicas on nodes with `free` GPUs; None when they do not fit.

    Rules: a job that fits one node takes the node with the fewest free GPUs that still fits
    (best fit, keeping whole nodes for wide jobs); a wider job takes whole free nodes, then the
    rest on the best-fitting node; a node hosts at most one multi-node job (Pollux's rule: two
    jobs' all-reduce traffic on one node's network interfere); only when no such layout exists
    are the replicas spread over the emptiest allowed nodes. `free` and `distributed` are updated.
    """
    nodes = len(free)
    counts = [0] * nodes
    if gpus <= gpus_per_node:
        fits = [i for i in range(nodes) if free[i] >= gpus]
        if fits:
            best = min(fits, key=lambda i: (free[i], i))
            counts[best] = gpus
            free[best] -= gpus
            return tuple(counts)
    allowed = [i for i in range(nodes) if free[i] > 0 and not distributed[i]]
    if sum(free[i] for i in allowed) < gpus:
        return None
    left = gpus
    for i in allowed:
        if left >= gpus_per_node and free[i] == gpus_per_node:
            counts[i] = gpus_per_node
            left -= gpus_per_node
    if left:
        fits = [i for i in allowed if counts[i] == 0 and free[i] >= left]
        if fits:
            best = min(fits, key=lambda i: (free[i], i))
            counts[best] = left
            left = 0
    for i in sorted(allowed, key=lambda i: (-free[i], i)):
        if not left:
            break
        take = min(free[i] - counts[i], left)
        counts[i] += take
        left -= take
    for i in range(nodes):
        free[i] -= counts[i]
    if sum(1 for c in counts if c) > 1:
        for i in range(nodes):
            if counts[i]:
                distributed[i] = True
    return tuple(counts)


def compact_placement(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """Whole nodes then the rest on one node: what a compact placer gives an exclusive job."""
    whole, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * whole + ((rest,) if rest else ())

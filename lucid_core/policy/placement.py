"""GPU pools and compact (consolidated) placement.

A pool is a set of same-sized nodes, partitioned by virtual cluster (VC): a job is placed only
on nodes of its own VC (the partition "" when nodes carry no VC). Compact placement puts a job
of g <= node-size GPUs on one node, choosing the node with the fewest free GPUs that still fits (best fit, which
keeps whole nodes free for wide jobs); a wider job takes whole free nodes plus one
best-fit node for the remainder. Fit tests are O(node size), not O(nodes).

Among nodes that fit equally well, the first by name: the choice depends only on what the nodes hold, never
on the order in which they last changed. A live round rebuilds its pool from the store every round, so an
order kept in memory (the simulator's) is one the live view cannot have; by name, both place alike.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Protocol

from lucid_core.domain import GpuRef


@dataclass(slots=True)
class NodeState:
    name: str
    gpus: int
    gpu_memory_mb: float
    occupants: list[list[str]] = field(default_factory=list)  # job ids on each GPU
    mem_used_mb: list[float] = field(default_factory=list)
    borrowed: bool = False
    vc: str = ""
    held: bool = False  # reserved for one waiting job during a scan: no other placement sees it
    empty: int = field(init=False, default=0)  # GPUs with no occupant, kept by the pool's occupy/release

    def __post_init__(self) -> None:
        if not self.occupants:
            self.occupants = [[] for _ in range(self.gpus)]
            self.mem_used_mb = [0.0] * self.gpus
        self.empty = sum(1 for o in self.occupants if not o)

    @property
    def free(self) -> int:
        """GPUs with no occupant (asked at every fit-index move: counted as they change, not recounted)."""
        return self.empty

    def empty_gpus(self) -> list[int]:
        return [i for i, o in enumerate(self.occupants) if not o]


class GpuPool:
    """Nodes of one pool with an index from 'number of empty GPUs' to nodes."""

    def __init__(self, name: str, gpus_per_node: int, gpu_memory_mb: float) -> None:
        self.name = name
        self.gpus_per_node = gpus_per_node
        self.gpu_memory_mb = gpu_memory_mb
        self.nodes: dict[str, NodeState] = {}
        # per VC: number of empty GPUs -> nodes with that many
        self._by_vc: dict[str, list[dict[str, None]]] = {}
        self.busy_gpus = 0  # GPUs with at least one job
        self.held: dict[str, None] = {}  # nodes out of the fit index until `release_holds`
        self._indexed: dict[str, int] = {}  # per VC: nodes in the fit index (kept so `has_vc` is O(1))

    # --- inventory -------------------------------------------------------------------------
    def _index(self, vc: str) -> list[dict[str, None]]:
        index = self._by_vc.get(vc)
        if index is None:
            index = self._by_vc[vc] = [{} for _ in range(self.gpus_per_node + 1)]
        return index

    @property
    def vcs(self) -> set[str]:
        """The VCs that own nodes in this pool (held nodes aside)."""
        return {vc for vc, count in self._indexed.items() if count}

    def has_vc(self, vc: str) -> bool:
        """`vc in self.vcs` without building the set (asked once per queued job)."""
        return self._indexed.get(vc, 0) > 0

    def _indexed_change(self, vc: str, delta: int) -> None:
        self._indexed[vc] = self._indexed.get(vc, 0) + delta

    def add_node(self, name: str, gpus: int | None = None, gpu_memory_mb: float | None = None,
                 borrowed: bool = False, vc: str = "") -> NodeState:
        gpus = gpus or self.gpus_per_node
        if gpus > self.gpus_per_node:
            raise ValueError(f"node {name} has {gpus} GPUs, more than the pool's {self.gpus_per_node}")
        if name in self.nodes:
            raise ValueError(f"node {name} is already in pool {self.name}")
        node = NodeState(name, gpus, gpu_memory_mb or self.gpu_memory_mb, borrowed=borrowed, vc=vc)
        self.nodes[name] = node
        self._index(vc)[node.free][name] = None
        self._indexed_change(vc, 1)
        return node

    def remove_node(self, name: str) -> NodeState:
        node = self.nodes[name]
        if node.free != node.gpus:
            raise ValueError(f"node {name} still runs jobs")
        del self._index(node.vc)[node.free][name]
        self._indexed_change(node.vc, -1)
        del self.nodes[name]
        return node

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def total_gpus_of(self, vc: str) -> int:
        return sum(n.gpus for n in self.nodes.values() if n.vc == vc)

    def free_gpus(self, vc: str | None = None) -> int:
        """Empty GPUs of one VC, or of the whole pool."""
        indexes = self._by_vc.values() if vc is None else [self._index(vc)]
        return sum(k * len(names) for index in indexes for k, names in enumerate(index))

    def idle_nodes(self) -> list[str]:
        """Nodes with every GPU empty (any VC)."""
        return [n for index in self._by_vc.values() for n in index[self.gpus_per_node]
                if self.nodes[n].gpus == self.gpus_per_node]

    # --- fit and placement -----------------------------------------------------------------
    def max_free_on_a_node(self, vc: str = "") -> int:
        index = self._index(vc)
        for k in range(self.gpus_per_node, 0, -1):
            if index[k]:
                return k
        return 0

    def can_fit(self, gpus: int, vc: str = "") -> bool:
        size = self.gpus_per_node
        index = self._index(vc)
        if gpus <= size:
            return self.max_free_on_a_node(vc) >= gpus
        whole, rest = divmod(gpus, size)
        full = len(index[size])
        if rest == 0:
            return full >= whole
        if full > whole:
            return True
        return full == whole and any(index[k] for k in range(rest, size))

    def could_hold(self, gpus: int, vc: str = "") -> bool:
        """Whether VC `vc`'s nodes could hold an exclusive job of `gpus` GPUs once all were empty: the
        rule of `can_fit` over capacity instead of free GPUs (a job wider than a node takes whole nodes)."""
        return fleet_could_hold(gpus, [n.gpus for n in self.nodes.values() if n.vc == vc], self.gpus_per_node)

    def place_compact(self, gpus: int, vc: str = "") -> tuple[GpuRef, ...] | None:
        """Choose GPUs of VC `vc` for an exclusive job, or None when no compact fit exists. Reserves nothing."""
        size = self.gpus_per_node
        if not self.can_fit(gpus, vc):
            return None
        by_free = self._index(vc)
        chosen: list[GpuRef] = []
        used: set[str] = set()
        whole, rest = divmod(gpus, size) if gpus > size else (0, gpus)
        for name in heapq.nsmallest(whole, by_free[size]):
            used.add(name)
            chosen.extend(GpuRef(name, i) for i in range(size))
        if rest:
            for k in range(rest, size + 1):
                name = min((n for n in by_free[k] if n not in used), default=None)
                if name is not None:
                    chosen.extend(GpuRef(name, i) for i in self.nodes[name].empty_gpus()[:rest])
                    break
            else:  # pragma: no cover - can_fit said yes
                return None
        return tuple(chosen)

    # --- bookkeeping -----------------------------------------------------------------------
    def hold(self, names: list[str]) -> None:
        """Take nodes out of every fit test (a reservation) until `release_holds`."""
        for name in names:
            node = self.nodes[name]
            if not node.held:
                del self._index(node.vc)[node.free][name]
                self._indexed_change(node.vc, -1)
                node.held = True
                self.held[name] = None

    def release_holds(self) -> None:
        for name in self.held:
            node = self.nodes.get(name)
            if node is not None and node.held:
                node.held = False
                self._index(node.vc)[node.free][name] = None
                self._indexed_change(node.vc, 1)
        self.held = {}

    def _move(self, node: NodeState, before: int) -> None:
        after = node.free
        if after != before and not node.held:
            index = self._index(node.vc)
            del index[before][node.name]
            index[after][node.name] = None

    def occupy(self, job_id: str, gpus: tuple[GpuRef, ...], mem_mb: float) -> None:
        for ref in gpus:
            node = self.nodes[ref.host]
            before = node.free
            slot = node.occupants[ref.index]
            if job_id in slot:
                raise ValueError(f"job {job_id} already holds {ref}")
            if len(slot) >= 2:
                raise ValueError(f"GPU {ref} already holds two jobs")
            if not slot:
                self.busy_gpus += 1
                node.empty -= 1
            slot.append(job_id)
            node.mem_used_mb[ref.index] += mem_mb
            self._move(node, before)

    def release(self, job_id: str, gpus: tuple[GpuRef, ...], mem_mb: float) -> None:
        for ref in gpus:
            node = self.nodes[ref.host]
            before = node.free
            slot = node.occupants[ref.index]
            slot.remove(job_id)
            node.mem_used_mb[ref.index] = max(0.0, node.mem_used_mb[ref.index] - mem_mb)
            if not slot:
                self.busy_gpus -= 1
                node.empty += 1
            self._move(node, before)

    def mem_free_on(self, gpus: tuple[GpuRef, ...]) -> float:
        return min(self.nodes[r.host].gpu_memory_mb - self.nodes[r.host].mem_used_mb[r.index] for r in gpus)

    def check_invariants(self) -> None:
        """Raise AssertionError if any GPU holds more than two jobs or more memory than it has."""
        for node in self.nodes.values():
            assert node.empty == sum(1 for o in node.occupants if not o), f"{node.name}: empty-GPU count out of date"
            for i, slot in enumerate(node.occupants):
                assert len(slot) <= 2, f"{node.name}:{i} holds {len(slot)} jobs"
                assert len(set(slot)) == len(slot), f"{node.name}:{i} lists a job twice"
                assert node.mem_used_mb[i] <= node.gpu_memory_mb + 1e-6, (
                    f"{node.name}:{i} uses {node.mem_used_mb[i]} MB of {node.gpu_memory_mb}")
            if node.held:
                assert all(node.name not in names for names in self._index(node.vc)), f"held {node.name} indexed"
            else:
                assert node.name in self._index(node.vc)[node.free], f"index out of date for {node.name}"
        for vc, index in self._by_vc.items():
            assert self._indexed.get(vc, 0) == sum(map(len, index)), f"indexed count of VC {vc!r} out of date"


def fleet_could_hold(gpus: int, node_gpus: list[int], size: int) -> bool:
    """Whether nodes of these GPU counts (node size `size`), all empty, hold an exclusive `gpus`-GPU job
    under compact placement: one node with room, or whole `size`-GPU nodes and one more for the rest."""
    if gpus <= size:
        return any(n >= gpus for n in node_gpus)
    whole, rest = divmod(gpus, size)
    full = sum(1 for n in node_gpus if n == size)
    if rest == 0:
        return full >= whole
    return full > whole or (full == whole and any(rest <= n < size for n in node_gpus))


class Placement(Protocol):
    """Where a job of `gpus` GPUs goes in a pool's nodes of one VC; None when it does not fit now.
    A policy declares its placement once (`SchedulingPolicy.placement`); every scan of it uses that."""

    name: str

    def place(self, pool: GpuPool, gpus: int, vc: str = "") -> tuple[GpuRef, ...] | None: ...


@dataclass(frozen=True, slots=True)
class CompactPlacement:
    """The default: best-fit node within a node, whole free nodes plus one best fit for wider jobs."""

    name: str = "compact"

    def place(self, pool: GpuPool, gpus: int, vc: str = "") -> tuple[GpuRef, ...] | None:
        return pool.place_compact(gpus, vc)


COMPACT = CompactPlacement()

"""The goodput model of a measured training application: step times, gradient statistics, epochs.

Read from a folder in the Pollux artifact's layout by `lucid_core.sim.elastic_apps` (see the data README):
`placements.csv` and `scalability.csv` hold seconds per step of one replica for a placement and a
per-replica ("local") batch size, `validation-B.csv` the progress and gradient statistics per epoch
when training with total batch size B. From these a job's speed at any allocation follows:

* throughput: the step time of its placement (GPUs per node) at its local batch size, linearly
  interpolated between measured batch sizes; a placement not measured is interpolated linearly in
  (nodes, replicas, local batch size) over every measurement (each placement averaged per shape);
* statistical efficiency: one step at total batch size M does the work of
  ``gain = (var + sqr) / (var / scale + sqr)`` steps at the initial batch size (``scale = M / M0``,
  `sqr` and `var` the gradient's squared norm and variance, interpolated between the measured batch
  sizes at the current epoch), i.e. the gradient noise scale ``var / sqr * M0`` decides how much a
  larger batch helps;
* goodput (progress per second) = gain / seconds per step; work is progress, in initial-batch steps;
  epoch e ends at progress ``min_B progress_B[e - 1]``; a job ends with its last epoch.

Progress units, interpolation rules, gradient accumulation and the local batch rules follow the
Pollux simulator (OSDI '21 artifact), so a run on its data reproduces its job model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GPUS_PER_NODE_MEASURED = 4  # the testbed's nodes (g4dn.12xlarge: 4 x T4); placements have digits 1..4
EPS = 1e-8
SHAPE_GRID_POINTS = 48


@dataclass(frozen=True, slots=True)
class AppLimits:
    """What the artifact fixed per application (data README): epochs, batch limits, Pollux pins."""

    max_epochs: int | None = None  # None: as many epochs as every validation file has
    max_local_bsz: int | None = None  # None: the largest measured local batch size
    pollux_batch_size: int | None = None  # a batch size Pollux may not change (ncf)
    pollux_max_replicas: int | None = None  # a replica cap Pollux must keep (ncf: 1)


#: Limits of the six measured applications, as the artifact ran them (data README).
KNOWN_LIMITS: dict[str, AppLimits] = {
    "bert": AppLimits(max_epochs=2),
    "cifar10": AppLimits(max_epochs=100),
    "ncf": AppLimits(max_epochs=10, pollux_batch_size=32768, pollux_max_replicas=1),
    "imagenet": AppLimits(max_epochs=90),
    "deepspeech2": AppLimits(max_epochs=80),
    "yolov3": AppLimits(max_epochs=50, max_local_bsz=8),
}


def normalize_placement(placement: tuple[int, ...]) -> tuple[int, ...]:
    """GPUs per node, zeros dropped, smallest first: one name for every order of the same nodes."""
    return tuple(sorted(c for c in placement if c > 0))


def placement_id(placement: tuple[int, ...]) -> str:
    """The file's placement name: its digits, e.g. (1, 3) -> "13"."""
    return "".join(str(c) for c in placement)


class _Triangulation:
    """Linear interpolation of scattered 3-D measurements over their Delaunay triangulation.

    Barycentric coordinates are computed for all simplices at once with batched 3 x 3 inverses
    (SciPy's own set-up of them took seconds on these near-degenerate measurement grids); a point
    outside every simplex takes the value of the nearest measurement."""

    def __init__(self, points: np.ndarray, values: np.ndarray) -> None:
        from scipy.spatial import Delaunay, cKDTree

        self.low = points.min(axis=0)
        self.span = np.ptp(points, axis=0)
        self.span[self.span == 0] = 1.0
        unit = (points - self.low) / self.span
        simplices = Delaunay(unit, qhull_options="QJ").simplices
        corners = unit[simplices]  # (simplex, 4 corners, 3)
        edges = np.transpose(corners[:, 1:] - corners[:, :1], (0, 2, 1))  # columns: corner k - corner 0
        usable = np.abs(np.linalg.det(edges)) > 1e-12
        self.simplices = simplices[usable]
        self.origin = corners[usable, 0]
        self.inverse = np.linalg.inv(edges[usable])
        self.values = values
        self.tree = cKDTree(unit)
        box = unit[self.simplices]
        self.box_low, self.box_high = box.min(axis=1), box.max(axis=1)

    def __call__(self, points: np.ndarray) -> np.ndarray:
        unit = (points - self.low) / self.span
        # only simplices whose bounding box meets the points' box can hold them
        near = np.all((self.box_low <= unit.max(axis=0) + 1e-9) & (self.box_high >= unit.min(axis=0) - 1e-9), axis=1)
        candidates = np.flatnonzero(near)
        local = np.einsum("sij,psj->psi", self.inverse[candidates], unit[:, None, :] - self.origin[candidates][None])
        weights = np.concatenate([1.0 - local.sum(axis=2, keepdims=True), local], axis=2)  # (point, simplex, 4)
        inside = np.all(weights >= -1e-9, axis=2)
        found = inside.any(axis=1)
        which = np.argmax(inside, axis=1) if candidates.size else np.zeros(len(points), dtype=int)
        rows = np.arange(len(points))
        if candidates.size:
            chosen = weights[rows, which]  # (point, 4)
            out = np.einsum("pk,pkv->pv", chosen, self.values[self.simplices[candidates[which]]])
        else:
            out = np.zeros((len(points), self.values.shape[1]))
        if not found.all():
            _, nearest = self.tree.query(unit[~found])
            out[~found] = self.values[nearest]
        return out


@dataclass(slots=True)
class Application:
    """One measured application: step-time tables, per-epoch progress and gradient statistics."""

    name: str
    batch_sizes: np.ndarray  # validated total batch sizes, ascending
    epoch_progress: np.ndarray  # progress at the end of epoch e (index e - 1)
    grad_sqr: np.ndarray  # [batch size index, epoch]
    grad_var: np.ndarray
    placements: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # id -> (bsz, step, sync)
    shape_points: np.ndarray  # rows (nodes, replicas, local bsz) of every measurement shape
    shape_values: np.ndarray  # rows (step, sync)
    max_epochs: int
    min_local_bsz: int
    max_local_bsz: int
    limits: AppLimits = field(default_factory=AppLimits)
    _triangles: _Triangulation | None = None
    _memo: dict = field(default_factory=dict)
    _goodput_memo: dict = field(default_factory=dict)
    _shape_grid: dict = field(default_factory=dict)

    @property
    def init_batch_size(self) -> int:
        return int(self.batch_sizes[0])

    @property
    def max_batch_size(self) -> int:
        return int(self.batch_sizes[-1])

    @property
    def total_progress(self) -> float:
        """Work of a whole job: progress at the end of its last epoch."""
        return float(self.epoch_progress[self.max_epochs - 1])

    def epoch_end(self, epoch: int) -> float:
        """Progress at which epoch `epoch` (0-based) ends."""
        return float(self.epoch_progress[epoch])

    def epoch_of(self, progress: float) -> int:
        """The epoch (0-based) a job at `progress` is in."""
        return int(np.searchsorted(self.epoch_progress[: self.max_epochs], progress, side="right"))

    # --- throughput ------------------------------------------------------------------------
    def step_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """(seconds per step, of which gradient sync) of one replica on `placement` at `local_bsz`."""
        hit = self._memo.get((placement, local_bsz))
        if hit is not None:
            return hit
        raw = (placement, local_bsz)
        placement = normalize_placement(placement)
        measured = self.placements.get(placement_id(placement))
        if measured is not None:
            bsz, step, sync = measured
            value = (float(np.interp(local_bsz, bsz, step)), float(np.interp(local_bsz, bsz, sync)))
        else:
            shaped = self._by_shape(len(placement), sum(placement), local_bsz)[0]
            value = (float(shaped[0]), float(shaped[1]))
        self._memo[raw] = value
        return value

    def step_times(self, placement: tuple[int, ...], local_bsz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`step_time` for many local batch sizes at once (one interpolation call)."""
        local_bsz = np.asarray(local_bsz, dtype=float)
        normal = normalize_placement(placement)
        measured = self.placements.get(placement_id(normal))
        if measured is not None:
            bsz, step, sync = measured
            steps, syncs = np.interp(local_bsz, bsz, step), np.interp(local_bsz, bsz, sync)
        else:
            values = self._by_shape(len(normal), sum(normal), local_bsz)
            steps, syncs = values[:, 0], values[:, 1]
        for b, st, sy in zip(local_bsz.tolist(), steps.tolist(), syncs.tolist(), strict=True):
            self._memo[(placement, b)] = (st, sy)
        return steps, syncs

    def _by_shape(self, nodes: int, replicas: int, local_bsz: float | np.ndarray) -> np.ndarray:
        """Linear interpolation over (nodes, replicas, local batch size); nearest outside the hull.

        Each (nodes, replicas) is interpolated once on a grid of batch sizes (48 geometric steps
        between the smallest and largest measured), then linearly along it: a point inside the
        measurements' bounding box but outside their hull costs the triangulation a brute-force
        search, so the grid is kept small."""
        grid = self._shape_grid.get((nodes, replicas))
        if grid is None:
            sizes = np.geomspace(self.shape_points[:, 2].min(), self.shape_points[:, 2].max(), SHAPE_GRID_POINTS)
            grid = self._shape_grid[(nodes, replicas)] = (sizes, self._interpolate(nodes, replicas, sizes))
        sizes, values = grid
        query = np.atleast_1d(np.asarray(local_bsz, dtype=float))
        return np.column_stack([np.interp(query, sizes, values[:, 0]), np.interp(query, sizes, values[:, 1])])

    def _interpolate(self, nodes: int, replicas: int, local_bsz: np.ndarray) -> np.ndarray:
        """Piecewise-linear interpolation over the Delaunay triangulation of the measurements, in
        the unit cube; the nearest measurement outside their hull."""
        if self._triangles is None:
            self._triangles = _Triangulation(self.shape_points, self.shape_values)
        sizes = np.atleast_1d(np.asarray(local_bsz, dtype=float))
        points = np.column_stack([np.full(sizes.size, min(nodes, 16)), np.full(sizes.size, replicas), sizes])
        return self._triangles(points)

    # --- statistical efficiency ------------------------------------------------------------
    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(squared gradient norm, gradient variance) at `batch_size` in `epoch`, interpolated."""
        epoch = min(epoch, self.grad_sqr.shape[1] - 1)
        sizes = self.batch_sizes
        b = min(max(batch_size, sizes[0]), sizes[-1])
        hi = int(np.searchsorted(sizes, b, side="left"))
        if sizes[hi] == b:
            return float(self.grad_sqr[hi, epoch]), float(self.grad_var[hi, epoch])
        lo = hi - 1
        w = (b - sizes[lo]) / (sizes[hi] - sizes[lo])
        sqr = (1 - w) * self.grad_sqr[lo, epoch] + w * self.grad_sqr[hi, epoch]
        var = (1 - w) * self.grad_var[lo, epoch] + w * self.grad_var[hi, epoch]
        return float(sqr), float(var)

    def gain(self, batch_size: float, sqr: float, var: float) -> float:
        """Initial-batch steps of progress one step at `batch_size` makes, from the noise scale."""
        scale = batch_size / self.init_batch_size
        denom = var / scale + sqr
        return (var + sqr) / denom if denom > 0 else 1.0

    # --- batch layout ----------------------------------------------------------------------
    def fixed_layout(self, replicas: int, batch_size: int) -> tuple[int, int]:
        """(atomic batch, accumulation steps) for a total batch a user fixed: split it over the
        replicas, accumulate when a replica's share exceeds its largest batch (and at least once
        on one replica above the initial batch: gradient statistics need two micro-batches)."""
        local = math.ceil(batch_size / replicas - EPS)
        accum = math.ceil(local / self.max_local_bsz - EPS) - 1
        if replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - EPS)
        atomic = min(atomic, int(self.max_batch_size / (replicas * (accum + 1))))
        return max(atomic, 1), accum

    def goodput(self, placement: tuple[int, ...], atomic: int, accum: int, epoch: int) -> float:
        """True progress per second of a job on `placement` with this batch layout in `epoch`."""
        key = (placement, atomic, accum, epoch)
        hit = self._goodput_memo.get(key)
        if hit is not None:
            return hit
        replicas = sum(placement)
        batch = replicas * atomic * (accum + 1)
        step, sync = self.step_time(placement, atomic)
        total = step + (step - sync) * accum
        sqr, var = self.grad_stats(batch, epoch)
        value = self._goodput_memo[key] = self.gain(batch, sqr, var) / total
        return value

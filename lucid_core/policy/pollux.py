"""Pollux (Qiao et al., OSDI '21): elastic GPUs and batch size chosen for goodput, every period.

Rules, as the paper and its artifact state them:

* Goodput: throughput x statistical efficiency; a job's efficiency at batch size M comes from its
  gradient noise scale at its current epoch (`Application.gain`).
* Batch size per allocation: for a number of GPUs, the total batch size (with gradient
  accumulation when a GPU's share exceeds its largest batch) that maximises goodput, searched over
  50 sizes spaced geometrically between the smallest usable and the largest measured; chosen again
  at every re-allocation and every epoch boundary. Applications the artifact pins (ncf) keep their
  batch size and replica cap.
* Speedup: best goodput on k GPUs over best goodput at the fair share (the cluster's GPUs over
  the active jobs), scaled by the job's dominant share times the node count.
* Exploration: a job may get at most twice the most GPUs it has held so far (1 before its
  first run), so it grows as its throughput is observed.
* Restart penalty: an allocation that changes a job's GPUs multiplies its speedup by
  ``max(age - restarts x 30 s, 0) / (age + 30 s)`` (age since submission).
* Objective: the power mean with p = -1 of the jobs' penalised speedups (a job without GPUs
  counts as speedup 0, plus 1e-3), maximised every 60 s.
* Placement: at most one multi-node job per node; a job fits on as few nodes as it can (`pack`).

Optimiser (the one deviation in method): the artifact runs a genetic algorithm (NSGA-II,
100 x 100 generations) over GPU-per-node matrices. The objective depends on each job only through
its GPU count (speedups are evaluated on compact placements; node choice is then the packing
rule), and it is a sum of per-job terms (maximising the p = -1 power mean = minimising
sum 1 / speedup). So the optimum over GPU counts is found exactly by dynamic programming over
jobs and GPUs used (a knapsack with one term per job, O(jobs x GPUs x max GPUs per job)), then
packed. An exact answer in milliseconds replaces a stochastic search that took up to 30 minutes a
run; the GA's randomness (and its occasional worse allocations) is what we do not reproduce.

The second deviation: throughput comes from the measured step times (the simulator's truth)
instead of Pollux's fitted throughput model, i.e. a perfectly fitted model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lucid_core.policy.elastic_view import Counts, ElasticCluster, ElasticJob, compact_placement, pack
from lucid_core.policy.goodput import EPS, Application

CANDIDATE_BATCH_SIZES = 50
P_FAIRNESS = -1.0  # exponent of the power mean: more negative is fairer
RESTART_PENALTY_S = 30.0
SPEEDUP_FLOOR = 1e-3


def candidate_layouts(app: Application, replicas: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(total batch, per-GPU batch, accumulation steps) of the batch sizes searched on `replicas`
    GPUs; empty when even the smallest per-GPU batch on each would exceed the largest batch."""
    low = max(app.init_batch_size, app.min_local_bsz * replicas)
    if low > app.max_batch_size:
        empty = np.zeros(0)
        return empty, empty.astype(int), empty.astype(int)
    batch = np.geomspace(low, app.max_batch_size, CANDIDATE_BATCH_SIZES)
    local = batch / replicas
    accum = np.ceil(local / app.max_local_bsz - EPS) - 1
    if replicas == 1:
        accum = np.where(local > app.init_batch_size + EPS, np.maximum(accum, 1), accum)
    accum = accum.astype(int)
    atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
    ok = (atomic >= app.min_local_bsz) & (atomic <= app.max_local_bsz)
    atomic, accum = atomic[ok], accum[ok]
    return replicas * atomic * (accum + 1), atomic, accum


class _AppTable:
    """Per application, for each GPU count on a compact placement, the searched batch layouts'
    batch sizes and seconds per step (padded rows), so a job's best goodput on every GPU count
    for given gradient statistics is a single array operation."""

    def __init__(self, app: Application, max_gpus: int, gpus_per_node: int) -> None:
        self.app = app
        self.max_gpus = max_gpus
        self.batch = np.ones((max_gpus + 1, CANDIDATE_BATCH_SIZES))
        self.step = np.full((max_gpus + 1, CANDIDATE_BATCH_SIZES), np.inf)  # inf: no such layout
        for k in range(1, max_gpus + 1):
            batch, atomic, accum = candidate_layouts(app, k)
            if batch.size:
                step, sync = app.step_times(compact_placement(k, gpus_per_node), atomic)
                self.batch[k, : batch.size] = batch
                self.step[k, : batch.size] = step + (step - sync) * accum

    def best_goodput(self, sqr: float, var: float) -> np.ndarray:
        """Best goodput on 0..max_gpus GPUs for gradient statistics (sqr, var)."""
        scale = self.batch / self.app.init_batch_size
        denom = var / scale + sqr
        gain = np.where(denom > 0, (var + sqr) / np.where(denom > 0, denom, 1.0), 1.0)
        out = np.max(gain / self.step, axis=1)
        out[0] = 0.0
        return out


class PolluxPolicy:
    """Pollux's allocation and batch-size rules (see the module docstring)."""

    name = "pollux"
    assumes_checkpoints = True  # every re-allocation restarts the job from its checkpoint

    def __init__(self, max_gpus_per_job: int = 64, max_nodes_per_job: int = 16) -> None:
        self.max_gpus_per_job = max_gpus_per_job
        self.max_nodes_per_job = max_nodes_per_job
        self._tables: dict[str, _AppTable] = {}
        self._goodput_cache: dict[tuple[str, int, int], np.ndarray] = {}
        self._layout_cache: dict[tuple[str, tuple[int, ...], int, int], tuple[int, int]] = {}
        self._candidates: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # --- per-job model -----------------------------------------------------------------------
    def _table(self, app: Application, cluster: ElasticCluster) -> _AppTable:
        table = self._tables.get(app.name)
        if table is None:
            limit = min(cluster.total_gpus, self.max_gpus_per_job, self.max_nodes_per_job * cluster.gpus_per_node)
            table = self._tables[app.name] = _AppTable(app, limit, cluster.gpus_per_node)
        return table

    def _grad_stats(self, job: ElasticJob) -> tuple[float, float]:
        """The gradient statistics the job reports: at its current batch size and epoch."""
        batch = job.batch_size or job.app.init_batch_size
        return job.app.grad_stats(batch, job.epoch)

    def max_replicas(self, job: ElasticJob, cluster: ElasticCluster) -> int:
        """Exploration cap: twice the most GPUs held so far (1 before the first run), within limits."""
        app = job.app
        cap = min(max(2 * job.max_replicas_seen, 1), cluster.total_gpus, self.max_gpus_per_job,
                  self.max_nodes_per_job * cluster.gpus_per_node, app.max_batch_size // app.min_local_bsz)
        if app.limits.pollux_max_replicas is not None:
            cap = min(cap, app.limits.pollux_max_replicas)
        return max(cap, 1)

    def goodputs(self, job: ElasticJob, cluster: ElasticCluster) -> np.ndarray:
        """Best goodput of the job on 0..(all usable) GPUs, compact placements, current statistics."""
        table = self._table(job.app, cluster)
        key = (job.app.name, job.epoch, job.batch_size)  # what the gradient statistics depend on
        cached = self._goodput_cache.get(key)
        if cached is None:
            if job.app.limits.pollux_batch_size is not None:
                cached = self._fixed_goodputs(job, cluster, table.max_gpus)
            else:
                sqr, var = self._grad_stats(job)
                cached = table.best_goodput(sqr, var)
            self._goodput_cache[key] = cached
        return cached

    def _fixed_goodputs(self, job: ElasticJob, cluster: ElasticCluster, upto: int) -> np.ndarray:
        app = job.app
        batch = app.limits.pollux_batch_size or app.init_batch_size
        out = np.zeros(upto + 1)
        for k in range(1, min(upto, batch) + 1):
            atomic, accum = app.fixed_layout(k, batch)
            out[k] = app.goodput(compact_placement(k, cluster.gpus_per_node), atomic, accum, job.epoch)
        return out

    # --- the period's decision --------------------------------------------------------------
    def allocate(self, now: float, jobs: Sequence[ElasticJob], cluster: ElasticCluster) -> dict[str, Counts]:
        """Choose each job's GPU count by the exact optimum of the objective, then place them."""
        total = cluster.total_gpus
        fair = min(total, math.ceil(total / max(len(jobs), 1)))
        scale = 1.0 / cluster.gpus_per_node  # dominant share (1 GPU of all) x node count
        costs: list[np.ndarray] = []
        for job in jobs:
            goodput = self.goodputs(job, cluster)
            cap = min(self.max_replicas(job, cluster), len(goodput) - 1)
            base = float(np.max(goodput[1: fair + 1])) if fair >= 1 else 0.0
            speedup = goodput[: cap + 1] / base * scale if base > 0 else np.zeros(cap + 1)
            age = now - job.spec.submit_time
            restarts = job.restarts or 0
            factor = max(age - restarts * RESTART_PENALTY_S, 0.0) / (age + RESTART_PENALTY_S)
            penalty = np.full(cap + 1, factor)
            current = job.replicas
            if current <= cap:
                penalty[current] = 1.0
            penalty[0] = 1.0
            costs.append((speedup * penalty + SPEEDUP_FLOOR) ** P_FAIRNESS)
        counts = _min_cost_counts(costs, total)
        return self._place(jobs, counts, cluster)

    def _place(self, jobs: Sequence[ElasticJob], counts: list[int], cluster: ElasticCluster) -> dict[str, Counts]:
        """Jobs keeping their GPU count keep their GPUs; the others are packed, widest first."""
        free = [cluster.gpus_per_node] * cluster.nodes
        distributed = [False] * cluster.nodes
        out: dict[str, Counts] = {}
        moving: list[tuple[int, int]] = []
        for index, (job, k) in enumerate(zip(jobs, counts, strict=True)):
            if k and job.counts is not None and job.replicas == k:
                out[job.name] = job.counts
                for i, c in enumerate(job.counts):
                    free[i] -= c
                    if c and len(job.placement) > 1:
                        distributed[i] = True
            elif k:
                moving.append((k, index))
        moving.sort(key=lambda item: (-item[0], item[1]))
        for k, index in moving:
            for want in range(k, 0, -1):  # fewer GPUs when fragmentation leaves no layout for k
                trial_free, trial_distributed = list(free), list(distributed)
                placed = pack(want, trial_free, trial_distributed, cluster.gpus_per_node)
                if placed is not None and sum(1 for c in placed if c) <= self.max_nodes_per_job:
                    out[jobs[index].name] = placed
                    free, distributed = trial_free, trial_distributed
                    break
        return out

    def layout(self, job: ElasticJob, placement: tuple[int, ...]) -> tuple[int, int]:
        """The batch layout of best goodput on this placement (true step times, current statistics)."""
        app = job.app
        replicas = sum(placement)
        if app.limits.pollux_batch_size is not None:
            return app.fixed_layout(replicas, app.limits.pollux_batch_size)
        key = (app.name, tuple(sorted(placement)), job.epoch, job.batch_size)
        hit = self._layout_cache.get(key)
        if hit is None:
            hit = self._layout_cache[key] = self._best_layout(job, placement)
        return hit

    def _best_layout(self, job: ElasticJob, placement: tuple[int, ...]) -> tuple[int, int]:
        app = job.app
        replicas = sum(placement)
        found = self._candidates.get((app.name, replicas))
        if found is None:
            found = self._candidates[(app.name, replicas)] = candidate_layouts(app, replicas)
        batch, atomic, accum = found
        if batch.size == 0:
            return app.fixed_layout(replicas, max(app.init_batch_size, replicas))
        sqr, var = self._grad_stats(job)
        step, sync = app.step_times(placement, atomic)
        scale = batch / app.init_batch_size
        gain = (var + sqr) / np.maximum(var / scale + sqr, 1e-300)
        choice = int(np.argmax(gain / (step + (step - sync) * accum)))
        a, m = int(atomic[choice]), int(accum[choice])
        return min(a, int(app.max_batch_size / (replicas * (m + 1)))) or 1, m


def _min_cost_counts(costs: list[np.ndarray], total: int) -> list[int]:
    """GPU count per job minimising the summed costs with at most `total` GPUs in all (exact DP).

    `costs[j][k]` is job j's cost on k GPUs. best[c] is the least cost of the jobs so far using at
    most c GPUs; each job adds one min-plus step, and the choices are walked back at the end.
    """
    best = np.zeros(total + 1)
    choices: list[np.ndarray] = []
    columns = np.arange(total + 1)
    for cost in costs:
        ks = np.arange(len(cost))[:, None]
        before = columns[None, :] - ks
        table = np.where(before >= 0, best[np.clip(before, 0, None)] + cost[:, None], np.inf)
        pick = np.argmin(table, axis=0)
        best = table[pick, columns]
        choices.append(pick)
    counts = [0] * len(costs)
    c = total
    for j in range(len(costs) - 1, -1, -1):
        k = int(choices[j][c])
        counts[j] = k
        c -= k
    return counts

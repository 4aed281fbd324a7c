"""Run metrics from per-job outcomes: JCT, queueing, makespan, utilization, debug feedback.

Percentiles (P99.9) use ``numpy.percentile(values, 99.9, method="linear")``: the linear
interpolation between closest ranks (Hyndman & Fan type 7), i.e. at rank ``0.999 * (n - 1)`` of
the sorted values. With fewer than 1,000 jobs this lies between the two largest values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lucid_core.sim.records import JobOutcome

if TYPE_CHECKING:  # pandas is imported where a table is built: `lucid simulate` writes its files without it
    import pandas as pd

SHORT_JOB_S = 60.0  # a "short" job (debug run): it should not wait behind long ones
TAIL_PERCENTILE = 99.9
PERCENTILE_METHOD = "linear"


def tail(values: Sequence[float] | np.ndarray, q: float = TAIL_PERCENTILE) -> float:
    """The q-th percentile with the documented interpolation method (0.0 for no values)."""
    array = np.asarray(values, dtype=float)
    return float(np.percentile(array, q, method=PERCENTILE_METHOD)) if array.size else 0.0


def time_weighted_utilization(timeline: Sequence[tuple[float, float]], total_gpus: int,
                              start: float, end: float) -> float:
    """Mean busy fraction of `total_gpus` over [start, end] from (time, busy) change points.

    The timeline is a step function: `busy` holds from its time until the next change point; before
    the first point nothing is busy; the last value holds to `end`. Busy counts above the cluster
    size (should an engine report them) are clipped to it.
    """
    if total_gpus <= 0 or end <= start or not timeline:
        return 0.0
    points = sorted(timeline, key=lambda point: point[0])
    times = np.array([t for t, _ in points], dtype=float)
    busy = np.clip(np.array([b for _, b in points], dtype=float), 0, total_gpus)
    segment_ends = np.append(times[1:], max(end, times[-1]))
    lo = np.clip(times, start, end)
    hi = np.clip(segment_ends, start, end)
    gpu_seconds = float(np.sum(busy * (hi - lo)))
    return gpu_seconds / (total_gpus * (end - start))


def utilization_over_time(timeline: Sequence[tuple[float, float]], total_gpus: int, start: float, end: float,
                          bin_s: float = 3600.0) -> pd.Series:
    """Busy fraction per `bin_s` bin over [start, end) (last bin may be shorter), indexed by bin start."""
    import pandas as pd

    if bin_s <= 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s!r}")
    if end <= start or total_gpus <= 0:
        return pd.Series(dtype=float, name="gpu_utilization")
    edges = np.append(np.arange(start, end, bin_s), end)
    if not timeline:
        return pd.Series(np.zeros(edges.size - 1), index=edges[:-1], name="gpu_utilization")
    points = sorted(timeline, key=lambda point: point[0])
    times = np.array([t for t, _ in points], dtype=float)
    busy = np.clip(np.array([b for _, b in points], dtype=float), 0, total_gpus)
    cumulative = np.concatenate([[0.0], np.cumsum(busy[:-1] * np.diff(times))])
    index = np.searchsorted(times, edges, side="right") - 1
    safe = np.maximum(index, 0)
    integral = np.where(index >= 0, cumulative[safe] + busy[safe] * (edges - times[safe]), 0.0)
    fraction = np.diff(integral) / (total_gpus * np.diff(edges))
    return pd.Series(fraction, index=edges[:-1], name="gpu_utilization")


def compute_metrics(outcomes: Sequence[JobOutcome], gpu_busy_timeline: Sequence[tuple[float, float]],
                    total_gpus: int) -> dict[str, float | int]:
    """Summary of one simulated run. Times in seconds (`_s`) and hours (`_h`); JCT counts profiling."""
    if not outcomes:
        raise ValueError("no job outcomes to summarize")
    jct = np.array([o.end_time - o.submit_time for o in outcomes], dtype=float)
    queue = np.array([o.queue_delay for o in outcomes], dtype=float)
    duration = np.array([o.duration for o in outcomes], dtype=float)
    first_submit = min(o.submit_time for o in outcomes)
    last_end = max(o.end_time for o in outcomes)
    short = duration <= SHORT_JOB_S
    short_queued = int(np.sum(short & (queue > 0)))
    in_profiling = sum(1 for o in outcomes if o.ended_in_profiling)
    metrics: dict[str, float | int] = {"jobs": len(outcomes)}
    for name, values in (("jct", jct), ("queue", queue)):
        mean, p999 = float(values.mean()), tail(values)
        metrics[f"avg_{name}_s"] = mean
        metrics[f"avg_{name}_h"] = mean / 3600
        metrics[f"p999_{name}_s"] = p999
        metrics[f"p999_{name}_h"] = p999 / 3600
    metrics.update({
        "makespan_s": last_end - first_submit,
        "makespan_h": (last_end - first_submit) / 3600,
        "gpu_utilization": time_weighted_utilization(gpu_busy_timeline, total_gpus, first_submit, last_end),
        "finished_in_profiling": in_profiling,
        "finished_in_profiling_pct": 100.0 * in_profiling / len(outcomes),
        "short_jobs": int(short.sum()),
        "short_jobs_queued": short_queued,
        "short_jobs_queued_pct": 100.0 * short_queued / int(short.sum()) if short.any() else 0.0,
        "shared_jobs": sum(1 for o in outcomes if o.shared_seconds > 0),
        "preemptions": sum(o.preemptions for o in outcomes),
        "total_gpus": total_gpus,
    })
    return metrics


PER_VC_COLUMNS = ("jobs", "avg_gpus", "avg_jct_h", "p999_jct_h", "avg_queue_h", "p999_queue_h", "shared_jobs")


def per_vc_rows(outcomes: Sequence[JobOutcome]) -> dict[str, dict[str, float]]:
    """Per virtual cluster, in VC order: jobs, GPUs requested, average/P99.9 JCT and queueing (hours), and
    how many jobs shared a GPU (`per_vc_table` as plain dicts)."""
    if not outcomes:
        raise ValueError("no job outcomes to summarize")
    groups: dict[str, list[JobOutcome]] = {}
    for o in outcomes:
        groups.setdefault(o.vc, []).append(o)
    rows: dict[str, dict[str, float]] = {}
    for vc in sorted(groups):
        members = groups[vc]
        jct = np.array([(o.end_time - o.submit_time) / 3600 for o in members], dtype=float)
        queue = np.array([o.queue_delay / 3600 for o in members], dtype=float)
        rows[vc] = {"jobs": len(members), "avg_gpus": float(np.mean([o.gpus for o in members])),
                    "avg_jct_h": float(jct.mean()), "p999_jct_h": tail(jct), "avg_queue_h": float(queue.mean()),
                    "p999_queue_h": tail(queue), "shared_jobs": sum(o.shared_seconds > 0 for o in members)}
    return rows


def per_vc_table(outcomes: Sequence[JobOutcome]) -> pd.DataFrame:
    """One row per virtual cluster: jobs, GPUs requested, average/P99.9 JCT and queueing (hours)."""
    import pandas as pd

    rows = per_vc_rows(outcomes)
    table = pd.DataFrame.from_dict(rows, orient="index", columns=list(PER_VC_COLUMNS))
    table = table.astype({"jobs": int, "shared_jobs": int})
    table.index.name = "vc"
    return table

"""The controller's side of telemetry: read an agent's JSON-lines file defensively, summarize a
profiling window into the profile the packing model reads, and estimate a shared job's speed
relative to running alone. The agent that writes the file is `telemetry_agent` (shipped to hosts).

    python -m lucid_core.runtime.hosts.telemetry FILE      # the profile of a sample file, as JSON
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lucid_core.runtime.hosts.telemetry_agent import (
    KEPT_WATCH_BYTES,
    RECORD_BYTES_BOUND,
    SPEED_READ_BYTES,
    Sample,
    counts_for_speed,
)

__all__ = ["KEPT_WATCH_BYTES", "RECORD_BYTES_BOUND", "SPEED_READ_BYTES", "Sample", "counts_for_speed"]


def bounded_file_bytes(keep_all_s: float, interval_s: float, gpus: int,
                       watch_bytes: int = KEPT_WATCH_BYTES) -> int:
    """Most bytes a `TelemetryLog` file holds: its window's samples plus twice the watch part, one line over.

    A reader that asks for this many bytes of the file's tail gets the whole file, window included.
    """
    window_rows = (int(keep_all_s / max(interval_s, 1e-3)) + 2) * max(1, gpus)
    return (window_rows + 1) * RECORD_BYTES_BOUND + 2 * watch_bytes


def summarize(samples: Iterable[Sample]) -> dict[str, Any]:
    """Profile of a window: mean utilizations over samples and GPUs, peak memory of the job.

    The job's memory is the peak over samples of its own processes' memory on its busiest GPU;
    when no per-process figure was available it falls back to the GPU's memory used.
    """
    rows = list(samples)
    if not rows:
        return {"samples": 0}
    util = sum(r["gpu_util"] for r in rows) / len(rows)
    mem_util = sum(r["mem_util"] for r in rows) / len(rows)
    job_mem = max(r.get("job_mem_mb", 0.0) for r in rows)
    mem = job_mem if job_mem > 0 else max(r.get("mem_used_mb", 0.0) for r in rows)
    times = [r["t"] for r in rows if "t" in r]
    return {"samples": len(rows), "gpu_util": util, "mem_util": mem_util, "gpu_mem_mb": mem,
            "emulated": any(r.get("emulated", False) for r in rows),
            "window_s": (max(times) - min(times)) if times else 0.0}


def first_window(samples: Iterable[Sample], window_s: float) -> list[Sample]:
    """The samples of the first `window_s` seconds (by the host's clock), for an agent that keeps
    sampling after a job's profiling window ended (it also watches the job's speed)."""
    rows = [r for r in samples if "t" in r]
    if not rows:
        return []
    start = min(r["t"] for r in rows)
    return [r for r in rows if r["t"] <= start + window_s]


@dataclass(frozen=True)
class SpeedEstimate:
    """A shared job's speed relative to running alone, and what it was estimated from."""

    speed: float  # in [0, 1]
    shared_sm_util: float  # mean SM utilization of the job's processes while sharing, %
    exclusive_util: float  # its GPU utilization while it ran alone (profiling window), %
    samples: int
    emulated: bool

    def describe(self) -> str:
        tag = ", emulated" if self.emulated else ""
        return (f"SM util {self.shared_sm_util:.1f}% shared vs {self.exclusive_util:.1f}% alone = "
                f"{self.speed:.2f} over {self.samples} samples{tag}")


def estimate_shared_speed(samples: Iterable[Sample], exclusive_util: float, *, since: float,
                          min_samples: int = 10, max_samples: int = 120,
                          min_exclusive_util: float = 5.0) -> SpeedEstimate | None:
    """Speed of a job sharing its GPUs, relative to running alone, from its own SM utilization.

    Assumption: a training step's kernels take the same SM time whether the GPU is shared or not,
    so the share of time the job's kernels keep the SMs busy scales with its step rate; then
    (SM utilization of its processes while sharing) / (its utilization alone) is its relative
    speed. The exclusive figure is the GPU utilization of its profiling window; on a GPU a job has
    to itself, its processes' SM utilization and the GPU's utilization agree closely.

    Only samples from `since` on (host clock; the pair's start plus a settle time, so both jobs
    are past start-up), in which another job's process group used the GPU and the job's own SM
    utilization was reported, count; the latest `max_samples` of them are averaged over GPUs.
    None when fewer than `min_samples` qualify, or the job was nearly idle alone.

    Limits: jobs whose step time is not GPU-bound (input pipelines, CPU work, communication) keep
    their utilization low whatever their partner does, so a slowdown elsewhere goes unseen;
    phases (evaluation, checkpoints) move utilization without moving speed; kernels that overlap
    in time (as under MPS) can make SM utilization overstate progress;
    and the scheduler's and hosts' clocks are assumed to agree to well under the settle time.
    """
    rows = [r for r in samples if isinstance(r, dict) and counts_for_speed(r)
            and float(r.get("t", float("-inf"))) >= since]
    rows.sort(key=lambda r: float(r["t"]))
    rows = rows[-max_samples:] if max_samples > 0 else rows
    if len(rows) < max(1, min_samples) or exclusive_util < min_exclusive_util:
        return None
    shared = sum(float(r["job_sm_util"]) for r in rows) / len(rows)
    return SpeedEstimate(speed=min(1.0, max(0.0, shared / exclusive_util)), shared_sm_util=shared,
                         exclusive_util=exclusive_util, samples=len(rows),
                         emulated=any(bool(r.get("emulated", False)) for r in rows))


# what NVML can report: utilizations are percentages, memory and counts are never negative, and a host's GPU
# index is below this (as `discover_gpus` reads it); a value outside these was written by something else
MAX_GPU_INDEX = 1023
MAX_COUNT = 1 << 20  # other jobs' process groups on one GPU


def _number(value: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    """A finite int or float (not a bool) in [low, high]: what every numeric field of a sample must be."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def _count(value: Any, high: int) -> bool:
    """An int (not a bool) in [0, high]: a GPU index or a number of jobs."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high


def is_sample(record: Any) -> bool:
    """True for a record shaped as the agent writes it, every figure in the range NVML reports it in; anything
    else in a telemetry file is not believed. A job can append to its own run's file: a negative utilization
    would make its profile look light enough to share (and a GPU index past the store's integer column would
    fail the round's write), so out-of-range figures are malformed, not merely odd."""
    if not isinstance(record, dict):
        return False
    if not _number(record.get("t")) or not all(_number(record.get(key), 0.0, 100.0)
                                               for key in ("gpu_util", "mem_util")):
        return False
    if not _count(record.get("gpu", 0), MAX_GPU_INDEX):
        return False
    if any(key in record and not _number(record[key], 0.0) for key in ("mem_used_mb", "job_mem_mb")):
        return False
    if record.get("job_sm_util") is not None and not _number(record["job_sm_util"], 0.0, 100.0):
        return False
    others = record.get("others", 0)
    if others is not None and not _count(others, MAX_COUNT):
        return False
    return isinstance(record.get("emulated", False), bool)


def parse_samples(text: str) -> list[Sample]:
    """JSON lines back into samples, skipping a torn last line and every line not shaped as a sample (an integer
    of more digits than Python converts is a ValueError of json.loads, not a JSONDecodeError: skipped too)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if is_sample(record):
            out.append(record)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the profile (`summarize`) of a sample file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lucid_core.runtime.hosts.telemetry SAMPLES.jsonl", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        print(json.dumps(summarize(parse_samples(fh.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

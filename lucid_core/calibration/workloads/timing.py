"""Torch-free timing of a training loop: warm up, meet co-located partners at a barrier, measure, hold.

Co-located processes must measure the same wall-clock window, or one of them measures a stretch
where it ran alone. Each process, once warm, drops a `ready.<tag>` file holding its clock into a
shared directory and keeps training until all partners are ready; all then start measuring at
the latest ready time plus a margin, measure for the same number of seconds, and keep training
(unmeasured) for a hold time afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lucid_core.calibration.workloads.protocol import progress_line


class PartnerMissing(RuntimeError):
    """A co-located partner never became ready (it crashed or could not start)."""


@dataclass(frozen=True)
class LoopTiming:
    """When to measure: after warmup_s (and the barrier, if any) for `seconds`, then hold for hold_s."""

    seconds: float
    warmup_s: float = 3.0
    sync_dir: str | None = None
    parties: int = 1
    tag: str = ""
    hold_s: float = 0.0
    start_margin_s: float = 0.5
    barrier_timeout_s: float = 600.0
    min_warmup_iters: int = 2
    report_every_s: float = 1.0


def _ready_times(directory: Path) -> list[float]:
    times = []
    for entry in directory.glob("ready.*"):
        try:
            times.append(float(entry.read_text().strip()))
        except (OSError, ValueError):
            continue  # being written: the next look sees it
    return times


def meet(timing: LoopTiming, step: Callable[[], None], clock: Callable[[], float] = time.time) -> float:
    """Announce readiness, keep stepping until every party is ready; return the agreed start time."""
    if timing.sync_dir is None or timing.parties <= 1:
        return clock()
    directory = Path(timing.sync_dir)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".ready.{timing.tag}.{os.getpid()}"
    tmp.write_text(repr(clock()))
    tmp.replace(directory / f"ready.{timing.tag}")
    deadline = clock() + timing.barrier_timeout_s
    next_look = 0.0
    while True:
        now = clock()
        if now >= next_look:
            times = _ready_times(directory)
            if len(times) >= timing.parties:
                return max(times) + timing.start_margin_s
            next_look = now + 0.02
        if now > deadline:
            raise PartnerMissing(f"only {len(times)} of {timing.parties} processes ready after "
                                 f"{timing.barrier_timeout_s:g} s in {directory}")
        step()


def run_timed(step: Callable[[], object], sync: Callable[[], None], timing: LoopTiming,
              emit: Callable[[str], None], clock: Callable[[], float] = time.time) -> tuple[int, float, float]:
    """Warm up, meet, measure `seconds` from the agreed start, hold; return (iterations, start, end).

    `sync` waits for the device after every step, so the iteration count is exact.
    """
    def synced() -> None:
        step()
        sync()

    began = clock()
    warm = 0
    while warm < timing.min_warmup_iters or clock() - began < timing.warmup_s:
        synced()
        warm += 1
    start_at = meet(timing, synced, clock)
    while clock() < start_at:
        synced()
    start = clock()
    iters = 0
    last_report = start
    while True:
        synced()
        iters += 1
        now = clock()
        if now - last_report >= timing.report_every_s:
            emit(progress_line(now - start, iters, iters / (now - start)))
            last_report = now
        if now - start >= timing.seconds:
            break
    end = now
    hold_until = start_at + timing.seconds + timing.hold_s
    while clock() < hold_until:
        synced()
    return iters, start, end

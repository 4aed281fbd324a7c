"""Observed speed of running GPU pairs, from the telemetry agents beside their jobs.

The live counterpart of the simulator's co-location speeds: each job of a pair has an agent
sampling its own processes' SM utilization (lucid_core.runtime.hosts.telemetry); once the pair has
run past a settle time, the round reads both agents' samples and reports the slower member's
estimated speed to the binder, which splits pairs below `binder.unstable_speed`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lucid_core.runtime.hosts.telemetry import SPEED_READ_BYTES, SpeedEstimate, estimate_shared_speed, parse_samples
from lucid_core.runtime.round.pairs import mutual_pairs
from lucid_core.runtime.round.snapshot import Snapshot
from lucid_core.runtime.store.schema import RunRow

# bytes of a job's telemetry.jsonl read each round: its latest few hundred samples, all of them speed
# samples once its profiling window has passed (the agent keeps at least this many: TelemetryLog)
TELEMETRY_TAIL_BYTES = SPEED_READ_BYTES


@dataclass(frozen=True)
class PairSpeedSettings:
    """When a pair's telemetry is trusted: after `settle_s` from its start, from `min_samples` on."""

    settle_s: float = 60.0
    min_samples: int = 10


@dataclass
class PairObservation:
    """Speed estimates of this round's pairs: per job, and the report (slower member) per pair."""

    estimates: dict[str, SpeedEstimate]
    reports: list[tuple[str, float]]


def running_pairs(snapshot: Snapshot) -> list[tuple[RunRow, RunRow]]:
    """Rank-0 main runs of two jobs sharing GPUs: both running, neither stopping nor split already."""
    stopping = {r.job_id for r in snapshot.runs if r.stop_reason}
    pairs = []
    for run, other in mutual_pairs(snapshot.runs):
        if run.started_at is None or other.started_at is None or {run.job_id, other.job_id} & stopping:
            continue
        jobs = [snapshot.jobs.get(run.job_id), snapshot.jobs.get(other.job_id)]
        if any(j is None or j.no_share for j in jobs):
            continue  # gone, or already split: nothing left to decide
        pairs.append((run, other))
    return pairs


def settled_pairs(snapshot: Snapshot, now: float, settings: PairSpeedSettings) -> list[tuple[RunRow, RunRow, float]]:
    """Running pairs whose telemetry counts by `now`, each with the time from which it counts."""
    settled = []
    for first, second in running_pairs(snapshot):
        since = max(first.started_at or 0.0, second.started_at or 0.0) + settings.settle_s
        if now >= since:
            settled.append((first, second, since))
    return settled


def runs_to_read(snapshot: Snapshot, now: float, settings: PairSpeedSettings) -> list[RunRow]:
    """The runs whose telemetry `observe_pair_speeds` will ask for (read them beforehand, all hosts at once)."""
    return [run for first, second, _ in settled_pairs(snapshot, now, settings) for run in (first, second)]


def observe_pair_speeds(snapshot: Snapshot, read_telemetry: Callable[[RunRow], str | None], now: float,
                        settings: PairSpeedSettings) -> PairObservation:
    """Estimate each settled pair member's speed; `read_telemetry` returns a run's samples (None: unread)."""
    estimates: dict[str, SpeedEstimate] = {}
    reports: list[tuple[str, float]] = []
    for first, second, since in settled_pairs(snapshot, now, settings):
        pair: list[tuple[str, SpeedEstimate]] = []
        for run in (first, second):
            job = snapshot.jobs[run.job_id]
            profile = snapshot.profiles.get(run.job_id)
            exclusive = profile.gpu_util if profile is not None else job.gpu_util
            if exclusive is None:
                continue
            text = read_telemetry(run)
            if text is None:
                continue
            estimate = estimate_shared_speed(parse_samples(text), exclusive, since=since,
                                             min_samples=settings.min_samples)
            if estimate is not None:
                estimates[run.job_id] = estimate
                pair.append((run.job_id, estimate))
        if pair:
            job_id, slower = min(pair, key=lambda item: item[1].speed)
            reports.append((job_id, slower.speed))
    return PairObservation(estimates, reports)

"""The small interfaces through which models enter the policy, and their honest fallbacks.

The fallbacks use only what a live scheduler knows: past jobs' observed durations
(never the job's own), GPU demand, the submitting user/VC and recent submissions.
They are also the cold-start path of the interpretable models.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, runtime_checkable

from lucid_core.domain import Job, Profile, ShareClass

#: what a job is taken to run when nothing better is known (no history, or a model gave no number)
DEFAULT_DURATION_S = 3600.0


@runtime_checkable
class DurationPredictor(Protocol):
    """Predicts each job's run time in seconds (Workload Estimate Model)."""

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]: ...

    def observe(self, job: Job, duration: float) -> None:
        """A job ended after running `duration` seconds; models may learn from it."""
        ...


@runtime_checkable
class PackingClassifier(Protocol):
    """Labels a profile Tiny / Medium / Jumbo (Packing Analyze Model)."""

    def classify(self, profiles: Sequence[Profile]) -> list[ShareClass]: ...


@dataclass(frozen=True, slots=True)
class Forecast:
    jobs_per_slot: float
    gpus_per_slot: float
    source: str


@runtime_checkable
class ThroughputForecaster(Protocol):
    """Forecasts GPU-job submissions for the next slots (Throughput Predict Model)."""

    def observe_submission(self, time: float, gpus: int) -> None: ...

    def forecast(self, now: float) -> Forecast: ...


class HistoryKeys(Protocol):
    """What the history fallback groups a past job by: a Job, or a store row read for history."""

    @property
    def user(self) -> str: ...

    @property
    def gpus(self) -> int: ...


class _DurationTable:
    """Observed log-durations of one history key, sorted, with suffix sums for conditional means."""

    __slots__ = ("_pending", "_sorted", "_suffix")

    def __init__(self) -> None:
        self._sorted: list[float] = []
        self._suffix: list[float] = [0.0]
        self._pending: list[float] = []

    def add(self, duration: float) -> None:
        self._pending.append(duration)

    def extend(self, durations: list[float]) -> None:
        self._pending.extend(durations)

    def rebuild(self) -> None:
        if self._pending:
            self._sorted = sorted(self._sorted + self._pending)
            self._pending = []
            # suffix[i] = logs[i] + ... + logs[-1], summed from the end (accumulate adds in that order)
            suffix = list(accumulate(reversed(list(map(math.log1p, self._sorted))), initial=0.0))
            suffix.reverse()
            self._suffix = suffix

    def conditional(self, at_least: float) -> tuple[int, float]:
        """(count, mean log1p duration) of observations longer than `at_least`."""
        i = bisect.bisect_right(self._sorted, at_least)
        n = len(self._sorted) - i
        return (n, self._suffix[i] / n) if n else (0, 0.0)


class HistoryDurationPredictor:
    """Geometric mean of past durations of the same user and GPU demand, falling back to the
    user, then the GPU demand, then everything; conditioned on what is known of the job
    (a job that outlived its profiling window is compared only with jobs that did too).

    Learned tables refresh every `refresh_s` of observed time (the Update Engine's cadence).
    """

    def __init__(self, min_samples: int = 3, refresh_s: float = 86400.0, recent: int = 30,
                 recent_weight: float = 0.5) -> None:
        self.min_samples = min_samples
        self.refresh_s = refresh_s
        self.recent = recent
        self.recent_weight = recent_weight
        self.tables_: dict[tuple, _DurationTable] = defaultdict(_DurationTable)
        self.recent_: dict[tuple, deque[float]] = {}
        self.last_refresh_: float | None = None

    def fit(self, jobs: Iterable[HistoryKeys], durations: Iterable[float]) -> HistoryDurationPredictor:
        """Learn past jobs in the order given (anything with `user` and `gpus`: a live round passes its
        history rows as read). The same tables as `_add` per job, grouped first: a round refits on up to
        50,000 finished jobs, where four table updates per job cost more than the rest of the round."""
        by_pair: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (user, gpus) -> (order, duration)
        for order, (job, duration) in enumerate(zip(jobs, durations, strict=True)):
            by_pair.setdefault((job.user, job.gpus), []).append((order, max(0.0, float(duration))))
        groups: dict[tuple, list[list[tuple[int, float]]]] = defaultdict(list)
        for (user, gpus), items in by_pair.items():
            for key in (("user-gpus", user, gpus), ("user", user), ("gpus", gpus), ("all",)):
                groups[key].append(items)
        for key, parts in groups.items():
            self.tables_[key].extend([d for items in parts for _, d in items])
            if self.recent:  # the last `recent` in the order learned, across the parts of the key
                tails = heapq.merge(*(items[-self.recent:] for items in parts))
                self.recent_.setdefault(key, deque(maxlen=self.recent)).extend(d for _, d in tails)
        self._refresh()
        return self

    def _keys(self, job: HistoryKeys) -> tuple[tuple, ...]:
        return (("user-gpus", job.user, job.gpus), ("user", job.user), ("gpus", job.gpus), ("all",))

    def _add(self, job: Job, duration: float) -> None:
        duration = max(0.0, float(duration))
        for key in self._keys(job):
            self.tables_[key].add(duration)
            if self.recent:
                self.recent_.setdefault(key, deque(maxlen=self.recent)).append(duration)

    def _refresh(self) -> None:
        for table in self.tables_.values():
            table.rebuild()

    def observe(self, job: Job, duration: float) -> None:
        self._add(job, duration)
        now = job.end_time if job.end_time is not None else 0.0
        if self.last_refresh_ is None or now - self.last_refresh_ >= self.refresh_s:
            self._refresh()
            self.last_refresh_ = now

    def predict_one(self, job: Job, floor: float | None = None) -> tuple[float, str]:
        """(predicted seconds, which history decided it), for a job known to outlive `floor` seconds
        (its own `known_min_duration` unless given)."""
        floor = job.known_min_duration if floor is None else floor
        for key in self._keys(job):
            table = self.tables_.get(key)
            if table is None:
                continue
            n, mean_log = table.conditional(floor)
            if n >= self.min_samples or (key == ("all",) and n):
                recent = [math.log1p(d) for d in self.recent_.get(key, ()) if d > floor]
                if len(recent) >= self.min_samples:
                    w = self.recent_weight
                    mean_log = (1 - w) * mean_log + w * sum(recent) / len(recent)
                    return max(math.expm1(mean_log), floor), (
                        f"{key[0]} history ({n} jobs, the last {len(recent)} weighted {w:g})")
                return max(math.expm1(mean_log), floor), f"{key[0]} history ({n} jobs)"
        return max(floor * 2.0, DEFAULT_DURATION_S), "no history: default 1 h"

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        return [self.predict_one(job)[0] for job in jobs]


class UtilizationRuleClassifier:
    """Fallback packing labels from GPU utilization alone (the packing tree's first split):
    light kernels co-locate well, busy ones do not. Replaced by the trained tree when present."""

    def __init__(self, tiny_below: float = 40.0, medium_below: float = 75.0) -> None:
        self.tiny_below = tiny_below
        self.medium_below = medium_below

    def classify(self, profiles: Sequence[Profile]) -> list[ShareClass]:
        out = []
        for p in profiles:
            if p.gpu_util < self.tiny_below:
                out.append(ShareClass.TINY)
            elif p.gpu_util < self.medium_below:
                out.append(ShareClass.MEDIUM)
            else:
                out.append(ShareClass.JUMBO)
        return out


class RecentSlotsForecaster:
    """Next-slot forecast = mean of the last `window` slots of observed submissions."""

    def __init__(self, slot_s: float = 600.0, window: int = 6) -> None:
        self.slot_s = slot_s
        self.window = window
        self.slots_: deque[tuple[int, int, int]] = deque()  # (slot index, jobs, gpus)

    def observe_submission(self, time: float, gpus: int) -> None:
        slot = int(time // self.slot_s)
        if self.slots_ and self.slots_[-1][0] == slot:
            s, j, g = self.slots_[-1]
            self.slots_[-1] = (s, j + 1, g + gpus)
        else:
            self.slots_.append((slot, 1, gpus))
        while self.slots_ and self.slots_[0][0] <= slot - self.window:
            self.slots_.popleft()

    def forecast(self, now: float) -> Forecast:
        current = int(now // self.slot_s)
        recent = [(j, g) for s, j, g in self.slots_ if current - self.window < s <= current]
        jobs = sum(j for j, _ in recent) / self.window
        gpus = sum(g for _, g in recent) / self.window
        return Forecast(jobs, gpus, f"mean of last {self.window} slots")

"""Duration models with fixed answers, for tests that isolate the ordering rules from any learned model."""

from __future__ import annotations

from collections.abc import Callable, Mapping


class FixedDurations:
    """Predicts `durations[key(job)]` (by job id unless told), counting the jobs it is asked about."""

    def __init__(self, durations: Mapping[str, float], key: Callable[[object], str] = lambda job: job.job_id) -> None:
        self.durations = durations
        self.key = key
        self.asked: list[int] = []

    def predict_duration(self, jobs):
        self.asked.append(len(jobs))
        return [self.durations[self.key(job)] for job in jobs]

    def observe(self, job, duration):
        return None

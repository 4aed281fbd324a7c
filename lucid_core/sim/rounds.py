"""When the policy decides in a simulation: at every event (the default, as the papers' simulators do), or only
at the instants a live deployment's scheduling rounds run.

Live, a policy decides only when a round runs (the scheduling DAG's schedule, one a minute by default): a job
submitted between two rounds waits for the next one, a job that ended is seen, and its GPUs reused, only then.
A simulation on a round cadence keeps every event at its own instant (a job's end and its outcome stay exact)
but lets the policy decide only at rounds, so its figures are the ones a deployment with that cadence gets.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

#: the shortest round interval a cadence takes: below it, rounds are no cadence a scheduler keeps (and a
#: quotient of times by it may overflow)
MIN_INTERVAL_S = 1e-3


@dataclass(frozen=True)
class RoundCadence:
    """Rounds every `interval_s` seconds (at `origin_s` plus whole multiples of it), or at the given `instants`
    (a live run's round clocks, sorted); past the last instant the policy decides at every event again."""

    interval_s: float = 0.0
    instants: tuple[float, ...] = ()
    origin_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.interval_s > 0) == bool(self.instants):
            raise ValueError("a round cadence is an interval or a list of instants, exactly one of the two")
        if not (self.interval_s == 0 or MIN_INTERVAL_S <= self.interval_s < math.inf) or not math.isfinite(
                self.origin_s):
            raise ValueError(f"round interval must be 0 or a finite number of seconds >= {MIN_INTERVAL_S:g} (origin "
                             f"finite), got {self.interval_s!r} from {self.origin_s!r}")
        if any(not math.isfinite(t) for t in self.instants) or list(self.instants) != sorted(self.instants):
            raise ValueError("round instants must be finite and sorted")

    @classmethod
    def every(cls, interval_s: float, origin_s: float = 0.0) -> RoundCadence:
        return cls(interval_s=float(interval_s), origin_s=float(origin_s))

    @classmethod
    def at(cls, instants: list[float] | tuple[float, ...]) -> RoundCadence:
        return cls(instants=tuple(instants))

    def next_round(self, t: float) -> float:
        """The first round at or after `t` (`t` itself once past the last of the given instants). Idempotent:
        a round's own instant is its next round, so `next_round(t) == t` says whether a round runs at `t`."""
        if self.instants:
            i = bisect.bisect_left(self.instants, t)
            return self.instants[i] if i < len(self.instants) else t
        rounds = (t - self.origin_s) / self.interval_s
        if not math.isfinite(rounds):  # times at the ends of the float range: no round to find, decide at t
            return t
        k = math.floor(rounds)
        for step in (k, k + 1):  # float division may land a hair either side of a multiple
            if self.origin_s + step * self.interval_s >= t:
                return self.origin_s + step * self.interval_s
        return self.origin_s + (k + 2) * self.interval_s

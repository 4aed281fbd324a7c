"""How long a round's parts may take, derived from one host call's deadline, so a round never outlives its lease.

A round renews its lease before each fan-out of host calls and in every write transaction. The
longest stretch without a renewal is one fan-out (a host's batch is given up past its deadline)
or the decision itself, so the lease TTL must exceed the longest fan-out plus a margin for store
work and the policy. A round step (an Airflow task) makes a bounded number of fan-outs, so its
timeout follows too; a task killed at its timeout leaves rows the next round repairs.
Pure arithmetic on the config: the round DAG imports it at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid_core.config import RuntimeConfig

GRACE_S = 2.0  # the pool's grace past a batch's deadline (hosts.calls.GRACE_S)
STORE_MARGIN_S = 60.0  # store work and the policy between two renewals, with room to spare
# fan-outs per step at most: reconcile (stops and launches left over, peer stops, polls, sweeps, cancel
# stops, profile reads, lost-run reaps), decide (profile reads, pair reads), carry out (stops, launches,
# peer stops)
FAN_OUTS = {"reconcile": 8, "decide": 2, "carry_out": 3}


@dataclass(frozen=True)
class RoundDeadlines:
    """A round's time limits from one host call's deadline and the stop grace."""

    call_s: float
    stop_grace_s: float

    @classmethod
    def from_runtime(cls, runtime: RuntimeConfig) -> RoundDeadlines:
        return cls(runtime.host_call_deadline_s, runtime.stop_grace_s)

    @property
    def fan_out_s(self) -> float:
        """Longest one fan-out of host calls can take (a stop's batch has the stop grace on top)."""
        return self.call_s + self.stop_grace_s + GRACE_S

    @property
    def min_lease_ttl_s(self) -> float:
        """The least lease TTL that outlasts any stretch of a round between two renewals."""
        return self.fan_out_s + STORE_MARGIN_S

    def step_timeout_s(self, step: str) -> float:
        """An upper bound on one round step (an Airflow task): its fan-outs plus store work."""
        return FAN_OUTS[step] * self.fan_out_s + STORE_MARGIN_S

    @property
    def round_timeout_s(self) -> float:
        """An upper bound on a whole round (`lucid round`, the DAG run)."""
        return sum(self.step_timeout_s(step) for step in FAN_OUTS)


def lease_ttl_for(runtime: RuntimeConfig) -> float:
    """The lease TTL a round takes: the configured one, or (0, the default) the least one that outlasts a
    fan-out. A shorter one set on purpose (tests of take-overs) is kept: a take-over then stays safe (every
    write is fenced, launches are idempotent on the host), it only comes sooner than a slow host call ends."""
    return runtime.lease_ttl_s or RoundDeadlines.from_runtime(runtime).min_lease_ttl_s

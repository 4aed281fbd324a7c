"""What a scheduling round is configured with and what it reports: `RoundSettings` (the live
driver's knobs, from `LucidConfig.runtime`), `RoundReport`, the lease holder name.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from lucid_core.config import LucidConfig, RuntimeConfig
from lucid_core.runtime.round.deadlines import lease_ttl_for
from lucid_core.runtime.store.schema import (
    JobRow,
)

EmulatedProfileFn = Callable[[JobRow], tuple[float, float, float]]


class InjectedCrash(BaseException):
    """Raised at a named step to simulate the round's process dying there (tests only)."""


def default_holder() -> str:
    """A lease holder name: host and pid, plus a random token, because processes of look-alike containers
    share both (a holder re-takes its own unexpired lease, so two controllers' names must never collide)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class RoundSettings:
    """Knobs of the live driver; defaults and meanings are those of `LucidConfig.runtime` (config.py),
    which deployments set (file, LUCID__RUNTIME__* variables) and `from_config` reads."""

    lease_ttl_s: float = 120.0  # from_config: runtime.lease_ttl_s, or derived from the host call deadline
    stop_grace_s: float = RuntimeConfig.stop_grace_s
    launch_grace_s: float = RuntimeConfig.launch_grace_s
    telemetry_interval_s: float = RuntimeConfig.telemetry_interval_s
    telemetry_margin_s: float = 5.0
    # a main run's agent keeps sampling for the job's life, this often, to watch its speed when it shares
    monitor_interval_s: float = RuntimeConfig.monitor_interval_s
    # a pair's telemetry counts from this long after its second job started, from this many samples on
    speed_settle_s: float = RuntimeConfig.speed_settle_s
    speed_min_samples: int = RuntimeConfig.speed_min_samples
    max_launch_failures: int = RuntimeConfig.max_launch_failures  # a job whose launch hosts refuse this often fails
    host_cooldown_s: float = RuntimeConfig.host_cooldown_s  # a host that refused a launch gets no new work this long
    # give up on a host silent this long: its runs are lost, their jobs fail (or requeue_lost); None: wait
    host_lost_after_s: float | None = RuntimeConfig.host_lost_after_s or None
    requeue_lost: bool = RuntimeConfig.requeue_lost
    # probe an idle host not heard from this long (None: only once it read unreachable)
    idle_probe_s: float | None = RuntimeConfig.idle_probe_s or None
    # stop a run whose status has read as garbage this long (its job fails); None: hold it until cancelled
    unreadable_stop_after_s: float | None = RuntimeConfig.unreadable_stop_after_s or None
    # remove a run's files from its host this long after it ended; None: keep them for ever
    keep_ended_runs_s: float | None = RuntimeConfig.keep_ended_runs_days * 86400.0
    prune_batch: int = 64  # runs whose files one round removes at most (the rest: later rounds)
    host_parallelism: int = RuntimeConfig.host_parallelism  # hosts called at once
    host_call_deadline_s: float = RuntimeConfig.host_call_deadline_s  # one host call's deadline (a stop: + grace)
    # workload catalog (Lucid artifact format) behind emulated telemetry; None: the synthetic one
    catalog_dir: str | None = None
    holder: str = field(default_factory=default_holder)

    @classmethod
    def from_config(cls, config: LucidConfig, **overrides: Any) -> RoundSettings:
        """Settings from the config's `runtime` section (what `lucid round` and the round DAG use)."""
        values: dict[str, Any] = {f.name: getattr(config.runtime, f.name) for f in fields(config.runtime)}
        values["host_lost_after_s"] = values["host_lost_after_s"] or None  # 0 in the config: wait forever
        values["idle_probe_s"] = values["idle_probe_s"] or None  # 0: idle hosts probed only once unreachable
        values["unreadable_stop_after_s"] = values["unreadable_stop_after_s"] or None  # 0: until cancelled
        days = values.pop("keep_ended_runs_days")
        values["keep_ended_runs_s"] = days * 86400.0 if days else None  # 0: keep for ever
        values["lease_ttl_s"] = lease_ttl_for(config.runtime)  # 0 in the config: outlasts a fan-out of host calls
        return cls(**{**values, **overrides})


@dataclass
class RoundReport:
    round_id: int | None = None
    decisions: list[tuple[str, str | None, str]] = field(default_factory=list)  # (kind, job, reason)
    launched: list[str] = field(default_factory=list)  # run ids started on a host this round
    ended: dict[str, str] = field(default_factory=dict)  # job id -> terminal state
    requeued: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pair_speeds: dict[str, float] = field(default_factory=dict)  # job id -> speed observed while sharing
    conflicts: list[str] = field(default_factory=list)  # writes that found the row changed under them
    removed_hosts: list[str] = field(default_factory=list)  # drained hosts deleted once empty
    pruned: list[str] = field(default_factory=list)  # runs whose files were removed from their hosts
    host_calls: int = 0  # calls made on hosts (polls, launches, stops, reads)
    decide_ms: float = 0.0
    total_ms: float = 0.0
    acquired: bool = True
    fenced: str | None = None  # why the round stopped: another took its lease over


def emulated_profile_from_catalog(catalog: Any) -> EmulatedProfileFn:
    """The catalog profile of a job's workload key, else one picked by a stable hash of its name."""
    import zlib

    workloads = catalog.workloads
    entries = list(workloads() if callable(workloads) else workloads)

    def pick(job: JobRow) -> tuple[float, float, float]:
        by_key = {w.key: w for w in entries}
        workload = by_key.get(job.workload or "")
        if workload is None:
            workload = entries[zlib.crc32(f"{job.user}/{job.name}".encode()) % len(entries)]
        return workload.gpu_util, workload.mem_util, workload.gpu_mem_mb

    return pick

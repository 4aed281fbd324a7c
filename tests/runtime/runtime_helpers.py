"""Helpers for the runtime tests: a small live cluster over real sshd hosts, and a round loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from lucid_core.config import LucidConfig
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.round.scheduling_round import RoundReport, RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.store.store import Store

FAST = {"profiler.tprof_s": 1, "profiler.in_place": False, "binder.sharing": "on",
        "forecast.mode_check_interval_s": 1}
SETTINGS = RoundSettings(stop_grace_s=1.0, telemetry_interval_s=0.25, launch_grace_s=30, lease_ttl_s=5,
                         holder="test-round")


#: yielding at once in a test: a job may be stopped after 1 s of run (checkpoints cost 0.1 s), checked every round
YIELD_NOW = {"profiler.enabled": False, "binder.sharing": "off", "tiresias.checkpoint_cost_s": 0.1,
             "tiresias.checkpoint_cost_wide_s": 0.1, "orchestrator.yield_interval_s": 0,
             "orchestrator.yield_min_run": 1}


def fast_config(**overrides: object) -> LucidConfig:
    return LucidConfig().with_overrides({**FAST, **overrides})


def register(store: Store, cluster, workroot: Path, gpus: dict[str, int] | None = None) -> None:
    """Add the sshd hosts of `cluster` (prof0 profiling, main0/main1 main) with emulated telemetry."""
    gpus = gpus or {"prof0": 2, "main0": 2, "main1": 2}
    for name, count in gpus.items():
        host = cluster.hosts[name]
        add_host(store, HostSpec(
            name, address="127.0.0.1", port=host.port, user=cluster.user, key_path=str(cluster.client_key),
            vc="vc-a", pool="profiling" if name.startswith("prof") else "main", executor="ssh",
            telemetry="emulated", workdir=str(workroot / name), gpus=count))


def one_round(store: Store, cluster, config: LucidConfig, **kwargs) -> RoundReport:
    executor = ssh_executor(str(cluster.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    settings = kwargs.pop("settings", SETTINGS)
    return SchedulingRound(store, executor, config, settings, **kwargs).run()


def rounds_until(store: Store, cluster, config: LucidConfig, done: Callable[[dict[str, JobRow]], bool],
                 timeout_s: float = 30.0, pause_s: float = 0.2, **kwargs) -> dict[str, JobRow]:
    deadline = time.monotonic() + timeout_s
    while True:
        one_round(store, cluster, config, **kwargs)
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout_s} s: "
                                 f"{ {j: (r.state, r.pending_reason) for j, r in jobs.items()} }")
        time.sleep(pause_s)


def jobs_by_id(store: Store) -> dict[str, JobRow]:
    with store.session() as s:
        return {j.job_id: j for j in s.scalars(select(JobRow))}


def runs_of(store: Store, job_id: str) -> list[RunRow]:
    with store.session() as s:
        return list(s.scalars(select(RunRow).where(RunRow.job_id == job_id).order_by(RunRow.planned_at)))


def pid_alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def marked_processes(marker: str) -> dict[int, int]:
    """{pid: process group} of the live processes whose environment holds exactly the entry `marker`."""
    entry = marker.encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = environ.read_bytes().split(b"\0")
            fields = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile, or it is not ours to read
            continue
        if entry in entries and fields[0] != "Z":
            found[int(environ.parent.name)] = int(fields[2])
    return found

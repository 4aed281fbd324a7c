"""Inventory changes are serialised with rounds: removal cannot slip between a round's snapshot and its
writes, a round repairs runs on a host that vanished anyway, and a drained host is removed once empty."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fault_injection import add_local_hosts
from runtime_helpers import SETTINGS, fast_config, jobs_by_id
from sqlalchemy import delete, select, update
from test_lease_fencing import HERE, _env

from lucid_core.runtime.hosts.inventory import InventoryError, drain_host, list_hosts, remove_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store import lease
from lucid_core.runtime.store.schema import GpuRow, HostRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

CONFIG = fast_config(**{"binder.sharing": "off"})


def _round(store: Store):
    return SchedulingRound(store, local_executor(), CONFIG, SETTINGS).run()


def _until(store: Store, done, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(jobs_by_id(store)):
        report = _round(store)
        assert not report.errors, report.errors
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_removal_waits_for_a_round_between_snapshot_and_writes(tmp_path, backend, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")
    with store.session() as s:  # one main host only, so the round's placement lands on m1
        s.execute(delete(GpuRow).where(GpuRow.host == "m0"))
        s.execute(delete(HostRow).where(HostRow.name == "m0"))
    drain_host(store, "m1")  # the job waits, profiled, until the stalled round places it
    job = submit(store, JobRequest("sleep 4", 1, "u", "vc-a"))
    _until(store, lambda j: j[job].state == "QUEUED")
    drain_host(store, "m1", draining=False)
    go = tmp_path / "go"
    slow = subprocess.Popen([sys.executable, str(HERE / "slow_round_child.py"), store.url, str(go), "cli"],
                            env=_env(tmp_path, ttl_s=30), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "STALLED" not in (line := slow.stderr.readline()):
        assert line, "the slow round ended before its snapshot"
    # the round has decided to place the job on m1 and has not written it: removal must not slip in
    with pytest.raises(lease.LeaseHeld, match="scheduling round holds"):
        remove_host(store, "m1", wait_s=1.0)
    go.touch()
    slow.communicate(timeout=60)
    assert slow.returncode == 0
    assert jobs_by_id(store)[job].state == "RUNNING"
    with pytest.raises(InventoryError, match="still runs 1 job run"):
        remove_host(store, "m1", wait_s=5.0)  # waits for no round now; refused: the host has work
    _until(store, lambda j: j[job].state == "COMPLETED")
    remove_host(store, "m1", wait_s=5.0)
    assert "m1" not in {h["name"] for h in list_hosts(store)}
    store.dispose()


def test_round_repairs_runs_on_a_host_that_vanished(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_local_hosts(store, tmp_path / "hosts")
    running = submit(store, JobRequest("sleep 30", 2, "u", "vc-a"))
    _until(store, lambda j: j[running].state == "RUNNING")
    with store.session() as s:
        host = s.scalar(select(RunRow.host).where(RunRow.job_id == running, RunRow.state == "running"))
    other = "m1" if host == "m0" else "m0"
    planned = submit(store, JobRequest("sleep 1", 2, "u", "vc-a"))
    with store.session() as s:  # a placement recorded on `other`, not launched yet
        s.add(RunRow(run_id=f"{planned}-main9", host=other, job_id=planned, kind="main", pool="main",
                     gpu_indices=[0, 1], node_rank=0, state="planned", planned_at=time.time()))
    with store.session() as s:
        s.execute(update(JobRow).where(JobRow.job_id == planned).values(state="RUNNING"))
        for name in (host, other):  # both vanish under the round, as an unserialised removal did
            s.execute(delete(GpuRow).where(GpuRow.host == name))
            s.execute(delete(HostRow).where(HostRow.name == name))
    report = _round(store)  # before: KeyError in build_view, every later round failed
    assert not report.errors, report.errors
    jobs = jobs_by_id(store)
    assert jobs[running].state == "FAILED" and "removed from the inventory" in jobs[running].end_reason
    assert jobs[planned].state in ("QUEUED", "SUBMITTED") and planned in report.requeued
    assert not _round(store).errors
    store.dispose()


def test_drained_host_is_removed_once_its_runs_end(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_local_hosts(store, tmp_path / "hosts")
    job = submit(store, JobRequest("sleep 8", 2, "u", "vc-a"))  # outlasts the "still busy" round under load
    _until(store, lambda j: j[job].state == "RUNNING")
    with store.session() as s:
        host = s.scalar(select(RunRow.host).where(RunRow.job_id == job, RunRow.state == "running"))
    drain_host(store, host, remove=True)
    assert not _round(store).removed_hosts  # still busy
    assert host in {h["name"] for h in list_hosts(store)}
    _until(store, lambda j: j[job].state == "COMPLETED")
    deadline = time.monotonic() + 10
    while host in {h["name"] for h in list_hosts(store)}:
        _round(store)
        assert time.monotonic() < deadline
    store.dispose()

"""A round killed between a launch and its record leaves a planned run that is alive on its host; when
the job is cancelled before the next round, that round must stop the run on the host, not only end its
row "before launch" (the process would live on untracked, holding a GPU the store sees free).

Real processes: the round dies by SIGKILL (round_child.py), the job is a local process.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fault_injection import add_local_hosts
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, runs_of
from test_faults_round import CHILD

from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import HostRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_cancel_after_a_round_died_between_launch_and_record_stops_the_run(tmp_path, backend, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")
    job = submit(store, JobRequest("sleep 30", 1, "u", "vc-a", name="victim"))
    child = subprocess.run([sys.executable, str(CHILD), store.url, "after_launch"], capture_output=True, text=True,
                           timeout=60)
    assert "KILLED" in child.stderr, child.stderr[-2000:]
    [run] = runs_of(store, job)
    assert run.state == "planned"  # launched on the host, not recorded
    cancel(store, job)
    time.sleep(0.6)  # the child's lease (0.5 s) lapses
    SchedulingRound(store, local_executor(), fast_config(), SETTINGS).run()
    assert jobs_by_id(store)[job].state in ("CANCELLED", "RUNNING", "PROFILING")
    with store.session() as s:
        host = host_address(s.get(HostRow, run.host))
    status = local_executor().poll(host, [run.run_id]).get(run.run_id)
    rows = runs_of(store, job)
    tracked = any(r.run_id == run.run_id and r.state == "running" for r in rows)
    assert tracked or status is None or status.state != "RUNNING", \
        f"{run.run_id} runs on {run.host} while the store says {[(r.state, r.outcome) for r in rows]}"
    deadline = time.monotonic() + 30
    while jobs_by_id(store)[job].state != "CANCELLED":
        SchedulingRound(store, local_executor(), fast_config(), SETTINGS).run()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    status = local_executor().poll(host, [run.run_id]).get(run.run_id)
    assert status is None or status.state != "RUNNING", f"{run.run_id} outlived its job's cancellation"
    store.dispose()

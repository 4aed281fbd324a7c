"""Round faults with real job processes (local hosts): the round process SIGKILLed at every step
boundary in turn, and the state database (our own PostgreSQL server) restarted mid-round.

After each: every job ends in exactly one terminal state, no job runs twice, no GPU double-booked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fault_injection import RestartingRound, add_local_hosts
from lucid_invariants import TERMINAL, check_invariants, ledger_command
from runtime_helpers import SETTINGS, fast_config, jobs_by_id

from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

CHILD = Path(__file__).with_name("round_child.py")
KILL_STEPS = ["after_repair", "after_reconcile", "during_decide", "during_record", "after_record",
              "after_launch", "after_execute"]
DB_RESTART_STEPS = ["after_repair", "after_reconcile", "during_record", "after_record", "after_launch",
                    "after_execute"]


def job_mix(i: int) -> tuple[str, int]:
    """(command body, GPUs): ends in profiling, profiled then placed, fails, wide."""
    return [("sleep 0.3", 1), ("sleep 2.4", 1), ("sleep 0.2; exit 3", 1), ("sleep 2.2", 2)][i % 4]


# jobs that outlive their profiling window, so they run on the main hosts beside each other
LONG_MIX = [("sleep 5", 1), ("sleep 4", 1), ("sleep 0.2; exit 3", 1), ("sleep 4", 2)]


def expected_state(i: int) -> str:
    return "FAILED" if i % 4 == 2 else "COMPLETED"


def normal_round(store: Store) -> None:
    SchedulingRound(store, local_executor(), fast_config(), SETTINGS).run()


def test_round_killed_while_host_calls_are_in_flight_is_repaired(tmp_path):
    """SIGKILL while a fan-out of host calls is under way (one host answered, another's call still running):
    launches may have started on hosts the store does not know of; the next round finishes them once."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_local_hosts(store, tmp_path / "hosts")
    ledger = tmp_path / "ledger"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    jobs: list[tuple[str, int]] = []
    killed, cycle = 0, 0
    deadline = time.monotonic() + 180  # each cycle starts a child process: slow on a loaded machine
    while True:
        if cycle < 5:
            for i in range(4 * cycle, 4 * cycle + 4):  # more than one main host holds, long enough to reach them:
                body, gpus = LONG_MIX[i % len(LONG_MIX)]  # a round then has calls to several hosts at once
                jobs.append((submit(store, JobRequest(ledger_command(ledger, body), gpus, "u", "vc-a")), i))
        child = subprocess.run([sys.executable, str(CHILD), store.url, "during_calls"], env=env,
                               capture_output=True, text=True, timeout=60)
        if child.returncode == -9:
            assert "KILLED" in child.stderr
            killed += 1
        else:
            assert child.returncode == 0, child.stderr[-2000:]
        time.sleep(0.6)  # the dead round's lease (0.5 s) lapses
        normal_round(store)
        cycle += 1
        rows = jobs_by_id(store)
        if cycle >= 5 and all(r.state in TERMINAL for r in rows.values()) and killed >= 2:
            break
        assert time.monotonic() < deadline, (killed, {j: (r.state, r.pending_reason) for j, r in rows.items()})
        time.sleep(0.1)
    states = check_invariants(store, [j for j, _ in jobs], ledger)
    for job_id, i in jobs:
        expected = "FAILED" if "exit 3" in LONG_MIX[i % len(LONG_MIX)][0] else "COMPLETED"
        assert states[job_id] == expected, (job_id, i, jobs_by_id(store)[job_id].end_reason)
    store.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_round_killed_at_every_step_boundary_repairs_without_running_twice(tmp_path, backend, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")
    ledger = tmp_path / "ledger"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    jobs: list[tuple[str, int]] = []
    killed: dict[str, int] = {step: 0 for step in KILL_STEPS}
    deadline = time.monotonic() + 120
    cycle = 0
    while True:
        if cycle < 12:  # keep work arriving so every step has something to interrupt
            body, gpus = job_mix(cycle)
            jobs.append((submit(store, JobRequest(ledger_command(ledger, body), gpus, "u", "vc-a")), cycle))
        step = KILL_STEPS[cycle % len(KILL_STEPS)]
        child = subprocess.run([sys.executable, str(CHILD), store.url, step], env=env, capture_output=True,
                               text=True, timeout=60)
        if child.returncode == -9:
            assert "KILLED" in child.stderr
            killed[step] += 1
        else:
            assert child.returncode == 0, child.stderr[-2000:]
        time.sleep(0.6)  # the dead round's lease (0.5 s) lapses
        normal_round(store)
        cycle += 1
        rows = jobs_by_id(store)
        if cycle >= 12 and all(r.state in TERMINAL for r in rows.values()) and all(killed.values()):
            break
        assert time.monotonic() < deadline, (killed, {j: (r.state, r.pending_reason) for j, r in rows.items()})
        time.sleep(0.1)
    states = check_invariants(store, [j for j, _ in jobs], ledger)
    for job_id, i in jobs:
        assert states[job_id] == expected_state(i), (job_id, i, jobs_by_id(store)[job_id].end_reason)
    store.dispose()


@pytest.mark.postgres
def test_state_database_restarting_mid_round_loses_nothing(fresh_pg_store, throwaway_pg, tmp_path):
    store = fresh_pg_store
    add_local_hosts(store, tmp_path / "hosts")
    ledger = tmp_path / "ledger"
    jobs: list[tuple[str, int]] = []

    def submit_batch(count: int) -> None:
        for i in range(len(jobs), len(jobs) + count):
            jobs.append((submit(store, JobRequest(ledger_command(ledger, job_mix(i)[0]), job_mix(i)[1], "u",
                                                  "vc-a")), i))

    submit_batch(8)
    restarts, failures = [], []
    deadline = time.monotonic() + 150
    cycle = 0
    while True:
        # the steps not hit yet come round first; a step bites only in a round that reaches it (after_launch:
        # one that launches), so when every job has ended with a step still missing, more jobs are submitted
        missing = [step for step in DB_RESTART_STEPS if step not in restarts] or DB_RESTART_STEPS
        step = missing[cycle % len(missing)]
        rnd = RestartingRound(store, local_executor(), fast_config(), SETTINGS, server=throwaway_pg, restart_at=step)
        try:
            rnd.run()
        except sa.exc.DBAPIError as exc:  # the round may die with the database; the next one repairs
            failures.append((step, type(exc.orig).__name__))
        if rnd.restarted:
            restarts.append(step)
        cycle += 1
        rows = jobs_by_id(store)
        if all(r.state in TERMINAL for r in rows.values()):
            if set(restarts) >= set(DB_RESTART_STEPS):
                break
            submit_batch(4)
        assert time.monotonic() < deadline, (sorted(set(restarts)), {j: (r.state, r.pending_reason)
                                                                      for j, r in rows.items()})
        time.sleep(0.1)
    assert failures, "no round ever saw its database go away: the restart did not bite"
    states = check_invariants(store, [j for j, _ in jobs], ledger)
    for job_id, i in jobs:
        assert states[job_id] == expected_state(i), (job_id, i, jobs_by_id(store)[job_id].end_reason)

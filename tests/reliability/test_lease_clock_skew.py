"""Two controllers whose wall clocks disagree by more than the lease's TTL (a host whose NTP broke).

When the lease's expiry was written and judged with each process's own clock, a controller running ahead
saw a live round's lease as lapsed and took it over: the live round was fenced, and a skewed controller
fenced every round of the others. Expiry is now written and judged by the database's clock (`db_clock`),
one for all, so the skewed controller finds the lease held and leaves.

Real processes: the live round is a `lucid round` child stalled after its snapshot (lease TTL 30 s), the
skewed one a `lucid round` whose clock (`time.time`, all a controller's own code reads) runs 45 s ahead.
On SQLite the database's clock is the machine's (every process on it shares that file and that clock); on
PostgreSQL it is the server's.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fault_injection import add_local_hosts
from sqlalchemy import select
from test_lease_fencing import HERE, REPO, _env

from lucid_core.runtime.store.schema import JobEventRow, JobRow, RoundRow, RunRow
from lucid_core.runtime.store.store import Store

SKEWED_ROUND = ("import sys, time; real = time.time; time.time = lambda: real() + 45.0; "
                "from lucid_core.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_skewed_controller_does_not_take_a_live_lease(tmp_path, backend, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")
    env = _env(tmp_path, ttl_s=30)
    go = tmp_path / "go"
    live = subprocess.Popen([sys.executable, str(HERE / "slow_round_child.py"), store.url, str(go), "cli"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "STALLED" not in (line := live.stderr.readline()):
            assert line, "the live round ended before its snapshot"
        skewed = subprocess.run([sys.executable, "-c", SKEWED_ROUND, "round", "--store", store.url,
                                 "--lucid-config", env["LUCID_CONFIG"]], env=env, capture_output=True, text=True,
                                timeout=60, cwd=REPO)
    finally:
        go.touch()
    out, _err = live.communicate(timeout=60)
    store.dispose()
    assert skewed.returncode == 3, f"the skewed controller took a live lease: rc {skewed.returncode}"
    assert live.returncode == 0, f"the live round was fenced by the skewed one: {out[-500:]}"
    assert "another round holds the lease" in skewed.stderr


SKEWED_HOUR = ("import sys, time; real = time.time; time.time = lambda: real() + 3600.0; "
               "from lucid_core.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_skewed_submitter_and_controller_write_the_databases_time(tmp_path, backend, request):
    """A submitter and a controller an hour ahead (an Airflow worker whose clock is off) write the times of
    the submission, the round, its decisions and its runs on the database's clock: nothing an hour in the
    future for the next, correct controller to misjudge (a wait counted from the future, a run judged
    vanished, a host given up)."""
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")
    env = _env(tmp_path, ttl_s=30)

    def skewed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SKEWED_HOUR, *args], env=env, capture_output=True,
                              text=True, timeout=60, cwd=REPO)

    before = time.time()
    submitted = skewed("submit", "--store", store.url, "--gpus", "1", "--vc", "vc-a", "--", "sleep", "30")
    assert submitted.returncode == 0, submitted.stderr
    placed = skewed("round", "--store", store.url, "--lucid-config", env["LUCID_CONFIG"])
    assert placed.returncode == 0, placed.stderr
    after = time.time()
    with store.session() as s:
        written = {"submit": list(s.scalars(select(JobRow.submit_time))),
                   "round": list(s.scalars(select(RoundRow.started_at))),
                   "event": list(s.scalars(select(JobEventRow.time))),
                   "run": [t for t in s.scalars(select(RunRow.planned_at)) if t is not None]}
    for job in _job_ids(store):  # stop the job's run before the hosts' directory goes
        subprocess.run([sys.executable, "-m", "lucid_core.cli", "cancel", "--store", store.url, job], env=env,
                       capture_output=True, timeout=60, cwd=REPO)
    subprocess.run([sys.executable, "-m", "lucid_core.cli", "round", "--store", store.url, "--lucid-config",
                    env["LUCID_CONFIG"]], env=env, capture_output=True, timeout=60, cwd=REPO)
    store.dispose()
    assert all(written.values()), f"nothing written of some kind: {written}"
    for kind, times in written.items():
        assert all(before - 5 <= t <= after + 5 for t in times), f"{kind} times off the database's clock: {times}"


def _job_ids(store: Store) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(JobRow.job_id)))

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

import pytest
from fault_injection import add_local_hosts
from test_lease_fencing import HERE, REPO, _env

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

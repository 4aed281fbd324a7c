"""Two controllers whose processes look alike (containers: same host name, same pid) are still two
holders: the second `lucid round` must not take the lease the first holds (a holder re-takes its own
unexpired lease, which is meant for a retried Airflow try, not for a stranger with the same name).

Real processes: each `lucid round` runs as pid 1 of its own pid namespace (`unshare`), as in a container.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from fault_injection import add_local_hosts
from test_lease_fencing import HERE, _env

from lucid_core.runtime.store.store import Store


def _as_pid_one(argv: list[str]) -> list[str]:
    return ["unshare", "--pid", "--fork", "--", "sh", "-c", 'exec "$@"', "sh", *argv]


def _pid_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(_as_pid_one([sys.executable, "-c", "import os; print(os.getpid())"]),
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == "1"


def test_look_alike_controllers_do_not_share_the_lease(tmp_path):
    if not _pid_namespaces_work():
        pytest.skip("needs `unshare --pid` (root or user namespaces) to run two processes as pid 1")
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_local_hosts(store, tmp_path / "hosts")
    env = _env(tmp_path, ttl_s=30)
    go = tmp_path / "go"
    first = subprocess.Popen(_as_pid_one([sys.executable, str(HERE / "slow_round_child.py"), store.url, str(go),
                                          "cli"]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "STALLED" not in (line := first.stderr.readline()):  # holds the lease, 30 s TTL
            assert line, "the first round ended before its snapshot"
        second = subprocess.run(_as_pid_one([sys.executable, "-m", "lucid_core.cli", "round", "--store", store.url,
                                             "--lucid-config", env["LUCID_CONFIG"]]),
                                env=env, capture_output=True, text=True, timeout=60)
    finally:
        go.touch()
    out, err = first.communicate(timeout=60)
    assert second.returncode == 3, f"the look-alike took the held lease: rc {second.returncode} {second.stderr[-500:]}"
    assert first.returncode == 0, f"the first round was fenced by its look-alike: {out[-1000:]} {err[-1000:]}"
    store.dispose()

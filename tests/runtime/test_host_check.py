"""`lucid hosts check`: a real sshd host is found ready; each broken prerequisite is named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from runtime_helpers import register

from lucid_core.runtime.hosts.check import check_host
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.store.schema import HostRow
from lucid_core.runtime.store.store import Store


def _items(report) -> dict[str, bool]:
    return {i.name: i.ok for i in report.items}


@pytest.mark.ssh
def test_a_healthy_sshd_host_is_ready_and_each_broken_prerequisite_is_named(sshd_hosts, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts", gpus={"main0": 2, "main1": 2})
    executor = ssh_executor(str(sshd_hosts.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    try:
        healthy = check_host(store, executor, "main0")
        assert healthy.ok, healthy.describe()
        assert {"reach", "workdir", "disk", "python", "setsid"} <= set(_items(healthy))
        assert "nvidia-smi" not in _items(healthy)  # emulated telemetry: NVML is not needed

        (tmp_path / "blocked").write_text("a file where the work directory should be")
        with store.session() as s:
            row = s.get(HostRow, "main1")
            row.workdir, row.python = str(tmp_path / "blocked"), "/nonexistent/python3"
        broken = check_host(store, executor, "main1")
        assert not broken.ok
        assert _items(broken) == {"reach": True, "workdir": False, "disk": True, "python": False, "setsid": True}
        assert "cannot create files" in broken.describe() and "/nonexistent/python3" in broken.describe()

        with store.session() as s:
            row = s.get(HostRow, "main1")
            row.port, row.workdir, row.python, row.telemetry = 1, str(tmp_path / "w"), "python3", "nvml"
        fresh = ssh_executor(str(sshd_hosts.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
        try:  # a new executor: the first one keeps its connection to the old port open
            gone = check_host(store, fresh, "main1")
        finally:
            fresh.close()
        assert _items(gone) == {"reach": False}, gone.describe()
    finally:
        executor.close()
    store.dispose()


def test_nvml_and_sudo_checks_on_a_local_host(tmp_path):
    """Without a GPU the NVML checks fail with what is missing; sudo reaches a real user, not a missing one."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("gpu", executor="local", telemetry="nvml", gpus=2, workdir=str(tmp_path / "gpu")))
    add_host(store, HostSpec("sub", executor="local", telemetry="emulated", gpus=1, run_as="submitter",
                             workdir=str(tmp_path / "sub")))
    executor = local_executor()
    nvml = check_host(store, executor, "gpu")
    smi = next(i for i in nvml.items if i.name == "nvidia-smi")
    assert not smi.ok and ("not found" in smi.detail or "in the store" in smi.detail)
    assert not check_host(store, executor, "sub").ok  # no --as-user: says what to give
    assert "give --as-user" in check_host(store, executor, "sub").describe()
    assert not check_host(store, executor, "sub", as_user="root").ok  # never a target
    missing = check_host(store, executor, "sub", as_user="lucid-no-such-user")
    assert not _items(missing)["sudo"], missing.describe()
    import shutil

    if shutil.which("sudo") is None:
        print("sudo is not installed: the reachable-user case is not checked here")
    else:
        reached = check_host(store, executor, "sub", as_user="nobody")
        assert _items(reached)["sudo"], reached.describe()
    cli = subprocess.run([sys.executable, "-m", "lucid_core.cli", "hosts", "check", "gpu", "--store", store.url,
                          "--json"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1, cli.stderr  # not ready: a script can tell
    assert json.loads(cli.stdout)[0]["host"] == "gpu"
    store.dispose()

"""A stop reaches the run's processes that left its process group (`setsid`, `set -m` + `nohup`), found by
the run's environment marker on a real sshd host, and nothing of another run: not one started beside it,
not one of the same run id from another work directory, not one whose env value spells the marker."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_helpers import marked_processes

from lucid_core.runtime.hosts.executor import HostAddress, HostExecutor, LaunchSpec, RunStatus
from lucid_core.runtime.hosts.run_records import RUN_MARKER
from lucid_core.runtime.hosts.ssh_executor import ssh_executor

pytestmark = pytest.mark.ssh

# a child in a new session, a `nohup` child in its own job-control group (bash: dash has no job
# control without a terminal), then the job's own foreground sleep
ESCAPING = "setsid sleep 300 & bash -c 'set -m; nohup sleep 301 > /dev/null 2>&1 &'; sleep 302"


@pytest.fixture
def host(sshd_hosts, tmp_path) -> Iterator[HostAddress]:
    if shutil.which("bash") is None:
        pytest.skip("bash is needed for a job-control (`set -m`) child: dash has none without a terminal")
    ssh = sshd_hosts.hosts["main0"]
    yield HostAddress("main0", "127.0.0.1", ssh.port, sshd_hosts.user, str(sshd_hosts.client_key),
                      str(tmp_path / "w"), executor="ssh")
    for marker in tmp_path.rglob("marker"):  # a failed test leaves nothing running
        for pid in marked_processes(f"{RUN_MARKER}={marker.read_text().strip()}"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def executor(sshd_hosts):
    executor = ssh_executor(str(sshd_hosts.known_hosts), connect_timeout_s=3, retries=1)
    yield executor
    executor.close()


def marker_of(host: HostAddress, run_id: str) -> str:
    return f"{RUN_MARKER}=" + (Path(host.workdir) / run_id / "marker").read_text().strip()


def started(host: HostAddress, run_id: str, sleeps: int, outside_group: int,
            timeout_s: float = 10.0) -> dict[int, int]:
    """The run's marked processes ({pid: pgid}) once all its `sleeps` sleeps run, `outside_group` of them
    out of the wrapper's process group (checked: else the test would not cover what it says)."""
    pgid = int((Path(host.workdir) / run_id / "pid").read_text())
    deadline = time.monotonic() + timeout_s
    while True:
        found = marked_processes(marker_of(host, run_id))
        sleeping = {pid: group for pid, group in found.items() if command_of(pid).startswith("sleep ")}
        if len(sleeping) >= sleeps:
            assert sum(group != pgid for group in sleeping.values()) == outside_group, (run_id, pgid, found)
            return found
        assert time.monotonic() < deadline, (run_id, pgid, found)
        time.sleep(0.05)


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def stop_and_wait(executor: HostExecutor, host: HostAddress, run_id: str, grace_s: float = 1.0) -> RunStatus:
    status = executor.stop(host, run_id, "cancel", grace_s)
    deadline = time.monotonic() + 5
    while marked_processes(marker_of(host, run_id)):
        assert time.monotonic() < deadline, (run_id, marked_processes(marker_of(host, run_id)), status)
        time.sleep(0.05)
    return status


def test_cancel_kills_processes_that_left_the_group_and_no_other_runs(executor, host, tmp_path):
    executor.launch(host, LaunchSpec("j1-main0", ESCAPING))
    victim = started(host, "j1-main0", sleeps=3, outside_group=2)
    marker = marker_of(host, "j1-main0")
    # beside it: a run whose env values spell the victim's marker (as a substring, and after a newline:
    # an exact match on lines of the raw environ would take it), and the same run id from another store
    forged = {"FORGED_LINE": f"x\n{marker}", "FORGED_SUBSTRING": f"{marker}0", "FORGED_PREFIX": f"A{marker}"}
    executor.launch(host, LaunchSpec("j2-main0", "setsid sleep 303 & sleep 304", forged))
    twin = dataclasses.replace(host, workdir=str(tmp_path / "other-store"))
    executor.launch(twin, LaunchSpec("j1-main0", "setsid sleep 305 & sleep 306"))
    bystanders = {**started(host, "j2-main0", sleeps=2, outside_group=1),
                  **started(twin, "j1-main0", sleeps=2, outside_group=1)}
    assert marker_of(twin, "j1-main0") != marker

    t0 = time.monotonic()
    status = stop_and_wait(executor, host, "j1-main0")
    assert (status.state, status.exit_code, status.stop_requested) == ("EXITED", 143, True), status
    assert status.escaped == 2, status  # the setsid child and the nohup child; not the group's own
    assert time.monotonic() - t0 < 5
    assert all(not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] == "Z"
               for pid in victim), victim
    still = {**marked_processes(marker_of(host, "j2-main0")), **marked_processes(marker_of(twin, "j1-main0"))}
    assert still == bystanders, "the stop touched another run"

    for address in (host, twin):
        status = stop_and_wait(executor, address, "j2-main0" if address is host else "j1-main0")
        assert status.escaped == 1 and status.stop_requested, status


def test_a_stop_after_the_command_ended_still_reaps_what_it_left_outside_its_group(executor, host):
    """The command exits 0 leaving a session leader behind (a daemon): a later stop (host-loss reaping,
    a peer ended) finds it by the marker, though the group is no longer signalled."""
    executor.launch(host, LaunchSpec("j3-main0", "setsid sleep 307 & exit 0"))
    started(host, "j3-main0", sleeps=1, outside_group=1)
    deadline = time.monotonic() + 10
    while executor.poll(host, ["j3-main0"])["j3-main0"].state != "EXITED":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert marked_processes(marker_of(host, "j3-main0")), "the daemon should outlive its command"
    status = stop_and_wait(executor, host, "j3-main0")
    assert (status.state, status.exit_code, status.stop_requested, status.escaped) == ("EXITED", 0, False, 1)


def test_an_escaped_process_that_ignores_term_is_killed_after_the_grace(executor, host):
    executor.launch(host, LaunchSpec("j4-main0", "setsid sh -c 'trap \"\" TERM; sleep 308' & sleep 309"))
    started(host, "j4-main0", sleeps=2, outside_group=1)
    t0 = time.monotonic()
    status = stop_and_wait(executor, host, "j4-main0", grace_s=1.0)
    took = time.monotonic() - t0
    assert status.escaped == 2 and status.stop_requested, status  # the TERM-ignoring shell and its sleep
    assert 0.9 <= took < 5, took  # it was given the grace before the KILL


def test_a_job_that_ends_on_its_own_leaves_nothing_running(sshd_hosts, tmp_path):
    """The round sweeps a naturally ended run: a daemon the job started (`setsid`, so outside its group)
    would otherwise keep its GPU memory after the scheduler gave the GPU to the next job."""
    from runtime_helpers import fast_config, jobs_by_id, one_round, register, runs_of

    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts", gpus={"main0": 1})
    config = fast_config(**{"profiler.enabled": False})
    job = submit(store, JobRequest("setsid sleep 300 < /dev/null > /dev/null 2>&1 & exit 0", gpus=1,
                                   user="ann", vc="vc-a", name="leaves-a-daemon"))
    deadline = time.monotonic() + 30
    while jobs_by_id(store)[job].state != "COMPLETED":
        one_round(store, sshd_hosts, config)
        assert time.monotonic() < deadline, jobs_by_id(store)[job].state
        time.sleep(0.2)
    (run,) = runs_of(store, job)
    marker = f"{RUN_MARKER}=" + (tmp_path / "hosts" / "main0" / run.run_id / "marker").read_text().strip()
    assert marked_processes(marker) == {}, "the daemon outlived the round that saw its job end"
    assert "1 of its processes outlived it" in run.outcome, run.outcome
    store.dispose()

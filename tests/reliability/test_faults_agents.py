"""Faults on the hosts themselves, with real processes: a telemetry agent that hangs, and a host whose
log directory is on a full disk (a small tmpfs).

After each: every job ends in exactly one terminal state, no job runs twice, no GPU double-booked,
and rounds stay quick (a hung agent or a full disk never stalls the scheduler).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from lucid_invariants import TERMINAL, check_invariants, ledger_command
from runtime_helpers import fast_config, jobs_by_id
from sqlalchemy import select

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import JobEventRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

SETTINGS = RoundSettings(stop_grace_s=1.0, telemetry_interval_s=0.2, launch_grace_s=3, lease_ttl_s=5,
                         holder="reliability")


def drive(store, config, timeout_s=40.0):
    """Rounds until every job has ended; returns the slowest round's wall time in seconds."""
    deadline = time.monotonic() + timeout_s
    slowest = 0.0
    while True:
        t0 = time.perf_counter()
        SchedulingRound(store, local_executor(timeout_s=10), config, SETTINGS).run()
        slowest = max(slowest, time.perf_counter() - t0)
        rows = jobs_by_id(store)
        if all(r.state in TERMINAL for r in rows.values()):
            return slowest
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason, r.end_reason) for j, r in rows.items()}
        time.sleep(0.2)


def hanging_python(root: Path, hang_after_s: float) -> tuple[Path, Path]:
    """A `python` for the host whose telemetry agent hangs: never starts sampling (0), or is frozen
    (SIGSTOP, as a stuck NVML call leaves it) after `hang_after_s` seconds of sampling."""
    pids = root / "hung_agents"
    script = root / f"python_hangs_after_{hang_after_s:g}"
    if hang_after_s == 0:
        script.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 3600\n")
    else:
        script.write_text(f"""#!/bin/sh
python3 "$@" &
agent=$!
echo $agent >> {pids}
sleep {hang_after_s:g}
kill -s STOP $agent
wait $agent
""")
    script.chmod(0o755)
    return script, pids


@pytest.mark.parametrize("hang_after_s", [0.0, 0.7], ids=["at-start", "mid-window"])
def test_a_hung_telemetry_agent_never_stalls_rounds_or_loses_jobs(tmp_path, hang_after_s):
    python, pids = hanging_python(tmp_path, hang_after_s)
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "p0"), python=str(python)))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m0")))
    ledger = tmp_path / "ledger"
    jobs = [submit(store, JobRequest(ledger_command(ledger, body), 1, "u", "vc-a"))
            for body in ("sleep 3", "sleep 0.3", "sleep 2.5; exit 5")]
    try:
        slowest = drive(store, fast_config())
    finally:
        for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert pids.exists() and pids.read_text().split(), "no agent was started through the hanging python"
    states = check_invariants(store, jobs, ledger)
    assert states == {jobs[0]: "COMPLETED", jobs[1]: "COMPLETED", jobs[2]: "FAILED"}
    assert slowest < 5.0, f"a round took {slowest:.1f} s with a hung agent"
    with store.session() as s:
        kinds = {e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == jobs[0]))}
    if hang_after_s == 0.0:  # nothing was sampled on the profiling host: the job moves on, and says so
        assert "profile_missing" in kinds


def tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}")


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs for a host's run logs: the first noisy job fills it."""
    mount = tmp_path / "small_disk"
    tmpfs(mount, "256k")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_disk_full_log_write_fails_the_job_cleanly_and_spares_the_rest(tmp_path, full_disk):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("full", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(full_disk / "runs")))
    add_host(store, HostSpec("ok", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "ok")))
    ledger = tmp_path / "ledger"  # on the roomy disk
    config = fast_config(**{"profiler.enabled": False})
    noisy = [submit(store, JobRequest(ledger_command(ledger, "head -c 2000000 /dev/zero && sleep 0.3"), 1, "u",
                                      "vc-a", name=f"noisy{i}")) for i in range(2)]
    quiet = [submit(store, JobRequest(ledger_command(ledger, "sleep 0.3"), 1, "u", "vc-a", name=f"quiet{i}"))
             for i in range(2)]
    slowest = drive(store, config)
    states = check_invariants(store, noisy + quiet, ledger)
    rows = jobs_by_id(store)
    from runtime_helpers import runs_of


    ran_on_full = [j for j in noisy + quiet if any(r.host == "full" and r.started_at for r in runs_of(store, j))]
    assert ran_on_full, "no job ran on the full disk's host"
    for job_id in noisy + quiet:
        runs = runs_of(store, job_id)
        if job_id in ran_on_full and job_id in noisy:  # its log write failed, so did its command (and says so)
            assert states[job_id] == "FAILED" and rows[job_id].exit_code == 1, rows[job_id].end_reason
            assert rows[job_id].end_reason == ("exited with code 1; the disk of host full was full when it ended: "
                                               "its log may be cut short"), rows[job_id].end_reason
        elif all(r.host == "full" for r in runs):  # every launch refused by the full disk, saying so
            assert states[job_id] == "FAILED" and "cannot write the run files" in rows[job_id].end_reason
        else:
            assert states[job_id] == "COMPLETED", rows[job_id].end_reason
    assert slowest < 5.0


def test_a_job_refused_by_a_full_host_runs_on_a_healthy_one(tmp_path, full_disk):
    (full_disk / "filler").write_bytes(b"x" * (256 * 1024))
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("full", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(full_disk / "runs")))
    add_host(store, HostSpec("ok", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "ok")))
    config = fast_config(**{"profiler.enabled": False})
    jobs = [submit(store, JobRequest("sleep 0.5", 1, "u", "vc-a")) for _ in range(2)]
    drive(store, config)
    check_invariants(store, jobs)
    assert {r.state for r in jobs_by_id(store).values()} == {"COMPLETED"}


def test_a_launch_on_a_full_disk_is_refused_with_the_reason_and_runs_nothing(tmp_path, full_disk):
    """Run files that cannot be written must not be run (a cut-short command.sh would run a prefix)."""
    from lucid_core.runtime.hosts.executor import HostAddress, HostCommandFailed, LaunchSpec

    (full_disk / "filler").write_bytes(b"x" * (256 * 1024))  # ENOSPC comes before the file is whole
    host = HostAddress("full", executor="local", workdir=str(full_disk / "runs"))
    (full_disk / "runs").mkdir(exist_ok=True)
    canary = tmp_path / "ran"
    command = f"touch {canary}; " + "true; " * 3000  # longer than what still fits on the disk
    with pytest.raises(HostCommandFailed, match="cannot write"):
        local_executor().launch(host, LaunchSpec("r1", command, {"X": "1"}))
    time.sleep(0.5)
    assert not canary.exists()
    assert not (full_disk / "runs" / "r1").exists()  # no half-made run directory left behind


def test_a_job_that_succeeds_while_the_log_disk_fills_up_still_completes(tmp_path, full_disk):
    """The disk fills after launch (another tenant's logs): the job's exit code must still be recorded."""
    from lucid_core.runtime.hosts.executor import HostAddress, LaunchSpec

    host = HostAddress("full", executor="local", workdir=str(full_disk / "runs"))
    executor = local_executor()
    executor.launch(host, LaunchSpec("r1", "sleep 1; exit 0"))
    executor.launch(host, LaunchSpec("r2", "sleep 1; exit 3"))
    filler = full_disk / "filler"
    try:  # fill every last block
        with open(filler, "wb", buffering=0) as handle:
            while True:
                handle.write(b"x" * 4096)
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while {s.state for s in executor.poll(host, ["r1", "r2"]).values()} & {"RUNNING", "NOPID"}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    statuses = executor.poll(host, ["r1", "r2"])
    assert (statuses["r1"].state, statuses["r1"].exit_code) == ("EXITED", 0), statuses
    assert (statuses["r2"].state, statuses["r2"].exit_code) == ("EXITED", 3), statuses


def test_a_stop_on_a_full_disk_is_still_known_as_a_stop(tmp_path, full_disk):
    """A profiling window ending (or a preemption) on a host whose disk is full is a stop, not the job
    failing with 143. The stop's marks are files whose presence is the mark: creating one needs an inode,
    not a block, so they survive a full disk (empty)."""
    from lucid_core.runtime.hosts.executor import HostAddress, LaunchSpec

    host = HostAddress("full", executor="local", workdir=str(full_disk / "runs"))
    executor = local_executor()
    executor.launch(host, LaunchSpec("r1", "sleep 30"))
    time.sleep(0.3)
    try:
        with open(full_disk / "filler", "wb", buffering=0) as handle:
            while True:
                handle.write(b"x" * 4096)
    except OSError:
        pass
    status = executor.stop(host, "r1", "profiling_window", grace_s=2)
    assert status.state == "EXITED" and status.stop_requested, status
    assert executor.poll(host, ["r1"])["r1"].stop_requested

"""Executors: quoting of what the scheduler adds, the user's command verbatim, reuse of SSH connections,
GPU discovery, and the local executor's TERM-then-KILL stop."""

from __future__ import annotations

import json
import time

import pytest

from lucid_core.runtime.hosts.executor import HostAddress, HostExecutor, LaunchSpec, ScriptResult, parse_status
from lucid_core.runtime.hosts.inputs import check_run_id
from lucid_core.runtime.hosts.launch import launch_script
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.ssh_executor import SshTransport, ssh_executor
from lucid_core.runtime.hosts.telemetry import RECORD_BYTES_BOUND, parse_samples

NASTY = "it's \"quoted\" $HOME `date` \\ ; rm -rf /nonexistent"


def _wait_exit(executor, host, run_id, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = executor.poll(host, [run_id])[run_id]
        if status.state == "EXITED":
            return status
        time.sleep(0.05)
    raise AssertionError(f"{run_id} did not exit")


def test_run_ids_and_env_names_cannot_escape(tmp_path):
    for bad in ("../x", "a b", "", "x;rm", "-rf"):
        with pytest.raises(ValueError):
            check_run_id(bad)
    with pytest.raises(ValueError, match="not a valid identifier"):
        launch_script(str(tmp_path), "j1-main1", "true", {"A B": "x"})


def test_local_executor_quotes_env_runs_command_verbatim_and_stops_term_then_kill(tmp_path):
    executor = local_executor()
    host = HostAddress("local", executor="local", workdir=str(tmp_path))
    command = 'printf "%s|%s\\n" "$LUCID_TEST" "$CUDA_VISIBLE_DEVICES"; echo \'single\' "$((1+2))"; exit 5'
    spec = LaunchSpec("j1-main1", command, {"LUCID_TEST": NASTY, "CUDA_VISIBLE_DEVICES": "0,1"})
    first = executor.launch(host, spec)
    again = executor.launch(host, spec)
    assert not first.already_launched and again.already_launched and again.pid == first.pid
    status = _wait_exit(executor, host, "j1-main1")
    assert status.exit_code == 5 and not status.stop_requested
    assert executor.read(host, "j1-main1", "stdout.log") == f"{NASTY}|0,1\nsingle 3\n"
    stubborn = LaunchSpec("j2-main1", "trap '' TERM; sleep 60", {})
    executor.launch(host, stubborn)
    time.sleep(0.2)
    t0 = time.monotonic()
    stopped = executor.stop(host, "j2-main1", "cancel", grace_s=0.5)
    assert stopped.state == "VANISHED" and stopped.stop_requested and time.monotonic() - t0 < 5
    polite = LaunchSpec("j3-main1", "sleep 60", {})
    executor.launch(host, polite)
    time.sleep(0.2)
    stopped = executor.stop(host, "j3-main1", "cancel", grace_s=5)
    assert (stopped.state, stopped.exit_code, stopped.stop_requested) == ("EXITED", 143, True)


@pytest.mark.ssh
def test_ssh_connection_is_reused_within_a_round_and_output_is_verbatim(sshd_hosts, tmp_path):
    host = sshd_hosts.hosts["main1"]
    transport = SshTransport(str(sshd_hosts.known_hosts), connect_timeout_s=3, retries=0)
    executor = ssh_executor(str(sshd_hosts.known_hosts))
    executor.transports["ssh"] = transport
    address = HostAddress("main1", "127.0.0.1", host.port, sshd_hosts.user, str(sshd_hosts.client_key),
                          str(tmp_path / "w"), executor="ssh")
    executor.launch(address, LaunchSpec("j9-main1", 'echo "$LUCID_TEST"', {"LUCID_TEST": NASTY}))
    _wait_exit(executor, address, "j9-main1")
    assert executor.read(address, "j9-main1", "stdout.log") == NASTY + "\n"
    assert executor.poll(address, ["j9-main1", "j8-main1"])["j8-main1"].state == "MISSING"
    assert transport.connects == 1  # one connection for five operations
    executor.close()
    executor.poll(address, ["j9-main1"])
    assert transport.connects == 2  # a new round opens a new one


def test_gpus_are_discovered_with_nvidia_smi_over_the_executor(tmp_path, monkeypatch):
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host, list_hosts
    from lucid_core.runtime.store.store import Store

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, GPU-aaa'\necho '1, NVIDIA H200, 143771, GPU-bbb'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    gpus = add_host(store, HostSpec("gpu0", executor="local"), local_executor())
    assert [(g.index, g.model, g.memory_mb, g.uuid) for g in gpus] == [
        (0, "NVIDIA H200", 143771.0, "GPU-aaa"), (1, "NVIDIA H200", 143771.0, "GPU-bbb")]
    assert list_hosts(store)[0]["gpus"] == 2
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    from lucid_core.runtime.hosts.inventory import InventoryError

    with pytest.raises(InventoryError, match="no NVIDIA GPU"):
        add_host(store, HostSpec("cpu0", executor="local"), local_executor())
    store.dispose()


def test_a_profile_window_is_read_from_the_files_front_past_what_the_job_appended(tmp_path):
    """The agent's window heads its telemetry file; the job may append megabytes of long lines and junk to
    it. The front read keeps every window sample, where a tail read of the same size sees none of them."""
    host = HostAddress("local", executor="local", workdir=str(tmp_path))
    run_dir = tmp_path / "j3-prof1"
    run_dir.mkdir()
    window = [json.dumps({"gpu": 0, "gpu_util": 40.0 + i, "mem_util": 5.0, "mem_used_mb": 900.0, "t": 100.0 + i})
              for i in range(12)]
    with open(run_dir / "telemetry.jsonl", "wb") as fh:
        fh.write(("\n".join(window[:4]) + "\n").encode())
        fh.write(b"x" * (1 << 20) + b"\n\377\376junk\n")  # a long line amid the window
        fh.write(("\n".join(window[4:]) + "\n").encode())
        for _ in range(3):
            fh.write(b'{"t": NaN}\n' + b"y" * (1 << 20) + b"\n")
    executor = local_executor()
    front = executor.read_front_lines(host, "j3-prof1", "telemetry.jsonl", 1 << 20, RECORD_BYTES_BOUND, 64 << 20)
    assert [json.dumps(s) for s in parse_samples(front)] == window
    assert parse_samples(executor.read(host, "j3-prof1", "telemetry.jsonl", 1 << 20)) == []
    # the scan is bounded: a window behind more than `scan_bytes` is not found (the job loses its profile)
    assert parse_samples(executor.read_front_lines(host, "j3-prof1", "telemetry.jsonl", 1 << 20,
                                                   RECORD_BYTES_BOUND, 1 << 10)) == [json.loads(w) for w in window[:4]]


@pytest.mark.parametrize(("words", "ago"), [
    (["EXITED", "0", "ago=42"], 42), (["EXITED", "0", "disk_full", "stopped", "ago=0"], 0),
    (["EXITED", "0"], None), (["EXITED", "0", "ago=-5"], None), (["EXITED", "0", "ago=\u0664\u0662"], None),
    (["EXITED", "0", "ago=" + "9" * 12], None), (["EXITED", "0", "ago="], None), (["EXITED", "0", "ago=1e3"], None),
    (["EXITED", "0", "ago=2.125"], 2.125), (["EXITED", "0", "ago=1.2.3"], None), (["EXITED", "0", "ago=.5"], None),
    (["EXITED", "0", "ago=nan"], None), (["EXITED", "0", "ago=1" + "0" * 25], None),
])
def test_an_exited_line_says_how_long_ago_it_ended_or_nothing(words, ago):
    """What a host says of a run's end age is believed only as plain ASCII seconds, no more than three years."""
    status = parse_status(words)
    assert (status.state, status.exit_code, status.ended_ago_s) == ("EXITED", 0, ago)


@pytest.mark.parametrize(("words", "state", "value"), [
    (["RUNNING", "4242"], "RUNNING", 4242),
    (["EXITED", "137", "stopped"], "EXITED", 137),
    (["EXITED", "\u00b2"], "UNREADABLE", None),                      # a Unicode digit: int() refuses it
    (["EXITED", "256"], "UNREADABLE", None),                         # no exit status is above 255
    (["EXITED", "9" * 23], "UNREADABLE", None),                      # a forged code no column holds
    (["RUNNING", "9" * 23], "UNREADABLE", None),
    (["RUNNING", "\u0663"], "UNREADABLE", None),                     # Arabic-Indic three
    (["VANISHED", "9" * 23], "UNREADABLE", None),
    (["VANISHED", "-", "escaped=\u00b2"], "VANISHED", None),         # a bad count is no count, the line stands
])
def test_a_poll_line_a_job_or_host_forged_is_unreadable_for_that_run_not_an_error(words, state, value):
    status = parse_status(words)
    assert status.state == state
    assert (status.pid if state == "RUNNING" else status.exit_code if state == "EXITED" else None) == value
    if state == "VANISHED":
        assert status.escaped == 0


class _Answering:
    """A transport whose host answers every script with `stdout`."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def run_script(self, host, script, timeout_s):
        return ScriptResult(0, self.stdout, "")

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("answer", "pid"), [
    ("EXISTS 4242\n", 4242),
    ("EXISTS " + "9" * 23 + "\n", None),  # a pid file the job rewrote: no pid rather than a store overflow
    ("LAUNCHED \u00b2\n", None),
])
def test_a_launch_answer_keeps_only_a_pid_the_store_can_hold(tmp_path, answer, pid):
    host = HostAddress("h", workdir=str(tmp_path), executor="fake")
    result = HostExecutor({"fake": _Answering(answer)}).launch(host, LaunchSpec("j1-main1", "true"))
    assert result.pid == pid


def test_gpu_discovery_skips_lines_a_host_garbled(tmp_path):
    lines = "0, NVIDIA H100, 81559, GPU-a\n\u00b2, NVIDIA H100, 81559\n1, NVIDIA H100, nan\n2, NVIDIA H100, 80000\n"
    host = HostAddress("h", workdir=str(tmp_path), executor="fake")
    gpus = HostExecutor({"fake": _Answering(lines)}).discover_gpus(host)
    assert [(g.index, g.memory_mb) for g in gpus] == [(0, 81559.0), (2, 80000.0)]

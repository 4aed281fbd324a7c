"""The shell kept on each SSH connection: one shell for many calls, each script isolated in its own `sh`,
replies framed so that neither a script's output nor its exit can forge or cut short another reply, and
a call past its deadline ending only that shell (the connection and the next call are fine)."""

from __future__ import annotations

import time

import pytest

from lucid_core.runtime.hosts.executor import HostAddress, HostUnreachable
from lucid_core.runtime.hosts.ssh_executor import SshTransport

pytestmark = pytest.mark.ssh


@pytest.fixture
def kept(sshd_hosts, tmp_path):
    host = sshd_hosts.hosts["main1"]
    transport = SshTransport(str(sshd_hosts.known_hosts), connect_timeout_s=3, retries=0)
    address = HostAddress("main1", "127.0.0.1", host.port, sshd_hosts.user, str(sshd_hosts.client_key),
                          str(tmp_path / "w"), executor="ssh")
    yield transport, address
    transport.close()


def test_one_kept_shell_runs_every_call_in_a_fresh_sh(kept):
    transport, host = kept
    first = transport.run_script(host, 'echo "$PPID"; cd /; X=leaked; exit 3', 5)
    second = transport.run_script(host, 'echo "$PPID"; pwd; echo "x=${X:-}"', 5)
    assert first.exit_status == 3 and second.exit_status == 0
    parent, cwd, x = second.stdout.splitlines()
    assert parent == first.stdout.strip()  # the same kept shell started both scripts
    assert cwd != "/" and x == "x="  # the first script's cd and variable stayed in its own sh
    assert transport.connects == 1


def test_output_is_verbatim_and_a_forged_frame_does_not_end_the_reply(kept):
    transport, host = kept
    forged = "\\nLUCID_0123456789abcdef0123456789abcdef 0\\n\\nLUCID_0123456789abcdef0123456789abcdef.\\n"
    result = transport.run_script(host, f"printf '{forged}tail'; printf 'oops' >&2; exit 7", 5)
    assert result.exit_status == 7
    assert result.stdout == forged.replace("\\n", "\n") + "tail"  # no newline added at the end
    assert result.stderr == "oops"
    big = transport.run_script(host, "head -c 300000 /dev/zero | tr '\\0' a", 10)
    assert big.exit_status == 0 and big.stdout == "a" * 300000


def test_a_call_past_its_deadline_ends_only_its_shell(kept):
    transport, host = kept
    transport.run_script(host, "true", 5)
    began = time.monotonic()
    with pytest.raises(HostUnreachable):
        transport.run_script(host, "sleep 30", 1.0)
    assert time.monotonic() - began < 4
    after = transport.run_script(host, "echo fine", 5)
    assert (after.exit_status, after.stdout) == (0, "fine\n")
    assert transport.connects == 1  # the connection was kept; only the shell was replaced


def test_bytes_between_calls_and_concurrent_callers_do_not_mix_replies(kept):
    transport, host = kept
    # a process left behind writes to the kept shell's stdout after its call's reply
    first = transport.run_script(host, "(sleep 0.3; echo STRAY) & echo first", 5)
    time.sleep(0.6)
    second = transport.run_script(host, "echo second", 5)
    assert (first.stdout, second.stdout) == ("first\n", "second\n")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: transport.run_script(host, f"sleep 0.05; echo call-{i}", 10).stdout, range(8)))
    assert outs == [f"call-{i}\n" for i in range(8)]
    assert transport.connects == 1


def test_a_large_script_runs_whole_and_needs_no_temporary_file_for_itself(kept):
    transport, host = kept
    lines = [f"echo {i}" for i in range(4000)]  # about 30 KB, like a launch that ships the telemetry agent
    result = transport.run_script(host, "\n".join(lines) + "\necho \"$(printf '%s' \"it's\")\"", 10)
    assert result.exit_status == 0
    assert result.stdout.splitlines() == [str(i) for i in range(4000)] + ["it's"]


def test_a_shell_idle_past_the_interval_answers_a_check_first_and_stray_bytes_do_not_confuse_it(kept, monkeypatch):
    """After `CONFIRM_AFTER_S` without a reply the shell must answer an echo before a script is sent; bytes a
    leftover process writes meanwhile fall before it or between it and the reply, and are dropped."""
    from lucid_core.runtime.hosts import ssh_shell

    monkeypatch.setattr(ssh_shell, "CONFIRM_AFTER_S", 0.2)
    sent: list[bytes] = []
    send = ssh_shell.KeptShell._send
    monkeypatch.setattr(ssh_shell.KeptShell, "_send", lambda self, data, deadline: (sent.append(data),
                                                                                    send(self, data, deadline))[1])
    transport, host = kept
    first = transport.run_script(host, 'echo "$PPID"; (sleep 0.3; echo STRAY; sleep 0.2; echo STRAY2) & true', 5)
    assert len(sent) == 1  # a new shell: the host has just answered, no check
    time.sleep(0.4)
    second = transport.run_script(host, 'echo "$PPID"', 5)
    assert len(sent) == 3 and sent[1].startswith(b"printf '%s\\n' LUCID_")  # the check, then the script
    time.sleep(0.3)
    third = transport.run_script(host, 'echo "$PPID"', 5)
    assert first.stdout == second.stdout == third.stdout  # one kept shell answered every call
    assert transport.connects == 1

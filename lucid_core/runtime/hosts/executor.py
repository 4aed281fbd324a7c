"""Executors: launch, poll, stop and read jobs on hosts through one interface.

`HostExecutor` speaks the host scripts (`launch`, `reads`, `stop`) over a `Transport` (a local
`sh` subprocess or an SSH channel), so local and SSH hosts behave the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lucid_core.runtime.hosts import launch as host_launch
from lucid_core.runtime.hosts import mps as host_mps
from lucid_core.runtime.hosts import prune as host_prune
from lucid_core.runtime.hosts import reads as host_reads
from lucid_core.runtime.hosts import stop as host_stop
from lucid_core.runtime.hosts.claims import CONFLICT, LaunchClaim, conflict_holder
from lucid_core.runtime.hosts.inputs import os_user_problem
from lucid_core.runtime.hosts.launch import REFUSED_USER, TelemetryLaunch


class HostUnreachable(RuntimeError):
    """The host could not be reached (network, sshd down, timeout) after the retries. `reached` is False only
    when no try ever had a session on the host (the connection was refused, timed out or failed its
    handshake): then the script certainly did not run there. Otherwise it may have."""

    def __init__(self, message: str, *, reached: bool = True) -> None:
        super().__init__(message)
        self.reached = reached


class HostKeyRejected(HostUnreachable):
    """The host presented a key that is not in known_hosts (or a different one): refused."""


class HostCommandFailed(RuntimeError):
    """A host script ran but reported an error."""


class LaunchConflict(HostCommandFailed):
    """The host's ledger of live runs refused a launch: the job already runs there, or another job's live run
    holds one of its GPUs and the store did not pair the two. Nothing was started; the host is fine.

    Not a fault of the host (no cool-down) and not one of the job's launch failures: the store's view was
    behind the host's (a stale round, a second controller), and the next round, reading again, repairs it.
    `holder`: the live run the ledger named as in the way, when its words name one.
    """

    def __init__(self, message: str, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class RunAsRefused(HostCommandFailed):
    """The host cannot run the job as its submitter (no such user, sudo refused, a bad name).

    Trying again does not help: the job fails with this reason (the host itself is fine for others).
    """


@dataclass(frozen=True, slots=True)
class HostAddress:
    """Where and how to reach a host."""

    name: str
    address: str = "127.0.0.1"
    port: int = 22
    user: str = ""
    key_path: str | None = None
    workdir: str = "~/.lucid-runs"
    python: str = "python3"
    executor: str = "ssh"  # ssh | local
    run_as: str = "account"  # account: jobs run as `user`; submitter: as the job's user, through sudo
    sharing: str = "time-slice"  # how jobs share its GPUs: none | time-slice | mps (an MPS control daemon)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    run_id: str
    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    telemetry: TelemetryLaunch | None = None
    user: str | None = None  # the job's user: the OS user it runs as on hosts with run_as="submitter"
    # the job whose run this is: given, the host refuses a second live run of it, and a run on a GPU that a
    # live run of another job holds unless that job is `partner` (the store paired the two)
    job_id: str | None = None
    gpu_indices: tuple[int, ...] = ()
    partner: str | None = None


@dataclass(frozen=True, slots=True)
class LaunchResult:
    pid: int | None
    already_launched: bool


@dataclass(frozen=True, slots=True)
class RunStatus:
    """What a host says about a run: MISSING, NOPID, RUNNING, EXITED or VANISHED."""

    state: str
    pid: int | None = None
    exit_code: int | None = None
    stop_requested: bool = False
    disk_full: bool = False  # the run directory's disk was full when the command ended: its log writes failed
    # a stop's count of the run's processes (by its environment marker) that had left its process group
    escaped: int = 0
    # run records that failed their check on the host and were not believed: "pid", "exit_code", or
    # "records" (its whole control directory was gone while its wrapper still ran)
    tampered: tuple[str, ...] = ()
    detail: str = ""  # UNREADABLE: the line the host answered
    # EXITED: seconds since its exit record was written, by the host's clock (None: the host did not say)
    ended_ago_s: float | None = None


@dataclass(frozen=True, slots=True)
class FileTail:
    """The end of a run's file as read from its host, and the file's whole size (None: absent or not said)."""

    text: str
    size: int | None = None

    def cut(self, max_bytes: int) -> bool:
        """Whether the file is longer than the read of at most `max_bytes` that returned this tail."""
        return self.size is not None and self.size > max_bytes


@dataclass(frozen=True, slots=True)
class FileBytes:
    """Bytes of a run's file as read from its host: `data` starts at byte `offset`; `size` is the file's whole size
    when read (None: absent or not said), so a reader knows whether more follows or the file shrank."""

    data: bytes
    offset: int = 0
    size: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    model: str
    memory_mb: float
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptResult:
    exit_status: int
    stdout: str
    stderr: str
    stdout_bytes: bytes | None = None  # stdout as the host wrote it (None: a transport that keeps only the text)


class Transport(Protocol):
    def run_script(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        """Run a POSIX sh script on the host (fed on stdin) and return its output."""
        ...

    def close(self) -> None: ...


def bounded_int(text: str, most: int) -> int | None:
    """`text` as an int when it is ASCII digits (at most 10) for a value of at most `most`, else None: a host
    or a job writes these words, and a Unicode digit or a 30-digit pid must not reach int() or the store."""
    if not (0 < len(text) <= 10 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= most else None


def _finite_or_none(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


PID_MAX = 2**31 - 1  # a pid the store's integer column holds (Linux's own limit is 2**22)
EXIT_CODE_MAX = 255
ENDED_AGO_MAX = 10**8  # seconds (three years): a larger age is a clock the host set back and forth


def _seconds(text: str) -> float | None:
    """`text` as seconds when it is ASCII digits with at most one point (at most 20 characters, at most
    `ENDED_AGO_MAX`), else None: a host or a job writes it."""
    whole, _, fraction = text.partition(".")
    if not (0 < len(text) <= 20 and whole.isascii() and whole.isdigit()
            and (not fraction or (fraction.isascii() and fraction.isdigit()))):
        return None
    value = float(text)
    return value if value <= ENDED_AGO_MAX else None


def parse_status(words: Sequence[str]) -> RunStatus:
    """Turn the words of one poll line (after the run id) into a RunStatus; a line that does not parse is
    UNREADABLE (with the line as its detail), for that run alone."""
    state = words[0] if words else ""
    escaped = next((n for w in words[1:] if w.startswith("escaped=")
                    and (n := bounded_int(w[8:], PID_MAX)) is not None), 0)
    tampered = next((tuple(x for x in w[9:].split(",") if x in {"pid", "exit_code", "records"})
                     for w in words[1:] if w.startswith("tampered=")), ())
    second = words[1] if len(words) > 1 else ""
    pid = bounded_int(second, PID_MAX)
    if state == "RUNNING" and pid is not None:
        return RunStatus("RUNNING", pid=pid, tampered=tampered)
    exit_code = bounded_int(second, EXIT_CODE_MAX)
    if state == "EXITED" and exit_code is not None:
        ago = next((n for w in words[2:] if w.startswith("ago=") and (n := _seconds(w[4:])) is not None), None)
        return RunStatus("EXITED", exit_code=exit_code, stop_requested="stopped" in words[2:],
                         disk_full="disk_full" in words[2:], escaped=escaped, ended_ago_s=ago)
    if state == "VANISHED" and (pid is not None or second == "-"):
        return RunStatus("VANISHED", pid=pid, stop_requested="stopped" in words[2:], escaped=escaped,
                         tampered=tampered)
    if state in {"MISSING", "NOPID"} and len(words) == 1:
        return RunStatus(state)
    return RunStatus("UNREADABLE", detail=" ".join(words)[:200])


def stopped_status(words: Sequence[str]) -> RunStatus:
    """The status a stop answered. A stop prints its line only after its signals went out, so a line of an
    ended run (EXITED, VANISHED) whose record does not parse (a job forged its exit code) still means the
    run was stopped: VANISHED, with the line as its detail, instead of UNREADABLE, which would leave it
    holding its GPUs however often it is stopped."""
    status = parse_status(words)
    if status.state == "UNREADABLE" and words[:1] and words[0] in {"EXITED", "VANISHED"}:
        return RunStatus("VANISHED", stop_requested=True, tampered=("exit_code",), detail=status.detail)
    return status


class HostExecutor:
    """The one executor: host scripts over a transport; `transport_for` picks local or SSH."""

    def __init__(self, transports: Mapping[str, Transport], *, timeout_s: float = 30.0) -> None:
        self.transports = dict(transports)
        self.timeout_s = timeout_s

    def _run(self, host: HostAddress, script: str, timeout_s: float | None = None) -> ScriptResult:
        transport = self.transports.get(host.executor)
        if transport is None:
            raise HostCommandFailed(f"host {host.name}: no transport for executor {host.executor!r}")
        return transport.run_script(host, script, timeout_s or self.timeout_s)

    def launch(self, host: HostAddress, spec: LaunchSpec) -> LaunchResult:
        """Start a run (once: a second launch of the same run id answers already_launched).

        On a host with run_as="submitter" the command runs as `spec.user`; raises RunAsRefused when the
        name is not a user name or the host will not run commands as that user, and LaunchConflict when the
        host's ledger of live runs refuses it (see LaunchSpec.job_id).
        """
        run_as = self._run_as(host, spec)
        claim = (LaunchClaim(spec.job_id, tuple(spec.gpu_indices), spec.partner)
                 if spec.job_id is not None else None)
        script = host_launch.launch_script(host.workdir, spec.run_id, spec.command, spec.env, spec.telemetry,
                                           run_as, claim)
        result = self._run(host, script)
        last = (result.stdout.strip().splitlines() or [""])[-1].split()
        if run_as is not None and last[:1] == [REFUSED_USER]:
            said = " ".join(last[1:])[-500:] or f"exit status {result.exit_status}"
            raise RunAsRefused(f"host {host.name} cannot run the job as user {run_as!r}: {said}")
        if last[:1] == [CONFLICT]:
            raise LaunchConflict(f"host {host.name} refused run {spec.run_id}: {' '.join(last[1:])[:500]}",
                                 holder=conflict_holder(last[1:]))
        if result.exit_status != 0 or not last or last[0] not in {"LAUNCHED", "EXISTS"}:
            raise HostCommandFailed(
                f"host {host.name}: launch of {spec.run_id} failed (status {result.exit_status}): "
                f"{(result.stdout + result.stderr).strip()[-500:]}")
        pid = bounded_int(last[1], PID_MAX) if len(last) > 1 else None
        return LaunchResult(pid, already_launched=last[0] == "EXISTS")

    @staticmethod
    def _run_as(host: HostAddress, spec: LaunchSpec) -> str | None:
        """The OS user to run the command as: None for the SSH account, else the checked job user."""
        if host.run_as == "account":
            return None
        if host.run_as != "submitter":
            raise HostCommandFailed(f"host {host.name}: run_as {host.run_as!r} is not account or submitter")
        problem = os_user_problem(spec.user)
        if problem is not None:
            raise RunAsRefused(f"host {host.name} cannot run the job as user {spec.user!r}: {problem}")
        return spec.user

    def probe(self, host: HostAddress) -> None:
        """Check that the host answers (raises HostUnreachable or HostCommandFailed otherwise)."""
        result = self._run(host, "echo LUCID_OK\n")
        if "LUCID_OK" not in result.stdout:
            raise HostCommandFailed(f"host {host.name}: probe answered {result.stdout[-200:]!r}")

    def poll(self, host: HostAddress, run_ids: Sequence[str]) -> dict[str, RunStatus]:
        """Each run's status; a run whose line does not parse is UNREADABLE, the others stand."""
        if not run_ids:
            return {}
        result = self._run(host, host_reads.poll_script(host.workdir, run_ids))
        lines = result.stdout.strip().splitlines()
        if not lines or lines[-1] != "END":
            raise HostCommandFailed(f"host {host.name}: poll output cut short: {result.stdout[-300:]!r}")
        out = {}
        for line in lines[:-1]:
            words = line.split()
            if words and words[0] in run_ids:
                out[words[0]] = parse_status(words[1:])
        return out

    def stop(self, host: HostAddress, run_id: str, reason: str, grace_s: float) -> RunStatus:
        script = host_stop.stop_script(host.workdir, run_id, reason, grace_s)
        result = self._run(host, script, timeout_s=self.timeout_s + grace_s)
        lines = result.stdout.strip().splitlines()
        if not lines:  # the script did not get to its answer: nothing is known of the run
            return RunStatus("UNREADABLE", detail=f"stop answered nothing (status {result.exit_status}): "
                                                  f"{result.stderr.strip()[-150:]}")
        return stopped_status(lines[-1].split())

    def prune(self, host: HostAddress, runs: Mapping[str, str | None]) -> dict[str, str]:
        """Remove the files of ended runs (run id -> the user it ran as on a submitter host, else None) from
        the host; the host's answer per run (`prune.PRUNE_ANSWERS`). A run whose wrapper still lives is LIVE."""
        if not runs:
            return {}
        as_users = {run_id: (user if host.run_as == "submitter" and os_user_problem(user) is None else None)
                    for run_id, user in runs.items()}
        result = self._run(host, host_prune.prune_script(host.workdir, as_users))
        answers = host_prune.parse_prune(result.stdout, list(runs))
        if answers is None:
            raise HostCommandFailed(f"host {host.name}: prune output cut short (status {result.exit_status}): "
                                    f"{(result.stdout + result.stderr).strip()[-300:]!r}")
        return answers

    def read(self, host: HostAddress, run_id: str, name: str, max_bytes: int = 1 << 20) -> str:
        return self._run(host, host_reads.read_script(host.workdir, run_id, name, max_bytes)).stdout

    def read_tail(self, host: HostAddress, run_id: str, name: str, max_bytes: int) -> FileTail:
        """The last `max_bytes` of a run's file with the file's size (`FileTail.cut` says whether it is all)."""
        out = self._run(host, host_reads.read_tail_script(host.workdir, run_id, name, max_bytes)).stdout
        head, newline, text = out.partition("\n")
        if not newline or not head.startswith("size="):
            return FileTail(out)  # the file is absent (nothing printed)
        size = head[len("size="):]
        return FileTail(text, int(size) if size.isascii() and size.isdigit() and len(size) <= 19 else None)

    def read_range(self, host: HostAddress, run_id: str, name: str, offset: int | None,
                   max_bytes: int) -> FileBytes:
        """Up to `max_bytes` of a run's file from byte `offset` (None: its last `max_bytes`), undecoded, with the
        file's size (host_reads.read_range_script): one round trip, whatever bytes the job wrote."""
        result = self._run(host, host_reads.read_range_script(host.workdir, run_id, name, offset, max_bytes))
        out = result.stdout_bytes if result.stdout_bytes is not None else result.stdout.encode("utf-8")
        return FileBytes(*host_reads.parse_range(out, offset, max_bytes))

    def read_front_lines(self, host: HostAddress, run_id: str, name: str, max_bytes: int, line_bytes: int,
                         scan_bytes: int) -> str:
        """The front of a run's file, lines longer than `line_bytes` dropped (host_reads.read_front_lines_script)."""
        script = host_reads.read_front_lines_script(host.workdir, run_id, name, max_bytes, line_bytes, scan_bytes)
        return self._run(host, script).stdout

    def mps_fault_read(self, host: HostAddress, gpu_indices: Sequence[int], run_ids: Sequence[str],
                       user: str | None = None) -> host_mps.FaultRead:
        """The runs' times and the fault lines of their GPU set's MPS daemon logs (bounded reads; on a host that
        runs jobs as their submitters, `user`'s daemons). Nothing readable there: no runs, no faults."""
        as_user = user if host.run_as == "submitter" else None
        if as_user is not None and os_user_problem(as_user) is not None:
            return host_mps.FaultRead({}, None, ())
        script = host_mps.fault_read_script(host.workdir, gpu_indices, run_ids, as_user)
        return host_mps.parse_fault_read(self._run(host, script).stdout)

    def discover_gpus(self, host: HostAddress) -> list[GpuInfo]:
        """GPUs reported by nvidia-smi on the host (empty when it has none)."""
        result = self._run(host, host_reads.discover_gpus_script())
        gpus = []
        for line in result.stdout.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            index = bounded_int(parts[0], 1023) if len(parts) >= 3 else None
            memory = _finite_or_none(parts[2]) if index is not None else None
            if index is not None and memory is not None and memory >= 0:
                gpus.append(GpuInfo(index, parts[1], memory, parts[3] if len(parts) > 3 else None))
        return gpus

    def forget(self, name: str) -> None:
        """Drop the connection to host `name` (its call overran the deadline): the next call opens a new one."""
        for transport in self.transports.values():
            forget = getattr(transport, "forget", None)
            if forget is not None:
                forget(name)

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

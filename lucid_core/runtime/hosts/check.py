"""`lucid hosts check`: is a registered host ready to run jobs? One script over the same executor.

Checks what a launch relies on, so a misconfigured host is found before the first job fails on it:
the host answers (host key known), its work directory is writable, disk left there, the Python the
telemetry agent runs under, `setsid`, NVML (nvidia-smi and the pynvml module) unless its telemetry is
emulated, the GPU count against what the store declares, and, on a host that runs jobs as their
submitter, that sudo will run a command as a given user without a password.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from sqlalchemy import func, select

from lucid_core.runtime.hosts.executor import HostCommandFailed, HostExecutor, HostUnreachable
from lucid_core.runtime.hosts.inputs import os_user_problem
from lucid_core.runtime.hosts.inventory import InventoryError, host_address
from lucid_core.runtime.store.schema import GpuRow, HostRow
from lucid_core.runtime.store.store import Store

MIN_FREE_MB = 1024  # below this the run files and logs of a few jobs may not fit
MIN_PYTHON = (3, 9)


@dataclass(frozen=True)
class CheckItem:
    name: str
    ok: bool
    detail: str


@dataclass
class HostCheck:
    host: str
    items: list[CheckItem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    def describe(self) -> str:
        lines = [f"{self.host}: {'ready' if self.ok else 'NOT READY'}"]
        lines += [f"  {'ok  ' if i.ok else 'FAIL'} {i.name}: {i.detail}" for i in self.items]
        return "\n".join(lines)


def check_script(workdir: str, python: str, nvml: bool, sudo_user: str | None) -> str:
    """POSIX sh printing `name|ok|detail` lines; every value it uses is quoted."""
    home_relative = workdir.startswith("~/")
    w = '"$HOME"/' + shlex.quote(workdir[2:]) if home_relative else shlex.quote(workdir)
    py = shlex.quote(python)
    lines = [
        f"W={w}",
        'if mkdir -p "$W" 2>/dev/null && : > "$W/.lucid-check.$$" 2>/dev/null; then rm -f "$W/.lucid-check.$$"; '
        'echo "workdir|ok|$W is writable"; else echo "workdir|fail|cannot create files in $W"; fi',
        'free=$(df -Pk "$W" 2>/dev/null | awk \'NR==2 {print int($4/1024)}\')',
        f'if [ -z "$free" ]; then echo "disk|fail|df cannot read $W"; elif [ "$free" -lt {MIN_FREE_MB} ]; '
        f'then echo "disk|fail|$free MB free under $W (under {MIN_FREE_MB} MB)"; '
        'else echo "disk|ok|$free MB free under $W"; fi',
        f'v=$({py} -c "import sys; print(\'%d.%d\' % sys.version_info[:2])" 2>/dev/null)',
        f'if [ -z "$v" ]; then echo "python|fail|"{py}" does not run"; else echo "python|ok|$v"; fi',
        'if command -v setsid >/dev/null 2>&1; then echo "setsid|ok|found"; '
        'else echo "setsid|fail|setsid missing (util-linux)"; fi',
    ]
    if nvml:
        lines += [
            'n=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)',
            'if command -v nvidia-smi >/dev/null 2>&1; then echo "nvidia-smi|ok|$n GPU(s)"; '
            'else echo "nvidia-smi|fail|not found"; fi',
            f'if {py} -c "import pynvml" 2>/dev/null; then echo "pynvml|ok|importable by "{py}; '
            f'else echo "pynvml|fail|"{py}" cannot import pynvml (pip install nvidia-ml-py)"; fi',
        ]
    if sudo_user is not None:
        u = shlex.quote(sudo_user)
        lines += [
            f"got=$(sudo -n -H -u {u} -- /bin/sh -c 'id -un' </dev/null 2>&1)",
            f'if [ "$got" = {u} ]; then echo "sudo|ok|runs commands as "{u}; '
            f'else echo "sudo|fail|cannot run as "{u}": $(echo "$got" | head -n 1)"; fi',
        ]
    lines.append('echo "END|ok|"')
    return "\n".join(lines) + "\n"


def check_host(store: Store, executor: HostExecutor, name: str, *, as_user: str | None = None) -> HostCheck:
    """Run the checks on host `name`; `as_user` (for a submitter host) is the user sudo must reach."""
    with store.session() as s:
        row = s.get(HostRow, name)
        if row is None:
            raise InventoryError(f"no host {name!r}")
        declared = s.scalar(select(func.count()).select_from(GpuRow).where(GpuRow.host == name)) or 0
        address, nvml = host_address(row), row.telemetry != "emulated"
    report = HostCheck(name)
    if as_user is not None and os_user_problem(as_user) is not None:
        report.items.append(CheckItem("sudo", False, f"{as_user!r}: {os_user_problem(as_user)}"))
        as_user = None
    if address.run_as == "submitter" and as_user is None and not report.items:
        report.items.append(CheckItem("sudo", False, "host runs jobs as their submitter: give --as-user USER "
                                                      "to check that sudo reaches a user"))
    script = check_script(address.workdir, address.python, nvml, as_user if address.run_as == "submitter" else None)
    transport = executor.transports.get(address.executor)
    try:
        if transport is None:
            raise HostCommandFailed(f"no transport for executor {address.executor!r}")
        result = transport.run_script(address, script, executor.timeout_s)
    except (HostUnreachable, HostCommandFailed) as exc:
        report.items.insert(0, CheckItem("reach", False, str(exc)))
        return report
    report.items.insert(0, CheckItem("reach", True, f"{address.user or 'current user'}@{address.address}"))
    seen: dict[str, CheckItem] = {}
    for line in result.stdout.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[1] in ("ok", "fail"):
            seen[parts[0]] = CheckItem(parts[0], parts[1] == "ok", parts[2])
    if "END" not in seen:
        report.items.append(CheckItem("script", False, f"output cut short: {(result.stdout + result.stderr)[-300:]!r}"))
    seen.pop("END", None)
    python = seen.get("python")
    if python is not None and python.ok:
        major, _, minor = python.detail.partition(".")
        if (int(major), int(minor or 0)) < MIN_PYTHON:
            seen["python"] = CheckItem("python", False, f"{python.detail} (the agent needs "
                                                        f"{'.'.join(map(str, MIN_PYTHON))} or newer)")
    smi = seen.get("nvidia-smi")
    if smi is not None and smi.ok:
        found = int(smi.detail.split()[0])
        if found != declared:
            seen["nvidia-smi"] = CheckItem("nvidia-smi", False, f"{found} GPU(s) on the host, {declared} in the store")
    report.items.extend(seen.values())
    return report

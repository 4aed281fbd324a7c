"""`lucid hosts check`: is a registered host ready to run jobs? One script over the same executor.

Checks what a launch relies on, so a misconfigured host is found before the first job fails on it:
the host answers (host key known), its work directory is writable, disk left there, the Python the
telemetry agent runs under, `setsid`, NVML (nvidia-smi and the pynvml module) unless its telemetry is
emulated, the GPU count and model against what the store declares and whether MIG is on (then the GPUs
are not shared by time slices or MPS, whatever the host's sharing says), on an MPS host the control
binary and `flock` (`mps`) and which daemons run, and, on a host that runs jobs as their submitter, that
sudo will run a command as a given user without a password. A warning does not make a host unready.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from sqlalchemy import func, select

from lucid_core.runtime.hosts.executor import HostCommandFailed, HostExecutor, HostUnreachable
from lucid_core.runtime.hosts.inputs import os_user_problem
from lucid_core.runtime.hosts.inventory import InventoryError, host_address
from lucid_core.runtime.hosts.mps import MPS_CONTROL, mps_root
from lucid_core.runtime.store.schema import GpuRow, HostRow
from lucid_core.runtime.store.store import Store

MIN_FREE_MB = 1024  # below this the run files and logs of a few jobs may not fit
MIN_PYTHON = (3, 9)


@dataclass(frozen=True)
class CheckItem:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # worth a look, but the host can run jobs


@dataclass
class HostCheck:
    host: str
    items: list[CheckItem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    def describe(self) -> str:
        lines = [f"{self.host}: {'ready' if self.ok else 'NOT READY'}"]
        lines += [f"  {('WARN' if i.warn else 'ok  ') if i.ok else 'FAIL'} {i.name}: {i.detail}" for i in self.items]
        return "\n".join(lines)


def check_script(workdir: str, python: str, nvml: bool, sudo_user: str | None, mps: bool = False) -> str:
    """POSIX sh printing `name|ok|detail` lines (and `gpu|ok|index, name[, MIG mode]` per GPU); every value
    it uses is quoted."""
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
            # drivers without MIG answer the three-field query with an error: ask for the two fields then
            'if command -v nvidia-smi >/dev/null 2>&1; then',
            '  q=$(nvidia-smi --query-gpu=index,name,mig.mode.current --format=csv,noheader 2>/dev/null) ||',
            '    q=$(nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null)',
            "  printf '%s\n' \"$q\" | grep . | head -n 64 | sed 's/^/gpu|ok|/'",
            '  echo "nvidia-smi|ok|found"',
            'else echo "nvidia-smi|fail|not found"; fi',
            f'if {py} -c "import pynvml" 2>/dev/null; then echo "pynvml|ok|importable by "{py}; '
            f'else echo "pynvml|fail|"{py}" cannot import pynvml (pip install nvidia-ml-py)"; fi',
        ]
    if mps:
        root = mps_root(workdir)
        lines += [
            f'if p=$(command -v {MPS_CONTROL} 2>/dev/null); then echo "mps-control|ok|$p"; '
            f'else echo "mps-control|fail|{MPS_CONTROL} is not on PATH (the NVIDIA driver\'s utilities)"; fi',
            'if command -v flock >/dev/null 2>&1; then echo "flock|ok|found"; '
            'else echo "flock|fail|flock missing (util-linux): MPS runs lock their daemon directories with it"; fi',
            "ours=",
            f"for d in {root}/gpus-*; do",
            '  [ -e "$d/pipe/control" ] || continue',
            f'  echo get_server_list | CUDA_MPS_PIPE_DIRECTORY="$d/pipe" timeout 10 {MPS_CONTROL} >/dev/null 2>&1 '
            '&& ours="$ours ${d##*/}"',
            "done",
            f"all=$(ps -eo args= 2>/dev/null | grep -c '^[^ ]*{MPS_CONTROL} -d')",
            'echo "mps-daemon|ok|${ours:+running for$ours under this work directory; }$all control daemon '
            'process(es) on the host"',
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
        address, nvml, model = host_address(row), row.telemetry != "emulated", row.gpu_model
    report = HostCheck(name)
    if as_user is not None and os_user_problem(as_user) is not None:
        report.items.append(CheckItem("sudo", False, f"{as_user!r}: {os_user_problem(as_user)}"))
        as_user = None
    if address.run_as == "submitter" and as_user is None and not report.items:
        report.items.append(CheckItem("sudo", False, "host runs jobs as their submitter: give --as-user USER "
                                                      "to check that sudo reaches a user"))
    script = check_script(address.workdir, address.python, nvml, as_user if address.run_as == "submitter" else None,
                          mps=address.sharing == "mps")
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
    gpus: list[list[str]] = []
    for line in result.stdout.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[0] == "gpu":
            gpus.append([p.strip() for p in parts[2].split(",")])
        elif len(parts) == 3 and parts[1] in ("ok", "fail"):
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
    if "nvidia-smi" in seen and seen["nvidia-smi"].ok:
        seen.update(_gpu_items(gpus, declared, model, address.sharing))
    report.items.extend(seen.values())
    return report


def _gpu_items(gpus: list[list[str]], declared: int, model: str | None, sharing: str) -> dict[str, CheckItem]:
    """What nvidia-smi's `index, name[, MIG mode]` lines say against the store: the count and the model (the
    key packing labels are looked up by), and MIG, under which GPUs are not shared as `sharing` says."""
    names = sorted({g[1] for g in gpus if len(g) >= 2 and g[1]})
    shown = f"{len(gpus)} GPU(s): {', '.join(names) or 'no model named'}"
    items = {"nvidia-smi": CheckItem("nvidia-smi", len(gpus) == declared, shown if len(gpus) == declared else
                                     f"{shown} on the host, {declared} in the store")}
    if model is not None and names and names != [model]:
        items["gpu-model"] = CheckItem("gpu-model", True, f"nvidia-smi says {', '.join(names)}, the store says "
                                       f"{model}: packing labels are looked up by the store's", warn=True)
    mig = [g[0] for g in gpus if len(g) >= 3 and g[2].lower() == "enabled"]
    if mig and sharing != "none":
        items["mig"] = CheckItem("mig", True, f"MIG is on for GPU(s) {','.join(mig)}: jobs there get MIG instances; "
                                 f"sharing by {sharing} is not what this host does", warn=True)
    else:
        items["mig"] = CheckItem("mig", True, f"on for GPU(s) {','.join(mig)} (sharing is none here)" if mig
                                 else "off")
    return items

"""NVIDIA MPS on the calibrated host: start the control daemon for the kit's runs and quit it afterwards.

The daemon (`nvidia-cuda-mps-control -d`) gets pipe and log directories of its own under the host's
work directory (`mps-gpu<N>/pipe`, `mps-gpu<N>/log`, mode 700) and sees only the calibrated GPU.
CUDA clients find a daemon through `CUDA_MPS_PIPE_DIRECTORY`, so the workload processes get the
same two directories in their environment. A daemon started by a non-root account serves that
account's processes only. The scripts run through the executor's transport (local `sh` or SSH).
"""

from __future__ import annotations

import shlex

from lucid_core.runtime.hosts.executor import HostAddress, HostCommandFailed, HostExecutor, ScriptResult
from lucid_core.runtime.hosts.inputs import quote_path

MPS_CONTROL = "nvidia-cuda-mps-control"
ASK_TIMEOUT_S = 5  # one control command; a stale pipe with no daemon behind it must not hang the script
WAIT_STEPS = 50  # polls 0.2 s apart: how long a start or a quit may take to show


class MpsUnavailable(RuntimeError):
    """The host cannot give the calibration an MPS daemon (no control binary, or the daemon did not answer)."""


def _prelude(workdir: str, gpu: int, device: str) -> str:
    """Shell lines every MPS script starts with: the directories (made, 700, absolute) and the daemon's env."""
    base = f"{quote_path(workdir)}/mps-gpu{int(gpu)}"
    return f"""set -u
B={MPS_CONTROL}
ask() {{
  if command -v timeout >/dev/null 2>&1; then printf '%s\\n' "$1" | timeout {ASK_TIMEOUT_S} "$B"
  else printf '%s\\n' "$1" | "$B"; fi
}}
M={base}
mkdir -p "$M/pipe" "$M/log" && chmod 700 "$M" "$M/pipe" "$M/log" && M=$(cd "$M" && pwd -P) ||
  {{ echo "MPS_ERROR cannot create the MPS directories in $M"; exit 0; }}
export CUDA_MPS_PIPE_DIRECTORY="$M/pipe" CUDA_MPS_LOG_DIRECTORY="$M/log" CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES={shlex.quote(device)}
"""


def start_script(workdir: str, gpu: int, device: str) -> str:
    """Start the daemon (quitting one an earlier, killed calibration left there); prints MPS_RUNNING <dir>.

    Prints MPS_MISSING when the host has no control binary on its PATH, MPS_ERROR <why> when it fails.
    """
    return f"""command -v {MPS_CONTROL} >/dev/null 2>&1 || {{ echo MPS_MISSING; exit 0; }}
{_prelude(workdir, gpu, device)}if ask get_server_list >/dev/null 2>&1; then
  ask quit >/dev/null 2>&1
  i=0; while [ $i -lt {WAIT_STEPS} ] && ask get_server_list >/dev/null 2>&1; do sleep 0.2; i=$((i+1)); done
fi
# its own session: a signal to the kit's process group (timeout, Ctrl-C) must not reach the daemon
if command -v setsid >/dev/null 2>&1; then S=setsid; else S=; fi
if ! $S "$B" -d < /dev/null > "$M/log/start.out" 2>&1; then
  echo "MPS_ERROR $B -d failed: $(tail -c 400 "$M/log/start.out" | tr '\\n' ' ')"; exit 0
fi
i=0
while [ $i -lt {WAIT_STEPS} ]; do
  if ask get_server_list >/dev/null 2>&1; then echo "MPS_RUNNING $M"; exit 0; fi
  sleep 0.2; i=$((i+1))
done
said=$(tail -c 400 "$M/log/control.log" 2>/dev/null | tr '\\n' ' ')
echo "MPS_ERROR the daemon did not answer get_server_list: $said"
"""


def stop_script(workdir: str, gpu: int, device: str) -> str:
    """Quit the daemon and wait until it no longer answers; prints MPS_STOPPED (or MPS_MISSING, MPS_ERROR)."""
    return f"""command -v {MPS_CONTROL} >/dev/null 2>&1 || {{ echo MPS_MISSING; exit 0; }}
{_prelude(workdir, gpu, device)}ask get_server_list >/dev/null 2>&1 && ask quit >/dev/null 2>&1
i=0
while [ $i -lt {WAIT_STEPS} ]; do
  if ! ask get_server_list >/dev/null 2>&1; then echo MPS_STOPPED; exit 0; fi
  sleep 0.2; i=$((i+1))
done
echo "MPS_ERROR the daemon still answers get_server_list after quit"
"""


class MpsDaemon:
    """The MPS control daemon the calibration runs under, on one GPU of one host."""

    def __init__(self, executor: HostExecutor, host: HostAddress, gpu: int, device: str | None = None,
                 timeout_s: float = 60.0) -> None:
        self.executor = executor
        self.host = host
        self.gpu = gpu
        self.device = device or str(gpu)  # CUDA_VISIBLE_DEVICES of daemon and clients: the GPU's UUID when known
        self.timeout_s = timeout_s
        self.directory: str | None = None  # absolute mps-gpu<N> directory on the host once running
        self.attempted = False  # a start was sent: stop() is owed even if the start did not answer

    def _script(self, script: str) -> ScriptResult:
        transport = self.executor.transports.get(self.host.executor)
        if transport is None:
            raise HostCommandFailed(f"host {self.host.name}: no transport for executor {self.host.executor!r}")
        return transport.run_script(self.host, script, self.timeout_s)

    @staticmethod
    def _answer(result: ScriptResult) -> list[str]:
        return (result.stdout.strip().splitlines() or [""])[-1].split(maxsplit=1) or [""]

    def start(self) -> dict[str, str]:
        """Start the daemon and return the environment its clients need; MpsUnavailable when it cannot run."""
        self.attempted = True
        result = self._script(start_script(self.host.workdir, self.gpu, self.device))
        answer = self._answer(result)
        if answer[0] == "MPS_MISSING":
            raise MpsUnavailable(f"host {self.host.name} has no {MPS_CONTROL} on its PATH (NVIDIA's MPS control "
                                 "daemon, shipped with the driver): install it there or use --sharing time-slice")
        if answer[0] != "MPS_RUNNING" or len(answer) < 2:
            said = (result.stdout + result.stderr).strip()[-500:]
            raise MpsUnavailable(f"host {self.host.name}: the MPS control daemon did not start: {said}")
        self.directory = answer[1]
        return self.client_env()

    def client_env(self) -> dict[str, str]:
        """CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and the GPU selector for the workload processes."""
        if self.directory is None:
            raise MpsUnavailable("the MPS control daemon has not been started")
        return {"CUDA_MPS_PIPE_DIRECTORY": f"{self.directory}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{self.directory}/log",
                "CUDA_VISIBLE_DEVICES": self.device}

    def stop(self) -> None:
        """`quit` the daemon and wait for it to go; MpsUnavailable when it still answers afterwards."""
        result = self._script(stop_script(self.host.workdir, self.gpu, self.device))
        answer = self._answer(result)
        if answer[0] not in {"MPS_STOPPED", "MPS_MISSING"}:
            said = (result.stdout + result.stderr).strip()[-500:]
            raise MpsUnavailable(f"host {self.host.name}: the MPS control daemon did not quit: {said}")
        self.directory = None

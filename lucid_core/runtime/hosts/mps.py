"""Main runs on an MPS host as MPS clients, with nothing asked of the job.

One MPS control daemon serves each GPU set that shares (a pair always holds the same GPUs), under the
host's work directory: `<workdir>/.mps/gpus-<i>[-<j>...]/{pipe,log,clients}`. A run's command is
wrapped so that, under one lock per GPU set, it starts the daemon when none answers, registers itself
as a client, runs the job with `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` (and a pinned
device memory limit from its profiled footprint plus headroom), and at its end quits the daemon if it
was the last client. The daemon runs as the account that starts it: MPS servers are per UNIX user, so
on hosts that run jobs as their submitters the binder pairs one user's jobs only, and each user's runs
find their own daemon under their own work directory.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from lucid_core.runtime.hosts.run_records import RUN_MARKER

MPS_CONTROL = "nvidia-cuda-mps-control"


def mps_dir(workdir: str, gpu_indices: Sequence[int]) -> str:
    """The daemon directory of a GPU set, as shell text ("~/" becomes "$HOME/")."""
    name = "gpus-" + "-".join(str(int(i)) for i in sorted(gpu_indices))
    base = workdir.rstrip("/") or "/"
    if base == "~" or base.startswith("~/"):
        return '"$HOME"/' + shlex.quote((base[2:] + "/" if len(base) > 1 else "") + ".mps/" + name)
    return shlex.quote(f"{base}/.mps/{name}")


def pinned_limit(gpu_count: int, limit_mb: float | None) -> str | None:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a client seeing `gpu_count` devices (ordinals as CUDA shows them)."""
    if limit_mb is None or limit_mb <= 0:
        return None  # not profiled yet: its footprint is unknown, so no limit is guessed
    return ",".join(f"{i}={int(limit_mb + 0.5)}M" for i in range(max(1, gpu_count)))


def mps_client_command(command: str, workdir: str, gpu_indices: Sequence[int], run_id: str,
                       limit_mb: float | None) -> str:
    """`command` run as an MPS client of its GPU set's daemon, started here when none answers and quit
    when the last client ends. The daemon's start and check fail the run with exit 97 (its log says why)."""
    d = mps_dir(workdir, gpu_indices)
    devices = ",".join(str(int(i)) for i in gpu_indices)
    client = shlex.quote(run_id)
    limit = pinned_limit(len(gpu_indices), limit_mb)
    lines = [
        f"M={d}",
        'mkdir -p "$M/pipe" "$M/log" "$M/clients" && chmod 700 "$M" "$M/pipe" "$M/log" || exit 97',
        'export CUDA_MPS_PIPE_DIRECTORY="$M/pipe" CUDA_MPS_LOG_DIRECTORY="$M/log"',
        *([f"export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={shlex.quote(limit)}"] if limit else []),
        "(",
        "  flock -x 9",
        f"  if ! echo get_server_list | timeout 5 {MPS_CONTROL} >/dev/null 2>&1; then",
        # the daemon outlives this run and serves its partner: it must not carry the run's marker, which a
        # stop of this run kills by
        f"    env -u {RUN_MARKER} CUDA_VISIBLE_DEVICES={shlex.quote(devices)} {MPS_CONTROL} -d 9>&- || exit 97",
        "    i=0",
        f"    until echo get_server_list | timeout 5 {MPS_CONTROL} >/dev/null 2>&1; do",
        '      i=$((i+1)); [ "$i" -lt 25 ] || exit 97; sleep 0.2',
        "    done",
        "  fi",
        f'  : > "$M/clients/"{client}',
        ') 9>"$M/lock" || { echo "lucid: the MPS control daemon did not start; see $M/log" >&2; exit 97; }',
        f"(\n{command}\n)",  # on lines of its own: a command ending in a comment still closes
        "rc=$?",
        "(",
        "  flock -x 9",
        f'  rm -f "$M/clients/"{client}',
        f'  [ -n "$(ls -A "$M/clients")" ] || echo quit | timeout 5 {MPS_CONTROL} >/dev/null 2>&1',
        ') 9>"$M/lock"',
        'exit "$rc"',
    ]
    return "\n".join(lines)

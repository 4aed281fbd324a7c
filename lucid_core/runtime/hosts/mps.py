"""Main runs on an MPS host as MPS clients, with nothing asked of the job; and what the daemons' logs say.

One MPS control daemon serves each GPU set that shares (a pair always holds the same GPUs), keyed by the
set's sorted indices: `<root>/gpus-<i>[-<j>...]/{pipe,log,clients}`, every directory mode 700. A main
run's command is wrapped (`mps_client_command`) so that, under one lock per root (`flock <root>/lock`), it
drops the clients of the root that no longer run, quits the daemons left without any (a run that was
killed never quit its own: the next launch does), starts its own set's daemon when none answers and
registers itself; then runs the job with `CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY` and a pinned
device memory limit, and at its end (a stop's TERM included) quits the daemon if it was the last client.

Whom the daemon runs as: the account that runs the job, because MPS servers are per UNIX user (a client
of another user waits until the running server has exited) and only root may start a server for another
user. On an account host that is the SSH account for every job, and the root is `<workdir>/.mps`. On a
host that runs jobs as their submitters each user's runs start their own daemons, in `/tmp/lucid-mps-<uid>`
on the host's own disk (the host's work directory is the SSH account's, private to it; a home directory is
often one NFS export that every host shares, where one host would take another's clients for dead), made
by and private to that user and refused when it is not: the binder pairs one user's jobs only there, so a
pair always meets in one daemon, and a user's daemons are tidied by that user's next launch on the host.
"""

from __future__ import annotations

import calendar
import math
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lucid_core.runtime.hosts.inputs import check_os_user, check_run_id, quote_path

MPS_CONTROL = "nvidia-cuda-mps-control"
START_FAILED = 97  # the run's exit status when its GPU set's daemon could not be started (its stderr says why)
START_FAILED_WORDS = "lucid: MPS: "  # how that stderr line begins; the job never ran, so it is the only line
# on hosts that run jobs as their submitters, each user's daemons: on the host's own disk (a home directory is
# often one NFS export shared by every host, whose clients one host cannot see), owned by and private to the user
SUBMITTER_ROOT = '/tmp/lucid-mps-"$(id -u)"'
FAULT_END_WINDOW_S = 30.0  # a run that failed more than this after an MPS fault failed of something else
LOG_READ_BYTES = 64 * 1024  # of each daemon log, from its end: the logs are the host's, and long-lived
LOG_LINE_CHARS = 512  # a longer line is no line the MPS daemon wrote: skipped
CLOCK_SLACK_S = 2.0  # run start and end come from file times in whole seconds

# an MPS log line: "[2024-05-01 12:00:09.269 Server 13929] New client 14781 connected"
_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{1,6}))?[^\]]{0,64}\]\s?(.*)$")
# what a fatal error contained by the server reads like ("default" does not count: whole words only)
_FAULT_WORDS = re.compile(r"\b(fatal|fault|faulted|exception|xid)\b", re.IGNORECASE)


def gpu_set_name(gpu_indices: Sequence[int]) -> str:
    """The daemon directory name of a GPU set: its sorted indices ("gpus-0-1")."""
    return "gpus-" + "-".join(str(int(i)) for i in sorted(gpu_indices))


def mps_root(workdir: str, as_submitter: bool = False) -> str:
    """Where a run's daemons live, as shell text: `<workdir>/.mps`, or `/tmp/lucid-mps-<uid>` of the job's user."""
    if as_submitter:
        return SUBMITTER_ROOT
    return quote_path(workdir.rstrip("/") + "/.mps" if workdir not in ("", "/") else "/.mps")


def memory_limit_mb(gpu_mem_mb: float | None, headroom_mb: float) -> float | None:
    """A client's pinned device memory: its profiled footprint plus the binder's headroom (None: no profile, or a
    footprint that is no finite positive number, as a stored Infinity or NaN: no limit is made of it, where
    math.ceil of it would raise out of the launch and fail the round)."""
    if not isinstance(gpu_mem_mb, int | float) or not math.isfinite(gpu_mem_mb) or gpu_mem_mb <= 0:
        return None
    headroom = headroom_mb if math.isfinite(headroom_mb) else 0.0
    return gpu_mem_mb + max(0.0, headroom)


def pinned_limit(gpu_count: int, limit_mb: float | None) -> str | None:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a client seeing `gpu_count` devices: "0=2048M,1=2048M", device
    ordinals as the client enumerates them (relative to its CUDA_VISIBLE_DEVICES)."""
    if limit_mb is None or not math.isfinite(limit_mb) or limit_mb <= 0:
        return None  # not profiled yet: its footprint is unknown, so no limit is guessed
    return ",".join(f"{i}={math.ceil(limit_mb)}M" for i in range(max(1, gpu_count)))


# Shell functions of the wrapped command (prefixed: the job's own variables keep their names).
# _lm_alive FILE: the client shell it names (pid and start time, so a reused pid does not count) still runs.
# _lm_ctl DIR CMD: CMD to DIR's daemon. _lm_tidy KEEP: clients gone are dropped; daemons without any,
# other than KEEP's, quit. _lm_devices: the daemon's and the client's CUDA_VISIBLE_DEVICES (GPU UUIDs, as
# NVIDIA advises: under MPS a client sees the daemon's devices renumbered from 0, and UUIDs mean the same
# GPU either way); without nvidia-smi, the indices for the daemon and the renumbered ordinals for the client.
_FUNCTIONS = r"""_lm_fail() { echo "lucid: MPS: $1 (logs: $_lm_dir/log)" >&2; exit 97; }  # START_FAILED_WORDS
_lm_alive() {
  _lm_p= _lm_t=
  read -r _lm_p _lm_t < "$1" 2>/dev/null || return 1
  case "$_lm_p" in ''|*[!0-9]*) return 1 ;; esac
  _lm_s=$(cat "/proc/$_lm_p/stat" 2>/dev/null) || return 1
  _lm_s=${_lm_s##*) }
  set -- $_lm_s
  [ "$1" != Z ] && [ "${20:-}" = "$_lm_t" ]
}
_lm_ctl() {
  _lm_d=$1; shift
  echo "$*" | CUDA_MPS_PIPE_DIRECTORY="$_lm_d/pipe" CUDA_MPS_LOG_DIRECTORY="$_lm_d/log" \
    timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
}
_lm_tidy() {
  for _lm_e in "$_lm_root"/gpus-*; do
    [ -d "$_lm_e/clients" ] || continue
    _lm_n=0
    for _lm_c in "$_lm_e/clients"/*; do
      [ -f "$_lm_c" ] || continue
      if _lm_alive "$_lm_c"; then _lm_n=$((_lm_n+1)); else rm -f "$_lm_c"; fi
    done
    # a daemon that does not answer its quit is left without its pipe, so later launches do not wait on it again
    if [ "$_lm_n" = 0 ] && [ "$_lm_e" != "$1" ] && [ -e "$_lm_e/pipe/control" ]; then
      _lm_ctl "$_lm_e" quit || rm -f "$_lm_e/pipe/control" "$_lm_e/pipe/nvidia-cuda-mps-control.pid"
    fi
  done
}
_lm_devices() {
  _lm_daemon_devs=$_lm_idx
  _lm_client_devs=$(echo "$_lm_idx" | awk -F, '{ for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), i - 1 }')
  _lm_u=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null | awk -F', *' -v want="$_lm_idx" '
    BEGIN { n = split(want, w, ","); for (i = 1; i <= n; i++) pos[w[i]] = i }
    ($1 in pos) && $2 ~ /^GPU-[0-9A-Za-z-]+$/ && !(pos[$1] in u) { u[pos[$1]] = $2; k++ }
    END { if (k != n) exit 1; for (i = 1; i <= n; i++) printf "%s%s", (i > 1 ? "," : ""), u[i] }') &&
    [ -n "$_lm_u" ] && _lm_daemon_devs=$_lm_u _lm_client_devs=$_lm_u
}
_lm_start() {
  _lm_tidy "$_lm_dir"
  _lm_ctl "$_lm_dir" get_server_list && return 0
  rm -f "$_lm_dir/pipe/control" "$_lm_dir/pipe/nvidia-cuda-mps-control.pid"  # nothing answers there
  # its own session, a clean environment (never the job's, nor its run marker: a stop of this run must not
  # reach the daemon its partner uses), out of the lock (fd 9) and of the job's directory
  ( cd / && exec setsid env -i PATH="$PATH" HOME="${HOME:-/}" CUDA_VISIBLE_DEVICES="$_lm_daemon_devs" \
      CUDA_MPS_PIPE_DIRECTORY="$_lm_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$_lm_dir/log" \
      nvidia-cuda-mps-control -d ) < /dev/null >> "$_lm_dir/log/lucid-start.log" 2>&1 9>&- || return 1
  _lm_i=0
  until _lm_ctl "$_lm_dir" get_server_list; do
    _lm_i=$((_lm_i+1)); [ "$_lm_i" -lt 50 ] || return 1; sleep 0.2
  done
}"""


def mps_client_command(command: str, workdir: str, gpu_indices: Sequence[int], run_id: str,
                       limit_mb: float | None, *, as_submitter: bool = False) -> str:
    """`command` run as an MPS client of its GPU set's daemon (see the module's text). A daemon that cannot be
    started fails the run with exit status 97 before the job starts, its stderr saying why."""
    check_run_id(run_id)
    indices = ",".join(str(int(i)) for i in gpu_indices)
    limit = pinned_limit(len(gpu_indices), limit_mb)
    lines = [
        f"_lm_root={mps_root(workdir, as_submitter)}",
        f"_lm_dir=\"$_lm_root\"/{gpu_set_name(gpu_indices)}",
        f"_lm_idx={shlex.quote(indices)}",
        f"_lm_client={shlex.quote(run_id)}",
        _FUNCTIONS,
        f'command -v {MPS_CONTROL} >/dev/null 2>&1 || _lm_fail "{MPS_CONTROL} is not on PATH"',
        'command -v flock >/dev/null 2>&1 || _lm_fail "flock is missing (util-linux)"',
        'mkdir -p "$_lm_dir/pipe" "$_lm_dir/log" "$_lm_dir/clients" && '
        'chmod 700 "$_lm_root" "$_lm_dir" "$_lm_dir/pipe" "$_lm_dir/log" "$_lm_dir/clients" '
        '|| _lm_fail "cannot create $_lm_dir"',
        # in a shared /tmp another user may have made the directory first (or a link to theirs): never use it
        '[ ! -L "$_lm_root" ] && [ -O "$_lm_root" ] && [ ! -L "$_lm_dir" ] && [ -O "$_lm_dir" ] '
        '|| _lm_fail "$_lm_root is not this user\'s own directory"',
        '_lm_me=$(cat /proc/$$/stat 2>/dev/null) && _lm_me=${_lm_me##*) } || _lm_fail "no /proc/$$/stat"',
        "set -- $_lm_me",
        "_lm_me=${20:-}",
        "set --",
        "_lm_devices",
        '( flock -x -w 60 9 || exit 1; _lm_start || exit 2; printf \'%s %s\\n\' "$$" "$_lm_me" > '
        '"$_lm_dir/clients/$_lm_client" || exit 3 ) 9> "$_lm_root/lock" '
        '|| _lm_fail "the control daemon of GPUs $_lm_idx did not start"',
        'export CUDA_MPS_PIPE_DIRECTORY="$_lm_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$_lm_dir/log" '
        'CUDA_VISIBLE_DEVICES="$_lm_client_devs"',
        f"export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={shlex.quote(limit)}" if limit else
        "# not profiled yet: no pinned device memory limit",
        "trap '_lm_term=1' TERM  # a stop's TERM reaches the job (its subshell resets it); this shell tidies",
        "(",
        command,
        ")",
        "_lm_rc=$?",
        # the job's own status 97, and whatever it printed, must never read as a daemon that did not start (the
        # round would requeue a job that ran and cool the host down): a second stderr line says it was the job's
        f'[ "$_lm_rc" != {START_FAILED} ] || echo "lucid: the job itself exited with status {START_FAILED}" >&2',
        '( flock -x -w 60 9 || exit 1; rm -f "$_lm_dir/clients/$_lm_client"; _lm_tidy "" ) 9> "$_lm_root/lock"',
        'exit "$_lm_rc"',
    ]
    return "\n".join(lines)


def fault_read_script(workdir: str, gpu_indices: Sequence[int], run_ids: Sequence[str],
                      user: str | None = None, max_bytes: int = LOG_READ_BYTES) -> str:
    """Print `RUN id start end` for each run (its pid and exit-code file times, host clock, `-` unknown),
    `NOW epoch local-date local-time`, `LOGS`, then the last `max_bytes` of its GPU set's control.log and
    server.log. `user`: the daemons are that user's (`/tmp/lucid-mps-<uid>`), read through sudo."""
    lines = [f"W={quote_path(workdir)}"]
    for run_id in run_ids:
        r = shlex.quote(check_run_id(run_id))
        lines.append(f'echo "RUN "{r}" $(stat -c %Y "$W"/{r}/pid 2>/dev/null || echo -) '
                     f'$(stat -c %Y "$W"/{r}/exit_code 2>/dev/null || echo -)"')
    # the host's local time as the daemons write it: they run with a clean environment (no TZ), so must the clock
    lines += ["echo \"NOW $(env -i date '+%s %Y-%m-%d %H:%M:%S')\"", "echo LOGS"]
    # regular files only (a FIFO would hang the read), and bounded in time as in size
    read = (f"for f in control.log server.log; do p=\"$M/log/$f\"; "
            f"[ -f \"$p\" ] && timeout 10 tail -c {int(max_bytes)} -- \"$p\"; echo; done")
    if user is None:
        lines.append(f"M={mps_root(workdir)}/{gpu_set_name(gpu_indices)}; {read}")
    else:
        inner = f"M={mps_root(workdir, True)}/{gpu_set_name(gpu_indices)}; {read}"
        lines.append(f"sudo -n -H -u {shlex.quote(check_os_user(user))} -- /bin/sh -c {shlex.quote(inner)} "
                     "< /dev/null 2> /dev/null")
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class MpsFault:
    """A fault line of a daemon's log: when (host clock, epoch seconds) and what it said."""

    at: float
    line: str


@dataclass(frozen=True, slots=True)
class FaultRead:
    """What `fault_read_script` printed, parsed: each run's (start, end) and the fault lines of the logs."""

    runs: dict[str, tuple[float | None, float | None]]
    now: float | None
    faults: tuple[MpsFault, ...]

    def fault_ending(self, run_id: str, run_ids: Sequence[str], window_s: float | None = None) -> MpsFault | None:
        """The fault that ended `run_id`: logged while all of `run_ids` ran (from the last start to the first
        end), at most `window_s` before `run_id`'s own end (a run that failed long after a fault failed of
        something else). None when there is none, or when a start or `run_id`'s end is not known."""
        spans = [self.runs.get(r, (None, None)) for r in run_ids]
        end = self.runs.get(run_id, (None, None))[1]
        starts = [s for s, _ in spans if s is not None]
        if end is None or not spans or len(starts) != len(spans):
            return None
        begin = max(starts) - CLOCK_SLACK_S
        upper = min(e for _, e in spans if e is not None) + CLOCK_SLACK_S
        window_s = FAULT_END_WINDOW_S if window_s is None else window_s
        return next((f for f in reversed(self.faults)
                     if begin <= f.at <= upper and end - f.at <= window_s + CLOCK_SLACK_S), None)


def _number(word: str) -> float | None:
    return float(word) if word.isascii() and word.isdigit() and len(word) <= 12 else None


def _naive_epoch(stamp: str) -> float | None:
    """A log's local 'YYYY-mm-dd HH:MM:SS' read as if it were UTC (the host's offset is applied after)."""
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")))
    except ValueError:
        return None


def parse_fault_read(text: str) -> FaultRead:
    """Parse what `fault_read_script` printed. The logs are untrusted: the read is bounded on the host,
    lines that are too long or not in MPS's format are skipped, and only the header before `LOGS` is ours.
    Log times are the host's local time: they are placed on its epoch clock by the offset its `NOW` shows
    (a daylight-saving change inside the window shifts them by an hour: such a fault is not found)."""
    runs: dict[str, tuple[float | None, float | None]] = {}
    now = offset = None
    lines = text.splitlines()
    faults: list[MpsFault] = []
    logs_at = next((i for i, line in enumerate(lines) if line == "LOGS"), len(lines))
    for line in lines[:logs_at]:
        words = line.split()
        if len(words) == 4 and words[0] == "RUN":
            runs[words[1]] = (_number(words[2]), _number(words[3]))
        elif len(words) == 4 and words[0] == "NOW" and (now := _number(words[1])) is not None:
            local = _naive_epoch(f"{words[2]} {words[3]}")
            offset = None if local is None else now - local
    for line in lines[logs_at + 1:]:
        if len(line) > LOG_LINE_CHARS or offset is None:
            continue
        match = _LOG_LINE.match(line)
        if match is None or not _FAULT_WORDS.search(match.group(3)):
            continue
        stamp = _naive_epoch(match.group(1))
        if stamp is not None:
            fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
            faults.append(MpsFault(stamp + fraction + offset, line.strip()))
    return FaultRead(runs, now, tuple(sorted(faults, key=lambda f: f.at)))

"""POSIX sh scripts the executors run on a host (over SSH or locally) to launch, poll and stop jobs.

Every value the scheduler adds is shell-quoted; the user's command is written verbatim into
`command.sh` and run by `sh`. A run directory `<workdir>/<run_id>` is the idempotency marker:
`mkdir` claims it atomically, so launching the same run twice starts one process.

Files in a run directory: pid (the wrapper's process group), command.sh, run.sh (the wrapper), marker
(see below), stdout.log, stderr.log, exit_code (written by the wrapper when the command ends: the exit
status, then `disk_full` when the run directory's disk had no room left as the command ended),
stop_requested (written before the scheduler signals the job), telemetry.jsonl.

Run as the submitter (`run_as` given): the wrapper, the run files and the logs stay with the host's SSH
account (private to it), and only the command runs as the job's user through `sudo -n -u USER`,
reading its environment and its text from `as_user.sh` on stdin (sudo resets the environment and the
user cannot read the run directory). The user's processes stay in the wrapper's process group, so a
stop signals them as that user (`sudo -u USER kill`) as well as the group as the SSH account.

Every process of a run carries the marker `LUCID_RUN_MARKER=<run_id>.<random hex>` in its environment
(children inherit it; the random part, kept in the run directory's `marker` file, tells apart runs of
the same id from other work directories or stores). A stop also finds, by that exact
`/proc/PID/environ` entry, the run's processes that left its process group (`setsid`, `set -m`,
daemons) and signals them: a process that scrubs or overwrites its environment, or that the account
and the job's user may no longer read (setuid), still escapes.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# the environment variable that marks every process of a run (its value: the run id and 16 random hex digits)
RUN_MARKER = "LUCID_RUN_MARKER"
# POSIX portable user names (portable filename characters, no leading hyphen), at most 32 as useradd allows
OS_USER_PATTERN = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$")
# what sudo says when it will not run a command as the user (the launch prints it after this word)
REFUSED_USER = "REFUSED_USER"


def os_user_problem(name: object) -> str | None:
    """Why `name` cannot be the OS user a job runs as on a host (None when it can)."""
    if not isinstance(name, str) or not OS_USER_PATTERN.match(name):
        return ("must be a POSIX user name to run on hosts that run jobs as their submitter: "
                "1-32 of A-Z a-z 0-9 . _ -, not starting with -")
    if name.isdigit():
        return "must not be all digits (sudo would read it as a uid)"
    if name in {".", ".."}:
        return "must not be . or .."
    if name == "root":
        return "jobs never run as root on hosts that run jobs as their submitter"
    return None


def check_os_user(name: str) -> str:
    """Refuse a user name before it reaches a host shell (see `os_user_problem`)."""
    problem = os_user_problem(name)
    if problem is not None:
        raise ValueError(f"user {name!r} {problem}")
    return name


def check_run_id(run_id: str) -> str:
    """Refuse run ids that could escape the work directory."""
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {RUN_ID_PATTERN.pattern}")
    return run_id


def quote_path(path: str) -> str:
    """Shell-quote a path, keeping a leading ~/ relative to the remote $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True, slots=True)
class TelemetryLaunch:
    """How to start the telemetry agent next to a job (see lucid_core.runtime.telemetry)."""

    agent_source: str
    agent_name: str  # file name in the work directory, versioned by content hash
    python: str
    gpu_indices: tuple[int, ...]
    interval_s: float
    duration_s: float
    emulated: tuple[float, float, float] | None = None  # (gpu_util, mem_util, gpu_mem_mb)
    seed: int = 0
    # a watching agent: every sample of this many seconds (the profiling window), then only bounded
    # speed samples (telemetry.TelemetryLog); None keeps every sample
    keep_all_s: float | None = None
    # a watching agent profiled in place samples this often once its window is kept (None: interval_s)
    watch_interval_s: float | None = None


# after the command: note a disk with no block (or no inode) left for the run directory's files, whose
# writes (the logs) then failed; filesystems without an inode count (btrfs: 0 files) are judged by blocks
_DISK_FULL_CHECK = """full=
set -- $(stat -f -c '%a %c %d' . 2>/dev/null)
if [ "${1:-1}" = 0 ] || { [ "${2:-0}" != 0 ] && [ "${3:-1}" = 0 ]; }; then full=disk_full; fi"""


def user_script(env: Mapping[str, str], command: str) -> str:
    """What the job's user runs through sudo: the job env, the user's home as working directory, the command."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    return f'exec < /dev/null\n{exports}cd "$HOME" 2>/dev/null || cd /\n{command}\n'


def wrapper_script(env: Mapping[str, str], run_as: str | None = None) -> str:
    """The detached wrapper: runs the command (as `run_as` through sudo, if given), records the exit code.

    It traps TERM so that a stop reaches the command, is waited for, and still leaves an exit code.
    """
    if run_as is None:
        exports = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())
        start = f"{exports}\nsh ./command.sh > stdout.log 2> stderr.log < /dev/null &"
    else:  # the job env travels in as_user.sh: sudo resets the environment
        start = (f"sudo -n -H -u {shlex.quote(check_os_user(run_as))} -- /bin/sh -c 'eval \"$(cat)\"' "
                 "< as_user.sh > stdout.log 2> stderr.log &")
    return f"""echo $$ > pid.self
trap 'echo 1 > term_received' TERM
{start}
child=$!
echo $child > child.pid
while :; do
  wait $child
  rc=$?
  kill -s 0 $child 2>/dev/null || break
done
{_DISK_FULL_CHECK}
{{ printf '%-19s\\n' "$rc $full" 1<> exit_code.tmp || printf '%s\\n' "$rc $full" > exit_code.tmp; }} &&
  mv exit_code.tmp exit_code
"""


def launch_script(workdir: str, run_id: str, command: str, env: Mapping[str, str],
                  telemetry: TelemetryLaunch | None = None, run_as: str | None = None) -> str:
    """Claim the run directory and start the job detached; prints LAUNCHED <pid> or EXISTS <pid>.

    With `run_as`, the run files are private to the SSH account and the host must first let it run a
    command as that user (`sudo -n`); when it does not, the run directory is removed and the script
    prints REFUSED_USER with sudo's words.
    """
    check_run_id(run_id)
    for name in env:
        if not ENV_NAME_PATTERN.match(name):
            raise ValueError(f"environment variable name {name!r} is not a valid identifier")
    if run_as is not None:
        check_os_user(run_as)
    marker = f"{run_id}.{secrets.token_hex(8)}"  # what a stop finds processes that left the group by
    env = {**env, RUN_MARKER: marker}
    w = quote_path(workdir)
    lines = ["set -u"]
    if run_as is not None:
        lines.append("umask 077")  # logs, env and the command are no other user's business
    lines += [
        f"W={w}",
        f'D="$W"/{shlex.quote(run_id)}',
        'mkdir -p "$W" || { echo "ERROR cannot create work directory $W"; exit 3; }',
        'if ! mkdir "$D" 2>/dev/null; then echo "EXISTS $(cat "$D/pid" 2>/dev/null)"; exit 0; fi',
        'cd "$D"',
    ]
    user_files = ""
    if run_as is not None:
        user = shlex.quote(run_as)
        lines.append(f"if ! why=$(sudo -n -H -u {user} -- /bin/sh -c 'exit 0' < /dev/null 2>&1); then "
                     f'cd /; rm -rf "$D"; echo "{REFUSED_USER} $(printf \'%s\' "$why" | tr \'\\n\' \' \')"; exit 5; fi')
        user_files = (f"printf '%s' {shlex.quote(user_script(env, command))} > as_user.sh && "
                      f"printf '%s\\n' {user} > run_as && ")
    lines += [
        f"printf '%s\\n' {shlex.quote(command)} > command.sh && "
        f"printf '%s\\n' {shlex.quote(marker)} > marker && "
        f"printf '%s' {shlex.quote(wrapper_script(env, run_as))} > run.sh && "
        + user_files +
        # room for the exit code, taken now: the wrapper overwrites it in place, so a disk that fills
        # up while the job runs cannot turn a finished job into one that vanished
        "printf '%-19s\\n' '' > exit_code.tmp || "
        # a cut-short command.sh (disk full) would run a prefix of the command: run nothing instead
        '{ echo "ERROR cannot write the run files in $D (disk full or read-only?)"; cd /; rm -rf "$D"; exit 4; }',
        "setsid sh ./run.sh < /dev/null > /dev/null 2>&1 &",
        "pid=$!",
        "echo $pid > pid",
    ]
    if telemetry is not None:
        agent = shlex.quote(telemetry.agent_name)
        args = [
            "sample", "--pid-file", "pid", "--out", "telemetry.jsonl",
            "--gpus", ",".join(str(i) for i in telemetry.gpu_indices) or "none",
            "--interval", f"{telemetry.interval_s:g}", "--duration", f"{telemetry.duration_s:g}",
            "--seed", str(telemetry.seed),
        ]
        if telemetry.emulated is not None:
            args += ["--emulate", ",".join(f"{v:g}" for v in telemetry.emulated)]
        if telemetry.keep_all_s is not None:  # repr: the window's end must not move by rounding
            args += ["--keep-all-s", repr(float(telemetry.keep_all_s))]
        if telemetry.watch_interval_s is not None:
            args += ["--watch-interval", f"{telemetry.watch_interval_s:g}"]
        lines += [
            f'if [ ! -f "$W"/{agent} ]; then',
            f"  printf '%s' {shlex.quote(telemetry.agent_source)} > \"$W\"/{agent}.tmp && "
            f'mv "$W"/{agent}.tmp "$W"/{agent}',
            "fi",
            f'setsid {shlex.quote(telemetry.python)} "$W"/{agent} {shlex.join(args)} '
            "< /dev/null > telemetry.err 2>&1 &",
        ]
    lines.append('echo "LAUNCHED $pid"')
    return "\n".join(lines) + "\n"


# a wrapper is alive when its pid exists, is no zombie, and still runs run.sh (not a reused pid)
_ALIVE = """alive() {
  kill -s 0 "$1" 2>/dev/null || return 1
  if [ -r "/proc/$1/stat" ]; then
    [ "$(cut -d' ' -f3 "/proc/$1/stat")" = Z ] && return 1
    grep -q run.sh "/proc/$1/cmdline" 2>/dev/null || return 1
  fi
  return 0
}
stopflag() { if [ -f "$1/stop_requested" ] && [ -f "$1/term_received" ]; then echo stopped; fi; }"""


def poll_script(workdir: str, run_ids: Sequence[str]) -> str:
    """One line per run: MISSING | NOPID | RUNNING pid | EXITED rc [stopped] | VANISHED pid [stopped]."""
    ids = " ".join(shlex.quote(check_run_id(r)) for r in run_ids)
    return f"""W={quote_path(workdir)}
{_ALIVE}
for r in {ids}; do
  D="$W/$r"
  if [ ! -d "$D" ]; then echo "$r MISSING"; continue; fi
  if [ -f "$D/exit_code" ]; then echo "$r EXITED $(cat "$D/exit_code") $(stopflag "$D")"; continue; fi
  p=$(cat "$D/pid" 2>/dev/null || cat "$D/pid.self" 2>/dev/null || true)
  if [ -z "$p" ]; then echo "$r NOPID"; continue; fi
  if alive "$p"; then echo "$r RUNNING $p"; continue; fi
  if [ -f "$D/exit_code" ]; then echo "$r EXITED $(cat "$D/exit_code") $(stopflag "$D")"; continue; fi
  if [ -f "$D/stop_requested" ]; then echo "$r VANISHED $p stopped"; else echo "$r VANISHED $p"; fi
done
echo END
"""


# Run by `sh -c` as the SSH account and, on run-as hosts, as the job's user (sudo): every process whose
# environment holds the exact entry $2 (the run marker), other than the stop's own shells ($$, $3), is
# sent signal $1 (or none: `list`) and printed as "pid pgid". grep -l only narrows the candidates; the
# exact test turns NUL-separated entries into lines (and newlines inside values into \001, so a value
# cannot forge an entry). A pid that ends mid-scan fails a read and is skipped.
_MARKED_SWEEP = r"""a=$1 m=$2 me=$3
for e in $(grep -l -F -e "$m" /proc/[0-9]*/environ 2>/dev/null); do
  q=${e#/proc/}
  q=${q%/environ}
  case "$q" in ""|*[!0-9]*) continue ;; esac
  if [ "$q" = "$$" ] || [ "$q" = "$me" ]; then continue; fi
  tr '\n\000' '\001\n' 2>/dev/null < "$e" | grep -q -x -F -e "$m" || continue
  s=$(cat "/proc/$q/stat" 2>/dev/null) || continue
  s=${s##*\)}
  set -- $s
  [ "$a" = list ] || kill -s "$a" "$q" 2>/dev/null
  echo "$q ${3:-0}"
done
exit 0
"""


def stop_script(workdir: str, run_id: str, reason: str, grace_s: float) -> str:
    """TERM the run's process group and every process carrying its marker, wait up to `grace_s`, then KILL
    what is left; prints the poll line after, with `escaped=N` when N marked processes had left the group.

    A run started as its submitter (a `run_as` file) is signalled as that user too: the SSH account may
    signal its wrapper and sudo, but not the user's processes in the same group. Marked processes are
    swept even when the command had already ended (its exit code written), but the group only while it
    had not: once its leader is gone the group's id may be another's.
    """
    ticks = max(1, round(grace_s * 10))
    run = check_run_id(run_id)
    return f"""W={quote_path(workdir)}
D="$W"/{shlex.quote(run)}
if [ ! -d "$D" ]; then echo MISSING; exit 0; fi
printf '%s\\n' {shlex.quote(reason)} > "$D/stop_requested"
p=$(cat "$D/pid" 2>/dev/null || cat "$D/pid.self" 2>/dev/null || true)
case "$p" in *[!0-9]*) p= ;; esac
if [ -z "$p" ]; then echo NOPID; exit 0; fi
u=$(cat "$D/run_as" 2>/dev/null || true)
case "$u" in -*|*[!A-Za-z0-9._-]*) u= ;; esac
as_user() {{ [ -n "$u" ] && sudo -n -u "$u" -- /bin/sh -c "$1" sh "$2" "$p" < /dev/null > /dev/null 2>&1; }}
signal() {{
  as_user 'kill -s "$1" -- -"$2"' "$1"
  kill -s "$1" -- -"$p" 2>/dev/null || kill -s "$1" "$p" 2>/dev/null
}}
group_alive() {{ kill -s 0 -- -"$p" 2>/dev/null || as_user 'kill -s 0 -- -"$2"' 0; }}
unset {RUN_MARKER}
k=$(cat "$D/marker" 2>/dev/null || true)
case "$k" in *[!A-Za-z0-9._-]*) k= ;; esac
m={RUN_MARKER}=$k
sweep={shlex.quote(_MARKED_SWEEP)}
marked() {{
  [ -n "$k" ] || return 0  # a run launched before runs were marked: its group only
  sh -c "$sweep" sh "$1" "$m" "$$" < /dev/null 2>/dev/null
  if [ -n "$u" ]; then sudo -n -u "$u" -- /bin/sh -c "$sweep" sh "$1" "$m" "$$" < /dev/null 2>/dev/null; fi
}}
# a signalled process counts as gone once its /proc entry is gone or a zombie
any_left() {{
  for q in $(printf '%s\\n' "$found" | cut -d' ' -f1); do
    s=$(cat "/proc/$q/stat" 2>/dev/null) || continue
    s=${{s##*\\)}}
    set -- $s
    [ "$1" = Z ] || return 0
  done
  return 1
}}
ran=
if [ ! -f "$D/exit_code" ]; then ran=1; signal TERM; fi
found=$(marked TERM)
i=0
while [ $i -lt {ticks} ]; do
  if [ -z "$ran" ] || [ -f "$D/exit_code" ] || ! group_alive; then any_left || break; fi
  sleep 0.1
  i=$((i+1))
done
# past the grace, or the command ended and left processes behind: nothing of the run outlives a stop
if [ -n "$ran" ] && group_alive; then
  signal KILL
  [ -f "$D/exit_code" ] || sleep 0.1
fi
# what still carries the marker (a survivor of the grace, or one started meanwhile): KILLed, a few passes
# so that one forked by a process the pass before KILLed is found too
late=
for pass in 1 2 3; do
  more=$(marked KILL)
  [ -n "$more" ] || break
  late="$late
$more"
  sleep 0.1
done
n=$(printf '%s\\n%s\\n' "$found" "$late" | awk -v p="$p" 'NF == 2 && $2 != p && !seen[$1]++' | wc -l)
n=$((n+0))
e=
if [ "$n" -gt 0 ]; then e=" escaped=$n"; fi
if [ -f "$D/exit_code" ]; then
  rc=$(cat "$D/exit_code")
  if [ -f "$D/term_received" ]; then echo "EXITED $rc stopped$e"; else echo "EXITED $rc$e"; fi
else echo "VANISHED $p stopped$e"; fi
"""


def read_script(workdir: str, run_id: str, name: str, max_bytes: int) -> str:
    """The last `max_bytes` of a file in the run directory (empty when absent)."""
    if name not in {"stdout.log", "stderr.log", "telemetry.jsonl", "telemetry.err", "command.sh"}:
        raise ValueError(f"not a run file: {name!r}")
    run = shlex.quote(check_run_id(run_id))
    # the job owns its run directory and may swap a file (or the directory) for a symlink: read only
    # what still resolves inside <workdir>/<run_id>/
    return (f"W={quote_path(workdir)}\n"
            'd=$(cd "$W" 2>/dev/null && pwd -P) || exit 0\n'
            f'f=$(readlink -f -- "$d"/{run}/{shlex.quote(name)} 2>/dev/null) || exit 0\n'
            f'case "$f" in "$d"/{run}/*) [ -f "$f" ] && tail -c {int(max_bytes)} -- "$f" ;; esac\n'
            "exit 0\n")


def discover_gpus_script() -> str:
    """index, name, memory MiB, uuid per GPU via nvidia-smi; prints NO_NVIDIA_SMI when absent."""
    return ("if command -v nvidia-smi >/dev/null 2>&1; then "
            "nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits; "
            "else echo NO_NVIDIA_SMI; fi\n")

"""POSIX sh scripts the executors run on a host (over SSH or locally) to launch, poll and stop jobs.

Every value the scheduler adds is shell-quoted; the user's command is written verbatim into
`command.sh` and run by `sh`.

Two rooms per run. The control directory `<workdir>/<run_id>` holds the controller's records: pid (the
wrapper's process group), pid.self, command.sh, run.sh (the wrapper), marker (see below), stdout.log,
stderr.log, exit_code (written by the wrapper when the command ends: the run's token, the exit status,
then `disk_full` when the run directory's disk had no room left as the command ended), stop_requested,
telemetry.jsonl and the telemetry agent itself (shipped with every launch, never shared between runs).
`mkdir` claims it atomically, so launching the same run twice starts one process. The job runs in a
working directory of its own (`LUCID_WORKDIR`): `<workdir>/.work/<run_id>` on account hosts, a
directory in the user's home on run-as hosts; nothing it writes there reaches the control directory.

Records are checked when read, against what the host's kernel says rather than what a file says: a pid
counts only while that process lives in the run's control directory and carries the run's marker in the
environment it was started with; an exit code only when it carries the run's token, which is written
into the wrapper and never given to the job. A record that fails the check is reported as tampered with
(`tampered=pid|exit_code` on the run's status line) and is not believed.

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

A launch that names its job (`claim`) also checks the host's ledger of live runs (`<workdir>/.claims`,
one line per run: job, GPUs, partner; checked and written under `flock` where the host has it): it
refuses a second live run of the same job, and a run on a GPU that a live run of another job holds
unless that job is the partner the store paired it with (prints CONFLICT). An entry counts while its
run's wrapper is alive by the same checks as a poll; the wrapper removes its own as it ends, and
entries of runs found dead are dropped.
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
    """How to start the telemetry agent next to a job (see lucid_core.runtime.telemetry_agent)."""

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


@dataclass(frozen=True, slots=True)
class LaunchClaim:
    """What a launch tells the host's ledger of live runs: whose run it is, its GPUs, the job it may share with."""

    job_id: str
    gpu_indices: tuple[int, ...] = ()
    partner: str | None = None  # a job the store paired this one with: a live run of it may hold the same GPUs


# the word a launch prints (then why) when the host's ledger of live runs refuses it
CONFLICT = "CONFLICT"
WORKROOM = ".work"  # under the work directory: the jobs' own working directories (not a run id: leading dot)
CLAIMS = ".claims"  # under the work directory: one file per live run that named its job (LaunchClaim)
_TOKEN_HEX = 32
_EXIT_ROOM = 63  # bytes of exit_code.tmp taken at launch: token, status and disk_full fit


def user_script(env: Mapping[str, str], command: str, run_id: str) -> str:
    """What the job's user runs through sudo: the job env, a working directory of its own, the command.

    The directory is `~/.lucid-work/<run_id>` in the user's home (a fresh temporary one when the home is
    not writable); `LUCID_WORKDIR` names it.
    """
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    room = '"$HOME"/.lucid-work/' + shlex.quote(check_run_id(run_id))
    return (f"exec < /dev/null\n{exports}"
            f"LUCID_WORKDIR={room}\n"
            'if ! { mkdir -p "$LUCID_WORKDIR" && cd "$LUCID_WORKDIR"; } 2>/dev/null; then\n'
            '  LUCID_WORKDIR=$(mktemp -d) && cd "$LUCID_WORKDIR" || { LUCID_WORKDIR=/; cd /; }\n'
            "fi\n"
            "export LUCID_WORKDIR\n"
            f"{command}\n")


def wrapper_script(env: Mapping[str, str], run_id: str, token: str, run_as: str | None = None) -> str:
    """The detached wrapper: runs the command in the job's working directory (as `run_as` through sudo, if
    given), records the exit code with the run's token, and takes the run off the host's ledger.

    It traps TERM so that a stop reaches the command, is waited for, and still leaves an exit code. The
    token is a shell variable of the wrapper, never exported: the job cannot see it.
    """
    run = shlex.quote(check_run_id(run_id))
    if run_as is None:
        exports = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())
        start = (f"{exports}\n"
                 f'LUCID_WORKDIR=$(cd ../{WORKROOM}/{run} && pwd -P) || LUCID_WORKDIR=/nonexistent\n'
                 "export LUCID_WORKDIR\n"
                 'here=$(pwd -P)\n'
                 '( cd "$LUCID_WORKDIR" && exec sh "$here/command.sh" ) > stdout.log 2> stderr.log < /dev/null &')
    else:  # the job env travels in as_user.sh: sudo resets the environment
        start = (f"sudo -n -H -u {shlex.quote(check_os_user(run_as))} -- /bin/sh -c 'eval \"$(cat)\"' "
                 "< as_user.sh > stdout.log 2> stderr.log &")
    return f"""tok={token}
echo $$ > pid.self
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
rec="$tok $rc $full"
{{ printf '%-{_EXIT_ROOM}s\\n' "$rec" 1<> exit_code.tmp || printf '%s\\n' "$rec" > exit_code.tmp; }} &&
  mv exit_code.tmp exit_code
rm -f ../{CLAIMS}/{run}
"""


# Shell functions that judge a run's records by the host's own facts. `setup RUN` sets R (the control
# directory, physical path; false when it is gone), tok (the token in its wrapper), legacy (a run started
# before records carried a token: judged as then) and MRE (the run's marker entry, as a regex).
# `is_wrapper R RUN PID`: that pid is alive, no zombie, works in R and carries the run's marker in the
# environment it started with (a reused pid, or a pid file naming another process, fails).
# `find_wrapper R RUN` sets wp (the live wrapper's pid, or empty), pv (what the pid file says) and bad
# (`pid` when a pid file named another process); when neither pid file names it, it looks for the
# process that works in R and carries the marker. `exit_ok R` is true when exit_code holds the run's
# token (sets rc and full).
_RECORDS = r"""first() { v=; [ -f "$1" ] || return 0; IFS= read -r v < "$1" || true; }
setup() {
  R= tok= legacy= wp= pv= bad= rc= full=
  MRE="LUCID_RUN_MARKER=$1\.[0-9a-f]{16}"
  [ -n "${Wp:-}" ] || Wp=$(cd "$W" 2>/dev/null && pwd -P) || Wp=$W
  R=$Wp/$1
  [ -d "$R" ] || return 1
  if [ -L "$R" ]; then R=$(cd "$R" 2>/dev/null && pwd -P) || return 1; fi
  first "$R/run.sh"
  case "$v" in tok=*) tok=${v#tok=} ;; *) legacy=1 ;; esac
  case "$tok" in *[!0-9a-f]*) tok= ;; esac
  return 0
}
cwd_is() {
  ls -l /proc/[0-9]*/cwd 2>/dev/null | awk -v d="$1" '{ i = index($0, " -> ")
    if (i && substr($0, i + 4) == d) {
      s = substr($0, 1, i - 1); sub(/\/cwd$/, "", s); sub(/.*\/proc\//, "", s); print s } }'
}
marked_as_run() { tr '\n\000' '\001\n' < "/proc/$1/environ" 2>/dev/null | grep -q -x -E -e "$MRE"; }
find_orphan() {
  wp=
  [ -d /proc/self ] || return 1
  for v in $(cwd_is "$Wp/$1 (deleted)"); do
    if marked_as_run "$v"; then wp=$v; return 0; fi
  done
  return 1
}
is_wrapper() {
  case "$3" in ''|*[!0-9]*) return 1 ;; esac
  if [ ! -d /proc/self ]; then kill -s 0 "$3" 2>/dev/null; return; fi
  [ -r "/proc/$3/stat" ] || return 1
  st=
  read -r st < "/proc/$3/stat" 2>/dev/null || true
  st=${st##*) }
  [ -n "$st" ] && [ "${st%% *}" != Z ] || return 1
  if [ -n "$legacy" ]; then grep -q run.sh "/proc/$3/cmdline" 2>/dev/null; return; fi
  [ "$(readlink "/proc/$3/cwd" 2>/dev/null)" = "$1" ] || return 1
  marked_as_run "$3"
}
find_wrapper() {
  wp= bad=
  first "$1/pid"
  pv=$v
  if is_wrapper "$1" "$2" "$pv"; then
    wp=$pv
  else
    first "$1/pid.self"
    if is_wrapper "$1" "$2" "$v"; then wp=$v; fi
  fi
  if [ -z "$wp" ] && [ -z "$legacy" ] && [ -d /proc/self ]; then
    for v in $(cwd_is "$1"); do
      if is_wrapper "$1" "$2" "$v"; then wp=$v; break; fi
    done
  fi
  if [ -n "$wp" ] && [ "$pv" != "$wp" ]; then bad=pid; fi
  if [ -z "$wp" ]; then case "$pv" in *[!0-9]*) bad=pid ;; esac; fi
  [ -n "$wp" ]
}
exit_ok() {
  [ -f "$1/exit_code" ] || return 1
  e1= e2= e3=
  read -r e1 e2 e3 rest < "$1/exit_code" || [ -n "$e1" ] || return 1
  if [ -n "$legacy" ]; then e3=$e2 e2=$e1; elif [ -z "$tok" ] || [ "$e1" != "$tok" ]; then return 1; fi
  case "$e2" in ''|*[!0-9]*) return 1 ;; esac
  rc=$e2 full=
  if [ "$e3" = disk_full ]; then full=disk_full; fi
  return 0
}
"""


def _claim_check(run_id: str, claim: LaunchClaim) -> str:
    """sh that refuses (prints CONFLICT, removes the run directory) a launch the ledger of live runs forbids;
    runs with the ledger locked. An entry in the way counts only while its run lives (else it is dropped)."""
    run = shlex.quote(run_id)
    gpus = ",".join(str(i) for i in claim.gpu_indices) or "-"
    return f"""mkdir -p "$W"/{CLAIMS} || {{ echo "ERROR cannot create $W/{CLAIMS}"; cd /; rm -rf "$D"; exit 3; }}
exec 9>> "$W"/{CLAIMS}/.lock
if command -v flock > /dev/null 2>&1 && ! flock -w 30 9; then
  cd /; rm -rf "$D"; echo "{CONFLICT} the host's ledger of live runs stayed locked for 30 s"; exit 6
fi
me={run} job={shlex.quote(claim.job_id)} mine={shlex.quote(gpus)} partner={shlex.quote(claim.partner or "-")}
why=
for c in "$W"/{CLAIMS}/*; do
  [ -f "$c" ] || continue
  o=${{c##*/}}
  [ "$o" = "$me" ] && continue
  cj= cg=
  read -r cj cg cp < "$c" || true
  held=
  if [ "$cj" = "$job" ]; then
    held="job $job already runs on this host as run $o"
  elif [ "$cj" != "$partner" ]; then
    for g in $(printf '%s' "$cg" | tr ',' ' '); do
      case ",$mine," in *",$g,"*) held="GPU $g is held by run $o of job $cj"; break ;; esac
    done
  fi
  [ -n "$held" ] || continue
  # only an entry in the way is checked: a run no longer alive holds nothing (its entry goes)
  if ! setup "$o" || exit_ok "$R" || ! find_wrapper "$R" "$o"; then rm -f "$c"; continue; fi
  why=$held
  break
done
if [ -n "$why" ]; then cd /; rm -rf "$D"; echo "{CONFLICT} $why"; exit 6; fi
"""


def launch_script(workdir: str, run_id: str, command: str, env: Mapping[str, str],
                  telemetry: TelemetryLaunch | None = None, run_as: str | None = None,
                  claim: LaunchClaim | None = None) -> str:
    """Claim the run directory and start the job detached; prints LAUNCHED <pid> or EXISTS <pid>.

    With `run_as`, the run files are private to the SSH account and the host must first let it run a
    command as that user (`sudo -n`); when it does not, the run directory is removed and the script
    prints REFUSED_USER with sudo's words. With `claim`, a launch the host's ledger of live runs forbids
    prints CONFLICT and why, and starts nothing.
    """
    check_run_id(run_id)
    for name in env:
        if not ENV_NAME_PATTERN.match(name):
            raise ValueError(f"environment variable name {name!r} is not a valid identifier")
    if run_as is not None:
        check_os_user(run_as)
    marker = f"{run_id}.{secrets.token_hex(8)}"  # what a stop finds processes that left the group by
    token = secrets.token_hex(_TOKEN_HEX // 2)  # what tells the wrapper's exit record from anyone else's
    env = {**env, RUN_MARKER: marker}
    w = quote_path(workdir)
    run = shlex.quote(run_id)
    lines = ["set -u"]
    if run_as is not None:
        lines.append("umask 077")  # logs, env and the command are no other user's business
    lines += [
        f"W={w}",
        f'D="$W"/{run}',
        'mkdir -p "$W" || { echo "ERROR cannot create work directory $W"; exit 3; }',
        'if ! mkdir "$D" 2>/dev/null; then echo "EXISTS $(head -c 32 "$D/pid" 2>/dev/null | tr -cd 0-9)"; exit 0; fi',
        'cd "$D"',
        _RECORDS,
    ]
    user_files = ""
    if run_as is not None:
        user = shlex.quote(run_as)
        lines.append(f"if ! why=$(sudo -n -H -u {user} -- /bin/sh -c 'exit 0' < /dev/null 2>&1); then "
                     f'cd /; rm -rf "$D"; echo "{REFUSED_USER} $(printf \'%s\' "$why" | tr \'\\n\' \' \')"; exit 5; fi')
        user_files = (f"printf '%s' {shlex.quote(user_script(env, command, run_id))} > as_user.sh && "
                      f"printf '%s\\n' {user} > run_as && ")
    else:
        user_files = f'mkdir -p "$W"/{WORKROOM}/{run} && '
    if claim is not None:
        lines.append(_claim_check(run_id, claim))
    lines += [
        f"printf '%s\\n' {shlex.quote(command)} > command.sh && "
        f"printf '%s\\n' {shlex.quote(marker)} > marker && "
        f"printf '%s' {shlex.quote(wrapper_script(env, run_id, token, run_as))} > run.sh && "
        + user_files +
        # room for the exit code, taken now: the wrapper overwrites it in place, so a disk that fills
        # up while the job runs cannot turn a finished job into one that vanished
        f"printf '%-{_EXIT_ROOM}s\\n' '' > exit_code.tmp || "
        # a cut-short command.sh (disk full) would run a prefix of the command: run nothing instead
        '{ echo "ERROR cannot write the run files in $D (disk full or read-only?)"; cd /; rm -rf "$D"; exit 4; }',
        # the marker is in the wrapper's own environment from its start: the kernel's copy is what polls trust
        f"{RUN_MARKER}={shlex.quote(marker)} setsid sh ./run.sh < /dev/null > /dev/null 2>&1 9>&- &",
        "pid=$!",
        "echo $pid > pid",
        # wait (briefly) for the wrapper to be itself, so that the first poll sees it as the run's
        "i=0",
        "while [ ! -s pid.self ] && [ $i -lt 300 ]; do sleep 0.01; i=$((i+1)); done",
    ]
    if claim is not None:
        gpus = ",".join(str(i) for i in claim.gpu_indices) or "-"
        lines.append(f"printf '%s %s %s\\n' {shlex.quote(claim.job_id)} {shlex.quote(gpus)} "
                     f"{shlex.quote(claim.partner or '-')} > \"$W\"/{CLAIMS}/{run}")
        lines.append("exec 9>&-")
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
            # shipped with every launch into the control directory: no job's file, and none shared
            f"printf '%s' {shlex.quote(telemetry.agent_source)} > {agent} || "
            '{ echo "ERROR cannot write the telemetry agent in $D"; exit 4; }',
            f'setsid {shlex.quote(telemetry.python)} ./{agent} {shlex.join(args)} '
            '--device-table "$W"/.emulated-gpus < /dev/null > telemetry.err 2>&1 &',
        ]
    lines.append('echo "LAUNCHED $pid"')
    return "\n".join(lines) + "\n"


def _stop_flag() -> str:
    return 'stopflag() { if [ -f "$1/stop_requested" ] && [ -f "$1/term_received" ]; then echo " stopped"; fi; }'


def poll_script(workdir: str, run_ids: Sequence[str]) -> str:
    """One line per run: MISSING | NOPID | RUNNING pid | EXITED rc [disk_full] [stopped] | VANISHED pid|-
    [stopped]; RUNNING and VANISHED lines end with `tampered=pid,exit_code` (what did not pass) when a
    record failed its check, and a run whose control directory is gone while its wrapper lives is
    `RUNNING pid tampered=records`."""
    ids = " ".join(shlex.quote(check_run_id(r)) for r in run_ids)
    return f"""W={quote_path(workdir)}
{_RECORDS}
{_stop_flag()}
for r in {ids}; do
  if ! setup "$r"; then
    # its control directory is gone (removed by a job on purpose or by accident): alive while its wrapper is
    if find_orphan "$r"; then echo "$r RUNNING $wp tampered=records"; else echo "$r MISSING"; fi
    continue
  fi
  if exit_ok "$R"; then echo "$r EXITED $rc $full$(stopflag "$R")"; continue; fi
  if find_wrapper "$R" "$r"; then
    if [ -f "$R/exit_code" ]; then bad="${{bad:+$bad,}}exit_code"; fi
    echo "$r RUNNING $wp${{bad:+ tampered=$bad}}"; continue
  fi
  if exit_ok "$R"; then echo "$r EXITED $rc $full$(stopflag "$R")"; continue; fi
  if [ -f "$R/exit_code" ]; then bad="${{bad:+$bad,}}exit_code"; fi
  if [ -z "$pv$bad" ] && [ ! -s "$R/pid.self" ]; then echo "$r NOPID"; continue; fi
  case "$pv" in ''|*[!0-9]*) pv=- ;; esac
  echo "$r VANISHED $pv$(stopflag "$R")${{bad:+ tampered=$bad}}"
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
{_RECORDS}
r={shlex.quote(run)}
orphan=
if setup "$r"; then
  D=$R
  printf '%s\\n' {shlex.quote(reason)} > "$D/stop_requested"
  find_wrapper "$D" "$r"
elif find_orphan "$r"; then  # its control directory was removed while it ran: stopped by its wrapper's marker
  D=/nonexistent/removed orphan=1 pv=$wp
else
  echo MISSING; exit 0
fi
p=$wp
case "$pv" in *[!0-9]*) pv= ;; esac
if [ -z "$p$pv" ] && [ ! -s "$D/pid.self" ] && ! exit_ok "$D"; then echo NOPID; exit 0; fi
u=$(cat "$D/run_as" 2>/dev/null || true)
case "$u" in -*|*[!A-Za-z0-9._-]*) u= ;; esac
as_user() {{ [ -n "$u" ] && sudo -n -u "$u" -- /bin/sh -c "$1" sh "$2" "$p" < /dev/null > /dev/null 2>&1; }}
signal() {{
  as_user 'kill -s "$1" -- -"$2"' "$1"
  kill -s "$1" -- -"$p" 2>/dev/null || kill -s "$1" "$p" 2>/dev/null
}}
group_alive() {{ kill -s 0 -- -"$p" 2>/dev/null || as_user 'kill -s 0 -- -"$2"' 0; }}
unset {RUN_MARKER}
# the marker: the live wrapper's own (the kernel's copy), else the marker file when it names this run
k=
if [ -n "$p" ] && [ -z "$legacy" ]; then
  k=$(tr '\\n\\000' '\\001\\n' < "/proc/$p/environ" 2>/dev/null | grep -x -E -e "$MRE" | head -n 1)
  k=${{k#{RUN_MARKER}=}}
fi
if [ -z "$k" ]; then
  k=$(head -c 200 "$D/marker" 2>/dev/null | head -n 1)
  case "$k" in "$r".*) ;; *) k= ;; esac
fi
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
if [ -n "$p" ] && ! exit_ok "$D"; then ran=1; signal TERM; fi
found=$(marked TERM)
i=0
while [ $i -lt {ticks} ]; do
  if [ -z "$ran" ] || exit_ok "$D" || ! group_alive; then any_left || break; fi
  sleep 0.1
  i=$((i+1))
done
# past the grace, or the command ended and left processes behind: nothing of the run outlives a stop
if [ -n "$ran" ] && group_alive; then
  signal KILL
  exit_ok "$D" || sleep 0.1
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
n=$(printf '%s\\n%s\\n' "$found" "$late" | awk -v p="${{p:-$pv}}" 'NF == 2 && $2 != p && !seen[$1]++' | wc -l)
n=$((n+0))
e=
if [ "$n" -gt 0 ]; then e=" escaped=$n"; fi
if exit_ok "$D"; then
  if [ -f "$D/term_received" ]; then echo "EXITED $rc stopped$e"; else echo "EXITED $rc$e"; fi
else
  t=
  if [ -f "$D/exit_code" ]; then t=" tampered=exit_code"; fi
  if [ -n "$orphan" ]; then t=" tampered=records"; fi
  echo "VANISHED ${{p:-${{pv:--}}}} stopped$e$t"
fi
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

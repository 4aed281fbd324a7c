"""Launch a run on its host: claim its control directory, write its files, start its wrapper detached.

The user's command is written verbatim into `command.sh` and run by `sh`; every value the scheduler adds
is shell-quoted (`inputs`). Where the run's files go and how they are checked later: `run_records`.

Run as the submitter (`run_as` given): the wrapper, the run files and the logs stay with the host's SSH
account (private to it), and only the command runs as the job's user through `sudo -n -u USER`,
reading its environment and its text from `as_user.sh` on stdin (sudo resets the environment and the
user cannot read the run directory). The user's processes stay in the wrapper's process group, so a
stop signals them as that user (`sudo -u USER kill`) as well as the group as the SSH account.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from lucid_core.runtime.hosts.claims import CLAIMS, LaunchClaim, claim_check, claim_entry
from lucid_core.runtime.hosts.inputs import ENV_NAME_PATTERN, check_os_user, check_run_id, quote_path
from lucid_core.runtime.hosts.run_records import RECORD_CHECKS, RUN_MARKER, WORKROOM

# what sudo says when it will not run a command as the user (the launch prints it after this word)
REFUSED_USER = "REFUSED_USER"


@dataclass(frozen=True, slots=True)
class TelemetryLaunch:
    """How to start the telemetry agent next to a job (see lucid_core.runtime.hosts.telemetry_agent)."""

    agent_source: str
    agent_name: str  # file name in the run's control directory, versioned by content hash
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
if [ -f stop_requested ]; then  # stopped before it started (its launch went unanswered): the command never runs
  echo 1 > term_received
  (exit 143) &
else
{start}
fi
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
        # a launch that gives up removes what it made, but keeps a stop that reached the directory meanwhile: a
        # later launch of the run then finds it there and starts nothing
        'drop_run() { cd /; if [ -f "$D/stop_requested" ]; then '
        'find "$D" -mindepth 1 -maxdepth 1 ! -name stop_requested -exec rm -rf {} +; else rm -rf "$D"; fi; }',
        'mkdir -p "$W" || { echo "ERROR cannot create work directory $W"; exit 3; }',
        'if ! mkdir "$D" 2>/dev/null; then echo "EXISTS $(head -c 32 "$D/pid" 2>/dev/null | tr -cd 0-9)"; exit 0; fi',
        'cd "$D"',
        RECORD_CHECKS,
    ]
    user_files = ""
    if run_as is not None:
        user = shlex.quote(run_as)
        lines.append(f"if ! why=$(sudo -n -H -u {user} -- /bin/sh -c 'exit 0' < /dev/null 2>&1); then "
                     f'drop_run; echo "{REFUSED_USER} $(printf \'%s\' "$why" | tr \'\\n\' \' \')"; exit 5; fi')
        user_files = (f"printf '%s' {shlex.quote(user_script(env, command, run_id))} > as_user.sh && "
                      f"printf '%s\\n' {user} > run_as && ")
    else:
        user_files = f'mkdir -p "$W"/{WORKROOM}/{run} && '
    if claim is not None:
        lines.append(claim_check(run_id, claim))
    lines += [
        f"printf '%s\\n' {shlex.quote(command)} > command.sh && "
        f"printf '%s\\n' {shlex.quote(marker)} > marker && "
        f"printf '%s' {shlex.quote(wrapper_script(env, run_id, token, run_as))} > run.sh && "
        + user_files +
        # room for the exit code, taken now: the wrapper overwrites it in place, so a disk that fills
        # up while the job runs cannot turn a finished job into one that vanished
        f"printf '%-{_EXIT_ROOM}s\\n' '' > exit_code.tmp || "
        # a cut-short command.sh (disk full) would run a prefix of the command: run nothing instead
        '{ echo "ERROR cannot write the run files in $D (disk full or read-only?)"; drop_run; exit 4; }',
        # the marker is in the wrapper's own environment from its start: the kernel's copy is what polls trust
        f"{RUN_MARKER}={shlex.quote(marker)} setsid sh ./run.sh < /dev/null > /dev/null 2>&1 9>&- &",
        "pid=$!",
        "echo $pid > pid",
        # wait (briefly) for the wrapper to be itself, so that the first poll sees it as the run's
        "i=0",
        "while [ ! -s pid.self ] && [ $i -lt 300 ]; do sleep 0.01; i=$((i+1)); done",
    ]
    if claim is not None:
        lines.append(claim_entry(run_id, claim))
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


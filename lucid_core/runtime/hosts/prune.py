"""Remove the files of runs that ended long ago from their host: both rooms of each run (see `run_records`).

Every run leaves its control directory (`<workdir>/<run_id>`: logs, telemetry, the wrapper) and the job's
working directory (`<workdir>/.work/<run_id>`, or `~/.lucid-work/<run_id>` of the job's user on hosts that
run jobs as their submitter) behind. Kept for ever they fill the host's disk, so a round removes them once a
run has been over for `runtime.keep_ended_runs_days`. The host checks again before removing anything: a run
whose wrapper still lives there (a store that says otherwise is wrong, or was written by someone else) is
left alone and answered LIVE. Paths are removed as they are, never through a symlink a job put in their
place, and a directory the job made unreadable is opened up first (it belongs to the same account or user).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from lucid_core.runtime.hosts.inputs import check_os_user, check_run_id, quote_path
from lucid_core.runtime.hosts.run_records import RECORD_CHECKS, WORKROOM

#: what the host answers per run: its files removed, none were there, its wrapper still runs, or some stayed
PRUNE_ANSWERS = ("PRUNED", "MISSING", "LIVE", "FAILED")

# `gone DIR`: remove DIR (not what a symlink there points at), opening up what its owner made unreadable;
# true when nothing is left at that path
_GONE = r"""gone() {
  [ -e "$1" ] || [ -L "$1" ] || return 0
  if [ -d "$1" ] && [ ! -L "$1" ]; then chmod -R u+rwx -- "$1" 2>/dev/null || true; fi
  rm -rf -- "$1" 2>/dev/null || true
  [ ! -e "$1" ] && [ ! -L "$1" ]
}
"""

# run as the job's user through sudo: remove $HOME/.lucid-work/$1 the same way
_USER_GONE = ('[ -n "$HOME" ] && [ "$HOME" != / ] || exit 0; d="$HOME/.lucid-work/$1"; '
              '[ -e "$d" ] || [ -L "$d" ] || exit 0; '
              '{ [ -L "$d" ] || chmod -R u+rwx -- "$d"; } 2>/dev/null; rm -rf -- "$d" 2>/dev/null; '
              '[ ! -e "$d" ] && [ ! -L "$d" ]')


def prune_script(workdir: str, runs: Mapping[str, str | None]) -> str:
    """Remove the rooms of each run (run id -> the OS user it ran as on a submitter host, else None); prints
    `<run_id> <answer>` per run (PRUNE_ANSWERS), then END."""
    lines = [f"W={quote_path(workdir)}", RECORD_CHECKS, _GONE]
    for run_id, user in runs.items():
        run = shlex.quote(check_run_id(run_id))
        as_user = ""
        if user is not None:
            u = shlex.quote(check_os_user(user))
            as_user = (f"if ! sudo -n -H -u {u} -- /bin/sh -c {shlex.quote(_USER_GONE)} sh {run} "
                       "< /dev/null > /dev/null 2>&1; then ok=; fi\n  ")
        lines.append(f"""r={run}
if setup "$r" && find_wrapper "$R" "$r"; then
  echo "$r LIVE"
else
  c="$Wp/$r" w="$Wp/{WORKROOM}/$r" ok=1 any=
  if [ -e "$c" ] || [ -L "$c" ] || [ -e "$w" ] || [ -L "$w" ]; then any=1; fi
  gone "$w" || ok=
  {as_user}gone "$c" || ok=
  if [ -z "$ok" ]; then echo "$r FAILED"; elif [ -n "$any" ]; then echo "$r PRUNED"; else echo "$r MISSING"; fi
fi""")
    lines.append("echo END")
    return "\n".join(lines) + "\n"


def parse_prune(stdout: str, run_ids: list[str]) -> dict[str, str] | None:
    """The answer per run asked about (runs the host did not answer for are left out); None when the output
    was cut short (no END line): nothing is known then."""
    lines = stdout.strip().splitlines()
    if not lines or lines[-1] != "END":
        return None
    asked = set(run_ids)
    out: dict[str, str] = {}
    for line in lines[:-1]:
        words = line.split()
        if len(words) == 2 and words[0] in asked and words[1] in PRUNE_ANSWERS:
            out[words[0]] = words[1]
    return out

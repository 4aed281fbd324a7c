"""A run's records on its host: where they live, the marker its processes carry, and how they are judged.

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

Every process of a run carries the marker `LUCID_RUN_MARKER=<run_id>.<random hex>` in its environment
(children inherit it; the random part, kept in the run directory's `marker` file, tells apart runs of
the same id from other work directories or stores). A stop finds by it the run's processes that left
its process group (see `stop`).
"""

from __future__ import annotations

# the environment variable that marks every process of a run (its value: the run id and 16 random hex digits)
RUN_MARKER = "LUCID_RUN_MARKER"
WORKROOM = ".work"  # under the work directory: the jobs' own working directories (not a run id: leading dot)

# Shell functions that judge a run's records by the host's own facts. `setup RUN` sets R (the control
# directory, physical path; false when it is gone), tok (the token in its wrapper), legacy (a run started
# before records carried a token: judged as then) and MRE (the run's marker entry, as a regex).
# `is_wrapper R RUN PID`: that pid is alive, no zombie, works in R and carries the run's marker in the
# environment it started with (a reused pid, or a pid file naming another process, fails).
# `find_wrapper R RUN` sets wp (the live wrapper's pid, or empty), pv (what the pid file says) and bad
# (`pid` when a pid file named another process); when neither pid file names it, it looks for the
# process that works in R and carries the marker. `exit_ok R` is true when exit_code holds the run's
# token (sets rc and full).
RECORD_CHECKS = r"""first() { v=; [ -f "$1" ] || return 0; IFS= read -r v < "$1" || true; }
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

"""Stop a run on its host: TERM its process group and every process carrying its marker, then KILL.

Every process of a run carries its marker (`run_records`). Besides the wrapper's process group, a stop
finds by that exact `/proc/PID/environ` entry the run's processes that left the group (`setsid`,
`set -m`, daemons) and signals them: a process that scrubs or overwrites its environment, or that the
account and the job's user may no longer read (setuid), still escapes. A run started as its submitter
is signalled as that user too (`launch`).
"""

from __future__ import annotations

import shlex

from lucid_core.runtime.hosts.inputs import check_run_id, quote_path
from lucid_core.runtime.hosts.run_records import RECORD_CHECKS, RUN_MARKER

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
{RECORD_CHECKS}
r={shlex.quote(run)}
orphan=
if setup "$r"; then
  D=$R
elif find_orphan "$r"; then  # its control directory was removed while it ran: stopped by its wrapper's marker
  D=/nonexistent/removed orphan=1 pv=$wp
else
  t="$W/$r"
  if [ ! -L "$t" ] && mkdir -p "$W" 2>/dev/null && mkdir "$t" 2>/dev/null; then
    # never started here: the stop is left in its directory, so that a launch still on its way starts nothing
    printf '%s\\n' {shlex.quote(reason)} > "$t/stop_requested"
    echo MISSING; exit 0
  fi
  setup "$r" || {{ echo MISSING; exit 0; }}  # a launch made its directory meanwhile: stopped as found below
  D=$R
fi
if [ -z "$orphan" ]; then
  printf '%s\\n' {shlex.quote(reason)} > "$D/stop_requested"
  find_wrapper "$D" "$r"
fi
p=$wp
case "$pv" in *[!0-9]*) pv= ;; esac
nowrapper=
if [ -z "$p$pv" ] && [ ! -s "$D/pid.self" ] && ! exit_ok "$D"; then
  # no wrapper by its files: one whose job rewrote or removed them still sits in the run's directory, marked
  for v in $(cwd_is "$D"); do if marked_as_run "$v"; then p=$v; break; fi; done
  [ -n "$p" ] || nowrapper=1
fi
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
if [ -n "$nowrapper" ] && [ "$n" -eq 0 ]; then
  # no wrapper and nothing marked (a launch cut short, or one still on its way): stop_requested, written above,
  # keeps any later wrapper from running the command
  echo MISSING; exit 0
fi
if exit_ok "$D"; then
  if [ -f "$D/term_received" ]; then echo "EXITED $rc stopped$e"; else echo "EXITED $rc$e"; fi
else
  t=
  if [ -f "$D/exit_code" ]; then t=" tampered=exit_code"; fi
  if [ -n "$orphan" ]; then t=" tampered=records"; fi
  echo "VANISHED ${{p:-${{pv:--}}}} stopped$e$t"
fi
"""

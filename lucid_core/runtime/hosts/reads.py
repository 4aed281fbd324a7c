"""Scripts that only read a host: each run's status (poll), the tail or front of a run's file, the host's GPUs."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from lucid_core.runtime.hosts.inputs import check_run_id, quote_path
from lucid_core.runtime.hosts.run_records import RECORD_CHECKS


def _stop_flag() -> str:
    """A run ended by a stop: the stop wrote stop_requested and its wrapper caught the TERM. On a host that runs
    jobs as their submitter (a run_as file) the stop signals the user's processes before the account's wrapper,
    and a job that dies of it can take the wrapper down before its TERM arrives: there stop_requested alone
    counts (the job's user cannot write the account's control directory). Else a cancelled job could end FAILED,
    "exited with code 143", when the stop's own answer was lost."""
    return ('stopflag() { if [ -f "$1/stop_requested" ] && { [ -f "$1/term_received" ] || [ -f "$1/run_as" ]; }; '
            'then echo " stopped"; fi; }')


def _ended_ago() -> str:
    """How many seconds ago a run's exit record was written (to the nanosecond where GNU `stat` and `date` say
    it, else whole seconds), both times on the host's own clock (no skew to the store's): a round that reads the
    end a minute late still records when the job ended. Nothing where `stat` cannot say or the clock went back."""
    return ('secs() { case "$1" in ""|*[!0-9.]*|*.*.*|.*|*.) return 1 ;; esac; }; '
            'endedago() { m=$(stat -c %.9Y -- "$1" 2>/dev/null); n=$(date +%s.%N 2>/dev/null); '
            'if ! secs "$m" || ! secs "$n"; then m=$(stat -c %Y -- "$1" 2>/dev/null); n=$(date +%s); fi; '
            'secs "$m" && secs "$n" || return 0; '
            'awk -v n="$n" -v m="$m" \'BEGIN { if (n >= m) printf " ago=%.3f", n - m }\'; }')


def poll_script(workdir: str, run_ids: Sequence[str]) -> str:
    """One line per run: MISSING | NOPID | RUNNING pid | EXITED rc [disk_full] [stopped] [ago=s] | VANISHED
    pid|- [stopped]; RUNNING and VANISHED lines end with `tampered=pid,exit_code` (what did not pass) when a
    record failed its check, and a run whose control directory is gone while its wrapper lives is
    `RUNNING pid tampered=records`. `ago`: seconds since the exit record was written."""
    ids = " ".join(shlex.quote(check_run_id(r)) for r in run_ids)
    return f"""W={quote_path(workdir)}
{RECORD_CHECKS}
{_stop_flag()}
{_ended_ago()}
for r in {ids}; do
  if ! setup "$r"; then
    # its control directory is gone (removed by a job on purpose or by accident): alive while its wrapper is
    if find_orphan "$r"; then echo "$r RUNNING $wp tampered=records"; else echo "$r MISSING"; fi
    continue
  fi
  if exit_ok "$R"; then echo "$r EXITED $rc $full$(stopflag "$R")$(endedago "$R/exit_code")"; continue; fi
  if find_wrapper "$R" "$r"; then
    if [ -f "$R/exit_code" ]; then bad="${{bad:+$bad,}}exit_code"; fi
    echo "$r RUNNING $wp${{bad:+ tampered=$bad}}"; continue
  fi
  if exit_ok "$R"; then echo "$r EXITED $rc $full$(stopflag "$R")$(endedago "$R/exit_code")"; continue; fi
  if [ -f "$R/exit_code" ]; then bad="${{bad:+$bad,}}exit_code"; fi
  if [ -z "$pv$bad" ] && [ ! -s "$R/pid.self" ]; then echo "$r NOPID"; continue; fi
  case "$pv" in ''|*[!0-9]*) pv=- ;; esac
  echo "$r VANISHED $pv$(stopflag "$R")${{bad:+ tampered=$bad}}"
done
echo END
"""


def read_script(workdir: str, run_id: str, name: str, max_bytes: int) -> str:
    """The last `max_bytes` of a file in the run directory (empty when absent)."""
    return _run_file_script(workdir, run_id, name, f'tail -c {int(max_bytes)} -- "$f"')


def read_tail_script(workdir: str, run_id: str, name: str, max_bytes: int) -> str:
    """`size=N` (the file's size in bytes; N empty when it could not be read) on a line of its own, then its last
    `max_bytes` (nothing when absent): the size says whether the tail is the whole file, whatever its bytes
    decode to. The marker line is always the first, so no line of the file can be read as the size."""
    return _run_file_script(workdir, run_id, name,
                            f'{{ printf "size=%s\\n" "$(wc -c < "$f" 2>/dev/null | tr -cd 0-9 | head -c 19)"; '
                            f'tail -c {int(max_bytes)} -- "$f"; }}')


def read_range_script(workdir: str, run_id: str, name: str, offset: int | None, max_bytes: int) -> str:
    """`size=N from=O` on a line of its own (the file's size, N empty when it could not be read; the byte offset
    the bytes start at), then up to `max_bytes` of the file from byte `offset`, or its last `max_bytes` when
    `offset` is None (nothing when absent): a follow or a whole read goes on from `O` plus the bytes it got, one
    round trip per chunk, whatever the bytes are. The marker line is the first, so no byte of the file is read as
    it; a file shorter than `offset` (truncated) gives no bytes and its size says so."""
    if (offset is not None and offset < 0) or max_bytes <= 0:
        raise ValueError(f"not a byte range: offset {offset!r}, {max_bytes!r} bytes")
    # 18 digits: the size stays inside the shell's 64-bit arithmetic
    length = int(max_bytes)
    start = f"$(( ${{s:-0}} > {length} ? ${{s:-0}} - {length} : 0 ))" if offset is None else str(int(offset))
    return _run_file_script(workdir, run_id, name,
                            f'{{ s=$(wc -c < "$f" 2>/dev/null | tr -cd 0-9 | head -c 18); o={start}; '
                            f'printf "size=%s from=%s\\n" "$s" "$o"; '
                            f'tail -c +$((o + 1)) -- "$f" | head -c {length}; }}')


def parse_range(out: bytes, offset: int | None, max_bytes: int) -> tuple[bytes, int, int | None]:
    """What `read_range_script` printed as (bytes, the offset they start at, the file's size or None): no bytes
    when the file is absent (nothing printed) or the marker line does not say where they start (a read asked at
    `offset` that the host says began elsewhere is not trusted either)."""
    head, newline, data = out.partition(b"\n")
    words = head.split(b" ")
    if not newline or len(words) != 2:
        return b"", offset or 0, None
    size, start = _byte_count(words[0], b"size="), _byte_count(words[1], b"from=")
    if start is None or (offset is not None and start != offset):
        return b"", offset or 0, size
    return data[:max_bytes], start, size


def _byte_count(word: bytes, prefix: bytes) -> int | None:
    """The count after `prefix` in a marker word when it is 1 to 18 ASCII digits (what the script prints), else
    None."""
    value = word[len(prefix):] if word.startswith(prefix) else b""
    return int(value) if 0 < len(value) <= 18 and value.isdigit() else None


def read_front_lines_script(workdir: str, run_id: str, name: str, max_bytes: int, line_bytes: int,
                            scan_bytes: int) -> str:
    """The first `max_bytes` of the lines no longer than `line_bytes` among a file's first `scan_bytes`.

    For a telemetry window, which sits at the front of its file: the job can append to its own run's
    file, and neither what it appends after the window nor long lines it slips in can push the agent's
    samples out of the read (a job that floods past `scan_bytes` only loses its own profile).
    """
    keep = f"LC_ALL=C awk 'length($0) <= {int(line_bytes)}'"
    return _run_file_script(workdir, run_id, name,
                            f'head -c {int(scan_bytes)} -- "$f" | {keep} | head -c {int(max_bytes)}')


def _run_file_script(workdir: str, run_id: str, name: str, reader: str) -> str:
    """Run `reader` on "$f", a file of the run directory (nothing when absent or when it resolves outside)."""
    if name not in {"stdout.log", "stderr.log", "telemetry.jsonl", "telemetry.err", "command.sh"}:
        raise ValueError(f"not a run file: {name!r}")
    run = shlex.quote(check_run_id(run_id))
    # the job owns its run directory and may swap a file (or the directory) for a symlink: read only
    # what still resolves inside <workdir>/<run_id>/. The file is opened once (fd 3) and what was opened is
    # checked through /proc, then read there: a component swapped for a link between the check and a read
    # (a race a job can run) cannot send a read elsewhere
    return (f"W={quote_path(workdir)}\n"
            'd=$(cd "$W" 2>/dev/null && pwd -P) || exit 0\n'
            f'f=$(readlink -f -- "$d"/{run}/{shlex.quote(name)} 2>/dev/null) || exit 0\n'
            f'case "$f" in "$d"/{run}/*) ;; *) exit 0 ;; esac\n'
            '[ -f "$f" ] || exit 0\n'
            'exec 3< "$f" || exit 0\n'
            'if [ -e "/proc/$$/fd/3" ]; then\n'
            '  g=$(readlink "/proc/$$/fd/3" 2>/dev/null) || exit 0\n'
            f'  case "$g" in "$d"/{run}/*) f="/proc/$$/fd/3" ;; *) exit 0 ;; esac\n'
            'fi\n'
            f'[ -f "$f" ] && {reader}\n'
            "exit 0\n")


def discover_gpus_script() -> str:
    """index, name, memory MiB, uuid per GPU via nvidia-smi; prints NO_NVIDIA_SMI when absent."""
    return ("if command -v nvidia-smi >/dev/null 2>&1; then "
            "nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits; "
            "else echo NO_NVIDIA_SMI; fi\n")

"""`lucid logs`: a job's output, read from its host by byte offset a chunk at a time (`HostExecutor.read_range`).

Bare, it shows the end of the log (its last 64 KiB, from the first whole line); `-n N` its last N lines, read
further back a chunk at a time up to `LINES_SEARCH_BYTES`; `--all` (or tail's `-n +K`) the whole log (from line
K), streamed; `-f` goes on from where the read it started with ended, every read from the previous one's end, so
no output is skipped however much arrives between two reads, and a host or store that stops answering once it
follows is waited for (said once) rather than ending the follow. Bytes are decoded as UTF-8 by one incremental
decoder (a character cut by a chunk's end is whole in the next), carriage returns kept.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lucid_core.runtime.hosts.executor import FileBytes, HostAddress, HostExecutor
    from lucid_core.runtime.store.store import Store

#: the most bytes one read brings back: one round trip to the host each
CHUNK_BYTES = 1 << 20
#: what a bare `lucid logs JOB` shows: the end of the log
TAIL_BYTES = 65536
#: where `-f` starts without -n or --all: the last MiB of the log, from its first whole line
FOLLOW_START_BYTES = 1 << 20
#: how long `-f` goes on trying to read the rest of an ended job's log from a host or store that does not answer
ENDED_RETRY_S = 30.0
#: the least time between two tries of a follow's read that found no answer
RETRY_INTERVAL_S = 1.0
#: how far back from the end `-n N` looks for its N lines (at most 17 reads); past it, --all reads the log whole
LINES_SEARCH_BYTES = 16 << 20


@dataclass(frozen=True)
class FromLine:
    """`-n +K`, tail's form: the log from its K-th line on (`-n +1`: all of it, as --all)."""

    line: int


def line_count(text: str) -> int | FromLine:
    """-n's value: N, the last N lines (0 or more), or +K, from line K on (1 or more), as `tail -n` takes them."""
    digits = text[1:] if text.startswith("+") else text
    try:
        value = int(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0 or (text.startswith("+") and value < 1):
        raise argparse.ArgumentTypeError(f"{text} lines: give 0 or more, or +1 or more (from that line on)")
    return FromLine(value) if text.startswith("+") else value


@dataclass
class LogSource:
    """A job's log: its latest run's file on its host, read through the command's one executor (one connection)."""

    executor: HostExecutor
    address: HostAddress
    run_id: str
    host: str
    name: str
    largest: int = 0  # the largest size a read of it saw: whether it was ever anything but empty

    def read(self, offset: int | None, max_bytes: int = CHUNK_BYTES) -> FileBytes:
        """Up to `max_bytes` from byte `offset` (None: the last `max_bytes`), with the file's size."""
        got = self.executor.read_range(self.address, self.run_id, self.name, offset, max_bytes)
        self.largest = max(self.largest, got.size or 0)
        return got


def _source(store: Store, executor: HostExecutor, job_id: str, stream: str) -> LogSource | None:
    """The log of the job's latest launched run (None before its first launch); UnknownJob for no such job."""
    from lucid_core.runtime.hosts.inventory import host_address
    from lucid_core.runtime.surfaces.queries import latest_run

    found = latest_run(store, job_id)
    if found is None:
        return None
    run, host = found
    return LogSource(executor, host_address(host), run.run_id, host.name, f"{stream}.log")


class _Printer:
    """Writes a log's bytes to stdout as UTF-8 text: one incremental decoder across chunks, replacement for bytes
    that are no UTF-8, carriage returns as written."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.printed = False  # whether any of a log was written (then no note says it was empty)

    def write(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        if text:
            self.printed = True
            sys.stdout.write(text)
            sys.stdout.flush()

    def finish(self) -> None:
        """The end of one file: a character it left cut is written as a replacement, and the next file starts clean."""
        self.write(b"", final=True)
        self.decoder.reset()


def _skip_lines(data: bytes, skip: int) -> tuple[bytes, int]:
    """`data` past its first `skip` newlines, and how many newlines are still to skip after it."""
    at = 0
    while skip and (newline := data.find(b"\n", at)) >= 0:
        at, skip = newline + 1, skip - 1
    return (b"", skip) if skip else (data[at:], 0)


@dataclass
class Cursor:
    """Where the next read of a log goes on: its byte offset, and the newlines still to skip (`-n +K`). A read
    that fails leaves it where the last printed byte ended, so a retry prints nothing twice."""

    offset: int = 0
    skip: int = 0


def _drain(source: LogSource, printer: _Printer, cursor: Cursor) -> None:
    """Print the log from the cursor on (the lines it still skips left out) a chunk at a time until the reads catch
    up with its size, moving the cursor past each chunk printed; a log shorter than the cursor's offset (truncated,
    replaced) is said and printed again from its start."""
    while True:
        got = source.read(cursor.offset)
        if got.size is None:  # absent: not written yet, or removed
            return
        if got.size < cursor.offset:
            printer.finish()
            print(f"(its {source.name.removesuffix('.log')} shrank from {_size(cursor.offset)} to {_size(got.size)}: "
                  "truncated or replaced; printing it from its start)", file=sys.stderr)
            cursor.offset = 0
            continue
        data, skip = _skip_lines(got.data, cursor.skip)
        printer.write(data)
        cursor.offset, cursor.skip = got.offset + len(got.data), skip
        if not got.data or cursor.offset >= got.size:
            return


def _window(source: LogSource, max_bytes: int) -> tuple[bytes, int, int, int]:
    """The last `max_bytes` of the log from the first whole line in them (all of them when they are the whole
    log); where they end, the bytes before them that are not shown, and the log's size (0: absent or empty)."""
    got = source.read(None, max_bytes + 1)  # a byte more: whether the window starts a line
    data, start = got.data, got.offset
    if start > 0:
        newline = data.find(b"\n")
        cut = newline + 1 if newline >= 0 else 1
        while newline < 0 and cut < min(4, len(data)) and data[cut] & 0xC0 == 0x80:
            cut += 1  # one long line: at least start at a character
        data, start = data[cut:], start + cut
    return data, got.offset + len(got.data), start, got.size or 0


def _last_lines(source: LogSource, lines: int) -> tuple[bytes, int, int | None]:
    """The last `lines` lines of the log as `tail -n` counts them (ended by a newline; a carriage return makes
    none), reading back from its end a chunk at a time, at most `LINES_SEARCH_BYTES`; where they end, and the
    count of lines found when the bound stopped the search short (else None)."""
    got = source.read(None, TAIL_BYTES)
    parts, start, end = [got.data], got.offset, got.offset + len(got.data)
    newlines, trailing = got.data.count(b"\n"), got.data.endswith(b"\n")
    while newlines - trailing < lines and start > 0 and end - start < LINES_SEARCH_BYTES:
        size = min(CHUNK_BYTES, start, LINES_SEARCH_BYTES - (end - start))
        back = source.read(start - size, size)
        if back.offset != start - size or len(back.data) != size:
            break  # the log changed under the reads (truncated): what was read stands
        parts.append(back.data)
        start, newlines = start - size, newlines + back.data.count(b"\n")
    whole = b"".join(reversed(parts))
    body, last = (whole[:-1], b"\n") if trailing else (whole, b"")
    pieces = body.split(b"\n")
    if lines == 0:
        return b"", end, None
    if len(pieces) > lines:
        return b"\n".join(pieces[-lines:]) + last, end, None
    if start == 0:
        return whole, end, None
    return (b"\n".join(pieces[1:]) + last if len(pieces) > 1 else b""), end, len(pieces) - 1  # whole lines only


def _size(n: int) -> str:
    """A byte count for a person: 812 bytes, 64 KiB, 17.9 MiB."""
    if n < 1024:
        return f"{n} bytes"
    k, unit = next((k, unit) for k, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")) if n >= 1024 ** k)
    return f"{n // 1024 ** k if n % 1024 ** k == 0 else round(n / 1024 ** k, 1)} {unit}"


def _follow(args: argparse.Namespace, store: Store, executor: HostExecutor, printer: _Printer,
            source: LogSource | None, cursor: Cursor) -> tuple[LogSource | None, bool]:
    """Print what the log gains from the cursor on until the job ends, every byte once: each read goes on from the
    last one's end, as many chunks as it takes to catch up. A new run of the job is followed from its start, the
    old one's end printed first. A host or store that does not answer is said once and tried again from where the
    last read ended (once the job has ended, for `ENDED_RETRY_S` at most). The last source read, and whether its
    log was read to the end."""
    from lucid_core.domain import TERMINAL_STATES
    from lucid_core.runtime.surfaces.queries import status

    terminal = {s.value for s in TERMINAL_STATES}
    stream = "stderr" if args.stderr else "stdout"
    ended_at, failing_since = None, None
    while True:
        try:
            if ended_at is None and status(store, args.job)["state"] in terminal:  # before the read: all it wrote
                ended_at = time.monotonic()
            latest = _source(store, executor, args.job, stream)
            if source is not None and latest is not None and latest.run_id != source.run_id:
                _finish_run(source, printer, cursor)
                print(f"(run {latest.run_id} of {args.job} on host {latest.host}: its {stream} from its start)",
                      file=sys.stderr)
                cursor.offset, cursor.skip = 0, 0
            source = latest or source
            if source is not None:
                _drain(source, printer, cursor)
        except _unanswered() as exc:
            if _refused(exc) or _not_a_lost_connection(exc):
                raise
            now = time.monotonic()
            if failing_since is None:  # the decoder keeps a character cut by the failed read's start
                failing_since = now
                print(f"(no answer: {_error_line(exc)}; trying again, from byte {cursor.offset} of its {stream}: "
                      "nothing is skipped)", file=sys.stderr)
            if ended_at is not None and now - max(failing_since, ended_at) >= ENDED_RETRY_S:
                print(f"({args.job} ended; the rest of its {stream}, from byte {cursor.offset}, could not be read "
                      f"in {ENDED_RETRY_S:g} s of trying: lucid logs {args.job} --all reads it when its host answers)",
                      file=sys.stderr)
                return source, False
            time.sleep(max(args.interval, RETRY_INTERVAL_S))
            continue
        if failing_since is not None:
            failing_since = None
            print("(answered again: following)", file=sys.stderr)
        if ended_at is not None:
            return source, True
        time.sleep(args.interval)


def _finish_run(source: LogSource, printer: _Printer, cursor: Cursor) -> None:
    """Print the end of a run the job has moved on from; when its host does not answer, say so and move on."""
    try:
        _drain(source, printer, cursor)
    except _unanswered() as exc:  # a refused key too: the new run may be on a host that answers
        if _not_a_lost_connection(exc):
            raise
        printer.finish()
        print(f"(the end of run {source.run_id}'s {source.name.removesuffix('.log')} on host {source.host}, from "
              f"byte {cursor.offset}, could not be read: {_error_line(exc)})", file=sys.stderr)
    printer.finish()


def _unanswered() -> tuple[type[BaseException], ...]:
    """The errors a follow tries again after: a host that does not answer (not one whose key is refused: that
    will not pass by itself) and a store that does not."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError

    from lucid_core.runtime.hosts.executor import HostUnreachable

    return (HostUnreachable, DBAPIError, sqlite3.OperationalError)


def _not_a_lost_connection(exc: BaseException) -> bool:
    """A database error that is no outage (bad SQL, a constraint): not tried again. An OperationalError is one, and
    so is any error the driver raised as its connection was lost (PostgreSQL's InterfaceError among them)."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    return isinstance(exc, DBAPIError) and not (isinstance(exc, OperationalError) or exc.connection_invalidated)


def _error_line(exc: BaseException) -> str:
    """An error as one line of a note."""
    from lucid_core.units import one_line

    return one_line(str(exc), 160) or type(exc).__name__


def _refused(exc: BaseException) -> bool:
    """A host whose key is refused: that does not pass by itself, so it ends the command as an error."""
    from lucid_core.runtime.hosts.executor import HostKeyRejected

    return isinstance(exc, HostKeyRejected)


def cmd_logs(args: argparse.Namespace) -> int:
    """`lucid logs JOB [-n N | -n +K | --all] [-f] [--stderr]`: see the module's docstring."""
    from lucid_core.runtime.surfaces.cli.context import executor_of, store_of

    store = store_of(args)
    stream = "stderr" if args.stderr else "stdout"
    executor = executor_of(args)
    printer = _Printer()
    try:
        source = _source(store, executor, args.job, stream)
        cursor = Cursor(skip=args.lines.line - 1 if isinstance(args.lines, FromLine) else 0)
        whole = args.all or isinstance(args.lines, FromLine)
        if source is not None and whole and not args.follow:  # a follow reads it so, trying again where it fails
            _drain(source, printer, cursor)
        elif source is not None and args.lines is not None and not whole:
            data, cursor.offset, found = _last_lines(source, args.lines)
            printer.write(data)
            if found is not None:
                print(f"(only {found} lines lie in the last {_size(LINES_SEARCH_BYTES)} of its {stream}, as far "
                      f"back as -n reads; its whole {_size(source.largest)}: lucid logs {args.job} --all)",
                      file=sys.stderr)
        elif source is not None and not whole:
            window = FOLLOW_START_BYTES if args.follow else TAIL_BYTES
            data, cursor.offset, start, size = _window(source, window)
            if start > 0 and args.follow:
                print(f"(following from the first whole line of its last {_size(window)}: the first {_size(start)} "
                      f"of its {stream} ({_size(size)}) are skipped; lucid logs {args.job} -f --all prints them too)",
                      file=sys.stderr)
            printer.write(data)
            if start > 0 and not args.follow:
                printer.finish()
                print(f"(only the last {_size(window)} of its {stream} were read, from the first whole line in "
                      f"them: the log on its host is {_size(size)}; lucid logs {args.job} -n N gives its last N "
                      f"lines, --all all of it)", file=sys.stderr)
        complete = True
        if args.follow:
            source, complete = _follow(args, store, executor, printer, source, cursor)
        printer.finish()
        if not printer.printed and complete:  # a log that vanished while followed (a job removed it) was not empty
            _empty_notes(args, store, executor, source, stream)
    finally:
        executor.close()
    return 0 if complete else 1


def _empty_notes(args: argparse.Namespace, store: Store, executor: HostExecutor, source: LogSource | None,
                 stream: str) -> None:
    """Why nothing was printed, when the log was empty or absent: its run's files were pruned, its output went to
    stderr, it never ran, it has not started yet."""
    from lucid_core.domain import TERMINAL_STATES
    from lucid_core.runtime.surfaces.queries import status

    if source is not None and source.largest:
        return
    pruned = _pruned_note(store, args.job)
    if pruned:
        print(pruned, file=sys.stderr)
        return
    if stream != "stdout":
        return
    data = status(store, args.job)
    terminal = {s.value for s in TERMINAL_STATES}
    other = (LogSource(executor, source.address, source.run_id, source.host, "stderr.log").read(None, 1).size
             if source is not None else None)
    if other:
        print(f"(stdout of {args.job} is empty; it wrote {other} bytes to stderr: "
              f"lucid logs {args.job} --stderr)", file=sys.stderr)
    elif not data["runs"] and data["state"] in terminal:
        print(f"({args.job} never ran: {data['end_reason'] or data['state']})", file=sys.stderr)
    elif not data["runs"]:
        print(f"({args.job} has not started yet: {data['pending_reason'] or data['state']})", file=sys.stderr)


def _pruned_note(store: Store, job_id: str) -> str | None:
    """What to say when the job's latest run's files were removed from its host (None when they were not)."""
    from lucid_core.policy.view import saved_number
    from lucid_core.runtime.surfaces.queries import latest_run

    found = latest_run(store, job_id)
    if found is None or found[0].pruned_at is None:
        return None
    run = found[0]
    stamp = run.pruned_at if saved_number(run.pruned_at) and run.pruned_at < 253402300800 else None  # year 9999
    when = "on " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(stamp)) if stamp is not None else "earlier"
    return (f"(the files of run {run.run_id} were removed from host {run.host} {when}: runs' logs and working "
            "directories are kept runtime.keep_ended_runs_days after they end)")

"""Trace readers: Philly, Helios `cluster_log.csv` and a generic CSV, into `TraceRecord`s.

Every reader validates row by row: a bad row (missing, negative, non-numeric or absurdly large
value, unparsable time, bytes that are not UTF-8, duplicate job id) is skipped and reported as a
`RowProblem`; it never stops the read. A file with no valid row raises `TraceFormatError`.

Times. Submit times become seconds since `Trace.epoch`: the window start when one is given, else
the first valid submission. Naive timestamps are taken as they are (Philly and Helios publish
local cluster time); timestamps with an offset are converted to UTC and made naive.

Generic CSV (``fmt="generic"``), one job per row, header required, columns in any order:

============  ========  =====================================================================
column        required  meaning
============  ========  =====================================================================
submit_time   yes       ISO 8601 (``2024-03-04 09:15:00``) or seconds (Unix time or offsets)
duration      yes       run time in seconds when running alone (> 0)
gpus          yes       GPUs requested (integer >= 1)
job_id        no        unique id; generated as ``job-<line>`` when absent or blank
vc            no        virtual cluster; ``default`` when absent or blank
user          no        submitting user
name          no        job name (recurring names let the duration model match history)
state         no        final state in the source (COMPLETED, FAILED, CANCELLED, ...)
preemptible   no        the job resumes from its own checkpoints, so it may be stopped and restarted:
                        ``1``/``true``/``yes`` or ``0``/``false``/``no``; blank or absent: no
============  ========  =====================================================================

Checkpointing is each job's own property: Philly and Helios carry no such column, so their jobs are
not preemptible (`lucid simulate --preemptible-share` draws a share of them for a what-if).

A file is parsed once (`parse_trace`) and cut into windows (`ParsedTrace.window`): `read_trace` does both,
and a caller that simulates several windows of one file (the history before a window, the policy matrix)
parses it once.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from lucid_core.sim.records import TraceRecord

TRACE_FORMATS = ("philly", "helios", "generic")
MAX_DURATION_S = 366 * 24 * 3600.0  # a job longer than a year is a corrupt row, not a job
MAX_GPUS = 4096
UNIX_EPOCH = datetime(1970, 1, 1)


class TraceFormatError(ValueError):
    """The file cannot be read as a trace of the given format (no header, no valid row, ...)."""


@dataclass(frozen=True, slots=True)
class RowProblem:
    """A skipped row: `row` is its line number in the file (the header is line 1)."""

    row: int
    column: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.row}: {self.column}={self.value!r}: {self.reason}"


@dataclass(slots=True)
class Trace:
    """Valid jobs sorted by submit time (ties keep file order), their clock origin, skipped rows."""

    records: list[TraceRecord]
    epoch: datetime
    problems: list[RowProblem] = field(default_factory=list)
    source: str = ""
    fmt: str = ""
    rows_read: int = 0  # data rows seen in the file
    outside_window: int = 0  # valid rows dropped by the [start, end) window
    non_gpu_rows: int = 0  # valid CPU-only rows dropped (Helios)

    def problem_summary(self, examples: int = 3) -> str:
        """Count skipped rows by reason, with a few examples each, for a human to read."""
        if not self.problems:
            return f"{self.source}: {self.rows_read} rows, none skipped"
        by_reason = Counter(p.reason for p in self.problems)
        lines = [f"{self.source}: {self.rows_read} rows, {len(self.problems)} skipped"]
        for reason, count in by_reason.most_common():
            shown = [str(p) for p in self.problems if p.reason == reason][:examples]
            lines.append(f"  {count} x {reason}: " + "; ".join(shown))
        return "\n".join(lines)


class _BadValue(ValueError):
    """A cell failed validation; carries the column so the row can be reported."""

    def __init__(self, column: str, value: str, reason: str) -> None:
        super().__init__(reason)
        self.column, self.value, self.reason = column, value, reason


@dataclass(slots=True)
class _Row:
    """A validated row before re-basing its submit time on the trace epoch."""

    line: int
    job_id: str
    submit: datetime
    duration: float
    gpus: int
    vc: str
    user: str
    name: str
    state: str
    preemptible: bool = False


_TRUE = frozenset({"1", "true", "yes", "y", "t"})
_FALSE = frozenset({"", "0", "false", "no", "n", "f"})


def _flag(row: dict[str, str | None], column: str) -> bool:
    """An optional yes/no cell: blank or absent is no; anything else that is not yes or no is a bad row."""
    text = _cell(row, column, required=False)
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise _BadValue(column, text, "not a yes/no value (1/0, true/false, yes/no)")


def _cell(row: dict[str, str | None], column: str, required: bool = True) -> str:
    raw = row.get(column)
    value = raw.strip() if raw is not None else ""
    if required and not value:
        raise _BadValue(column, "", "missing value")
    return value


def _number(row: dict[str, str | None], column: str) -> float:
    text = _cell(row, column)
    try:
        value = float(text)
    except ValueError:
        raise _BadValue(column, text, "not a number") from None
    if not math.isfinite(value):
        raise _BadValue(column, text, "not a finite number")
    return value


def _duration(row: dict[str, str | None], column: str) -> float:
    value = _number(row, column)
    if value <= 0:
        raise _BadValue(column, row[column] or "", "duration must be > 0 seconds")
    if value > MAX_DURATION_S:
        raise _BadValue(column, row[column] or "", f"duration above {MAX_DURATION_S:.0f} s (366 days)")
    return value


def _gpus(row: dict[str, str | None], column: str, allow_zero: bool = False) -> int:
    value = _number(row, column)
    if value != int(value):
        raise _BadValue(column, row[column] or "", "GPU count must be a whole number")
    if value < (0 if allow_zero else 1):
        raise _BadValue(column, row[column] or "", "GPU count must be >= 1")
    if value > MAX_GPUS:
        raise _BadValue(column, row[column] or "", f"GPU count above {MAX_GPUS}")
    return int(value)


def _naive(moment: datetime) -> datetime:
    if moment.tzinfo is not None:
        return moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def _timestamp(row: dict[str, str | None], column: str, allow_seconds: bool = False) -> datetime:
    text = _cell(row, column)
    try:
        moment: datetime | None = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    try:
        if moment is not None:
            return _naive(moment)  # a time zone may carry it past year 9999 or before year 1
        if allow_seconds:
            try:
                seconds = float(text)
            except ValueError:
                seconds = math.nan
            if math.isfinite(seconds) and abs(seconds) < 1e11:
                return UNIX_EPOCH + timedelta(seconds=seconds)
    except OverflowError:
        raise _BadValue(column, text, "time out of range (years 1 to 9999, in UTC)") from None
    hint = " (want ISO 8601 or seconds)" if allow_seconds else " (want ISO 8601)"
    raise _BadValue(column, text, "unparsable time" + hint)


def _check_encoding(row: dict[str, str | None]) -> None:
    """Rows are decoded with surrogateescape: a lone surrogate marks bytes that were not UTF-8."""
    for column, value in row.items():
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("latin-1")
            raise _BadValue(str(column), shown, "not valid UTF-8") from None


def _philly_row(row: dict[str, str | None], line: int) -> _Row | None:
    fast = _philly_fast(row, line)  # most rows: every cell well formed, read in one go
    if fast is not None:
        return fast
    return _Row(line, f"philly-{line:06d}", _timestamp(row, "timestamp"), _duration(row, "duration"),
                _gpus(row, "num_gpus"), _cell(row, "cluster", required=False) or "default", "", "", "")


def _philly_fast(row: dict[str, str | None], line: int) -> _Row | None:
    """A Philly row whose cells all pass the checks of `_timestamp`, `_duration` and `_gpus`, read without
    them; None for any other (the careful path then names what is wrong)."""
    try:
        submit = datetime.fromisoformat(row["timestamp"].strip())  # type: ignore[union-attr]
        duration = float(row["duration"])  # type: ignore[arg-type]
        gpus = float(row["num_gpus"])  # type: ignore[arg-type]
    except (KeyError, AttributeError, ValueError, TypeError):
        return None
    if not (0 < duration <= MAX_DURATION_S and 1 <= gpus <= MAX_GPUS and gpus == int(gpus)):
        return None  # NaN and infinities fail these too
    try:
        submit = _naive(submit)
    except OverflowError:  # a time zone carries it out of range: the careful path says so
        return None
    cluster = (row.get("cluster") or "").strip() or "default"
    return _Row(line, f"philly-{line:06d}", submit, duration, int(gpus), cluster, "", "", "")


def _helios_row(row: dict[str, str | None], line: int) -> _Row | None:
    gpus = _gpus(row, "gpu_num", allow_zero=True)
    if gpus == 0:
        return None  # a CPU job: not ours to schedule
    duration_text = _cell(row, "duration", required=False)
    if duration_text:
        duration = _duration(row, "duration")
    else:  # some exports leave duration blank but keep start and end
        elapsed = (_timestamp(row, "end_time") - _timestamp(row, "start_time")).total_seconds()
        duration = _duration({"duration": str(elapsed)}, "duration")
    name = _cell(row, "jobname", required=False) or _cell(row, "name", required=False)
    return _Row(line, _cell(row, "job_id"), _timestamp(row, "submit_time"), duration, gpus,
                _cell(row, "vc", required=False) or "default", _cell(row, "user", required=False),
                name, _cell(row, "state", required=False))


def _generic_row(row: dict[str, str | None], line: int) -> _Row | None:
    return _Row(line, _cell(row, "job_id", required=False) or f"job-{line}",
                _timestamp(row, "submit_time", allow_seconds=True), _duration(row, "duration"),
                _gpus(row, "gpus"), _cell(row, "vc", required=False) or "default",
                _cell(row, "user", required=False), _cell(row, "name", required=False),
                _cell(row, "state", required=False), _flag(row, "preemptible"))


_ROW_PARSERS: dict[str, tuple[Callable[[dict[str, str | None], int], _Row | None], tuple[str, ...]]] = {
    "philly": (_philly_row, ("timestamp", "duration", "num_gpus")),
    "helios": (_helios_row, ("job_id", "gpu_num", "submit_time", "duration")),
    "generic": (_generic_row, ("submit_time", "duration", "gpus")),
}


def detect_format(path: str | Path) -> str:
    """Guess a trace's format from its header line."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
        header = {name.strip() for name in next(csv.reader(handle), [])}
    for fmt, (_, required) in _ROW_PARSERS.items():
        if set(required) <= header:
            return fmt
    raise TraceFormatError(f"{path}: header {sorted(header)} matches none of {', '.join(TRACE_FORMATS)}")


def as_window_time(value: datetime | date | str | None, name: str) -> datetime | None:
    """A window's bound as a naive datetime (None for none); TraceFormatError naming `name` when it is no ISO
    date or time."""
    if value is None or isinstance(value, datetime):
        return _naive(value) if value is not None else None
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    try:
        return _naive(datetime.fromisoformat(str(value)))
    except ValueError:
        raise TraceFormatError(f"{name}={value!r} is not an ISO date or time (e.g. 2017-10-01)") from None


_BAD_ROW = object()  # what `_rows` yields for a row it reported as a problem


def _rows(handle, parse, problems: list[RowProblem], columns: list[str],
          check_encoding: bool = True) -> Iterator[_Row | object | None]:
    """Parse each data row after the header: a `_Row`, None for a non-GPU job, or `_BAD_ROW`; blank lines are
    skipped. `check_encoding=False` when the text is known to be ASCII (no byte can have failed to decode).
    Read with `csv.reader` (a quote left open is an error), each row made a dict by the header here (what
    `csv.DictReader` does, in a third of its time)."""
    reader = csv.reader(handle, strict=True)
    width = len(columns)
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as error:  # e.g. a field larger than the csv module allows
            problems.append(RowProblem(reader.line_num + 1, "*", "", f"malformed CSV: {error}"))
            yield _BAD_ROW
            continue
        if not cells:
            continue
        line = reader.line_num + 1  # the header line was read before the reader started
        try:
            if len(cells) > width:
                raise _BadValue("*", ",".join(cells[width:]), "more cells than header columns")
            row: dict[str, str | None] = dict(zip(columns, cells, strict=False))
            if len(cells) < width:  # fewer cells: the rest are missing values
                row.update(dict.fromkeys(columns[len(cells):]))
            if check_encoding:
                _check_encoding(row)
            yield parse(row, line)
        except _BadValue as bad:
            problems.append(RowProblem(line, bad.column, bad.value, bad.reason))
            yield _BAD_ROW


@dataclass(slots=True)
class ParsedTrace:
    """Every valid row of a trace file in file order, with what the parse skipped; cut into windows by `window`."""

    path: Path
    fmt: str
    rows: list[_Row]
    problems: list[RowProblem]
    rows_read: int
    non_gpu_rows: int

    def window(self, start: datetime | date | str | None = None,
               end: datetime | date | str | None = None) -> Trace:
        """Jobs submitted in [start, end), sorted by submit time; a job id seen before in the window is skipped."""
        window_start, window_end = as_window_time(start, "start"), as_window_time(end, "end")
        if window_start and window_end and window_end <= window_start:
            raise TraceFormatError(f"empty window: end {window_end} is not after start {window_start}")
        problems = list(self.problems)
        kept: list[_Row] = []
        seen_ids: dict[str, int] = {}
        outside = 0
        for parsed in self.rows:
            before = window_start is not None and parsed.submit < window_start
            if before or (window_end is not None and parsed.submit >= window_end):
                outside += 1
                continue
            first_line = seen_ids.get(parsed.job_id)
            if first_line is not None:
                problems.append(RowProblem(parsed.line, "job_id", parsed.job_id,
                                           f"duplicate job_id (first on line {first_line})"))
                continue
            seen_ids[parsed.job_id] = parsed.line
            kept.append(parsed)
        problems.sort(key=lambda p: p.row)
        if not kept and outside:  # every valid row fell outside: say where the trace's submissions are
            first, last = min(r.submit for r in self.rows), max(r.submit for r in self.rows)
            raise TraceFormatError(
                f"{self.path}: no {self.fmt} job submitted in the window: all {outside} valid rows are outside it "
                f"(the trace's submissions run from {first} to {last})")
        return _build_trace(self.path, self.fmt, kept, problems, window_start, self.rows_read, outside,
                            self.non_gpu_rows)


def parse_trace(path: str | Path, fmt: str = "auto") -> ParsedTrace:
    """Read and validate every row of a trace file once (windows are cut from the result)."""
    path = Path(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in _ROW_PARSERS:
        raise TraceFormatError(f"unknown trace format {fmt!r}; choose from auto, {', '.join(TRACE_FORMATS)}")
    parse, required = _ROW_PARSERS[fmt]
    problems: list[RowProblem] = []
    rows: list[_Row] = []
    rows_read = non_gpu = 0
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
        header = handle.readline()
        columns = [name.strip() for name in next(csv.reader([header]), [])]
        missing = [name for name in required if name not in columns]
        if missing:
            raise TraceFormatError(f"{path}: not a {fmt} trace: header lacks {missing} (has {columns})")
        repeated = sorted({name for name in columns if name and columns.count(name) > 1})
        if repeated:  # which of two `gpus` cells is the job's? The last one won, silently
            raise TraceFormatError(f"{path}: the header names {repeated} more than once")
        body = handle.read()
        # an ASCII file has no byte that failed to decode: its rows skip the per-cell check
        # newline='': rows end at \n, \r\n or a lone \r, as the header did (a file saved with \r alone had every
        # row after the header read as one malformed line)
        for parsed in _rows(io.StringIO(body, newline=""), parse, problems, columns, check_encoding=not body.isascii()):
            rows_read += 1
            if parsed is _BAD_ROW:
                continue
            if parsed is None:
                non_gpu += 1
                continue
            assert isinstance(parsed, _Row)
            rows.append(parsed)
    return ParsedTrace(path, fmt, rows, problems, rows_read, non_gpu)


def read_trace(path: str | Path, fmt: str = "auto", start: datetime | date | str | None = None,
               end: datetime | date | str | None = None) -> Trace:
    """Read a trace file, keep jobs submitted in [start, end), sorted by submit time."""
    window_start, window_end = as_window_time(start, "start"), as_window_time(end, "end")
    if window_start and window_end and window_end <= window_start:  # said before the file is read
        raise TraceFormatError(f"empty window: end {window_end} is not after start {window_start}")
    return parse_trace(path, fmt).window(start, end)


def _build_trace(path: Path, fmt: str, kept: list[_Row], problems: list[RowProblem],
                 window_start: datetime | None, rows_read: int, outside: int, non_gpu: int) -> Trace:
    if not kept:
        detail = f"{len(problems)} rows skipped" + (f", e.g. {problems[0]}" if problems else "")
        raise TraceFormatError(
            f"{path}: no valid {fmt} job rows in the window ({rows_read} rows read; {detail})")
    kept.sort(key=lambda r: (r.submit, r.line))
    epoch = window_start if window_start is not None else kept[0].submit
    records = [
        TraceRecord(job_id=r.job_id, submit_time=(r.submit - epoch).total_seconds(), duration=r.duration,
                    gpus=r.gpus, vc=r.vc, user=r.user, name=r.name, state=r.state, preemptible=r.preemptible)
        for r in kept
    ]
    return Trace(records, epoch, problems, source=str(path), fmt=fmt, rows_read=rows_read,
                 outside_window=outside, non_gpu_rows=non_gpu)


def describe(trace: Trace, examples: int = 3) -> str:
    """A few lines on what was read: jobs kept, window, GPUs, VCs, and the skipped-row summary."""
    records = trace.records
    gpus = Counter(r.gpus for r in records)
    last = records[-1].submit_time
    lines = [
        f"{trace.source} ({trace.fmt}): {len(records)} jobs kept of {trace.rows_read} rows"
        f" ({trace.outside_window} outside the window, {trace.non_gpu_rows} without GPUs, "
        f"{len(trace.problems)} skipped)",
        f"submissions {trace.epoch} .. {trace.epoch + timedelta(seconds=last)}; "
        f"{len({r.vc for r in records})} VCs; GPUs per job " + ", ".join(f"{g}: {n}" for g, n in sorted(gpus.items())),
    ]
    if trace.problems:
        lines.append(trace.problem_summary(examples))
    return "\n".join(lines)

"""`lucid history`'s options and its sacct-like table: field names (sacct's accepted), ages and dates for
--since/--until, state aliases, and how each cell is written for a person."""

from __future__ import annotations

import time
from typing import Any

from lucid_core.runtime.surfaces.job_views import FINISHED_STATE_ALIASES
from lucid_core.runtime.surfaces.terminal_text import columns, pad

#: What a time or duration shows when the store holds no number there (text a hand edit left in a SQLite store).
UNREADABLE = "unreadable"


def local_time(t: float | None) -> str:
    """A Unix time as local date and time, '-' for none, or `UNREADABLE` (one odd row failed the listing)."""
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (TypeError, ValueError, OverflowError, OSError):
        return UNREADABLE


def elapsed_clock(seconds: float | None) -> str:
    """Elapsed time as sacct prints it: [D-]HH:MM:SS."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


#: `lucid history --format` names (sacct's where one exists) -> history field
HISTORY_COLUMNS = {"jobid": "job_id", "job_id": "job_id", "jobname": "name", "name": "name", "user": "user",
                   "vc": "vc", "account": "vc", "gpus": "gpus", "allocgpus": "gpus", "state": "state",
                   "submit": "submit_time", "start": "start_time", "end": "end_time", "queued": "queued_s",
                   "elapsed": "elapsed_s", "exitcode": "exit_code", "exit_code": "exit_code", "reason": "end_reason",
                   "end_reason": "end_reason", "inprofiling": "ended_in_profiling", "timelimit": "time_limit_s",
                   "time_limit": "time_limit_s", "ran": "ran_s", "runtime": "ran_s", "nodelist": "hosts",
                   "hosts": "hosts"}
HISTORY_HEADERS = {"job_id": "JOBID", "name": "JOBNAME", "submit_time": "SUBMIT", "start_time": "START",
                    "end_time": "END", "queued_s": "QUEUED", "elapsed_s": "ELAPSED", "exit_code": "EXITCODE",
                    "end_reason": "REASON", "ended_in_profiling": "INPROFILING", "time_limit_s": "TIMELIMIT",
                    "ran_s": "RAN", "hosts": "NODELIST"}
STATE_ALIASES = FINISHED_STATE_ALIASES


def parse_since(text: str, now: float) -> float:
    """A point in time from `2026-12-01`, `2026-12-01T10:00`, or an age like `90m`, `6h`, `3d`, `1w` ago."""
    import re
    from datetime import datetime

    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if match:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[match.group(2)]
        return now - float(match.group(1)) * unit
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is not None:
        try:
            return moment.timestamp()
        except (OverflowError, OSError, ValueError):  # year 1 in a zone east of UTC; before the epoch on some
            raise ValueError(f"--since/--until {text!r} is out of the range of times") from None
    else:
        raise ValueError(f"--since/--until {text!r}: give a date (2026-12-01), a date-time (2026-12-01T10:00) "
                         "or an age (90m, 6h, 3d, 1w)") from None


def history_columns(text: str | None) -> list[str]:
    """`--format` as history fields (case-insensitive, sacct names accepted); an error naming the bad one."""
    from lucid_core.runtime.surfaces.job_views import HISTORY_DEFAULT_FIELDS

    if not text:
        return list(HISTORY_DEFAULT_FIELDS)
    fields = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        field = HISTORY_COLUMNS.get(name.lower().split("%")[0])
        if field is None:
            raise ValueError(f"--format: unknown field {name!r}; known: {', '.join(sorted(set(HISTORY_COLUMNS)))}")
        fields.append(field)
    return fields


def history_cell(field: str, value: Any) -> str:
    """One field as shown in the table: '-' for none (and for a job submitted without a name)."""
    if value is None or (field == "name" and value == ""):
        return "-"
    if field.endswith("_time"):
        return local_time(value)
    if field.endswith("_s"):
        return elapsed_clock(value)
    if isinstance(value, bool):
        return "yes" if value else ""
    return str(value)


def history_lines(fields: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The table: a header of sacct-like names, then one aligned line per job."""
    table = [[HISTORY_HEADERS.get(f, f.upper()) for f in fields]]
    table += [[history_cell(f, row[f]) for f in fields] for row in rows]
    widths = [max(columns(r[i]) for r in table) for i in range(len(fields))]
    return ["  ".join(pad(c, w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]

"""Reader of Pollux-format workloads: elastic-job traces over measured applications.

A workload file (``name,time,application,num_replicas,batch_size``, one job a row) names, for each
job, an application whose measurements live in a folder of application profiles (see
`elastic_apps`): by default the nearest `traces/` folder at or above the workload's folder, as in
the Pollux artifact's layout (``workloads/workload-1.csv`` beside ``traces/cifar10/...``).

Rows are validated one by one as the other readers do: a row with a missing, non-numeric,
negative or fractional value, an application with no profile, a batch size outside the
application's measured range, or a duplicate name is skipped and reported as a `RowProblem`;
a file without a valid row raises `TraceFormatError`.

============  =====================================================================
column        meaning
============  =====================================================================
name          unique job name
time          submission, seconds from the start of the trace (>= 0)
application   folder name of the measured application (bert, cifar10, ...)
num_replicas  GPUs a user would ask for (fixed-size policies run it so)
batch_size    total batch size a user would ask for (an elastic policy picks its own)
============  =====================================================================
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from lucid_core.policy.elastic_view import ElasticJobSpec
from lucid_core.policy.goodput import Application
from lucid_core.sim.elastic_apps import load_applications
from lucid_core.sim.traces import MAX_GPUS, RowProblem, TraceFormatError

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
MAX_SUBMIT_S = 366 * 24 * 3600.0


@dataclass(slots=True)
class PolluxTrace:
    jobs: list[ElasticJobSpec]
    applications: dict[str, Application]
    problems: list[RowProblem] = field(default_factory=list)
    source: str = ""
    rows_read: int = 0

    def problem_summary(self) -> str:
        """Rows read and skipped, with every skipped row's reason (a human reads it)."""
        head = f"{self.source}: {self.rows_read} rows, {len(self.problems) or 'none'} skipped"
        return "\n".join([head, *(f"  {p}" for p in self.problems[:20])])


class _Bad(ValueError):
    def __init__(self, column: str, value: str, reason: str) -> None:
        super().__init__(reason)
        self.column, self.value, self.reason = column, value, reason


def find_profiles(workload: str | Path) -> Path:
    """The `traces/` folder of application profiles nearest the workload file (it or a parent's)."""
    for folder in Path(workload).resolve().parents:
        candidate = folder / "traces"
        if candidate.is_dir():
            return candidate
    raise TraceFormatError(f"{workload}: no traces/ folder of application profiles at or above it; "
                           "give one with --profiles")


def _cell(row: dict[str, str | None], column: str) -> str:
    value = (row.get(column) or "").strip()
    if not value:
        raise _Bad(column, "", "missing value")
    return value


def _whole(row: dict[str, str | None], column: str, upper: float) -> int:
    text = _cell(row, column)
    try:
        value = float(text)
    except ValueError:
        raise _Bad(column, text, "not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise _Bad(column, text, "must be a whole number")
    if value < 1:
        raise _Bad(column, text, "must be >= 1")
    if value > upper:
        raise _Bad(column, text, f"above {upper:.0f}")
    return int(value)


def _parse(row: dict[str, str | None], apps: dict[str, Application], broken: dict[str, str]) -> ElasticJobSpec:
    name = _cell(row, "name")
    text = _cell(row, "time")
    try:
        submit = float(text)
    except ValueError:
        raise _Bad("time", text, "not a number (seconds from the trace start)") from None
    if not math.isfinite(submit) or submit < 0 or submit > MAX_SUBMIT_S:
        raise _Bad("time", text, "submission must be 0..366 days in seconds")
    app_name = _cell(row, "application")
    app = apps.get(app_name)
    if app_name in broken:
        raise _Bad("application", app_name, f"its profile folder is unusable: {broken[app_name]}")
    if app is None:
        raise _Bad("application", app_name, f"no profile folder for it (have {', '.join(sorted(apps))})")
    replicas = _whole(row, "num_replicas", MAX_GPUS)
    batch = _whole(row, "batch_size", 1 << 30)
    if not app.init_batch_size <= batch <= app.max_batch_size:
        raise _Bad("batch_size", str(batch), f"outside {app_name}'s measured batch sizes "
                                             f"{app.init_batch_size}..{app.max_batch_size}")
    if batch < replicas:
        raise _Bad("batch_size", str(batch), f"smaller than num_replicas={replicas} (no sample per GPU)")
    return ElasticJobSpec(name, submit, app_name, replicas, batch)


def read_pollux_trace(path: str | Path, profiles: str | Path | None = None) -> PolluxTrace:
    """Read a Pollux-format workload and the application profiles its jobs name."""
    path = Path(path)
    profiles_dir = Path(profiles) if profiles is not None else find_profiles(path)
    apps, broken = load_applications(profiles_dir)
    problems: list[RowProblem] = []
    jobs: list[ElasticJobSpec] = []
    seen: dict[str, int] = {}
    rows = 0
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in POLLUX_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(f"{path}: not a pollux workload: header lacks {missing} "
                                   f"(has {reader.fieldnames})")
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as error:
                rows += 1
                problems.append(RowProblem(reader.line_num, "*", "", f"malformed CSV: {error}"))
                continue
            rows += 1
            line = reader.line_num
            try:
                if None in row:
                    raise _Bad("*", ",".join(row[None] or []), "more cells than header columns")
                for column, value in row.items():
                    if value is not None:
                        try:
                            value.encode("utf-8")
                        except UnicodeEncodeError:
                            raise _Bad(str(column), value.encode("utf-8", "surrogateescape").decode("latin-1"),
                                       "not valid UTF-8") from None
                job = _parse(row, apps, broken)
            except _Bad as bad:
                problems.append(RowProblem(line, bad.column, bad.value, bad.reason))
                continue
            if job.name in seen:
                problems.append(RowProblem(line, "name", job.name, f"duplicate name (first on line {seen[job.name]})"))
                continue
            seen[job.name] = line
            jobs.append(job)
    if not jobs:
        detail = f", e.g. {problems[0]}" if problems else ""
        raise TraceFormatError(f"{path}: no valid pollux job rows ({rows} rows read{detail})")
    jobs.sort(key=lambda j: j.submit_time)
    used = {j.application for j in jobs}
    return PolluxTrace(jobs, {k: v for k, v in apps.items() if k in used}, problems, str(path), rows)

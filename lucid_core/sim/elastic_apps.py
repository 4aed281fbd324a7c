"""Reading measured training applications (the Pollux artifact's folders) into `policy.goodput.Application`s.

One application is a folder: `placements.csv` and `scalability.csv` hold seconds per step of one replica for a
placement and a per-replica batch size, `validation-B.csv` the progress and gradient statistics per epoch when
training with total batch size B. The model these feed (throughput, statistical efficiency, goodput) is
`lucid_core.policy.goodput`, which the Pollux policy uses too.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from lucid_core.policy.goodput import (
    GPUS_PER_NODE_MEASURED,
    KNOWN_LIMITS,
    Application,
    AppLimits,
    normalize_placement,
    placement_id,
)


class AppFormatError(ValueError):
    """An application folder is missing a file or holds a value that cannot be a measurement."""


def _floats(path: Path, row: Mapping[str, str], column: str, line: int) -> float:
    try:
        value = float(row[column])
    except (KeyError, TypeError, ValueError):
        raise AppFormatError(f"{path} line {line}: {column}={row.get(column)!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise AppFormatError(f"{path} line {line}: {column}={value} is not a finite non-negative number")
    return value


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.exists():
        raise AppFormatError(f"{path}: missing (an application folder needs placements.csv, "
                             "scalability.csv and validation-B.csv files)")
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise AppFormatError(f"{path}: header lacks {missing} (has {reader.fieldnames})")
        rows = [(line, row) for line, row in enumerate(reader, start=2)]
    if not rows:
        raise AppFormatError(f"{path}: no data rows")
    return rows


def load_application(folder: str | Path, limits: AppLimits | None = None) -> Application:
    """Read one application folder (`placements.csv`, `scalability.csv`, `validation-B.csv`)."""
    folder = Path(folder)
    name = folder.name
    limits = limits or KNOWN_LIMITS.get(name, AppLimits())
    by_placement: dict[str, list[tuple[float, float, float]]] = {}
    path = folder / "placements.csv"
    for line, row in _read_rows(path, ("placement", "local_bsz", "step_time", "sync_time")):
        pid = row["placement"].strip()
        if not pid.isdigit() or "0" in pid or any(int(c) > GPUS_PER_NODE_MEASURED for c in pid):
            raise AppFormatError(f"{path} line {line}: placement {pid!r} is not GPUs per node (digits 1-4)")
        values = tuple(_floats(path, row, c, line) for c in ("local_bsz", "step_time", "sync_time"))
        by_placement.setdefault(placement_id(normalize_placement(tuple(int(c) for c in pid))), []).append(values)
    placements = {}
    shapes: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for pid, rows in by_placement.items():
        rows.sort()
        arr = np.array(rows)
        placements[pid] = (arr[:, 0], arr[:, 1], arr[:, 2])
        nodes, replicas = len(pid), sum(int(c) for c in pid)
        for bsz, step, sync in rows:
            shapes.setdefault((nodes, replicas, bsz), []).append((step, sync))
    points = [k for k in shapes]
    values = [tuple(np.mean(shapes[k], axis=0)) for k in points]
    path = folder / "scalability.csv"
    for line, row in _read_rows(path, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")):
        point = tuple(_floats(path, row, c, line) for c in ("num_nodes", "num_replicas", "local_bsz"))
        points.append(point)
        values.append(tuple(_floats(path, row, c, line) for c in ("step_time", "sync_time")))
    validation: dict[int, list[tuple[float, float, float]]] = {}
    for vpath in sorted(folder.glob("validation-*.csv")):
        try:
            batch = int(vpath.stem.split("-", 1)[1])
        except ValueError:
            raise AppFormatError(f"{vpath}: name must be validation-<total batch size>.csv") from None
        rows = _read_rows(vpath, ("progress", "grad_sqr", "grad_var"))
        validation[batch] = [tuple(_floats(vpath, r, c, line) for c in ("progress", "grad_sqr", "grad_var"))
                             for line, r in rows]
    if not validation:
        raise AppFormatError(f"{folder}: no validation-B.csv files")
    sizes = sorted(validation)
    epochs = min(len(v) for v in validation.values())
    max_epochs = min(limits.max_epochs or epochs, epochs)
    progress = np.array([[validation[b][e][0] for e in range(epochs)] for b in sizes])
    local_sizes = [b for rows in by_placement.values() for b, _, _ in rows]
    app = Application(
        name=name, batch_sizes=np.array(sizes, dtype=float), epoch_progress=progress.min(axis=0),
        grad_sqr=np.array([[validation[b][e][1] for e in range(epochs)] for b in sizes]),
        grad_var=np.array([[validation[b][e][2] for e in range(epochs)] for b in sizes]),
        placements=placements, shape_points=np.array(points, dtype=float), shape_values=np.array(values, dtype=float),
        max_epochs=max_epochs, min_local_bsz=int(min(local_sizes)),
        max_local_bsz=int(limits.max_local_bsz or max(local_sizes)), limits=limits)
    if np.any(np.diff(app.epoch_progress[:max_epochs]) < 0) or app.total_progress <= 0:
        raise AppFormatError(f"{folder}: validation progress must grow epoch by epoch")
    return app


def load_applications(traces_dir: str | Path) -> tuple[dict[str, Application], dict[str, str]]:
    """Every application folder under `traces_dir`, and why each unusable one is (one bad folder
    fails only the jobs that name it)."""
    traces_dir = Path(traces_dir)
    if not traces_dir.is_dir():
        raise AppFormatError(f"{traces_dir}: not a folder of application profiles")
    apps: dict[str, Application] = {}
    broken: dict[str, str] = {}
    for folder in sorted(p for p in traces_dir.iterdir() if p.is_dir()):
        try:
            apps[folder.name] = load_application(folder)
        except AppFormatError as error:
            broken[folder.name] = str(error)
    return apps, broken

"""Generator of the embedded sample: a small synthetic trace (generic CSV) and synthetic catalog.

Nothing here is measured. The trace imitates what production GPU-cluster studies report
(Philly, Helios): submissions follow the working day, most jobs ask for one GPU, run times are
heavy-tailed, and users re-submit the same scripts (debug runs, hyper-parameter sweeps in bursts,
long final runs), so names and users recur. Regenerate with
``python -m lucid_core.sim.sample --out include/sample``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from lucid_core.sim.catalog import WorkloadCatalog

SAMPLE_START = datetime(2024, 3, 4)  # a Monday
TRACE_COLUMNS = ("job_id", "submit_time", "duration", "gpus", "vc", "user", "name", "state")
DEFAULT_JOBS, DEFAULT_SEED, DEFAULT_DAYS = 400, 7, 2.0

# Job kinds: share of submissions, median run time (s), log-normal sigma, clip bounds (s),
# chance of a FAILED end, jobs per submission burst (low, high).
_KINDS = {
    "debug": (0.42, 100.0, 1.1, (8.0, 3600.0), 0.35, (1, 3)),
    "sweep": (0.33, 2400.0, 0.8, (120.0, 8 * 3600.0), 0.08, (3, 8)),
    "eval": (0.15, 600.0, 0.7, (30.0, 2 * 3600.0), 0.05, (1, 2)),
    "final": (0.10, 6 * 3600.0, 0.9, (1800.0, 3 * 24 * 3600.0), 0.1, (1, 1)),
}
_LEARNING_RATES = ("1e-2", "3e-3", "1e-3", "3e-4", "1e-4", "3e-5", "1e-5", "3e-6")
_VCS = ("vision", "nlp", "speech", "rl")
_PROJECTS = ("resnet-aug", "bert-ft", "asr-ctc", "ppo-maze", "gan-faces", "seg-city", "mt-deen", "rec-ncf",
             "det-coco", "lm-small", "tts-fast", "kd-mobile", "vit-tiny", "sac-walk", "clip-mini", "nerf-room")


@dataclass(frozen=True, slots=True)
class _Project:
    user: str
    vc: str
    name: str
    width: int  # GPUs of its final runs (sweeps and debug use fewer)


def _diurnal_rate(hours: np.ndarray) -> np.ndarray:
    """Relative submission rate by hour of day: low at night, peaking mid-afternoon."""
    hour = hours % 24.0
    return 0.15 + np.exp(-(((hour - 15.0) / 4.0) ** 2)) + 0.4 * np.exp(-(((hour - 10.5) / 1.5) ** 2))


def _arrival_times(rng: np.random.Generator, count: int, days: float) -> np.ndarray:
    """`count` arrival offsets (s) over `days` with the diurnal rate, by rejection sampling."""
    peak = float(_diurnal_rate(np.linspace(0, 24, 2401)).max())
    accepted: list[float] = []
    while len(accepted) < count:
        candidates = rng.uniform(0.0, days * 24.0, size=4 * count)
        keep = rng.uniform(0.0, peak, size=candidates.size) < _diurnal_rate(candidates)
        accepted.extend((candidates[keep] * 3600.0).tolist())
    return np.sort(np.array(accepted[:count]))


def _projects(rng: np.random.Generator, users: int) -> list[_Project]:
    projects = []
    widths, width_p = (1, 2, 4, 8, 16), (0.35, 0.2, 0.2, 0.2, 0.05)
    for u in range(users):
        vc = _VCS[u % len(_VCS)]
        for k in range(int(rng.integers(1, 3))):
            name = _PROJECTS[(u * 3 + k) % len(_PROJECTS)]
            projects.append(_Project(f"user{u + 1:02d}", vc, name, int(rng.choice(widths, p=width_p))))
    return projects


def _job_gpus(rng: np.random.Generator, kind: str, project: _Project) -> int:
    if kind == "final":
        return project.width
    if kind == "sweep":
        return max(1, project.width // 2) if rng.random() < 0.35 else 1
    if kind == "debug":
        return 1 if rng.random() < 0.88 else min(project.width, 8)
    return 1


def generate_sample_trace(n_jobs: int = DEFAULT_JOBS, seed: int = DEFAULT_SEED, days: float = DEFAULT_DAYS,
                          start: datetime = SAMPLE_START, users: int = 12) -> list[dict[str, str | int | float]]:
    """Rows of a synthetic trace in the generic CSV format, sorted by submit time."""
    if n_jobs < 1 or days <= 0 or users < 1:
        raise ValueError("need n_jobs >= 1, days > 0 and users >= 1")
    rng = np.random.default_rng(seed)
    projects = _projects(rng, users)
    activity = 1.0 / np.arange(1, len(projects) + 1) ** 0.8  # a few busy projects, many quiet ones
    activity = rng.permutation(activity / activity.sum())
    kinds = list(_KINDS)
    kind_p = np.array([_KINDS[k][0] for k in kinds])
    final_runs: dict[str, int] = {}
    rows: list[dict[str, str | int | float]] = []
    times = _arrival_times(rng, n_jobs, days)
    t_index = 0
    while t_index < n_jobs:
        project = projects[int(rng.choice(len(projects), p=activity))]
        kind = kinds[int(rng.choice(len(kinds), p=kind_p))]
        _, median, sigma, (low, high), fail_p, (burst_lo, burst_hi) = _KINDS[kind]
        burst = int(rng.integers(burst_lo, burst_hi + 1))
        gpus = _job_gpus(rng, kind, project)
        if kind == "final":
            final_runs[project.name] = final_runs.get(project.name, 0) + 1
        burst_start = times[t_index]
        first_lr = int(rng.integers(0, len(_LEARNING_RATES)))
        for b in range(min(burst, n_jobs - t_index)):
            submit = burst_start + 20.0 * b  # a sweep lands within a few minutes
            failed = rng.random() < fail_p
            duration = float(np.clip(median * math.exp(sigma * rng.normal()), low, high))
            if failed:
                duration = float(np.clip(duration * rng.uniform(0.02, 0.3), 5.0, high))
            name = {
                "debug": f"{project.name}-debug",
                "sweep": f"{project.name}-sweep-lr{_LEARNING_RATES[(first_lr + b) % len(_LEARNING_RATES)]}",
                "eval": f"{project.name}-eval",
                "final": f"{project.name}-final-v{final_runs.get(project.name, 1)}",
            }[kind]
            rows.append({
                "submit_s": submit, "duration": round(duration), "gpus": gpus, "vc": project.vc,
                "user": project.user, "name": name, "state": "FAILED" if failed else "COMPLETED",
            })
            t_index += 1
    rows.sort(key=lambda r: float(r["submit_s"]))
    for k, row in enumerate(rows):
        moment = start + timedelta(seconds=round(float(row.pop("submit_s"))))
        row["submit_time"] = moment.isoformat(sep=" ")
        row["job_id"] = f"job-{k + 1:05d}"
    return [{column: row[column] for column in TRACE_COLUMNS} for row in rows]


def write_trace_csv(rows: list[dict[str, str | int | float]], path: str | Path) -> Path:
    """Write rows in the generic trace CSV format."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=TRACE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_sample(directory: str | Path, n_jobs: int = DEFAULT_JOBS, seed: int = DEFAULT_SEED,
                 days: float = DEFAULT_DAYS) -> list[Path]:
    """Write trace.csv and the synthetic catalog (single_data.csv, colocate_info.csv) to `directory`."""
    directory = Path(directory)
    trace = write_trace_csv(generate_sample_trace(n_jobs, seed, days), directory / "trace.csv")
    single, colocate = WorkloadCatalog.synthetic(seed).to_csv(directory)
    return [trace, single, colocate]


def default_sample_dir() -> Path:
    """include/sample/ of the source checkout this module belongs to."""
    return Path(__file__).resolve().parents[2] / "include" / "sample"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """`lucid make-sample`: regenerate the embedded synthetic sample trace and catalog."""
    parser = subparsers.add_parser("make-sample", help="write the synthetic sample trace and workload catalog")
    parser.add_argument("--out", type=Path, default=default_sample_dir(), help="output folder")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="number of jobs")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed")
    parser.add_argument("--days", type=float, default=DEFAULT_DAYS, help="days of submissions")
    parser.set_defaults(func=_run_cli)
    return parser


def _run_cli(args: argparse.Namespace) -> int:
    for path in write_sample(args.out, args.jobs, args.seed, args.days):
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lucid_core.sim.sample", description=__doc__)
    subparsers = parser.add_subparsers(dest="command")
    add_parser(subparsers)
    return _run_cli(parser.parse_args(["make-sample", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())

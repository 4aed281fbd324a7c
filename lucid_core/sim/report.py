"""Reports of simulated runs: side-by-side table with ratios, JCT CDF and per-VC queueing plots, files.

Ratios are "x" factors against a baseline policy (Lucid by default): ``policy value / baseline
value`` for each lower-is-better metric, so ``2.10x`` in the FIFO row means FIFO's value is 2.1
times Lucid's (Lucid is 2.1x better), and ``1.00x`` marks the baseline itself.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from lucid_core.sim.metrics import PER_VC_COLUMNS, per_vc_rows, per_vc_table, utilization_over_time
from lucid_core.sim.records import JobOutcome

# (metric key, column title, number format, show a ratio against the baseline)
TABLE_COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("avg_jct_h", "avg JCT h", "{:.2f}", True),
    ("p999_jct_h", "P99.9 JCT h", "{:.2f}", True),
    ("avg_queue_h", "avg queue h", "{:.3f}", True),
    ("p999_queue_h", "P99.9 queue h", "{:.2f}", True),
    ("makespan_h", "makespan h", "{:.1f}", False),
    ("gpu_utilization", "GPU util %", "{:.1%}", False),
    ("finished_in_profiling", "ended in prof.", "{:d}", False),
    ("short_jobs_queued", "short queued", "{:d}", False),
    ("shared_jobs", "shared jobs", "{:d}", False),
    ("preemptions", "preemptions", "{:d}", False),
)


def ratio_text(value: float, baseline: float) -> str:
    """'2.10x' for value / baseline; 'n/a' when the baseline is zero and the value is not."""
    if baseline == 0:
        return "1.00x" if value == 0 else "n/a"
    return f"{value / baseline:.2f}x"


def _format(value: object, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if pattern == "{:d}":
        return pattern.format(int(value))  # type: ignore[call-overload]
    if pattern == "{:.1%}":
        return f"{float(value) * 100:.1f}"  # type: ignore[arg-type]
    return pattern.format(float(value))  # type: ignore[arg-type]


def _shown_zero(text: str) -> bool:
    """Whether a formatted cell reads as zero (0, 0.00, ...): a ratio of two such cells says nothing."""
    try:
        return float(text) == 0.0
    except ValueError:
        return False


def pick_baseline(policies: Sequence[str], baseline: str = "lucid") -> str:
    """The baseline column: `baseline` when run (case-insensitive), else the first policy."""
    for name in policies:
        if name.lower() == baseline.lower():
            return name
    return policies[0]


def side_by_side(results: Mapping[str, Mapping[str, float]], baseline: str = "lucid") -> str:
    """A plain-text table, one row per policy, with 'x <baseline>' ratio columns."""
    if not results:
        raise ValueError("no results to tabulate")
    policies = list(results)
    base = pick_baseline(policies, baseline)
    header = ["policy"]
    for _, title, _, ratio in TABLE_COLUMNS:
        header.append(title)
        if ratio:
            header.append(f"x {base}")
    rows = [header]
    for name in policies:
        metrics = results[name]
        row = [name]
        for key, _, pattern, ratio in TABLE_COLUMNS:
            value = metrics.get(key)
            row.append(_format(value, pattern))
            if ratio:
                base_value = results[base].get(key)
                both_shown_zero = (value is not None and base_value is not None and _shown_zero(_format(value, pattern))
                                   and _shown_zero(_format(base_value, pattern)))
                row.append("-" if value is None or base_value is None or both_shown_zero
                           else ratio_text(value, base_value))
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths,
                                                                                                  strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    jobs = {int(m.get("jobs", 0)) for m in results.values()}
    note = (f"x {base}: policy value / {base} value (above 1.00x: {base} is better). "
            f"Jobs per run: {', '.join(str(j) for j in sorted(jobs))}.")
    return "\n".join([*lines, note, *checkpoint_lines(results)])


def checkpoint_lines(results: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Which rows assume that every job resumes from checkpoints, and how many jobs said they do."""
    assuming = [name for name, m in results.items() if m.get("assumes_checkpoints")]
    marked = {int(m["preemptible_jobs"]) for m in results.values() if "preemptible_jobs" in m}
    lines = []
    if assuming:
        lines.append(f"Checkpoints: {', '.join(assuming)} preempt{'s' if len(assuming) == 1 else ''} every job, "
                     "as if each resumed from its checkpoints; their figures hold only where jobs do.")
    if marked:
        count = ", ".join(str(n) for n in sorted(marked))
        lines.append(f"Jobs marked preemptible (the only ones other policies may stop): {count}.")
    return lines


def draw_plots(outcomes_by_policy: Mapping[str, Sequence[JobOutcome]],
               timelines_by_policy: Mapping[str, tuple[Sequence[tuple[float, float]], int]],
               directory: str | Path) -> list[Path]:
    """The three plots of a run: JCT CDF, queueing per VC, GPU utilization over time."""
    directory = Path(directory)
    return [jct_cdf_plot(outcomes_by_policy, directory / "jct_cdf.png"),
            *_queue_and_utilization_plots(outcomes_by_policy, timelines_by_policy, directory)]


def _import_plotting() -> None:
    """Import matplotlib (and pandas, for the per-VC table) and draw one small figure, so fonts and the
    renderer are loaded before the run ends."""
    import io

    import pandas  # noqa: F401

    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(2, 2))
    try:
        axes.step([1, 2], [0, 1], where="post", label="warm")
        axes.set_xscale("log")
        axes.legend()
        figure.tight_layout()
        figure.savefig(io.BytesIO(), format="png", dpi=30)
    finally:
        plt.close(figure)


class PlotWorker:
    """Draws a run's plots in two helper processes that imported matplotlib while the policies ran, so the
    import and the drawing overlap the simulation and the file writing: one draws the JCT CDF, the other the
    per-VC queueing and the utilization plots (about equal shares). The helpers run at a lower priority, so on
    a machine with few cores their warm-up takes only what the run leaves idle. Where processes cannot be
    forked, `draw` draws in this process. A context manager; `draw` returns a future-like object whose
    `result()` waits for the plots (and raises what drawing raised)."""

    def __init__(self) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self._pool = None
        if "fork" in multiprocessing.get_all_start_methods():
            # one pool: with fork it starts both helpers at its first submit, before any thread of its own
            # (a fork while another thread holds a lock, the import lock say, can leave the child waiting on
            # it for ever)
            self._pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_lower_priority)
            for _ in range(2):
                self._pool.submit(_import_plotting)

    def draw(self, outcomes_by_policy: Mapping[str, Sequence[JobOutcome]],
             timelines_by_policy: Mapping[str, tuple[Sequence[tuple[float, float]], int]], directory: str | Path):
        if self._pool is not None:
            directory = Path(directory)
            jct = {name: jct_hours(outcomes) for name, outcomes in outcomes_by_policy.items()}  # cheap to send
            cdf = self._pool.submit(_jct_cdf_plot, jct, directory / "jct_cdf.png")
            rest = self._pool.submit(_queue_and_utilization_plots, dict(outcomes_by_policy),
                                     dict(timelines_by_policy), directory)
            return _Plots(cdf, rest)
        from concurrent.futures import Future

        done: Future = Future()
        done.set_result(draw_plots(outcomes_by_policy, timelines_by_policy, directory))
        return done

    def __enter__(self) -> PlotWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _lower_priority() -> None:
    """A plot helper's initializer: yield the CPU to the run it draws for."""
    with contextlib.suppress(OSError):
        os.nice(10)


class _Plots:
    """The two helpers' futures as one: `result()` is draw_plots's list of paths."""

    def __init__(self, cdf, rest) -> None:
        self._cdf, self._rest = cdf, rest

    def result(self) -> list[Path]:
        return [self._cdf.result(), *self._rest.result()]


def _queue_and_utilization_plots(outcomes_by_policy: Mapping[str, Sequence[JobOutcome]],
                                 timelines_by_policy: Mapping[str, tuple[Sequence[tuple[float, float]], int]],
                                 directory: Path) -> list[Path]:
    return [queue_per_vc_plot(outcomes_by_policy, directory / "queue_per_vc.png"),
            utilization_plot(timelines_by_policy, directory / "gpu_utilization.png")]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


#: a CDF drawn 770 pixels wide shows no more steps than this; more points only cost drawing time
CDF_MAX_POINTS = 2000


def cdf_points(size: int, most: int = CDF_MAX_POINTS) -> np.ndarray:
    """Indices of the sorted values a CDF plot keeps: all of them up to `most`, else `most` evenly spaced
    ranks with the first and the last (the plot's ends stay exact)."""
    if size <= most:
        return np.arange(size)
    return np.unique(np.linspace(0, size - 1, most).round().astype(int))


def jct_hours(outcomes: Sequence[JobOutcome]) -> np.ndarray:
    """Each job's completion time in hours (what the CDF plots; an array is cheap to send to a helper)."""
    return np.array([(o.end_time - o.submit_time) / 3600 for o in outcomes], dtype=float)


def jct_cdf_plot(outcomes_by_policy: Mapping[str, Sequence[JobOutcome]], path: str | Path) -> Path:
    """Write a PNG of the empirical CDF of job completion time (hours, log scale) per policy."""
    return _jct_cdf_plot({name: jct_hours(outcomes) for name, outcomes in outcomes_by_policy.items()}, path)


def _jct_cdf_plot(jct_by_policy: Mapping[str, np.ndarray], path: str | Path) -> Path:
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        for name, hours in jct_by_policy.items():
            jct = np.sort(hours)
            if jct.size == 0:
                continue
            fraction = np.arange(1, jct.size + 1) / jct.size
            keep = cdf_points(jct.size)
            axes.step(np.maximum(jct[keep], 1e-4), fraction[keep], where="post", label=name)
        axes.set_xscale("log")
        axes.set_xlabel("job completion time (hours, log scale)")
        axes.set_ylabel("fraction of jobs")
        axes.set_ylim(0, 1.005)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="lower right")
        axes.set_title("JCT CDF")
        # the margins tight_layout finds for these fixed labels, set directly: its layout pass (the log axis's
        # ticks measured twice) was half of this plot's time, at the end of every `lucid simulate`
        figure.subplots_adjust(left=0.095, right=0.97, bottom=0.135, top=0.92)
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def queue_per_vc_plot(outcomes_by_policy: Mapping[str, Sequence[JobOutcome]], path: str | Path) -> Path:
    """Write a PNG bar chart of average queueing delay (hours) per VC, one bar per policy."""
    import pandas as pd

    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tables = {name: per_vc_table(outcomes)["avg_queue_h"] for name, outcomes in outcomes_by_policy.items()
              if outcomes}
    frame = pd.DataFrame(tables).fillna(0.0)
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(frame) * max(1, len(tables)) / 2 + 3), 4.5))
    try:
        positions = np.arange(len(frame))
        width = 0.8 / max(1, len(tables))
        for k, name in enumerate(frame.columns):
            axes.bar(positions + (k - (len(tables) - 1) / 2) * width, frame[name].to_numpy(), width, label=name)
        axes.set_xticks(positions)
        axes.set_xticklabels([str(vc) for vc in frame.index], rotation=45, ha="right")
        axes.set_xlabel("virtual cluster")
        axes.set_ylabel("average queueing delay (hours)")
        axes.legend()
        axes.grid(True, axis="y", alpha=0.3)
        axes.set_title("Queueing delay per VC")
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def flat_tail_start(timeline: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(when the busy-GPU level last changed before the cluster emptied, the level it then held): the
    start of the flat tail, e.g. one long job running alone after everything else ended."""
    points = sorted(timeline)
    while len(points) > 1 and points[-1][1] == 0:
        points.pop()
    if not points:
        return 0.0, 0.0
    level = points[-1][1]
    start = points[-1][0]
    for t, busy in reversed(points):
        if busy != level:
            break
        start = t
    return start, level


def utilization_plot(timelines_by_policy: Mapping[str, tuple[Sequence[tuple[float, float]], int]],
                     path: str | Path, bin_s: float = 3600.0) -> Path:
    """Write a PNG of GPU utilization over time (per `bin_s` bin) from each policy's busy timeline."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(8, 4))
    try:
        tail_from, last_end, tail_gpus = 0.0, 0.0, 0.0
        for name, (timeline, total_gpus) in timelines_by_policy.items():
            if not timeline:
                continue
            start, end = min(t for t, _ in timeline), max(t for t, _ in timeline)
            series = utilization_over_time(timeline, total_gpus, start, end, bin_s)
            axes.step((series.index.to_numpy() - start) / 3600, 100 * series.to_numpy(), where="post", label=name)
            flat, level = flat_tail_start(timeline)
            if (flat - start) / 3600 >= tail_from:
                tail_from, tail_gpus = (flat - start) / 3600, max(tail_gpus, level)
            last_end = max(last_end, (end - start) / 3600)
        title = "GPU utilization over time"
        if 0 < tail_from < 0.8 * last_end:  # a long flat tail would squeeze the part where scheduling matters
            axes.set_xlim(0, tail_from + max(bin_s / 3600, 0.05 * tail_from))
            title += f"\n(from {tail_from:.0f} h on, {tail_gpus:g} GPU(s) stay busy until {last_end:.0f} h: not shown)"
        axes.set_xlabel("hours since first submission")
        axes.set_ylabel(f"GPU utilization % (per {bin_s / 60:g} min)")
        axes.set_ylim(0, 105)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="upper right")
        axes.set_title(title, fontsize=10)
        # tight_layout's margins for these fixed labels, a title of one or two lines (see `_jct_cdf_plot`)
        figure.subplots_adjust(left=0.09, right=0.975, bottom=0.146, top=0.914 - 0.046 * title.count("\n"))
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def _json_ready(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(directory: str | Path, outcomes_by_policy: Mapping[str, Sequence[JobOutcome]],
                  metrics_by_policy: Mapping[str, Mapping[str, float]],
                  run_info: Mapping[str, object] | None = None) -> list[Path]:
    """Write `<policy>_jobs.csv` (one row per job), `<policy>_per_vc.csv` and `metrics.json`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    fields = list(JobOutcome.__dataclass_fields__)
    for name, outcomes in outcomes_by_policy.items():
        jobs_path = directory / f"{_safe(name)}_jobs.csv"
        with open(jobs_path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow([*fields, "jct"])
            writer.writerows([*(getattr(o, f) for f in fields), o.end_time - o.submit_time] for o in outcomes)
        written.append(jobs_path)
        if outcomes:
            vc_path = directory / f"{_safe(name)}_per_vc.csv"
            with open(vc_path, "w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle, lineterminator="\n")
                writer.writerow(["vc", *PER_VC_COLUMNS])
                writer.writerows([vc, *(row[c] for c in PER_VC_COLUMNS)] for vc, row in per_vc_rows(outcomes).items())
            written.append(vc_path)
    metrics_path = directory / "metrics.json"
    payload = {"run": dict(run_info or {}), "metrics": dict(metrics_by_policy)}
    metrics_path.write_text(json.dumps(_json_ready(payload), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    written.append(metrics_path)
    return written


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "policy"

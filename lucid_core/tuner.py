"""System Tuner: replay recent history in the simulator over a grid of knobs and rank the settings.

`expand_grid` turns lists of values into one override dict per configuration (the unit of work an
Airflow mapped task runs); `run_configuration` simulates one; `rank` orders the results by the
objective; `write_report` keeps a table and plots a person can read, plus JSON for machines.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lucid_core.config import ConfigError, LucidConfig, load_config
from lucid_core.sim.records import TraceRecord

#: Form field -> config knob it sets (what the Params form and the CLI accept).
GRID_KNOBS: dict[str, str] = {
    "tprof_s": "profiler.tprof_s",
    "nprof_gpus": "profiler.nprof_gpus",
    "cprof_nodes": "profiler.pool_nodes",
    "tiny_threshold": "binder.tiny_threshold",
    "medium_threshold": "binder.medium_threshold",
    "sharing": "binder.sharing",
    "update_cadence": "update.cadence",
    "aging": "orchestrator.aging",
}

#: objective -> (metric key, True when larger is better)
OBJECTIVES: dict[str, tuple[str, bool]] = {
    "avg_jct": ("avg_jct_s", False),
    "avg_queue_delay": ("avg_queue_delay_s", False),
    "p999_queue_delay": ("p999_queue_delay_s", False),
    "utilization": ("gpu_utilization", True),
}

#: How often the duration model's history refreshes under each update cadence, in seconds.
CADENCE_REFRESH_S = {"daily": 86400.0, "weekly": 7 * 86400.0, "never": math.inf}


@dataclass(frozen=True)
class TunerSettings:
    """What every configuration of one sweep shares: the trace window and the cluster size."""

    main_nodes: int
    objective: str = "avg_jct"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.main_nodes < 1:
            raise ValueError(f"main_nodes must be >= 1, got {self.main_nodes}")


@dataclass
class ConfigResult:
    """One configuration's simulated outcome (or why it could not run)."""

    index: int
    overrides: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    wall_seconds: float = 0.0
    worker: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfigResult:
        return cls(**dict(data))


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the form's value lists, as dotted-key overrides; invalid combinations dropped.

    Keys may be form names (`tprof_s`) or dotted knobs (`profiler.tprof_s`). An empty list or a
    missing key keeps the configured value. Combinations the config rejects (e.g. a Medium
    threshold above the Tiny one) are left out; duplicates collapse.
    """
    axes: list[tuple[str, list[Any]]] = []
    for key, values in grid.items():
        knob = GRID_KNOBS.get(key, key)
        if "." not in knob:
            raise ConfigError(f"unknown tuner knob {key!r}; known: {', '.join(GRID_KNOBS)}")
        values = list(values) if isinstance(values, list | tuple) else [values]
        if values:
            axes.append((knob, values))
    base = LucidConfig()
    configs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for combo in itertools.product(*(values for _, values in axes)):
        overrides = dict(zip((knob for knob, _ in axes), combo, strict=True))
        try:
            base.with_overrides(overrides)
        except ConfigError:
            continue
        key = json.dumps(overrides, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            configs.append(overrides)
    return configs


def outcome_metrics(result) -> dict[str, float]:
    """Average/P99.9 JCT and queueing, utilization and profiling figures of one `SimResult`."""
    from lucid_core.sim.metrics import compute_metrics

    m = compute_metrics(result.outcomes, result.busy_timeline, result.total_gpus)
    return {
        "jobs": float(m["jobs"]),
        "avg_jct_s": float(m["avg_jct_s"]),
        "p999_jct_s": float(m["p999_jct_s"]),
        "avg_queue_delay_s": float(m["avg_queue_s"]),
        "p999_queue_delay_s": float(m["p999_queue_s"]),
        "makespan_s": float(m["makespan_s"]),
        "gpu_utilization": float(m["gpu_utilization"]),
        "ended_in_profiling": float(m["finished_in_profiling"]),
        "jobs_shared": float(m["shared_jobs"]),
    }


def run_configuration(records: Sequence[TraceRecord], overrides: Mapping[str, Any], settings: TunerSettings,
                      index: int = 0, base: LucidConfig | None = None, catalog=None,
                      history: Sequence[TraceRecord] = ()) -> ConfigResult:
    """Simulate Lucid with `overrides` on `records` exactly as `lucid simulate` does (profiling pool
    carved out of the nodes, catalog co-location speeds, predictors trained on `history`); errors are
    recorded, not raised, so a sweep continues."""
    from lucid_core.policy.models import HistoryDurationPredictor
    from lucid_core.sim.experiment import Experiment, history_jobs, run_policy
    from lucid_core.sim.workloads import WorkloadCatalog

    outcome = ConfigResult(index, dict(overrides))
    try:
        config = (base or LucidConfig()).with_overrides(dict(overrides))
        exp = Experiment(list(records), list(history), catalog or WorkloadCatalog.synthetic(settings.seed),
                         config, settings.main_nodes, settings.seed)
        jobs, durations = history_jobs(exp.history)
        predictor = HistoryDurationPredictor(refresh_s=CADENCE_REFRESH_S[config.update.cadence]).fit(jobs, durations)
        result, _ = run_policy("lucid", exp, duration_model=predictor)
        outcome.metrics = outcome_metrics(result)
        outcome.wall_seconds = result.wall_seconds
    except (ConfigError, ValueError, RuntimeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def rank(results: Sequence[ConfigResult], objective: str) -> list[ConfigResult]:
    """Best first by the objective; failed configurations last."""
    metric, larger_better = OBJECTIVES[objective]

    def key(r: ConfigResult) -> tuple[int, float, int]:
        if r.error or metric not in r.metrics:
            return (1, 0.0, r.index)
        value = r.metrics[metric]
        return (0, -value if larger_better else value, r.index)

    return sorted(results, key=key)


def _fmt_hours(seconds: float) -> str:
    return f"{seconds / 3600:.3f}"


def _table_rows(ranked: Sequence[ConfigResult]) -> tuple[list[str], list[list[str]]]:
    knobs = sorted({k for r in ranked for k in r.overrides})
    header = ["rank", "config", *knobs, "avg JCT (h)", "avg queue (h)", "P99.9 queue (h)", "GPU util",
              "ended in profiling", "jobs shared", "worker"]
    rows = []
    for position, r in enumerate(ranked, start=1):
        cells = [str(position), f"#{r.index}", *[str(r.overrides.get(k, "")) for k in knobs]]
        if r.error:
            cells += [f"error: {r.error}", "", "", "", "", ""]
        else:
            m = r.metrics
            cells += [_fmt_hours(m["avg_jct_s"]), _fmt_hours(m["avg_queue_delay_s"]),
                      _fmt_hours(m["p999_queue_delay_s"]), f"{m['gpu_utilization']:.3f}",
                      str(int(m["ended_in_profiling"])), str(int(m["jobs_shared"]))]
        cells.append(r.worker)
        rows.append(cells)
    return header, rows


def _plots(ranked: Sequence[ConfigResult], objective: str, directory: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in ranked if not r.error]
    if not ok:
        return []
    metric, _ = OBJECTIVES[objective]
    names = []
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(ok) + 2), 3.2))
    values = [r.metrics[metric] / (3600 if metric.endswith("_s") else 1) for r in ok]
    ax.bar([f"#{r.index}" for r in ok], values, color=["#2a7" if i == 0 else "#89a" for i in range(len(ok))])
    ax.set_ylabel(metric.replace("_s", " (h)") if metric.endswith("_s") else metric)
    ax.set_title(f"Objective {objective} by configuration (best first)")
    fig.tight_layout()
    fig.savefig(directory / "objective.png", dpi=90)
    plt.close(fig)
    names.append("objective.png")
    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    ax.scatter([r.metrics["avg_jct_s"] / 3600 for r in ok], [r.metrics["p999_queue_delay_s"] / 3600 for r in ok])
    for r in ok:
        ax.annotate(f"#{r.index}", (r.metrics["avg_jct_s"] / 3600, r.metrics["p999_queue_delay_s"] / 3600), fontsize=7)
    ax.set_xlabel("average JCT (h)")
    ax.set_ylabel("P99.9 queueing delay (h)")
    ax.set_title("Trade-off")
    fig.tight_layout()
    fig.savefig(directory / "tradeoff.png", dpi=90)
    plt.close(fig)
    names.append("tradeoff.png")
    return names


def write_report(results: Sequence[ConfigResult], settings: TunerSettings, directory: str | Path,
                 context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write report.json, table.csv, report.md, report.html and plots; return the JSON summary."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ranked = rank(results, settings.objective)
    best = next((r for r in ranked if not r.error), None)
    header, rows = _table_rows(ranked)
    plots = _plots(ranked, settings.objective, out)
    summary: dict[str, Any] = {
        "objective": settings.objective,
        "main_nodes": settings.main_nodes,
        "configurations": len(results),
        "failed": sum(1 for r in results if r.error),
        "best": best.to_dict() if best else None,
        "ranked": [r.to_dict() for r in ranked],
        "workers": sorted({r.worker for r in results if r.worker}),
        "context": dict(context or {}),
        "plots": plots,
        "directory": str(out),
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    with (out / "table.csv").open("w", encoding="utf-8") as handle:
        handle.write(",".join(header) + "\n")
        for row in rows:
            handle.write(",".join(f'"{c}"' if "," in c else c for c in row) + "\n")
    md = [f"# System Tuner report ({settings.objective}, {settings.main_nodes} nodes)", "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    if best:
        md += ["", f"Best: configuration #{best.index} {json.dumps(best.overrides)}"]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    (out / "report.html").write_text(report_html(summary, header, rows), encoding="utf-8")
    return summary


def report_html(summary: Mapping[str, Any], header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A self-contained HTML fragment of the table and plot references (the plugin inlines the plots)."""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    best = summary.get("best")
    best_line = (f"<p>Best: configuration #{best['index']} <code>{esc(json.dumps(best['overrides']))}</code></p>"
                 if best else "<p>No configuration finished.</p>")
    return (f"<h2>System Tuner: objective {esc(str(summary['objective']))}</h2>{best_line}"
            f"<table class='tuner'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def records_from_jobs(jobs: Sequence[Mapping[str, Any]]) -> list[TraceRecord]:
    """Finished jobs of the store (dict rows) as trace records on a clock starting at the first submit."""
    done = [j for j in jobs if j.get("end_time") is not None and j.get("start_time") is not None]
    if not done:
        return []
    origin = min(float(j["submit_time"]) for j in done)
    records = [TraceRecord(job_id=str(j["job_id"]), submit_time=float(j["submit_time"]) - origin,
                           duration=max(1.0, float(j["end_time"]) - float(j["start_time"])),
                           gpus=int(j["gpus"]), vc=str(j.get("vc") or "default"), user=str(j.get("user") or ""),
                           name=str(j.get("name") or ""), state=str(j.get("state") or ""))
               for j in done]
    return sorted(records, key=lambda r: (r.submit_time, r.job_id))


def chosen_overrides(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The best configuration's overrides from a report summary; an error when none finished."""
    best = summary.get("best")
    if not best:
        raise ValueError("the sweep has no finished configuration to apply")
    return dict(best["overrides"])


def write_config_toml(overrides: Mapping[str, Any], path: str | Path, base: LucidConfig | None = None) -> Path:
    """Write the full configuration with `overrides` applied as TOML that `load_config` reads back.

    Without `base`, the file's own settings (when it exists) are the base, so applying a sweep changes
    only the swept knobs and keeps what the operator set there (environment overrides are not written)."""
    target = Path(path)
    if base is None and target.is_file():
        base = load_config(target, env={})
    config = (base or LucidConfig()).with_overrides(dict(overrides))
    lines = ["# written by the Lucid System Tuner", ""]
    for section, knobs in config.to_dict().items():
        lines.append(f"[{section}]")
        for knob, value in knobs.items():
            lines.append(f"{knob} = {_toml_value(value)}")
        lines.append("")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines), encoding="utf-8")
    return target


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _values(text: str, cast) -> list[Any]:
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def add_parser(subparsers) -> Any:
    """`lucid tune`: the System Tuner sweep without Airflow (the DAG runs the same code, one task each)."""
    parser = subparsers.add_parser("tune", help="simulate a grid of scheduler settings on a trace and rank them")
    parser.add_argument("--trace", required=True, help="trace file (philly, helios or generic CSV)")
    parser.add_argument("--format", default="auto")
    parser.add_argument("--start", default=None, help="window start, e.g. 2017-10-01")
    parser.add_argument("--end", default=None, help="window end (exclusive)")
    parser.add_argument("--nodes", type=int, default=8, help="8-GPU main nodes simulated")
    parser.add_argument("--tprof", default="100,200,300", help="Tprof values (s), comma-separated")
    parser.add_argument("--nprof", default="8", help="Nprof values (GPUs)")
    parser.add_argument("--cprof", default="2", help="Cprof values (profiling pool nodes)")
    parser.add_argument("--tiny", default="0.95", help="Tiny thresholds")
    parser.add_argument("--medium", default="0.85", help="Medium thresholds")
    parser.add_argument("--sharing", default="auto,off", help="sharing modes: auto, on, off")
    parser.add_argument("--cadence", default="daily", help="update cadences: daily, weekly, never")
    parser.add_argument("--aging", default="32", help="priority aging values (GPU-seconds per second waited)")
    parser.add_argument("--catalog", default=None, help="workload catalog dir (default: synthetic)")
    parser.add_argument("--objective", default="avg_jct", choices=sorted(OBJECTIVES))
    parser.add_argument("--out", default="out/tuner", help="report folder")
    parser.set_defaults(func=_run_cli)
    return parser


def _run_cli(args) -> int:
    from lucid_core.sim.experiment import load_experiment
    from lucid_core.sim.workloads import WorkloadCatalog

    grid = {"tprof_s": _values(args.tprof, float), "nprof_gpus": _values(args.nprof, int),
            "cprof_nodes": _values(args.cprof, int), "tiny_threshold": _values(args.tiny, float),
            "medium_threshold": _values(args.medium, float), "sharing": _values(args.sharing, str),
            "update_cadence": _values(args.cadence, str), "aging": _values(args.aging, float)}
    configs = expand_grid(grid)
    if not configs:
        raise ValueError("the grid has no valid configuration (is every Medium threshold above every Tiny one?)")
    settings = TunerSettings(main_nodes=args.nodes, objective=args.objective)
    catalog = WorkloadCatalog.from_artifact(args.catalog) if args.catalog else WorkloadCatalog.synthetic(settings.seed)
    exp, _ = load_experiment(args.trace, args.format, args.start, args.end, nodes=args.nodes, catalog=catalog,
                             config=LucidConfig(), seed=settings.seed)
    results = []
    for index, overrides in enumerate(configs):
        results.append(run_configuration(exp.records, overrides, settings, index=index, catalog=catalog,
                                         history=exp.history))
        print(f"[{index + 1}/{len(configs)}] {overrides}: "
              + (results[-1].error or f"avg JCT {results[-1].metrics['avg_jct_s'] / 3600:.3f} h"), flush=True)
    summary = write_report(results, settings, args.out, context={"trace": str(args.trace)})
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    return 0 if summary["best"] else 1

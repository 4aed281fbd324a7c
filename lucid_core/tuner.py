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

from lucid_core.config import ConfigError, LucidConfig, load_config, load_live_config
from lucid_core.sim.fleet import Fleet, FleetCatalogs
from lucid_core.sim.records import TraceRecord, stored_flag

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
    "guard_slowdown": "orchestrator.guard_slowdown",
    "long_quantile": "orchestrator.long_quantile",
    "guard_tail": "orchestrator.guard_tail",
    "yield_margin": "orchestrator.yield_margin",
    "yield_max": "orchestrator.yield_max",
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


#: Seeds the current configuration is replayed with to measure the run-to-run noise of the objective.
NOISE_SEEDS = 3
#: A difference under this share of the current value is never called an improvement, even with no noise.
NOISE_FLOOR = 0.01


@dataclass(frozen=True)
class TunerSettings:
    """What every configuration of one sweep shares: the cluster (a fleet of hosts, or N identical
    nodes) and the objective."""

    main_nodes: int | None = None
    objective: str = "avg_jct"
    seed: int = 0
    fleet: Fleet | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.fleet is None and (self.main_nodes is None or self.main_nodes < 1):
            raise ValueError(f"main_nodes must be >= 1 when no fleet is given, got {self.main_nodes}")

    def cluster_text(self, gpus_per_node: int = 8) -> str:
        """The simulated cluster in words."""
        if self.fleet is not None:
            return f"the live fleet ({self.fleet.describe()})"
        return f"{self.main_nodes} nodes x {gpus_per_node} GPUs"


@dataclass
class ConfigResult:
    """One configuration's simulated outcome (or why it could not run)."""

    index: int
    overrides: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    wall_seconds: float = 0.0
    worker: str = ""
    role: str = "candidate"  # "current": the live configuration, replayed under several seeds for the noise
    seed: int = 0
    left_out: int = 0  # jobs wider than the fleet could run, not replayed

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
                      history: Sequence[TraceRecord] = (), seed: int | None = None,
                      role: str = "candidate", catalogs: FleetCatalogs | None = None) -> ConfigResult:
    """Simulate Lucid with `overrides` on `records` exactly as `lucid simulate` does (catalog co-location
    speeds, predictors trained on `history`), on the settings' fleet or on N nodes with the profiling
    pool carved out of them; errors are recorded, not raised, so a sweep continues. `seed` (default:
    the settings') draws the jobs' workloads: the current configuration is replayed under several."""
    from lucid_core.policy.predictors import HistoryDurationPredictor
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import Experiment, build_policy, history_jobs, run_policy
    from lucid_core.sim.fleet import simulate_on_fleet

    seed = settings.seed if seed is None else seed
    outcome = ConfigResult(index, dict(overrides), role=role, seed=seed)
    try:
        config = (base or LucidConfig()).with_overrides(dict(overrides))
        catalog = catalog or WorkloadCatalog.synthetic(settings.seed)
        jobs, durations = history_jobs(list(history))
        predictor = HistoryDurationPredictor(refresh_s=CADENCE_REFRESH_S[config.update.cadence]).fit(jobs, durations)
        if settings.fleet is not None:
            config = settings.fleet.config_for(config)
            kept, left_out = settings.fleet.fitting(records)
            if not kept:
                raise ValueError(f"none of the {len(records)} jobs fits the fleet ({settings.fleet.describe()})")
            exp = Experiment(kept, list(history), catalog, config, len(settings.fleet.main_hosts), seed)
            if catalogs is not None:
                policy, config = build_policy("lucid", exp, duration_model=predictor,
                                              packing_models=catalogs.packing_models())
                result = simulate_on_fleet(kept, policy, config, settings.fleet, catalogs=catalogs, seed=seed)
            else:
                policy, config = build_policy("lucid", exp, duration_model=predictor)
                result = simulate_on_fleet(kept, policy, config, settings.fleet,
                                           workloads=catalog.assign(kept, seed=seed), speeds=catalog.colocated_speeds)
            outcome.left_out = len(left_out)
        else:
            exp = Experiment(list(records), list(history), catalog, config, settings.main_nodes, seed)
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


def duration_text(seconds: float) -> str:
    """A duration in the unit that keeps it readable: seconds, minutes or hours."""
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def metric_text(metric: str, value: float) -> str:
    return duration_text(value) if metric.endswith("_s") else f"{value:.3f}"


def sweep_items(configs: Sequence[Mapping[str, Any]], noise_seeds: int = NOISE_SEEDS, seed: int = 0) -> list[dict]:
    """The units of a sweep: each configuration of the grid, then the current configuration (no
    override) under `noise_seeds` workload draws, whose spread is the run-to-run noise."""
    items = [{"index": i, "overrides": dict(o), "role": "candidate", "seed": seed} for i, o in enumerate(configs)]
    items += [{"index": len(configs) + k, "overrides": {}, "role": "current", "seed": seed + k}
              for k in range(noise_seeds)]
    return items


def knob_text(value: Any) -> str:
    """A knob's value as a person writes it (200, not 200.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def changes_text(overrides: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """The knobs a configuration sets differently from the current one: `tprof_s 300 (now 200)`."""
    changed = [f"{k.split('.')[-1]} {knob_text(v)} (now {knob_text(current.get(k))})"
               for k, v in sorted(overrides.items()) if knob_text(v) != knob_text(current.get(k))]
    return ", ".join(changed) or "the same knobs as the current one"


def knob_value(config: LucidConfig, knob: str) -> Any:
    """The value of a dotted knob (`profiler.tprof_s`) in `config`."""
    section, _, name = knob.partition(".")
    return getattr(getattr(config, section), name)


def assess(ranked: Sequence[ConfigResult], current_runs: Sequence[ConfigResult], objective: str,
           seed: int = 0) -> dict[str, Any]:
    """Whether the best configuration beats the current one by more than the run-to-run noise.

    The noise is the spread (max - min) of the objective over the current configuration's replays
    under different workload draws, never less than `NOISE_FLOOR` of its value; the comparison is
    paired (the best configuration and the current one on the same draw, `seed`).
    """
    metric, larger_better = OBJECTIVES[objective]
    ok = [r for r in current_runs if not r.error and metric in r.metrics]
    best = next((r for r in ranked if not r.error and metric in r.metrics), None)
    if not ok:
        why = next((r.error for r in current_runs if r.error), "it was not replayed")
        return {"keep_current": False, "current": None, "noise": None, "threshold": None, "gain": None,
                "text": f"The current configuration could not be replayed ({why}): the ranking has no noise check."}
    current = next((r for r in ok if r.seed == seed), ok[0])
    values = [r.metrics[metric] for r in ok]
    noise = max(values) - min(values)
    threshold = max(noise, NOISE_FLOOR * abs(current.metrics[metric]))
    spread = (f"the current configuration's {objective} varied by {metric_text(metric, noise)} over "
              f"{len(ok)} workload draws; differences up to {metric_text(metric, threshold)} are noise")
    if best is None:
        text = f"Keep the current configuration: no configuration of the grid finished ({spread})."
        return {"keep_current": True, "current": current.to_dict(), "noise": noise, "threshold": threshold,
                "gain": None, "text": text}
    gain = (best.metrics[metric] - current.metrics[metric]) * (1 if larger_better else -1)
    if gain > threshold:
        text = (f"Configuration #{best.index} improves {objective} by {metric_text(metric, gain)} over the current "
                f"configuration ({metric_text(metric, current.metrics[metric])} -> "
                f"{metric_text(metric, best.metrics[metric])}), more than the run-to-run noise ({spread}).")
        return {"keep_current": False, "current": current.to_dict(), "noise": noise, "threshold": threshold,
                "gain": gain, "text": text}
    same = all(abs(r.metrics.get(metric, math.nan) - current.metrics[metric]) <= 1e-9 for r in ranked if not r.error)
    text = (f"Keep the current configuration: no configuration differs from it by more than the run-to-run noise "
            f"({spread})." + (" Every configuration gave exactly the current result: on this cluster and history "
                              "the knobs swept make no difference." if same else ""))
    return {"keep_current": True, "current": current.to_dict(), "noise": noise, "threshold": threshold,
            "gain": gain, "text": text}


def _table_rows(ranked: Sequence[ConfigResult], current: ConfigResult | None, current_values: Mapping[str, Any],
                objective: str, threshold: float | None) -> tuple[list[str], list[list[str]]]:
    """The report's table: the current configuration first, then the ranked ones. Only knobs that
    take more than one value are columns, so the table stays narrow."""
    metric, larger_better = OBJECTIVES[objective]
    knobs = sorted({k for r in ranked for k in r.overrides} | set(current_values))
    varying = [k for k in knobs
               if len({knob_text(r.overrides.get(k, current_values.get(k))) for r in ranked}
                      | {knob_text(current_values.get(k))}) > 1]
    header = ["rank", "config", *[k.split(".")[-1] for k in varying], f"{objective} vs current", "avg JCT",
              "avg queue", "P99.9 queue", "GPU util", "ended in profiling", "jobs shared", "worker"]
    base = current.metrics.get(metric) if current is not None and not current.error else None

    def versus(r: ConfigResult) -> str:
        if base is None or metric not in r.metrics:
            return ""
        delta = r.metrics[metric] - base
        better = (delta > 0) == larger_better and delta != 0
        within = threshold is not None and abs(delta) <= threshold
        relative = f" ({delta / base:+.1%})" if base else ""
        if delta == 0:
            return "same"
        tag = "within noise" if within else "better" if better else "worse"
        return f"{'+' if delta >= 0 else '-'}{metric_text(metric, abs(delta))}{relative} {tag}"

    def cells(position: str, label: str, r: ConfigResult | None, values: Mapping[str, Any]) -> list[str]:
        row = [position, label, *[knob_text(values.get(k, current_values.get(k, ""))) for k in varying]]
        if r is None or r.error:
            row += [f"error: {r.error}" if r is not None else "not replayed", "", "", "", "", "", "", ""]
        else:
            m = r.metrics
            row += [versus(r), duration_text(m["avg_jct_s"]), duration_text(m["avg_queue_delay_s"]),
                    duration_text(m["p999_queue_delay_s"]), f"{m['gpu_utilization']:.3f}",
                    str(int(m["ended_in_profiling"])), str(int(m["jobs_shared"]))]
        row.append(r.worker.split(".")[0] if r is not None else "")
        return row

    rows = [cells("-", "current", current, current_values)]
    rows += [cells(str(position), f"#{r.index}", r, r.overrides) for position, r in enumerate(ranked, start=1)]
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
                 context: Mapping[str, Any] | None = None, base: LucidConfig | None = None) -> dict[str, Any]:
    """Write report.json, table.csv, report.md, report.html and plots; return the JSON summary.

    `results` may hold the current configuration's replays (role "current", see `sweep_items`):
    they give the current row and the noise the verdict (`assess`) is measured against. `base` is
    the current configuration (default: the defaults)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    base = base or LucidConfig()
    candidates = [r for r in results if r.role != "current"]
    current_runs = [r for r in results if r.role == "current"]
    ranked = rank(candidates, settings.objective)
    verdict = assess(ranked, current_runs, settings.objective, settings.seed)
    current = ConfigResult.from_dict(verdict["current"]) if verdict["current"] else (
        current_runs[0] if current_runs else None)
    best = next((r for r in ranked if not r.error), None)
    current_values = {k: knob_value(base, k) for r in candidates for k in r.overrides}
    header, rows = _table_rows(ranked, current, current_values, settings.objective, verdict["threshold"])
    plots = _plots(ranked, settings.objective, out)
    cluster = settings.cluster_text(base.cluster.gpus_per_node)
    if settings.fleet is not None and len({r.overrides.get("profiler.pool_nodes") for r in candidates}) > 1:
        cluster += ("; its profiling pool is the inventory's profiling hosts, so the Cprof values swept "
                    "(profiler.pool_nodes) do not change it")
    left_out = max((r.left_out for r in results), default=0)
    summary: dict[str, Any] = {
        "objective": settings.objective,
        "main_nodes": settings.main_nodes,
        "fleet": settings.fleet.to_dict() if settings.fleet is not None else None,
        "cluster": cluster,
        "left_out": left_out,
        "configurations": len(candidates),
        "failed": sum(1 for r in candidates if r.error),
        "best": best.to_dict() if best else None,
        "keep_current": verdict["keep_current"],
        "verdict": verdict["text"],
        "noise": {"spread": verdict["noise"], "threshold": verdict["threshold"], "draws": len(current_runs)},
        "current": {"values": current_values, "result": verdict["current"]},
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
    md = [f"# System Tuner report ({settings.objective})", "", f"Cluster: {cluster}."]
    if left_out:
        md.append(f"{left_out} job(s) wider than the cluster could run were left out.")
    md += ["", summary["verdict"], "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    if best and not verdict["keep_current"]:
        md += ["", f"Best: configuration #{best.index}: {changes_text(best.overrides, current_values)}"]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    (out / "report.html").write_text(report_html(summary, header, rows), encoding="utf-8")
    return summary


def report_html(summary: Mapping[str, Any], header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A self-contained HTML fragment: verdict, cluster, and the table (current row first) in a box
    that scrolls sideways rather than cutting columns off (the plugin adds the plots)."""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(("<tr class='current'>" if i == 0 else "<tr>") + "".join(f"<td>{esc(c)}</td>" for c in row)
                   + "</tr>" for i, row in enumerate(rows))
    best = summary.get("best")
    verdict_class = "keep" if summary.get("keep_current") else "change"
    lines = [f"<p id='verdict' class='verdict {verdict_class}'>{esc(str(summary.get('verdict', '')))}</p>"]
    if best and not summary.get("keep_current"):
        current = (summary.get("current") or {}).get("values") or {}
        lines.append(f"<p id='best'>Best: configuration #{best['index']}: "
                     f"{esc(changes_text(best['overrides'], current))}</p>")
    elif not best:
        lines.append("<p>No configuration finished.</p>")
    lines.append(f"<p class='muted'>Cluster: {esc(str(summary.get('cluster', '')))}."
                 + (f" {summary['left_out']} job(s) wider than it could run were left out." if summary.get("left_out")
                    else "") + "</p>")
    return (f"<h2>System Tuner: objective {esc(str(summary['objective']))}</h2>{''.join(lines)}"
            f"<div class='scroll'><table class='tuner' id='tuner-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def records_from_jobs(jobs: Sequence[Mapping[str, Any]]) -> list[TraceRecord]:
    """Finished jobs of the store (dict rows) as trace records on a clock starting at the first submit; each
    keeps its own `preemptible` flag, so the replay yields only the jobs the live round could have stopped."""
    done = [j for j in jobs if j.get("end_time") is not None and j.get("start_time") is not None]
    if not done:
        return []
    origin = min(float(j["submit_time"]) for j in done)
    records = [TraceRecord(job_id=str(j["job_id"]), submit_time=float(j["submit_time"]) - origin,
                           duration=max(1.0, float(j["end_time"]) - float(j["start_time"])),
                           gpus=int(j["gpus"]), vc=str(j.get("vc") or "default"), user=str(j.get("user") or ""),
                           name=str(j.get("name") or ""), state=str(j.get("state") or ""),
                           preemptible=stored_flag(j.get("preemptible")))
               for j in done]
    return sorted(records, key=lambda r: (r.submit_time, r.job_id))


def chosen_overrides(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The best configuration's overrides from a report summary; an error when none finished."""
    best = summary.get("best")
    if summary.get("keep_current"):
        raise ValueError("the report says keep the current configuration: nothing to apply")
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


def inventory_fleet(store_url: str | None) -> Fleet:
    """The live inventory of the store as a fleet; an error naming what to do when it has no host."""
    from lucid_core.runtime.hosts.inventory import list_hosts
    from lucid_core.runtime.store.store import open_store

    store = open_store(store_url)
    try:
        fleet = Fleet.from_inventory(list_hosts(store))
    finally:
        store.dispose()
    if not fleet.main_hosts:
        raise ValueError("the inventory has no main host with GPUs: add hosts (lucid hosts add) or give a node count")
    return fleet


def _values(text: str, cast) -> list[Any]:
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def add_parser(subparsers) -> Any:
    """`lucid tune`: the System Tuner sweep without Airflow (the DAG runs the same code, one task each)."""
    parser = subparsers.add_parser("tune", help="simulate a grid of scheduler settings on a trace and rank them")
    parser.add_argument("--trace", required=True, help="trace file (philly, helios or generic CSV)")
    parser.add_argument("--format", default="auto")
    parser.add_argument("--start", default=None, help="window start, e.g. 2017-10-01")
    parser.add_argument("--end", default=None, help="window end (exclusive)")
    parser.add_argument("--nodes", type=int, default=8, help="8-GPU main nodes simulated (unless --fleet)")
    parser.add_argument("--fleet", action="store_true",
                        help="simulate the live inventory's hosts, GPUs, VCs and profiling pool instead of --nodes")
    parser.add_argument("--store", dest="store_url", default=None,
                        help="store whose inventory --fleet reads (default: LUCID_STORE_URL, else LUCID_HOME)")
    parser.add_argument("--tprof", default="100,200,300", help="Tprof values (s), comma-separated")
    parser.add_argument("--nprof", default="8", help="Nprof values (GPUs)")
    parser.add_argument("--cprof", default="2", help="Cprof values (profiling pool nodes)")
    parser.add_argument("--tiny", default="0.95", help="Tiny thresholds")
    parser.add_argument("--medium", default="0.85", help="Medium thresholds")
    parser.add_argument("--sharing", default="auto,off", help="sharing modes: auto, on, off")
    parser.add_argument("--cadence", default="daily", help="update cadences: daily, weekly, never")
    parser.add_argument("--aging", default="32", help="priority aging values (GPU-seconds per second waited)")
    parser.add_argument("--catalog", default=None, help="workload catalog dir (default: synthetic)")
    parser.add_argument("--catalog-for", action="append", default=[], metavar="[GPU MODEL:MECHANISM=]DIR",
                        help="with --fleet: the catalog of one GPU model and sharing mechanism of the fleet (its "
                             "key from the catalog's environment.json when not given); hosts of other keys run by "
                             "--catalog and share nothing (repeatable)")
    parser.add_argument("--objective", default="avg_jct", choices=sorted(OBJECTIVES))
    parser.add_argument("--out", default="out/tuner", help="report folder")
    parser.add_argument("--config", default=None,
                        help="configuration tuned from (default: the live one: LUCID_CONFIG, LUCID_HOME/lucid.toml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE", help="override a knob")
    parser.set_defaults(func=_run_cli)
    return parser


def fleet_catalogs(items: Sequence[str], default: Any) -> FleetCatalogs:
    """`[GPU MODEL:MECHANISM=]DIR` items as a catalog per key (the key from the catalog's own record if not given)."""
    from lucid_core.domain import SharingKey
    from lucid_core.models.packing import catalog_key
    from lucid_core.sim.catalog import WorkloadCatalog

    by_key = {}
    for item in items:
        named, _, folder = item.rpartition("=")
        if named:
            model, _, mechanism = named.rpartition(":")
            key = SharingKey(model, mechanism)
        else:
            key = catalog_key(folder)
        by_key[key] = WorkloadCatalog.from_artifact(folder)
    return FleetCatalogs(by_key, default)


def _run_cli(args) -> int:
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment

    grid = {"tprof_s": _values(args.tprof, float), "nprof_gpus": _values(args.nprof, int),
            "cprof_nodes": _values(args.cprof, int), "tiny_threshold": _values(args.tiny, float),
            "medium_threshold": _values(args.medium, float), "sharing": _values(args.sharing, str),
            "update_cadence": _values(args.cadence, str), "aging": _values(args.aging, float)}
    configs = expand_grid(grid)
    if not configs:
        raise ValueError("the grid has no valid configuration (is every Medium threshold above every Tiny one?)")
    fleet = inventory_fleet(args.store_url) if args.fleet else None
    settings = TunerSettings(main_nodes=None if fleet else args.nodes, objective=args.objective, fleet=fleet)
    catalog = WorkloadCatalog.from_artifact(args.catalog) if args.catalog else WorkloadCatalog.synthetic(settings.seed)
    exp, _ = load_experiment(args.trace, args.format, args.start, args.end, nodes=args.nodes, catalog=catalog,
                             config=LucidConfig(), seed=settings.seed)
    results = []
    items = sweep_items(configs, seed=settings.seed)
    base = load_live_config(args.config, args.set)
    catalogs = fleet_catalogs(args.catalog_for, catalog) if args.catalog_for else None
    for item in items:
        results.append(run_configuration(exp.records, item["overrides"], settings, index=item["index"], base=base,
                                         catalog=catalog, history=exp.history, seed=item["seed"], role=item["role"],
                                         catalogs=catalogs))
        print(f"[{item['index'] + 1}/{len(items)}] {item['role']} {item['overrides'] or ''}: "
              + (results[-1].error or f"avg JCT {duration_text(results[-1].metrics['avg_jct_s'])}"), flush=True)
    summary = write_report(results, settings, args.out, context={"trace": str(args.trace)})
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    return 0 if summary["best"] else 1

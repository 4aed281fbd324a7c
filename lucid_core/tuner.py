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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lucid_core.config import ConfigError, LucidConfig, check_knob, load_config_file, load_live_config
from lucid_core.policy.view import saved_float, saved_time_limit
from lucid_core.sim.fleet import Fleet, FleetCatalogs
from lucid_core.sim.records import TraceRecord, stored_flag
from lucid_core.tuner_grid import (
    DEFAULT_AROUND,
    GRID_KNOBS,
    drop_current,
    grid_request,
    grid_size,
    knob_name,
    knob_text,
    knob_value,
)
from lucid_core.units import duration_words

#: objective -> (metric key, True when larger is better)
OBJECTIVES: dict[str, tuple[str, bool]] = {
    "avg_jct": ("avg_jct_s", False),
    "avg_queue_delay": ("avg_queue_delay_s", False),
    "p999_queue_delay": ("p999_queue_delay_s", False),
    "utilization": ("gpu_utilization", True),
}

#: How often the duration model's history refreshes under each update cadence, in seconds.
CADENCE_REFRESH_S = {"daily": 86400.0, "weekly": 7 * 86400.0, "never": math.inf}


#: The longest stored run the tuner replays, in seconds: the Update Engine's job-log suite (include/gx/job_log.json,
#: column "duration") refuses longer ones too, so such a row is a corrupt one, not a job.
MAX_RUN_S = 30 * 86400.0
#: The longest stored wait (start - submit) the tuner replays: a sweep replays days of history, so a year's wait
#: is a corrupt submit time (one at -1e300 moved the replay clock's origin and every other job to 1e300 s).
MAX_WAIT_S = 365 * 86400.0
#: Why `records_from_jobs` leaves a stored job out as odd, in words for the report.
ODD_JOBS_REASON = "non-finite or impossible times or GPU counts"

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
    odd_jobs: int = 0  # stored jobs with impossible times or GPU counts, not replayed (`records_from_jobs`)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfigResult:
        return cls(**dict(data))


@dataclass(frozen=True)
class GridExpansion:
    """The configurations of a grid and the combinations left out because their knobs conflict (with why)."""

    configs: list[dict[str, Any]]
    dropped: int = 0
    reason: str = ""
    combinations: int = 0  # distinct combinations of the grid's values, the dropped ones included

    def dropped_text(self) -> str:
        """The combinations left out, in words (empty when none was)."""
        if not self.dropped:
            return ""
        verb = "was" if self.dropped == 1 else "were"
        return (f"{self.dropped} of the {self.combinations} combinations of the grid {verb} left out because their "
                f"knobs conflict (e.g. {self.reason})")


def checked_values(knob: str, values: Sequence[Any], given: str | None = None) -> list[Any]:
    """Each of a knob's grid values checked on its own, converted; ConfigError naming `given` (the flag or
    form field; default: the knob) and the value, so no bad value is silently left out of the grid."""
    return [check_knob(knob, value, given or knob) for value in values]


def grid_expansion(grid: Mapping[str, Sequence[Any]], base: LucidConfig | None = None) -> GridExpansion:
    """Cartesian product of the form's value lists, as dotted-key overrides, each value checked on its own.

    Keys may be form names (`tprof_s`) or dotted knobs (`profiler.tprof_s`). An empty list or a missing key
    keeps the configured value. A bad value is a ConfigError naming it; only combinations whose knobs conflict
    under the config (`base`, default: the defaults), e.g. a Medium threshold above the Tiny one, are left
    out and counted; duplicates collapse."""
    axes: list[tuple[str, list[Any]]] = []
    for key, values in grid.items():
        knob = knob_name(key)
        values = list(values) if isinstance(values, list | tuple) else [] if values is None else [values]
        if values:
            axes.append((knob, checked_values(knob, values, key)))
    base = base or LucidConfig()
    configs: list[dict[str, Any]] = []
    seen: set[str] = set()
    dropped, reason = 0, ""
    for combo in itertools.product(*(values for _, values in axes)):
        overrides = dict(zip((knob for knob, _ in axes), combo, strict=True))
        key = json.dumps(overrides, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            base.with_overrides(overrides)
        except ConfigError as exc:
            dropped, reason = dropped + 1, reason or str(exc)
            continue
        configs.append(overrides)
    return GridExpansion(configs, dropped, reason, len(seen))


def expand_grid(grid: Mapping[str, Sequence[Any]], base: LucidConfig | None = None) -> list[dict[str, Any]]:
    """The configurations of `grid_expansion` (conflicting combinations left out, bad values refused)."""
    return grid_expansion(grid, base).configs


def sweep_grid(explicit: Mapping[str, Any], around: Sequence[str], base: LucidConfig,
               most: int | None = None) -> GridExpansion:
    """The configurations a sweep replays: explicit values and values around the current ones
    (`grid_request`), valid under `base`, without the current configuration itself (replayed on its own).
    `most`: refuse, before building any, a grid of more combinations (a few long lists multiply to millions)."""
    request = grid_request(explicit, around, base)
    size = grid_size(request)
    # one combination more than `most` may be the current configuration, which is replayed apart and not counted
    # among the grid's configurations (callers check the count once it is dropped)
    if most is not None and size > most + 1:
        raise ValueError(f"the grid has {size:,} combinations, more than max_configurations={most}: give the knobs "
                         f"fewer values ({', '.join(f'{k}: {len(v)}' for k, v in request.items())})")
    grid = grid_expansion(request, base)
    return GridExpansion(drop_current(grid.configs, base), grid.dropped, grid.reason, grid.combinations)


def sweep_grid_with_configurations(explicit: Mapping[str, Any], around: Sequence[str],
                                   base: LucidConfig, most: int | None = None) -> GridExpansion:
    """`sweep_grid`, refusing a grid with nothing left to replay, or that sweeps no knob (the current configuration
    alone was replayed as a candidate, and the report said "the knobs swept make no difference" of none): the
    CLI's and the DAG's one message."""
    if not grid_request(explicit, around, base):
        raise ValueError("the grid sweeps no knob: give some knob's values, or name knobs in around")
    grid = sweep_grid(explicit, around, base, most)
    if not grid.configs:  # a grid of only current values still replays them (drop_current): a conflict left this
        which = "its only combination" if grid.dropped == 1 else f"all {grid.dropped} of its combinations"
        raise ValueError(f"the grid has no valid configuration: knobs conflict in {which} (e.g. {grid.reason})")
    return grid


def sweep_configurations(explicit: Mapping[str, Any], around: Sequence[str], base: LucidConfig) -> list[dict[str, Any]]:
    """The configurations of `sweep_grid`."""
    return sweep_grid(explicit, around, base).configs


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
    outcome = ConfigResult(index, dict(overrides), role=role, seed=seed, odd_jobs=getattr(records, "odd_jobs", 0))
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


@dataclass(frozen=True)
class DurationUnit:
    """The one unit every duration of a report is written in (table, verdict and plots)."""

    label: str
    seconds: float

    def value(self, seconds: float) -> float:
        """`seconds` in this unit."""
        return seconds / self.seconds

    def number(self, seconds: float) -> str:
        """`seconds` in this unit, without the unit, to a readable precision (no trailing zeros)."""
        value = self.value(seconds)
        size = abs(value)
        digits = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 or size == 0 else \
            min(6, 2 - math.floor(math.log10(size)))
        text = f"{value:.{digits}f}"
        text = text.rstrip("0").rstrip(".") if "." in text else text
        return "0" if text == "-0" else text

    def text(self, seconds: float) -> str:
        """`seconds` in this unit, with the unit: `12.5 min`."""
        return f"{self.number(seconds)} {self.label}"


SECONDS = DurationUnit("s", 1.0)
MINUTES = DurationUnit("min", 60.0)
HOURS = DurationUnit("h", 3600.0)


def pick_unit(seconds: Sequence[float]) -> DurationUnit:
    """Seconds, minutes or hours, whichever keeps the typical (median) of `seconds` readable."""
    finite = sorted(abs(s) for s in seconds if math.isfinite(s))
    typical = finite[len(finite) // 2] if finite else 0.0
    if typical < 120:
        return SECONDS
    return MINUTES if typical < 3 * 3600 else HOURS


def report_unit(results: Sequence[ConfigResult]) -> DurationUnit:
    """The unit of a report: picked once from the average JCTs of its finished rows."""
    return pick_unit([r.metrics["avg_jct_s"] for r in results if not r.error and "avg_jct_s" in r.metrics])


def metric_text(metric: str, value: float, unit: DurationUnit | None = None) -> str:
    """A metric's value for a sentence: durations in `unit`, utilization in percent."""
    if metric.endswith("_s"):
        return (unit or pick_unit([value])).text(value)
    if metric == "gpu_utilization":
        return f"{100 * value:.1f}%"
    return f"{value:.3f}"


def delta_text(metric: str, delta: float, unit: DurationUnit | None = None) -> str:
    """A difference of a metric for a sentence (utilization: in percentage points)."""
    if metric == "gpu_utilization":
        return f"{100 * delta:.1f} percentage points"
    return metric_text(metric, delta, unit)


def metric_number(metric: str, value: float, unit: DurationUnit) -> str:
    """A metric's value for a table cell whose header carries the unit."""
    if metric.endswith("_s"):
        return unit.number(value)
    if metric == "gpu_utilization":
        return f"{100 * value:.1f}"
    return f"{value:.3f}"


def metric_unit(metric: str, unit: DurationUnit) -> str:
    """The unit a table header names for a metric."""
    if metric.endswith("_s"):
        return unit.label
    return "%" if metric == "gpu_utilization" else ""


def sweep_items(configs: Sequence[Mapping[str, Any]], noise_seeds: int = NOISE_SEEDS, seed: int = 0) -> list[dict]:
    """The units of a sweep: each configuration of the grid, then the current configuration (no
    override) under `noise_seeds` workload draws, whose spread is the run-to-run noise."""
    items = [{"index": i, "overrides": dict(o), "role": "candidate", "seed": seed} for i, o in enumerate(configs)]
    items += [{"index": len(configs) + k, "overrides": {}, "role": "current", "seed": seed + k}
              for k in range(noise_seeds)]
    return items


def overrides_text(overrides: Mapping[str, Any]) -> str:
    """The knobs a configuration sets, as a person writes them: `tprof_s 300, sharing off`."""
    return ", ".join(f"{k.split('.')[-1]} {knob_text(v)}" for k, v in sorted(overrides.items())) or "no change"


def item_label(item: Mapping[str, Any]) -> str:
    """One unit of a sweep in words: `#2 tprof_s 300, sharing off` or `current configuration, draw 1`."""
    if item.get("role") == "current":
        return f"current configuration, draw {item.get('seed', 0)}"
    return f"#{item['index']} {overrides_text(item.get('overrides') or {})}"


def changes_text(overrides: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """The knobs a configuration sets differently from the current one: `tprof_s 300 (now 200)`."""
    changed = [f"{k.split('.')[-1]} {knob_text(v)} (now {knob_text(current.get(k))})"
               for k, v in sorted(overrides.items()) if knob_text(v) != knob_text(current.get(k))]
    return ", ".join(changed) or "the same knobs as the current one"


@dataclass(frozen=True)
class NoiseBand:
    """The current configuration's value of the objective and how far from it a result is only noise."""

    metric: str
    larger_better: bool
    current: float
    threshold: float
    spread: float = 0.0
    draws: int = 1

    def gain(self, value: float) -> float:
        """How much better than the current value `value` is (negative: worse)."""
        return (value - self.current) * (1 if self.larger_better else -1)

    def standing(self, value: float) -> str:
        """`same`, `within noise`, `better` or `worse`: where `value` falls against the band."""
        gain = self.gain(value)
        if abs(gain) <= 1e-12 * max(1.0, abs(self.current)):
            return "same"
        if abs(gain) <= self.threshold:
            return "within noise"
        return "better" if gain > 0 else "worse"


def noise_band(current_runs: Sequence[ConfigResult], objective: str,
               seed: int = 0) -> tuple[NoiseBand, ConfigResult] | None:
    """The band measured on the current configuration's replays and the replay on draw `seed` the rows are
    compared with; None when no replay finished.

    The noise is the spread (max - min) of the objective over the replays under different workload
    draws; the band's half-width is never less than `NOISE_FLOOR` of the current value."""
    metric, larger_better = OBJECTIVES[objective]
    ok = [r for r in current_runs if not r.error and metric in r.metrics]
    if not ok:
        return None
    current = next((r for r in ok if r.seed == seed), ok[0])
    values = [r.metrics[metric] for r in ok]
    spread = max(values) - min(values)
    threshold = max(spread, NOISE_FLOOR * abs(current.metrics[metric]))
    return NoiseBand(metric, larger_better, current.metrics[metric], threshold, spread, len(ok)), current


def _verdict_text(objective: str, band: NoiseBand, best: ConfigResult, counts: Mapping[str, int], spread: str,
                  unit: DurationUnit) -> tuple[bool, str]:
    """Keep or change, and why, from how the rows fall against the noise band (`counts` per standing)."""
    metric = band.metric
    total = sum(counts.values())
    value = best.metrics[metric]
    if counts["better"]:
        others = f" {counts['better']} of the {total} configurations beat it beyond the noise." \
            if counts["better"] > 1 else ""
        gain = delta_text(metric, band.gain(value), unit)
        return False, (f"Configuration #{best.index} improves {objective} by {gain}"
                       f" over the current configuration ({metric_text(metric, band.current, unit)} -> "
                       f"{metric_text(metric, value, unit)}), more than the run-to-run noise ({spread}).{others}")
    if counts["worse"] == total:
        relative = f" ({-band.gain(value) / abs(band.current):.0%})" if band.current else ""
        return True, (f"Keep the current configuration: all {total} configurations of the grid are worse than it by "
                      f"more than the run-to-run noise ({spread}); the closest, #{best.index}, is worse by "
                      f"{delta_text(metric, -band.gain(value), unit)}{relative}.")
    if counts["worse"]:
        worse = counts["worse"]
        return True, (f"Keep the current configuration: none of the {total} configurations beats it by more than "
                      f"the run-to-run noise ({spread}); {worse} {'is' if worse == 1 else 'are'} worse beyond it and "
                      f"{total - worse} within it.")
    text = (f"Keep the current configuration: no configuration differs from it by more than the run-to-run noise "
            f"({spread}).")
    if counts["same"] == total:
        text += (f" Every configuration gave exactly the current {objective}: on this cluster and history the knobs "
                 "swept do not change it.")
    return True, text


def assess(ranked: Sequence[ConfigResult], current_runs: Sequence[ConfigResult], objective: str,
           seed: int = 0, unit: DurationUnit | None = None) -> dict[str, Any]:
    """Whether the best configuration beats the current one by more than the run-to-run noise.

    Each finished row is `better`, `worse` (beyond the noise band), `within noise` or `same`
    (`NoiseBand.standing`, the same words as the table's); the verdict follows from those counts. The
    comparison is paired: every row and the current one on the same workload draw, `seed`."""
    metric, _ = OBJECTIVES[objective]
    finished = [r for r in ranked if not r.error and metric in r.metrics]
    unit = unit or report_unit([*finished, *current_runs])
    measured = noise_band(current_runs, objective, seed)
    empty = {"better": 0, "within noise": 0, "same": 0, "worse": 0}
    if measured is None:
        why = next((r.error for r in current_runs if r.error), "it was not replayed")
        return {"keep_current": False, "current": None, "noise": None, "threshold": None, "gain": None,
                "counts": empty, "text": f"The current configuration could not be replayed ({why}): the ranking has "
                                        "no noise check."}
    band, current = measured
    noise = band.spread
    floor = (f" (never less than {NOISE_FLOOR:.0%} of the current value)" if band.threshold > noise else "")
    spread = (f"the current configuration's {objective} varied by {delta_text(metric, noise, unit)} over "
              f"{band.draws} workload draws; differences up to {delta_text(metric, band.threshold, unit)} are "
              f"noise{floor}")
    result = {"current": current.to_dict(), "noise": noise, "threshold": band.threshold}
    if not finished:
        return {**result, "keep_current": True, "gain": None, "counts": empty,
                "text": f"Keep the current configuration: no configuration of the grid finished ({spread})."}
    counts = dict(empty)
    for r in finished:
        counts[band.standing(r.metrics[metric])] += 1
    best = max(finished, key=lambda r: band.gain(r.metrics[metric]))
    keep, text = _verdict_text(objective, band, best, counts, spread, unit)
    return {**result, "keep_current": keep, "gain": band.gain(best.metrics[metric]), "counts": counts, "text": text}


#: The table's metric columns: (header, metric key).
TABLE_METRICS: tuple[tuple[str, str], ...] = (("avg JCT", "avg_jct_s"), ("avg queue", "avg_queue_delay_s"),
                                              ("P99.9 queue", "p999_queue_delay_s"), ("GPU util", "gpu_utilization"))


def _varying_knobs(ranked: Sequence[ConfigResult], current_values: Mapping[str, Any]) -> list[str]:
    """The knobs that take more than one value over the rows (the only knob columns, so the table stays narrow)."""
    knobs = sorted({k for r in ranked for k in r.overrides} | set(current_values))
    return [k for k in knobs
            if len({knob_text(r.overrides.get(k, current_values.get(k))) for r in ranked}
                   | {knob_text(current_values.get(k))}) > 1]


def _versus(r: ConfigResult, band: NoiseBand | None, unit: DurationUnit) -> str:
    """A row's objective against the current one: `+1.5 (+3.0%) worse`, in the column's unit."""
    if band is None or r.error or band.metric not in r.metrics:
        return ""
    standing = band.standing(r.metrics[band.metric])
    if standing == "same":
        return "same"
    delta = r.metrics[band.metric] - band.current
    relative = f" ({delta / band.current:+.1%})" if band.current else ""
    return f"{'+' if delta >= 0 else '-'}{metric_number(band.metric, abs(delta), unit)}{relative} {standing}"


def _table_rows(ranked: Sequence[ConfigResult], current: ConfigResult | None, current_values: Mapping[str, Any],
                objective: str, band: NoiseBand | None, unit: DurationUnit) -> tuple[list[str], list[list[str]]]:
    """The report's table: the current configuration first (always, replayed or not), then the ranked ones.
    Durations are in `unit` and utilization in percent, both named once in the header; the worker column
    appears only when some row ran on a named worker."""
    metric, _ = OBJECTIVES[objective]
    varying = _varying_knobs(ranked, current_values)
    workers = any(r.worker for r in [*ranked, *([current] if current else [])])
    vs_unit = "percentage points" if metric == "gpu_utilization" else metric_unit(metric, unit)
    header = ["rank", "config", *[k.split(".")[-1] for k in varying],
              f"{objective} vs current" + (f" ({vs_unit})" if vs_unit else ""),
              *[f"{name} ({metric_unit(key, unit)})" for name, key in TABLE_METRICS],
              "ended in profiling", "jobs shared", *(["worker"] if workers else [])]

    def cells(position: str, label: str, r: ConfigResult | None, values: Mapping[str, Any]) -> list[str]:
        row = [position, label, *[knob_text(values.get(k, current_values.get(k, ""))) for k in varying]]
        if r is None or r.error:
            row += [f"error: {r.error}" if r is not None else "not replayed", *[""] * (len(TABLE_METRICS) + 2)]
        else:
            row += [_versus(r, band, unit), *[metric_number(key, r.metrics[key], unit) for _, key in TABLE_METRICS],
                    str(int(r.metrics["ended_in_profiling"])), str(int(r.metrics["jobs_shared"]))]
        if workers:
            row.append(r.worker.split(".")[0] if r is not None else "")
        return row

    rows = [cells("-", "current", current, current_values)]
    rows += [cells(str(position), f"#{r.index}", r, r.overrides) for position, r in enumerate(ranked, start=1)]
    return header, rows


def _axis_label(name: str, metric: str, unit: DurationUnit) -> str:
    """An axis label naming the report's unit: `average JCT (min)`, `GPU utilization (%)`."""
    label = metric_unit(metric, unit)
    return f"{name} ({label})" if label else name


def _plot_value(metric: str, value: float, unit: DurationUnit) -> float:
    """A metric as plotted: durations in the report's unit, utilization in percent."""
    if metric.endswith("_s"):
        return unit.value(value)
    return 100 * value if metric == "gpu_utilization" else value


def _plots(ranked: Sequence[ConfigResult], objective: str, directory: Path, unit: DurationUnit,
           band: NoiseBand | None) -> list[str]:
    """The objective per configuration (the current value and its noise band drawn across) and the JCT /
    P99.9 queueing trade-off, in the table's units."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in ranked if not r.error]
    if not ok:
        return []
    metric, _ = OBJECTIVES[objective]
    names = []
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(ok) + 2), 3.2))
    ax.bar([f"#{r.index}" for r in ok], [_plot_value(metric, r.metrics[metric], unit) for r in ok],
           color=["#2a7" if i == 0 else "#89a" for i in range(len(ok))])
    if band is not None:
        low, high = band.current - band.threshold, band.current + band.threshold
        ax.axhspan(_plot_value(metric, low, unit), _plot_value(metric, high, unit), color="#fc8", alpha=0.4,
                   label="current ± noise")
        ax.axhline(_plot_value(metric, band.current, unit), color="#c60", linewidth=1)
        ax.legend(fontsize=7, loc="best")
    ax.set_ylabel(_axis_label(objective, metric, unit))
    ax.set_title(f"Objective {objective} by configuration (best first)")
    fig.tight_layout()
    fig.savefig(directory / "objective.png", dpi=90)
    plt.close(fig)
    names.append("objective.png")
    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    xs = [unit.value(r.metrics["avg_jct_s"]) for r in ok]
    ys = [unit.value(r.metrics["p999_queue_delay_s"]) for r in ok]
    ax.scatter(xs, ys)
    for r, x, y in zip(ok, xs, ys, strict=True):
        ax.annotate(f"#{r.index}", (x, y), fontsize=7)
    ax.set_xlabel(_axis_label("average JCT", "avg_jct_s", unit))
    ax.set_ylabel(_axis_label("P99.9 queueing delay", "p999_queue_delay_s", unit))
    ax.set_title("Trade-off")
    fig.tight_layout()
    fig.savefig(directory / "tradeoff.png", dpi=90)
    plt.close(fig)
    names.append("tradeoff.png")
    return names


def write_report(results: Sequence[ConfigResult], settings: TunerSettings, directory: str | Path,
                 context: Mapping[str, Any] | None = None, base: LucidConfig | None = None,
                 grid: GridExpansion | None = None) -> dict[str, Any]:
    """Write report.json, table.csv, report.md, report.html and plots; return the JSON summary.

    `results` may hold the current configuration's replays (role "current", see `sweep_items`):
    they give the current row and the noise the verdict (`assess`) is measured against. `base` is
    the current configuration (default: the defaults). Every duration is in one unit (`report_unit`).
    `grid` (when given) says how many combinations were left out for conflicting knobs."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    base = base or LucidConfig()
    candidates = [r for r in results if r.role != "current"]
    current_runs = [r for r in results if r.role == "current"]
    ranked = rank(candidates, settings.objective)
    unit = report_unit(results)
    verdict = assess(ranked, current_runs, settings.objective, settings.seed, unit)
    measured = noise_band(current_runs, settings.objective, settings.seed)
    band = measured[0] if measured else None
    current = ConfigResult.from_dict(verdict["current"]) if verdict["current"] else (
        current_runs[0] if current_runs else None)
    best = next((r for r in ranked if not r.error), None)
    current_values = {k: knob_value(base, k) for r in candidates for k in r.overrides}
    header, rows = _table_rows(ranked, current, current_values, settings.objective, band, unit)
    plots = _plots(ranked, settings.objective, out, unit, band)
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
        "odd_jobs": max((r.odd_jobs for r in results), default=0),
        "dropped": grid.dropped if grid else 0,
        "dropped_text": grid.dropped_text() if grid else "",
        "configurations": len(candidates),
        "failed": sum(1 for r in candidates if r.error),
        "best": best.to_dict() if best else None,
        "keep_current": verdict["keep_current"],
        "verdict": verdict["text"],
        "counts": verdict["counts"],
        "noise": {"spread": verdict["noise"], "threshold": verdict["threshold"], "draws": len(current_runs)},
        "current": {"values": current_values, "result": verdict["current"]},
        "duration_unit": unit.label,
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
    (out / "report.md").write_text(report_markdown(summary, header, rows, best), encoding="utf-8")
    (out / "report.html").write_text(report_html(summary, header, rows), encoding="utf-8")
    return summary


def proposal_text(summary: Mapping[str, Any]) -> str:
    """What a report proposes, in words: keep the current configuration, or the best one's changes."""
    best = summary.get("best")
    if not best:
        return "no configuration finished"
    if summary.get("keep_current"):
        return "keep the current configuration"
    current = (summary.get("current") or {}).get("values") or {}
    return f"#{best['index']}: {changes_text(best['overrides'], current)}"


def report_markdown(summary: Mapping[str, Any], header: Sequence[str], rows: Sequence[Sequence[str]],
                    best: ConfigResult | None) -> str:
    """The report as Markdown: title, cluster, verdict, the table (current row first) and the proposal."""
    md = [f"# System Tuner report ({summary['objective']})", "", f"Cluster: {summary['cluster']}."]
    if summary.get("left_out"):
        md.append(f"{summary['left_out']} job(s) wider than the cluster could run were left out.")
    if summary.get("odd_jobs"):
        md.append(f"{odd_jobs_text(summary['odd_jobs'])}.")
    if summary.get("dropped_text"):
        md.append(f"{summary['dropped_text']}.")
    md += ["", summary["verdict"], "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    if best and not summary["keep_current"]:
        current = summary["current"]["values"]
        md += ["", f"Best: configuration #{best.index}: {changes_text(best.overrides, current)}"]
    return "\n".join(md) + "\n"


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
    if summary.get("odd_jobs"):
        lines.append(f"<p class='muted'>{esc(odd_jobs_text(summary['odd_jobs']))}.</p>")
    if summary.get("dropped_text"):
        lines.append(f"<p class='muted'>{esc(str(summary['dropped_text']))}.</p>")
    return (f"<h2>System Tuner: objective {esc(str(summary['objective']))}</h2>{''.join(lines)}"
            f"<div class='scroll'><table class='tuner' id='tuner-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def odd_jobs_text(count: int) -> str:
    """The stored jobs `records_from_jobs` left out as odd, in words for the report."""
    return f"{count} stored job{'' if count == 1 else 's'} left out: {ODD_JOBS_REASON}"


class StoredRecords(list):
    """Trace records replayed from the store, and how many stored jobs were left out as odd: a list, so a
    caller that only replays it need not know; `run_configuration` carries the count to the report."""

    def __init__(self, records: Iterable[TraceRecord] = (), odd_jobs: int = 0) -> None:
        super().__init__(records)
        self.odd_jobs = odd_jobs


def _never_ran(job: Mapping[str, Any]) -> bool:
    """No start or no end (None, or NaN: how a pandas frame holds a NULL): a job cancelled before it ran,
    not replayed and not odd."""
    return any(v is None or (isinstance(v, float) and math.isnan(v))
               for v in (job.get("start_time"), job.get("end_time")))


def _gpu_count(value: Any) -> int | None:
    """A stored GPU count as a positive int (2.0 from a float column too); None for anything else."""
    number = saved_float(value)
    return int(number) if number is not None and number >= 1 and number.is_integer() else None


def _replayable(job: Mapping[str, Any]) -> tuple[float, float, int] | None:
    """A finished stored job's submit time, run length and GPU count; None when the row is odd (a hand edit,
    another controller): a time not a finite number, a start before the submit (the job-log suite refuses it
    too) or a wait over MAX_WAIT_S, an end before the start, a run over MAX_RUN_S, or gpus not a positive
    integer. One such row failed, or made meaningless, every configuration of a sweep."""
    submit, start, end = (saved_float(job.get(k)) for k in ("submit_time", "start_time", "end_time"))
    gpus = _gpu_count(job.get("gpus"))
    if submit is None or start is None or end is None or gpus is None:
        return None
    if not (0 <= start - submit <= MAX_WAIT_S and 0 <= end - start <= MAX_RUN_S):
        return None
    return submit, end - start, gpus


def records_from_jobs(jobs: Sequence[Mapping[str, Any]]) -> StoredRecords:
    """Finished jobs of the store (dict rows) as trace records on a clock starting at the first submit; each
    keeps its own `preemptible` flag, so the replay yields only the jobs the live round could have stopped, and
    its time limit, which bounds its predictions there as live.
    Odd rows (`_replayable`) are left out and counted in `odd_jobs`, so one never fails a whole sweep."""
    done = [j for j in jobs if not _never_ran(j)]
    kept = [(j, times) for j in done if (times := _replayable(j)) is not None]
    if not kept:
        return StoredRecords([], odd_jobs=len(done))
    origin = min(submit for _, (submit, _, _) in kept)
    records = [TraceRecord(job_id=str(j["job_id"]), submit_time=submit - origin, duration=max(1.0, run), gpus=gpus,
                           vc=str(j.get("vc") or "default"), user=str(j.get("user") or ""),
                           name=str(j.get("name") or ""), state=str(j.get("state") or ""),
                           preemptible=stored_flag(j.get("preemptible")),
                           time_limit_s=saved_time_limit(j.get("time_limit_s")))
               for j, (submit, run, gpus) in kept]
    return StoredRecords(sorted(records, key=lambda r: (r.submit_time, r.job_id)), odd_jobs=len(done) - len(kept))


def chosen_overrides(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The best configuration's overrides from a report summary; an error when none finished."""
    best = summary.get("best")
    if summary.get("keep_current"):
        raise ValueError("the report says keep the current configuration: nothing to apply")
    if not best:
        raise ValueError("the sweep has no finished configuration to apply")
    return dict(best["overrides"])


def write_config_toml(overrides: Mapping[str, Any], path: str | Path, base: LucidConfig | None = None) -> Path:
    """Write the configuration with `overrides` applied as TOML that `load_config` reads back.

    Without `base`, the file's own settings (when it exists) are the base, so applying a sweep changes
    only the swept knobs and keeps what the operator set there (environment overrides are not written).
    Only knobs that the file set, the sweep chose or that differ from the built-in defaults are written:
    a knob left at its default follows the defaults of later versions instead of being pinned."""
    target = Path(path)
    kept: set[str] = set()
    if base is None and target.is_file():
        base, kept = load_config_file(target)
    config = (base or LucidConfig()).with_overrides(dict(overrides))
    defaults = LucidConfig().to_dict()
    lines = ["# written by the Lucid System Tuner; knobs not listed take the installed version's defaults", ""]
    for section, knobs in config.to_dict().items():
        chosen = [(knob, value) for knob, value in knobs.items() if value != defaults[section][knob]
                  or f"{section}.{knob}" in kept or f"{section}.{knob}" in overrides]
        if not chosen:
            continue
        lines.append(f"[{section}]")
        lines.extend(f"{knob} = {_toml_value(value)}" for knob, value in chosen)
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


#: `lucid tune`'s grid flags: flag -> the form name of the knob it sweeps.
GRID_FLAGS: dict[str, str] = {"--tprof": "tprof_s", "--nprof": "nprof_gpus", "--cprof": "cprof_nodes",
                              "--tiny": "tiny_threshold", "--medium": "medium_threshold", "--sharing": "sharing",
                              "--cadence": "update_cadence", "--aging": "aging"}


def _items(text: str) -> list[str]:
    """The comma-separated items of a flag, stripped, empty ones skipped."""
    return [v.strip() for v in text.split(",") if v.strip()]


def _around(text: str) -> list[str]:
    """The --around knobs, each a known tuner knob (ConfigError naming the flag otherwise)."""
    names = _items(text)
    for name in names:
        try:
            knob_name(name)
        except ConfigError as exc:
            raise ConfigError(f"--around: {exc}") from None
    return names


def _grid_flags(args) -> dict[str, list[Any]]:
    """The grid flags' values by form name, each checked on its own: a bad one fails naming its flag."""
    return {name: checked_values(GRID_KNOBS[name], _items(getattr(args, flag[2:])), flag)
            for flag, name in GRID_FLAGS.items()}


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
    parser.add_argument("--around", default=",".join(DEFAULT_AROUND),
                        help="knobs swept around their current value (a smaller, the current and a larger one; every "
                             f"choice of a text knob) unless given below, comma-separated: {', '.join(GRID_KNOBS)}")
    parser.add_argument("--tprof", default="", help="Tprof values (s), comma-separated; empty: see --around")
    parser.add_argument("--nprof", default="", help="Nprof values (GPUs)")
    parser.add_argument("--cprof", default="", help="Cprof values (profiling pool nodes)")
    parser.add_argument("--tiny", default="", help="Tiny thresholds")
    parser.add_argument("--medium", default="", help="Medium thresholds")
    parser.add_argument("--sharing", default="", help="sharing modes: auto, on, off")
    parser.add_argument("--cadence", default="", help="update cadences: daily, weekly, never")
    parser.add_argument("--aging", default="", help="priority aging values (GPU-seconds per second waited)")
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
    """`[GPU MODEL:MECHANISM=]DIR` items as a catalog per key: the key from the catalog's own record, which a
    given one may fill in but not contradict (`catalog_key`)."""
    from lucid_core.models.packing import catalog_key
    from lucid_core.sim.catalog import WorkloadCatalog

    by_key = {}
    for item in items:
        named, _, folder = item.rpartition("=")
        model, _, mechanism = named.rpartition(":")
        key = catalog_key(folder, model or None, mechanism or None)
        by_key[key] = WorkloadCatalog.from_artifact(folder)
    return FleetCatalogs(by_key, default)


def _run_cli(args) -> int:
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment

    base = load_live_config(args.config, args.set)
    grid = sweep_grid_with_configurations(_grid_flags(args), _around(args.around), base)
    configs = grid.configs
    if grid.dropped:
        print(f"note: {grid.dropped_text()}", flush=True)
    fleet = inventory_fleet(args.store_url) if args.fleet else None
    settings = TunerSettings(main_nodes=None if fleet else args.nodes, objective=args.objective, fleet=fleet)
    catalog = WorkloadCatalog.from_artifact(args.catalog) if args.catalog else WorkloadCatalog.synthetic(settings.seed)
    exp, _ = load_experiment(args.trace, args.format, args.start, args.end, nodes=args.nodes, catalog=catalog,
                             config=LucidConfig(), seed=settings.seed)
    results = []
    items = sweep_items(configs, seed=settings.seed)
    catalogs = fleet_catalogs(args.catalog_for, catalog) if args.catalog_for else None
    for item in items:
        results.append(run_configuration(exp.records, item["overrides"], settings, index=item["index"], base=base,
                                         catalog=catalog, history=exp.history, seed=item["seed"], role=item["role"],
                                         catalogs=catalogs))
        print(f"[{item['index'] + 1}/{len(items)}] {item_label(item)}: "
              + (results[-1].error or f"avg JCT {duration_words(results[-1].metrics['avg_jct_s'])}"), flush=True)
    summary = write_report(results, settings, args.out, context={"trace": str(args.trace)}, base=base,
                           grid=grid)
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    return 0 if summary["best"] else 1

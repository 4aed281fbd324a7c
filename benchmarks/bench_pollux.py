"""Pollux workloads (8 workloads x 4 loads) under Pollux, Tiresias and Lucid, beside the published means.

    nice -n 5 .venv/bin/python benchmarks/bench_pollux.py                # all 32 workloads, 2 processes
    .venv/bin/python benchmarks/bench_pollux.py --loads 1.0 --workloads 6  # one
    .venv/bin/python benchmarks/bench_pollux.py --policies pollux --processes 1

Each (workload, policy) run is one task in a process pool; its wall time is the simulator's own
(reading the trace excluded). Prints, per load, the mean over the workloads of each policy's
average JCT beside the Pollux paper's figures with the deviation, Lucid's standing against
Pollux, and the wall time per run; writes every run's figures to --json.
Reads ../shared/data/pollux (or $LUCID_SHARED_DATA/pollux); never copies it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LUCID_SHARED_DATA", REPO.parent / "shared" / "data"))
POLLUX = DATA / "pollux"
CATALOG = DATA / "lucid_artifact"
LOAD_DIRS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}
#: Mean over the 8 workloads of the average JCT, seconds (Pollux paper / artifact, 16 x 4 GPUs).
PUBLISHED = {
    "pollux": {"0.5": 1534, "1.0": 2751, "1.5": 3685, "2.0": 5289},
    "tiresias": {"0.5": 2092, "1.0": 4038, "1.5": 6182, "2.0": 10040},
}
FIDELITY = 0.15
HISTORY_VARIANT = "lucid+history"  # Lucid whose duration model learned from another workload's jobs


def run_one(task: tuple[str, str, str, tuple[tuple[str, Any], ...]]) -> dict:
    """Simulate one policy on one workload file, with knob overrides (`--set`); return its figures."""
    load, path, policy, overrides = task
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.pollux_experiment import (
        PolluxExperiment,
        fixed_config,
        history_records,
        run_pollux_policy,
    )
    from lucid_core.sim.pollux_trace import read_pollux_trace

    trace = read_pollux_trace(path)
    knobs = dict(overrides)
    config = fixed_config(LucidConfig().with_overrides({"cluster.gpus_per_node": 4, **knobs}), knobs)
    history = []
    if policy == HISTORY_VARIANT:  # the next workload of the same load stands for last week's jobs
        number = int(Path(path).stem.rsplit("-", 1)[1])
        past = read_pollux_trace(Path(path).with_name(f"workload-{number % 8 + 1}.csv"))
        history = history_records(past, trace, 4)
    exp = PolluxExperiment(trace, WorkloadCatalog.from_artifact(CATALOG), config, nodes=16, history=history)
    started, cpu = time.perf_counter(), time.process_time()
    _, metrics = run_pollux_policy("lucid" if policy == HISTORY_VARIANT else policy, exp)
    return {"load": load, "workload": Path(path).stem, "policy": policy, "jobs": len(trace.jobs),
            "avg_jct_s": metrics["avg_jct_h"] * 3600, "avg_queue_s": metrics["avg_queue_h"] * 3600,
            "makespan_h": metrics["makespan_h"], "gpu_util": metrics["gpu_utilization"],
            "shared_jobs": int(metrics.get("shared_jobs", 0)), "ended_in_profiling": int(metrics.get(
                "finished_in_profiling", 0)), "sim_wall_s": metrics["wall_s"],
            "run_wall_s": time.perf_counter() - started, "run_cpu_s": time.process_time() - cpu}


def report(rows: list[dict], policies: list[str]) -> str:
    """The per-load table: mean avg JCT per policy, published figure and deviation, wall times."""
    loads = sorted({r["load"] for r in rows})
    lines = ["| load | jobs | policy | mean avg JCT s | published s | deviation | within 15% | "
             "wall s per run (mean / max) | CPU s per run (mean / max) |", "|---|---|---|---|---|---|---|---|---|"]
    for load in loads:
        for policy in policies:
            runs = [r for r in rows if r["load"] == load and r["policy"] == policy]
            if not runs:
                continue
            mean = statistics.mean(r["avg_jct_s"] for r in runs)
            published = PUBLISHED.get(policy, {}).get(load)
            deviation = f"{100 * (mean / published - 1):+.1f}%" if published else "-"
            ok = ("yes" if abs(mean / published - 1) <= FIDELITY else "no") if published else "-"
            walls = [r["run_wall_s"] for r in runs]
            cpus = [r["run_cpu_s"] for r in runs]
            lines.append(f"| {load} | {runs[0]['jobs']} | {policy} | {mean:,.0f} | "
                         f"{f'{published:,}' if published else '-'} | {deviation} | {ok} | "
                         f"{statistics.mean(walls):.2f} / {max(walls):.2f} | "
                         f"{statistics.mean(cpus):.2f} / {max(cpus):.2f} |")
    for variant in ("lucid", HISTORY_VARIANT):
        if variant not in policies or "pollux" not in policies:
            continue
        lines += ["", f"| load | {variant} / pollux avg JCT (mean of workloads) | workloads where {variant} "
                      "is ahead |", "|---|---|---|"]
        for load in loads:
            pairs = [(r, s) for r in rows for s in rows if r["load"] == s["load"] == load
                     and r["workload"] == s["workload"] and r["policy"] == variant and s["policy"] == "pollux"]
            if pairs:
                lucid = statistics.mean(r["avg_jct_s"] for r, _ in pairs)
                pollux = statistics.mean(s["avg_jct_s"] for _, s in pairs)
                ahead = sum(1 for r, s in pairs if r["avg_jct_s"] < s["avg_jct_s"])
                lines.append(f"| {load} | {lucid / pollux:.2f}x ({lucid:,.0f} / {pollux:,.0f} s) | "
                             f"{ahead} of {len(pairs)} |")
    return "\n".join(lines)


LUCID_PARTS = (  # (label, policy, config overrides, with history)
    ("tiresias", "tiresias", {}, False),
    ("sjf (oracle, non-preemptive)", "sjf", {}, False),
    ("lucid", "lucid", {}, False),
    ("lucid, no profiling pool", "lucid", {"profiler.enabled": False}, False),
    ("lucid+history", "lucid", {}, True),
    ("lucid+history, aging 0", "lucid", {"orchestrator.aging": 0.0}, True),
    ("lucid+history, aging 0, no pool", "lucid", {"orchestrator.aging": 0.0, "profiler.enabled": False}, True),
)


def lucid_parts(loads: list[str]) -> str:
    """Lucid with one part changed at a time, mean avg JCT over the 8 workloads per load."""
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.pollux_experiment import (
        PolluxExperiment,
        fixed_config,
        history_records,
        run_pollux_policy,
    )
    from lucid_core.sim.pollux_trace import read_pollux_trace

    catalog = WorkloadCatalog.from_artifact(CATALOG)
    base = fixed_config(LucidConfig().with_overrides({"cluster.gpus_per_node": 4}))
    lines = ["| load | " + " | ".join(label for label, *_ in LUCID_PARTS) + " | jobs shared by lucid |",
             "|---|" + "---|" * (len(LUCID_PARTS) + 1)]
    for load in loads:
        traces = {w: read_pollux_trace(POLLUX / LOAD_DIRS[load] / f"workload-{w}.csv") for w in range(1, 9)}
        means, shared = [], 0
        for label, policy, overrides, with_history in LUCID_PARTS:
            values = []
            for w, trace in traces.items():
                history = history_records(traces[w % 8 + 1], trace, 4) if with_history else []
                config = base.with_overrides(overrides) if overrides else base
                _, metrics = run_pollux_policy(policy, PolluxExperiment(trace, catalog, config, 16, history=history))
                values.append(metrics["avg_jct_h"] * 3600)
                shared += int(metrics["shared_jobs"]) if label == "lucid" else 0
            means.append(statistics.mean(values))
        lines.append(f"| {load} | " + " | ".join(f"{v:,.0f}" for v in means) + f" | {shared} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default=",".join(LOAD_DIRS), help="comma-separated of 0.5,1.0,1.5,2.0")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8", help="workload numbers")
    parser.add_argument("--policies", default="pollux,tiresias,lucid")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "pollux.json"))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                        help="override a knob for every policy (to check a default on these workloads)")
    parser.add_argument("--lucid-parts", action="store_true",
                        help="instead: Lucid with one part changed at a time (profiling pool, history, aging)")
    args = parser.parse_args()
    if args.lucid_parts:
        print(lucid_parts(args.loads.split(",")))
        return 0
    policies = [p for p in args.policies.split(",") if p]
    from lucid_core.config import ConfigError, check_overrides

    try:  # a bad knob is one clear error here (the CLI's own check), not a traceback from every worker
        overrides = tuple(check_overrides(args.set).items())
    except ConfigError as err:
        parser.error(str(err))
    tasks = [(load, str(POLLUX / LOAD_DIRS[load] / f"workload-{w}.csv"), policy, overrides)
             for load in args.loads.split(",") for w in args.workloads.split(",") for policy in policies]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        rows = list(pool.map(run_one, tasks))
    print(report(rows, policies))
    print(f"\n{len(tasks)} runs in {time.perf_counter() - started:.1f} s wall on {args.processes} processes; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n", encoding="utf-8")
    print(f"per-run figures in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

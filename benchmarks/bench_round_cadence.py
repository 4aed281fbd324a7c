"""What deciding at rounds, as a live deployment does, costs each policy on Philly windows.

    .venv/bin/python benchmarks/bench_round_cadence.py                       # 3 cells x 6 policies x (0, 60 s)
    .venv/bin/python benchmarks/bench_round_cadence.py --cells 2017-10-01..2017-10-08@54 --intervals 0,60,300

Live, a policy decides only when the scheduling DAG runs a round (one a minute by default): a job submitted
between two rounds waits for the next, GPUs freed between two rounds idle until then. The simulator decides at
every event (interval 0), as the papers' simulators and every figure of the policy matrix do. This runs each
policy on each cell at each interval (`lucid simulate --round-interval`) and prints avg JCT and P99.9 queueing
side by side, each interval's ratio to the event-driven figure, and Lucid's avg JCT over the best non-preemptive
policy's (FIFO, QSSF, QSSF with backfilling), SJF-oracle's and Horus's at each interval (issue 35's share-0
yardsticks): whether its standing holds at a live cadence.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_policy_matrix import CATALOG, NON_PREEMPTIVE_PEERS, PHILLY

POLICIES = ("fifo", "sjf", "qssf", "qssf-backfill", "horus", "tiresias", "lucid")
DEFAULT_CELLS = "2017-10-01..2017-10-08@54,2017-10-23..2017-10-30@40,2017-11-01..2017-11-15@54"


def parse_cell(text: str) -> tuple[str, str, int]:
    window, nodes = text.split("@")
    start, end = window.split("..")
    return start, end, int(nodes)


def run_cell(cell: tuple[str, str, int], intervals: Sequence[float],
             policies: Sequence[str]) -> list[tuple[str, float, dict[str, float], float]]:
    """Every policy at every interval on one cell, in one worker (the trace parsed once)."""
    from dataclasses import replace

    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    start, end, nodes = cell
    exp, _ = load_experiment(PHILLY, "philly", start, end, nodes=nodes,
                             catalog=WorkloadCatalog.from_artifact(CATALOG), config=LucidConfig())
    out = []
    for policy in policies:
        for interval in intervals:
            began = time.process_time()
            _, metrics = run_policy(policy, replace(exp, round_interval_s=interval))
            kept = {k: float(metrics[k]) for k in ("avg_jct_s", "p999_queue_s", "avg_queue_s")}
            out.append((policy, interval, kept, time.process_time() - began))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="START..END@NODES, comma-separated")
    parser.add_argument("--intervals", default="0,60", help="round intervals in seconds, 0 = at every event")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    cells = [parse_cell(c) for c in args.cells.split(",")]
    intervals = [float(i) for i in args.intervals.split(",")]
    policies = args.policies.split(",")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(run_cell, cells, [intervals] * len(cells), [policies] * len(cells)))
    for (start, end, nodes), rows in zip(cells, results, strict=True):
        print(f"\n{start}..{end} @{nodes} nodes")
        print(f"{'policy':>9} {'round s':>8} {'avg JCT h':>10} {'x event':>8} {'P99.9 queue h':>14} {'x event':>8} "
              f"{'avg queue h':>12} {'cpu s':>6}")
        base = {p: m for p, i, m, _ in rows if i == intervals[0]}
        for policy, interval, m, cpu in rows:
            b = base[policy]
            print(f"{policy:>9} {interval:>8g} {m['avg_jct_s'] / 3600:>10.3f} {m['avg_jct_s'] / b['avg_jct_s']:>8.3f} "
                  f"{m['p999_queue_s'] / 3600:>14.2f} {m['p999_queue_s'] / max(b['p999_queue_s'], 1e-9):>8.3f} "
                  f"{m['avg_queue_s'] / 3600:>12.3f} {cpu:>6.1f}")
        for interval in intervals:
            by = {p: m["avg_jct_s"] for p, i, m, _ in rows if i == interval}
            if "lucid" not in by:
                continue
            peers = [p for p in NON_PREEMPTIVE_PEERS if p in by]
            yardsticks = ([("best non-preemptive", min(by[p] for p in peers))] if peers else []) + [
                (p, by[p]) for p in ("sjf", "horus") if p in by]
            print(f"  rounds {interval:g} s: Lucid avg JCT / " + ", ".join(
                f"{name} {by['lucid'] / value:.3f}" for name, value in yardsticks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

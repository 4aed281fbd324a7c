"""Simulator benchmark on the Philly trace: policy tables and speed/memory, in one run.

    .venv/bin/python benchmarks/bench_sim.py                 # tables (108/72/54 nodes) + speed
    .venv/bin/python benchmarks/bench_sim.py --only speed    # wall time and peak memory only

Reads ../shared/data (or $LUCID_SHARED_DATA); never copies it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LUCID_SHARED_DATA", REPO.parent / "shared" / "data"))
PHILLY = DATA / "philly" / "philly_jobs_2017-09_2017-11.csv"
CATALOG = DATA / "lucid_artifact"


def tables(nodes_list: list[int], seeds: list[int]) -> None:
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import POLICIES, load_experiment, run_policy
    from lucid_core.sim.report import side_by_side

    catalog = WorkloadCatalog.from_artifact(CATALOG)
    for nodes in nodes_list:
        exp, _ = load_experiment(PHILLY, "philly", "2017-10-01", "2017-10-08", nodes=nodes, catalog=catalog,
                                 config=LucidConfig(), seed=seeds[0])
        bound = sum(r.duration for r in exp.records) / len(exp.records) / 3600
        metrics = {}
        for name in POLICIES:
            _, m = run_policy(name, exp)
            metrics[name] = m
        print(f"\n## {nodes} nodes x 8 GPUs, Philly 2017-10-01..07 ({len(exp.records)} jobs); "
              f"lower bound (mean duration) {bound:.3f} h")
        print(side_by_side(metrics))
        lucid = metrics["lucid"]
        print(f"Lucid avg JCT vs lower bound: {100 * (lucid['avg_jct_h'] / bound - 1):+.2f}%")
        if len(seeds) > 1:
            rows = []
            for seed in seeds:
                exp.seed = seed
                _, m = run_policy("lucid", exp)
                rows.append((seed, m["avg_jct_h"], m["p999_queue_h"], m["avg_queue_h"]))
            print("Lucid across workload-mapping seeds (seed, avg JCT h, P99.9 queue h, avg queue h):")
            for seed, jct, p999, avg_q in rows:
                print(f"  seed {seed}  {jct:.4f}  {p999:.2f}  {avg_q:.3f}")
            print(f"  Tiresias (no workload mapping): {metrics['tiresias']['avg_jct_h']:.4f}  "
                  f"{metrics['tiresias']['p999_queue_h']:.2f}  {metrics['tiresias']['avg_queue_h']:.3f}")


def _one_speed_run(policy: str, start: str | None, end: str | None, nodes: int) -> dict:
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    t0 = time.perf_counter()
    exp, _ = load_experiment(PHILLY, "philly", start, end, nodes=nodes,
                             catalog=WorkloadCatalog.from_artifact(CATALOG), config=LucidConfig())
    load_s = time.perf_counter() - t0
    result, m = run_policy(policy, exp)
    return {"policy": policy, "window": f"{start or 'begin'}..{end or 'end'}", "nodes": nodes,
            "jobs": len(exp.records), "load_s": round(load_s, 2), "simulate_s": round(result.wall_seconds, 2),
            "events": result.events, "us_per_job": round(1e6 * result.wall_seconds / len(exp.records), 1),
            "avg_jct_h": round(m["avg_jct_h"], 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def speed() -> None:
    """Each run in a fresh process so peak memory is its own."""
    runs = [("lucid", "2017-10-01", "2017-10-08", 108), ("lucid", "2017-10-01", "2017-10-08", 72),
            ("lucid", "2017-10-01", "2017-10-08", 54), ("fifo", "2017-10-01", "2017-10-08", 54),
            ("lucid", "2017-10-01", "2017-10-15", 108), ("lucid", "2017-10-01", "2017-10-29", 108),
            ("lucid", None, None, 108), ("fifo", None, None, 108)]
    print("\n## Speed and memory (each run in its own process; wall = simulate only, load = read + map)")
    print(f"{'policy':8} {'window':24} {'nodes':>5} {'jobs':>6} {'load s':>7} {'sim s':>7} {'us/job':>7} "
          f"{'events':>7} {'peak MB':>8} {'avg JCT h':>9}")
    for policy, start, end, nodes in runs:
        out = subprocess.run([sys.executable, __file__, "--one", json.dumps([policy, start, end, nodes])],
                             check=True, capture_output=True, text=True, cwd=REPO).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{r['policy']:8} {r['window']:24} {r['nodes']:>5} {r['jobs']:>6} {r['load_s']:>7} "
              f"{r['simulate_s']:>7} {r['us_per_job']:>7} {r['events']:>7} {r['peak_rss_mb']:>8} {r['avg_jct_h']:>9}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["tables", "speed"])
    parser.add_argument("--nodes", default="108,72,54")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.one:
        print(json.dumps(_one_speed_run(*json.loads(args.one))))
        return
    if not PHILLY.exists():
        sys.exit(f"bench_sim: {PHILLY} not found (set LUCID_SHARED_DATA)")
    if args.only in (None, "tables"):
        tables([int(n) for n in args.nodes.split(",")], [int(s) for s in args.seeds.split(",")])
    if args.only in (None, "speed"):
        speed()


if __name__ == "__main__":
    main()

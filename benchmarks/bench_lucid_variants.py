"""Lucid alone under several configuration variants (development runs).

    .venv/bin/python benchmarks/bench_lucid_variants.py \\
        --cells 2017-11-01..2017-11-15@54,2017-10-02..2017-10-09@32 \\
        --variants default,orchestrator.guard_tail=3+orchestrator.backfill_reserved=true
    .venv/bin/python benchmarks/bench_lucid_variants.py --matrix \\
        --variants default,binder.pair_priority_ratio=4     # every non-trivial matrix cell, about 40 s each

A variant is `default` or SECTION.KNOB=VALUE pairs joined by '+'. With `--cells`, the trace of a cell is
read once and every variant runs on it, with the matrix's loading (`bench_policy_matrix.run_cell`'s); prints
avg JCT, P99.9 queueing, avg queueing and the CPU time of each run. With `--matrix`, each variant runs Lucid
at share 0 (nobody yields) on every non-trivial cell of the policy matrix, two cells at a time, and counts
the cells where it meets issue 35's share-0 conditions against the baselines' figures in
benchmarks/results/policy_matrix_shares.json (`--baselines`): avg JCT at most the best non-preemptive
policy's, at most SJF-oracle's and Horus's, P99.9 queueing at most QSSF's. Baselines are not rerun.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_policy_matrix import (
    CATALOG,
    NON_PREEMPTIVE_PEERS,
    NONTRIVIAL_QUEUE_SHARE,
    PHILLY,
    SIZES,
    TAIL_PEERS,
    all_windows,
    run_cell,
    share0_conditions,
)

BASELINES = Path(__file__).resolve().parent / "results" / "policy_matrix_shares.json"


def parse_variant(text: str) -> dict[str, str]:
    """'default' -> no overrides; 'a.b=1+c.d=2' -> {'a.b': '1', 'c.d': '2'}."""
    if text == "default":
        return {}
    return dict(item.split("=", 1) for item in text.split("+"))


def nontrivial_cells(baselines: dict[str, dict[str, float]]) -> list[tuple[str, str, int]]:
    """The matrix cells the issue-35 check counts: FIFO's avg queueing above 5% of its avg JCT."""
    cells = []
    for start, end in all_windows():
        for nodes in SIZES:
            fifo = baselines[f"{start}..{end}|{nodes}|fifo"]
            if fifo["avg_queue_h"] > NONTRIVIAL_QUEUE_SHARE * fifo["avg_jct_h"]:
                cells.append((start, end, nodes))
    return cells


def _run_lucid(task: tuple[tuple[str, str, int], tuple[tuple[str, str], ...]]) -> dict[str, float]:
    (start, end, nodes), overrides = task
    (_, metrics, _), = run_cell(start, end, nodes, ("lucid",), (), overrides)
    return metrics


def count_conditions(cells: Sequence[tuple[str, str, int]], lucid: Sequence[dict[str, float]],
                     baselines: dict[str, dict[str, float]]) -> tuple[dict[str, int], list[str]]:
    """Cells meeting each share-0 condition, and one line per cell naming what it misses."""
    counts = {"avg <= best non-preemptive": 0, "avg <= SJF": 0, "avg <= Horus": 0, "P99.9 queue <= QSSF": 0}
    lines = []
    for (start, end, nodes), m in zip(cells, lucid, strict=True):
        base = {p: baselines[f"{start}..{end}|{nodes}|{p}"] for p in ("fifo", "sjf", "qssf", "qssf-backfill", "horus")}
        best = min(base[p]["avg_jct_h"] for p in NON_PREEMPTIVE_PEERS)
        tail = min(base[p]["p999_queue_h"] for p in TAIL_PEERS)
        met = share0_conditions(m, base)
        for name, ok in met.items():
            counts[name] += ok
        missed = ", ".join(name for name, ok in met.items() if not ok) or "-"
        lines.append(f"  {start}..{end} @{nodes}: avg JCT {m['avg_jct_h']:.2f} h (best non-preemptive {best:.2f}, SJF "
                     f"{base['sjf']['avg_jct_h']:.2f}, Horus {base['horus']['avg_jct_h']:.2f}), P99.9 queue "
                     f"{m['p999_queue_h']:.1f} h (QSSF {tail:.1f}); misses: {missed}")
    return counts, lines


def run_matrix_variants(variants: Sequence[dict[str, str]], baselines_path: Path, jobs: int, verbose: bool) -> None:
    baselines = json.loads(baselines_path.read_text())
    cells = nontrivial_cells(baselines)
    for overrides in variants:
        started = time.perf_counter()
        task_overrides = tuple(sorted(overrides.items()))
        with ProcessPoolExecutor(jobs) as pool:
            lucid = list(pool.map(_run_lucid, [(cell, task_overrides) for cell in cells]))
        counts, lines = count_conditions(cells, lucid, baselines)
        label = "+".join(f"{k}={v}" for k, v in overrides.items()) or "default"
        print(f"{label}: " + ", ".join(f"{name} {n}/{len(cells)}" for name, n in counts.items())
              + f" ({time.perf_counter() - started:.0f} s)", flush=True)
        if verbose:
            print("\n".join(lines), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", help="comma-separated START..END@NODES")
    parser.add_argument("--matrix", action="store_true", help="every non-trivial matrix cell, share 0, counted")
    parser.add_argument("--baselines", default=str(BASELINES), help="matrix JSON with the baselines' figures")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for --matrix (default 2)")
    parser.add_argument("--verbose", action="store_true", help="with --matrix: one line per cell")
    parser.add_argument("--variants", default="default", help="comma-separated variants (see above)")
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variants.split(",")]
    if args.matrix:
        run_matrix_variants(variants, Path(args.baselines), args.jobs, args.verbose)
        return 0
    if not args.cells:
        parser.error("give --cells or --matrix")
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    for cell in args.cells.split(","):
        window, nodes = cell.split("@")
        start, end = window.split("..")
        exp, _ = load_experiment(PHILLY, "philly", start, end, nodes=int(nodes),
                                 catalog=WorkloadCatalog.from_artifact(CATALOG), config=LucidConfig())
        for overrides in variants:
            exp.config = LucidConfig().with_overrides(overrides) if overrides else LucidConfig()
            cpu = time.process_time()
            _, m = run_policy("lucid", exp)
            label = "+".join(f"{k}={v}" for k, v in overrides.items()) or "default"
            print(f"{window} @{nodes}  {label}: avg JCT {m['avg_jct_h']:.2f} h  P99.9 queue {m['p999_queue_h']:.1f} h"
                  f"  avg queue {m['avg_queue_h']:.2f} h  cpu {time.process_time() - cpu:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

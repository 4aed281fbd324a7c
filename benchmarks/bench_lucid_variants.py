"""Lucid alone under several configuration variants on a few matrix cells (development runs).

    .venv/bin/python benchmarks/bench_lucid_variants.py \\
        --cells 2017-11-01..2017-11-15@54,2017-10-02..2017-10-09@32 \\
        --variants default,orchestrator.guard_tail=3+orchestrator.backfill_reserved=true

A variant is `default` or SECTION.KNOB=VALUE pairs joined by '+'. The trace of a cell is read once
and every variant runs on it, with the matrix's loading (`bench_policy_matrix.run_cell`'s); prints
avg JCT, P99.9 queueing, avg queueing and the CPU time of each run. Baselines are not rerun: their
figures are in benchmarks/results/policy_matrix.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_policy_matrix import CATALOG, PHILLY


def parse_variant(text: str) -> dict[str, str]:
    """'default' -> no overrides; 'a.b=1+c.d=2' -> {'a.b': '1', 'c.d': '2'}."""
    if text == "default":
        return {}
    return dict(item.split("=", 1) for item in text.split("+"))


def main(argv: Sequence[str] | None = None) -> int:
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", required=True, help="comma-separated START..END@NODES")
    parser.add_argument("--variants", default="default", help="comma-separated variants (see above)")
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variants.split(",")]
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

"""The load benchmark, small: a burst through uvicorn, rounds on 1,000 emulated GPUs, its own checks hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_load.py"


def test_bench_load_runs_small_and_drops_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--burst", "200", "--queued", "400", "--rounds", "2",
                           "--concurrency", "16"], capture_output=True, text=True, timeout=240,
                          cwd=BENCH.parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "after bursts: " in out and "after rounds: " in out  # the store checks ran and held
    accepted = int(out.split("after bursts: ")[1].split(" jobs")[0])
    assert accepted >= 398  # a kept-alive connection closed under the client may cost a request, never a row
    assert "| 1 | 200 | 16 |" in out and "| 2 |" in out

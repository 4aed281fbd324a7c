"""Size of a watched job's telemetry.jsonl on its host: shared and unshared, for a given agent version.

The agent (lucid_core/runtime/hosts/telemetry_agent.py, or an older copy given with --agent) runs its own sample
loop with the emulated backend on a simulated clock: a job placed on the main pool after profiling,
watched every `--interval` seconds on `--gpus` GPUs for `--hours` (with `--window`, one profiled in
place: the round keeps its agent at the window's 1 s interval for its whole life); "shared" has another live job on
every GPU the whole time (a real process in the emulated device table), "unshared" has none. An agent
without `TelemetryLog` (before the file was bounded) appends every sample, as its `main` did.
Figures: the file's size after the first hour, its growth per hour after it, its size at the end and
the largest it was at any sample.
Both estimates a round makes from the file (the speed from its last 64 KB, for the shared job) are
printed for the bounded agent, beside the same estimate from the full record.

    .venv/bin/python benchmarks/bench_telemetry_size.py [--agent PATH] [--gpus 8] [--interval 5] [--hours 168]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any

AGENT = Path(__file__).resolve().parents[1] / "lucid_core" / "runtime" / "telemetry_agent.py"
SPEED_TAIL_BYTES = 64 * 1024


def load_agent(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("telemetry_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_job(agent: ModuleType, workdir: Path, shared: bool, gpus: int, interval_s: float,
            hours: float, window_s: float = 0.0) -> dict[str, Any]:
    """One watched job for `hours` of simulated time; returns the file's sizes and the speed estimates."""
    job = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    partner = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    try:
        table = agent.EmulatedDeviceTable(str(workdir / ".emulated-gpus"))
        if shared:
            table.register(partner.pid, list(range(gpus)), 70.0, 80.0, 2500.0)
        backend = agent.EmulatedBackend(list(range(gpus)), 70.0, 80.0, 1500.0, seed=1, device_table=table)
        path = workdir / ("shared.jsonl" if shared else "alone.jsonl")
        bounded = hasattr(agent, "TelemetryLog")
        # the full record's latest shared samples (the estimate averages at most 120 of them)
        full_speed: deque[dict[str, Any]] = deque(maxlen=4 * 120)
        if bounded:
            log = agent.TelemetryLog(str(path), keep_all_s=window_s)
            write, close = log.write, log.close
        else:
            out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - the old agent's main, line for line

            def write(record: dict[str, Any]) -> None:
                out.write(json.dumps(record) + "\n")
                out.flush()

            close = out.close
        ticks_per_hour = round(3600 / interval_s)
        last = round(hours * 3600 / interval_s)
        sizes: dict[int, int] = {}
        ticks = iter(range(last + 1))
        now = [0.0]

        def clock() -> float:
            now[0] = next(ticks) * interval_s
            return now[0]

        def sink(record: dict[str, Any]) -> None:
            if record.get("others", 0) >= 1:
                full_speed.append(dict(record))
            write(record)

        largest = [0]

        def between(_: float) -> None:
            tick = round(now[0] / interval_s)
            size = path.stat().st_size
            largest[0] = max(largest[0], size)
            if tick % ticks_per_hour == 0:
                sizes[tick // ticks_per_hour] = size

        agent.sample_loop(backend, sink, pid=job.pid, interval_s=interval_s, duration_s=last * interval_s,
                          clock=clock, sleep=between)
        close()
        end = path.stat().st_size
        result: dict[str, Any] = {"after_1h": sizes.get(1, end), "end": end, "largest": max(largest[0], end),
                                  "per_hour": (end - sizes.get(1, end)) / max(hours - 1, 1e-9)}
        if shared:
            tail = agent.parse_samples(path.read_bytes()[-SPEED_TAIL_BYTES:].decode())
            since = 3600.0
            result["speed_full"] = agent.estimate_shared_speed(full_speed, 70.0, since=since)
            result["speed_tail"] = agent.estimate_shared_speed(tail, 70.0, since=since)
        return result
    finally:
        for proc in (job, partner):
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", type=Path, default=AGENT, help="telemetry agent to measure (default: this tree's)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0, help="RoundSettings.monitor_interval_s")
    parser.add_argument("--hours", type=float, default=168.0)
    parser.add_argument("--window", type=float, default=0.0,
                        help="profiling window kept whole (a job profiled in place: 206 with --interval 1)")
    args = parser.parse_args()
    agent = load_agent(args.agent)
    print(f"agent {args.agent} ({'bounded' if hasattr(agent, 'TelemetryLog') else 'appends every sample'}), "
          f"{args.gpus} GPUs every {args.interval:g} s for {args.hours:g} h (simulated clock, emulated NVML)")
    with tempfile.TemporaryDirectory() as tmp:
        for shared in (False, True):
            r = run_job(agent, Path(tmp), shared, args.gpus, args.interval, args.hours, args.window)
            line = (f"{'shared  ' if shared else 'unshared'}: after 1 h {r['after_1h'] / 1e6:.3f} MB, "
                    f"then {r['per_hour'] / 1e6:+.3f} MB/h, at {args.hours:g} h {r['end'] / 1e6:.3f} MB "
                    f"(largest {r['largest'] / 1e6:.3f} MB)")
            if shared:
                full, tail = r["speed_full"], r["speed_tail"]
                same = "same" if full == tail else "DIFFERENT"
                line += (f"; speed from the full record {full.speed:.4f}, from the 64 KB tail "
                         f"{tail.speed:.4f} ({same}, {tail.samples} samples)")
            print(line, flush=True)


if __name__ == "__main__":
    main()

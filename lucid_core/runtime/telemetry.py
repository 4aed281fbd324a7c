"""Telemetry agent run on a GPU host next to a job: samples NVML for the job's GPUs.

Standalone on purpose (standard library + optional pynvml, no lucid_core imports), so the
scheduler can ship this file over SSH and run it with the host's python:

    python3 telemetry.py sample --pid-file pid --gpus 0,1 --interval 1 --duration 200 --out t.jsonl

Each sample is one JSON line per GPU: time, gpu index, GPU utilization %, memory (bandwidth)
utilization %, memory used MB on the GPU, memory of the job's own processes (those in the job's
process group; this attributes memory between two co-located jobs) and `emulated`.
Hosts without NVIDIA GPUs use `--emulate UTIL,MEMUTIL,MEM_MB` (a workload catalog's profile):
its samples are the catalog values with small seeded noise, and every record says emulated: true.
`summarize` turns samples into the profile the packing model reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Sample = dict[str, Any]


def process_group_of(pid: int) -> int | None:
    """The process group of `pid` from /proc (None when it is gone or /proc is absent)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[2]) if len(fields) > 2 else None


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited process nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return True  # no /proc: trust kill(0)
    return text[text.rfind(")") + 2:][:1] != "Z"


class NvmlBackend:
    """Reads utilization, memory and per-process memory through pynvml."""

    emulated = False

    def __init__(self, gpu_indices: Sequence[int]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices}

    def sample(self, job_pgid: int | None) -> list[Sample]:
        nvml = self.nvml
        out = []
        for index, handle in self.handles.items():
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            job_mem = 0.0
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                processes = []
            for proc in processes:
                used = getattr(proc, "usedGpuMemory", None)
                if used and job_pgid is not None and process_group_of(proc.pid) == job_pgid:
                    job_mem += used / 2**20
            out.append({"gpu": index, "gpu_util": float(rates.gpu), "mem_util": float(rates.memory),
                        "mem_used_mb": memory.used / 2**20, "job_mem_mb": job_mem, "emulated": False})
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class EmulatedBackend:
    """Catalog profile plus seeded noise, for hosts without NVIDIA GPUs; every record says so."""

    emulated = True

    def __init__(self, gpu_indices: Sequence[int], gpu_util: float, mem_util: float, mem_mb: float,
                 seed: int = 0, noise: float = 0.03) -> None:
        self.gpu_indices = list(gpu_indices) or [0]
        self.profile = (gpu_util, mem_util, mem_mb)
        self.rng = random.Random(seed)
        self.noise = noise

    def sample(self, job_pgid: int | None) -> list[Sample]:
        util, mem_util, mem_mb = self.profile
        out = []
        for index in self.gpu_indices:
            jitter = 1.0 + self.rng.uniform(-self.noise, self.noise)
            out.append({"gpu": index, "gpu_util": min(100.0, max(0.0, util * jitter)),
                        "mem_util": min(100.0, max(0.0, mem_util * jitter)),
                        "mem_used_mb": mem_mb, "job_mem_mb": mem_mb, "emulated": True})
        return out

    def close(self) -> None:
        """Nothing to release."""


def read_pid(path: str, wait_s: float = 5.0) -> int | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="ascii") as fh:
                text = fh.read().strip()
            if text.isdigit():
                return int(text)
        except OSError:
            pass
        time.sleep(0.05)
    return None


def sample_loop(backend: Any, write: Callable[[Sample], None], *, pid: int | None, interval_s: float,
                duration_s: float, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> int:
    """Sample every `interval_s` until the job ends or `duration_s` passes; returns the samples written."""
    start: float | None = None
    written = 0
    pgid = pid  # the wrapper leads its own process group (setsid)
    while True:
        now = clock()
        start = now if start is None else start
        for record in backend.sample(pgid):
            record["t"] = now
            write(record)
            written += 1
        if now - start >= duration_s or (pid is not None and not alive(pid)):
            return written
        sleep(interval_s)


def summarize(samples: Iterable[Sample]) -> dict[str, Any]:
    """Profile of a window: mean utilizations over samples and GPUs, peak memory of the job.

    The job's memory is the peak over samples of its own processes' memory on its busiest GPU;
    when no per-process figure was available it falls back to the GPU's memory used.
    """
    rows = list(samples)
    if not rows:
        return {"samples": 0}
    util = sum(r["gpu_util"] for r in rows) / len(rows)
    mem_util = sum(r["mem_util"] for r in rows) / len(rows)
    job_mem = max(r.get("job_mem_mb", 0.0) for r in rows)
    mem = job_mem if job_mem > 0 else max(r.get("mem_used_mb", 0.0) for r in rows)
    times = [r["t"] for r in rows if "t" in r]
    return {"samples": len(rows), "gpu_util": util, "mem_util": mem_util, "gpu_mem_mb": mem,
            "emulated": any(r.get("emulated", False) for r in rows),
            "window_s": (max(times) - min(times)) if times else 0.0}


def parse_samples(text: str) -> list[Sample]:
    """JSON lines back into samples, skipping a torn last line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lucid-telemetry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="sample the job's GPUs into a JSON-lines file")
    s.add_argument("--pid-file", default=None, help="file holding the job wrapper's pid (process group)")
    s.add_argument("--gpus", default="0", help="comma-separated GPU indices, or 'none'")
    s.add_argument("--interval", type=float, default=1.0)
    s.add_argument("--duration", type=float, default=200.0)
    s.add_argument("--out", default="-")
    s.add_argument("--emulate", default=None, help="GPU_UTIL,MEM_UTIL,MEM_MB: emulated backend")
    s.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("summarize", help="summarize a JSON-lines sample file")
    m.add_argument("path")
    args = parser.parse_args(argv)
    if args.cmd == "summarize":
        with open(args.path, encoding="utf-8") as fh:
            print(json.dumps(summarize(parse_samples(fh.read()))))
        return 0
    gpus = [] if args.gpus == "none" else [int(g) for g in args.gpus.split(",") if g]
    if args.emulate:
        util, mem_util, mem_mb = (float(v) for v in args.emulate.split(","))
        backend: Any = EmulatedBackend(gpus, util, mem_util, mem_mb, seed=args.seed)
    else:
        backend = NvmlBackend(gpus)
    pid = read_pid(args.pid_file) if args.pid_file else None
    out = sys.stdout if args.out == "-" else open(args.out, "a", encoding="utf-8")  # noqa: SIM115
    try:
        def write(record: Sample) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        sample_loop(backend, write, pid=pid, interval_s=args.interval, duration_s=args.duration)
    finally:
        backend.close()
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Telemetry agent run on a GPU host next to a job: samples NVML for the job's GPUs.

Standalone on purpose (standard library + optional pynvml, no lucid_core imports), so the scheduler
can ship this one file over SSH and run it with the host's python; the controller's side (reading,
summarizing, estimating speed) is `lucid_core.runtime.hosts.telemetry`, which imports this module's record
format, never the other way round:

    python3 telemetry_agent.py sample --pid-file pid --gpus 0,1 --interval 1 --duration 200 --out t.jsonl

Each sample is one JSON line per GPU: time, gpu index, GPU utilization %, memory (bandwidth) utilization %,
memory used MB on the GPU, memory of the job's own processes (those in the job's process group; this
attributes memory between two co-located jobs), their SM utilization (`job_sm_util`, None when the GPU
does not report it per process), how many other jobs' process groups use the GPU (`others`) and
`emulated`. Hosts without NVIDIA GPUs use `--emulate UTIL,MEMUTIL,MEM_MB` (see `EmulatedBackend`).
An agent that watches a job for its whole life (`--keep-all-s`) keeps its file bounded: see `TelemetryLog`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Sample = dict[str, Any]

# what the round reads of a watched job's file to estimate its speed: the file's tail
SPEED_READ_BYTES = 64 * 1024
# a watching agent keeps at least this much of its latest speed samples, at most twice as much
KEPT_WATCH_BYTES = 2 * SPEED_READ_BYTES
# longest JSON line of one sample: its keys, two ints, a bool and seven floats at full precision
RECORD_BYTES_BOUND = 360


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the process's name (state, ppid, pgrp, ...); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def process_group_of(pid: int) -> int | None:
    """The process group of `pid` from /proc (None when it is gone or /proc is absent)."""
    fields = proc_stat(pid) or []
    return int(fields[2]) if len(fields) > 2 else None


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited process nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat(pid)
    return fields is None or fields[:1] != ["Z"]  # None: no /proc, trust kill(0)


class NvmlBackend:
    """Reads utilization, memory and per-process memory and SM utilization through pynvml.

    Processes are told apart by process group, so the agent must see the jobs' processes in its
    own PID namespace (run it on the host, or in the jobs' container). Under MPS the driver may
    attribute work to the MPS server instead of the job's processes: not supported here.
    """

    def __init__(self, gpu_indices: Sequence[int]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices}
        # per GPU, the newest per-process sample already read (CPU time in microseconds)
        start_us = int((time.time() - 1.0) * 1e6)
        self.last_seen_us = {i: start_us for i in gpu_indices}

    def process_sm_util(self, index: int, handle: Any) -> dict[int, float] | None:
        """pid -> SM utilization % since the previous call (mean of the driver's samples), or None when the
        GPU does not report per-process utilization. The driver returns one sample per process that had
        non-zero utilization in a sample period, newer than `lastSeenTimeStamp`; NVML_ERROR_NOT_FOUND
        means no process had any."""
        nvml = self.nvml
        try:
            rows = nvml.nvmlDeviceGetProcessUtilization(handle, self.last_seen_us[index])
        except AttributeError:
            return None
        except nvml.NVMLError as exc:
            idle = {getattr(nvml, "NVML_ERROR_NOT_FOUND", 6), getattr(nvml, "NVML_SUCCESS", 0)}
            return {} if getattr(exc, "value", None) in idle else None
        by_pid: dict[int, list[float]] = {}
        for row in rows:
            by_pid.setdefault(int(row.pid), []).append(float(row.smUtil))
            self.last_seen_us[index] = max(self.last_seen_us[index], int(row.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in by_pid.items()}

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
            groups = {proc.pid: process_group_of(proc.pid) for proc in processes}
            for proc in processes:
                used = getattr(proc, "usedGpuMemory", None)
                if used and job_pgid is not None and groups[proc.pid] == job_pgid:
                    job_mem += used / 2**20
            others = len({g for g in groups.values() if g is not None and g != job_pgid})
            sm_by_pid = self.process_sm_util(index, handle)
            job_sm: float | None = None
            if sm_by_pid is not None and job_pgid is not None:
                mine = [pid for pid, group in groups.items() if group == job_pgid]
                mine += [pid for pid in sm_by_pid if pid not in groups and process_group_of(pid) == job_pgid]
                if mine:  # a process of the job holds the GPU; one without a sample ran no kernel
                    job_sm = sum(sm_by_pid.get(pid, 0.0) for pid in mine)
            out.append({"gpu": index, "gpu_util": float(rates.gpu), "mem_util": float(rates.memory),
                        "mem_used_mb": memory.used / 2**20, "job_mem_mb": job_mem, "job_sm_util": job_sm,
                        "others": others, "emulated": False})
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class EmulatedDeviceTable:
    """Emulated hosts' stand-in for NVML's list of the processes on a GPU.

    Each agent registers its job (process group, GPUs, exclusive profile) as a file in a directory
    that the agents of one host share (the work directory), and reads the entries of the other
    jobs that are still alive. A host's jobs are the only users of its emulated GPUs.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def register(self, pgid: int, gpus: Sequence[int], gpu_util: float, mem_util: float, mem_mb: float) -> None:
        entry = {"pgid": pgid, "gpus": list(gpus), "gpu_util": gpu_util, "mem_util": mem_util, "mem_mb": mem_mb}
        try:
            os.makedirs(self.root, exist_ok=True)
            tmp = os.path.join(self.root, f".{pgid}.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(entry, fh)
            os.replace(tmp, os.path.join(self.root, f"{pgid}.json"))
        except OSError:
            pass  # a full or read-only disk: the job looks alone, as it did before sharing was emulated

    def peers(self, pgid: int | None, gpu: int) -> list[dict[str, Any]]:
        """Entries of the other live jobs registered on `gpu` (dead ones are removed)."""
        try:
            names = [name for name in os.listdir(self.root) if name.endswith(".json")]
        except OSError:
            return []
        out = []
        for name in names:
            path = os.path.join(self.root, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    entry = json.load(fh)
                other = int(entry["pgid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if other == pgid or gpu not in entry.get("gpus", []):
                continue
            if not alive(other):
                with contextlib.suppress(OSError):
                    os.remove(path)
                continue
            out.append(entry)
        return out


def contention_speed(own: tuple[float, float], peers: Iterable[tuple[float, float]]) -> float:
    """Speed of a job relative to running alone when its GPU is time-sliced with `peers`.

    Each job needs its exclusive share of SM time and of memory bandwidth (its utilizations);
    while the shares add up to at most 100 % every job keeps its speed, beyond that every job gets
    a proportional slice of the busier resource (so all jobs on the GPU slow down alike).
    """
    sm, bandwidth = own
    for peer_sm, peer_bandwidth in peers:
        sm += peer_sm
        bandwidth += peer_bandwidth
    return min(1.0, 100.0 / max(sm, bandwidth, 1e-9))


class EmulatedBackend:
    """Catalog profile plus seeded noise, for hosts without NVIDIA GPUs; every record says so.

    With a device table, jobs that other live jobs share a GPU with run slower there by
    `contention_speed`: their own SM utilization (`job_sm_util`) drops by that factor, as a
    time-sliced GPU would show it, and the GPU-wide figures add up every job on it.
    """

    def __init__(self, gpu_indices: Sequence[int], gpu_util: float, mem_util: float, mem_mb: float,
                 seed: int = 0, noise: float = 0.03, device_table: EmulatedDeviceTable | None = None) -> None:
        self.gpu_indices = list(gpu_indices) or [0]
        self.profile = (gpu_util, mem_util, mem_mb)
        self.rng = random.Random(seed)
        self.noise = noise
        self.device_table = device_table
        self.registered = False

    def sample(self, job_pgid: int | None) -> list[Sample]:
        util, mem_util, mem_mb = self.profile
        table = self.device_table
        if table is not None and job_pgid is not None and not self.registered:
            table.register(job_pgid, self.gpu_indices, util, mem_util, mem_mb)
            self.registered = True
        out = []
        for index in self.gpu_indices:
            jitter = 1.0 + self.rng.uniform(-self.noise, self.noise)
            peers = table.peers(job_pgid, index) if table is not None and job_pgid is not None else []
            shares = [(float(p.get("gpu_util", 0.0)), float(p.get("mem_util", 0.0))) for p in peers]
            speed = contention_speed((util, mem_util), shares)  # the same for every job on the GPU
            device_util = (util + sum(s[0] for s in shares)) * speed
            device_mem_util = (mem_util + sum(s[1] for s in shares)) * speed
            out.append({"gpu": index, "gpu_util": min(100.0, max(0.0, device_util * jitter)),
                        "mem_util": min(100.0, max(0.0, device_mem_util * jitter)),
                        "mem_used_mb": mem_mb + sum(float(p.get("mem_mb", 0.0)) for p in peers),
                        "job_mem_mb": mem_mb, "job_sm_util": min(100.0, max(0.0, util * speed * jitter)),
                        "others": len(peers), "emulated": True})
        return out

    def close(self) -> None:
        """Nothing to release (a dead job's table entry is removed by whoever sees it next)."""


def read_pid(path: str, wait_s: float = 5.0) -> int | None:
    """The pid in `path` once the launch has written it (None after `wait_s` seconds without one)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(path, encoding="ascii") as fh:
            text = fh.read().strip()
            if text.isdigit():
                return int(text)
        time.sleep(0.05)
    return None


def sample_loop(backend: Any, write: Callable[[Sample], None], *, pid: int | None, interval_s: float,
                duration_s: float, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep,
                watch_interval_s: float | None = None, watch_after_s: float = 0.0) -> int:
    """Sample every `interval_s` until the job ends or `duration_s` passes; returns the samples written.

    With `watch_interval_s`, sampling slows to that interval once `watch_after_s` have passed: a job
    profiled in place needs a dense profiling window, but only the speed watch's rate after it."""
    written = 0
    pgid = pid  # the wrapper leads its own process group (setsid)
    start = now = clock()
    while True:
        for record in backend.sample(pgid):
            record["t"] = now
            write(record)
            written += 1
        if now - start >= duration_s or (pid is not None and not alive(pid)):
            return written
        slow = watch_interval_s is not None and now - start >= watch_after_s
        sleep(watch_interval_s if slow else interval_s)  # type: ignore[arg-type]
        now = clock()


def counts_for_speed(record: Sample) -> bool:
    """True for a sample the speed estimate can use: another job's processes shared the GPU and the
    job's own SM utilization was reported (the agent writes no other kind after the profiling window)."""
    return record.get("job_sm_util") is not None and int(record.get("others", 0) or 0) >= 1


class TelemetryLog:
    """A watching agent's JSON-lines file: the whole profiling window, then a bounded tail of speed samples.

    The scheduler reads the profile from every sample of the first `keep_all_s` seconds (`first_window`
    cuts at the same instant) and the speed estimate from the latest samples that `counts_for_speed` in
    the last SPEED_READ_BYTES (`estimate_shared_speed`). So the window is kept whole, and after it only
    speed samples are written (a job alone writes nothing more); once they fill 2 x `watch_bytes` the file
    is rewritten, atomically, as the window plus the last `watch_bytes` of them: the tail the round reads
    holds the newest samples of the whole record, so both figures come out exact, and the file stays under
    window + 2 x `watch_bytes` + one line however long the job runs. Filtering alone would grow without
    bound while a pair runs for days, a cap alone would keep rewriting every job's file, and aggregates
    (a mean every N samples) would change the estimate's sample counts (min_samples, max_samples).
    """

    def __init__(self, path: str, keep_all_s: float | None, watch_bytes: int = KEPT_WATCH_BYTES) -> None:
        self.path = path
        self.keep_all_s = keep_all_s  # None: keep every sample (a profiling run, calibration)
        self.watch_bytes = max(1, watch_bytes)
        self.file = open(path, "ab")  # noqa: SIM115 - held for the agent's life
        self.start: float | None = None
        self.window_bytes: int | None = None  # the file's size when the window ended
        self.watch_size = 0  # bytes written after the window (since the last compaction)

    def write(self, record: Sample) -> None:
        now = float(record["t"])
        self.start = now if self.start is None else self.start
        in_window = self.keep_all_s is None or now <= self.start + self.keep_all_s
        if not in_window:
            if self.window_bytes is None:
                self.window_bytes = self.file.tell()
            if not counts_for_speed(record):
                return
        line = (json.dumps(record) + "\n").encode()
        self.file.write(line)
        self.file.flush()
        if not in_window:
            self.watch_size += len(line)
            if self.watch_size >= 2 * self.watch_bytes:
                self.compact()

    def compact(self) -> None:
        """Rewrite the file as the window plus the last `watch_bytes` of whole lines after it.

        A reader that opened the old file keeps reading it whole; on a full disk the file is left
        as it is and compaction is tried again at the next line.
        """
        head = self.window_bytes or 0
        tmp = f"{self.path}.tmp"
        try:
            with open(self.path, "rb") as src, open(tmp, "wb") as dst:
                dst.write(src.read(head))
                size = src.seek(0, os.SEEK_END)
                cut = max(head, size - self.watch_bytes)
                src.seek(cut)
                tail = src.read()
                if cut > head:  # drop the partial line the cut landed in
                    tail = tail[tail.find(b"\n") + 1:]
                dst.write(tail)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            return
        self.file.close()
        self.file = open(self.path, "ab")  # noqa: SIM115 - held for the agent's life
        self.watch_size = len(tail)

    def close(self) -> None:
        self.file.close()


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
    s.add_argument("--device-table", default=None,
                   help="emulated backend: directory where the host's agents list their jobs' GPUs "
                        "(default: .emulated-gpus next to this script; a launch names its work directory's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--keep-all-s", type=float, default=None,
                   help="watching agent: keep every sample of the first S seconds (the profiling window), "
                        "then only those the speed estimate uses, bounded by --watch-bytes (default: keep all)")
    s.add_argument("--watch-bytes", type=int, default=KEPT_WATCH_BYTES,
                   help="with --keep-all-s: keep this many bytes of the latest speed samples (up to twice as many)")
    s.add_argument("--watch-interval", type=float, default=None,
                   help="after the first --keep-all-s seconds (or at once without it), sample this often")
    args = parser.parse_args(argv)
    gpus = [] if args.gpus == "none" else [int(g) for g in args.gpus.split(",") if g]
    if args.emulate:
        util, mem_util, mem_mb = (float(v) for v in args.emulate.split(","))
        table_dir = args.device_table or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".emulated-gpus")
        backend: Any = EmulatedBackend(gpus, util, mem_util, mem_mb, seed=args.seed,
                                       device_table=EmulatedDeviceTable(table_dir))
    else:
        backend = NvmlBackend(gpus)
    pid = read_pid(args.pid_file) if args.pid_file else None
    log = None if args.out == "-" else TelemetryLog(args.out, args.keep_all_s, args.watch_bytes)
    try:
        sample_loop(backend, (lambda record: print(json.dumps(record), flush=True)) if log is None else log.write,
                    pid=pid, interval_s=args.interval, duration_s=args.duration,
                    watch_interval_s=args.watch_interval, watch_after_s=args.keep_all_s or 0.0)
    finally:
        backend.close()
        if log is not None:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

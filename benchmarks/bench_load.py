"""Load: bursts of submissions through the HTTP API, then scheduling rounds with 20,000 jobs waiting.

1. Burst: the runtime's FastAPI app served by uvicorn on loopback (its own process), N POST /jobs
   sent at once by an httpx async client with C requests in flight. Figures: submissions accepted
   per second, latency percentiles, server peak RSS; then the store is checked: every 201 is a job
   row with the id the client got back, nothing else was written (nothing dropped, nothing doubled).
   Bursts repeat until `--queued` jobs are waiting.
2. Rounds: SchedulingRound.run() over that store, with the default policy, on 1,000 emulated GPUs
   (125 main hosts x 8 + 2 profiling hosts x 8). The executor emulates hosts in-process on a virtual
   clock that moves `--step` seconds per round: launches succeed, a run ends after its job's emulated
   duration, profiling windows return emulated telemetry. Figures: round time, policy time, decisions,
   jobs launched/ended per round, peak RSS. After the last round: every job is still there in one
   state, no job has two live runs, no GPU holds more than two.

    .venv/bin/python benchmarks/bench_load.py [--burst 10000] [--queued 20000] [--rounds 6]
        [--concurrency 64] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
from sqlalchemy import select

from lucid_core.config import LucidConfig
from lucid_core.runtime.hosts.executor import HostAddress, LaunchResult, LaunchSpec, RunStatus
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.store.store import Store

MAIN_HOSTS, PROF_HOSTS, GPUS_PER_HOST, VCS = 125, 2, 8, 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory (VmHWM) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def setup_cluster(store: Store) -> None:
    for i in range(MAIN_HOSTS):
        add_host(store, HostSpec(f"node{i:03d}", executor="local", vc=f"vc{i % VCS}", gpus=GPUS_PER_HOST,
                                 telemetry="emulated", workdir=f"~/.lucid-runs/node{i:03d}"))
    for i in range(PROF_HOSTS):
        add_host(store, HostSpec(f"prof{i}", executor="local", pool="profiling", vc="vc0", gpus=GPUS_PER_HOST,
                                 telemetry="emulated", workdir=f"~/.lucid-runs/prof{i}"))


def job_body(i: int) -> dict:
    """The i-th submission: mostly 1-GPU jobs, a few wide ones, 50 users over 4 VCs."""
    gpus = (1, 1, 1, 1, 2, 1, 4, 1, 8, 1)[i % 10]
    return {"command": f"python train.py --seed {i}", "gpus": gpus, "user": f"user{i % 50}", "vc": f"vc{i % VCS}",
            "name": f"exp-{i % 300}", "env": {"SEED": str(i)}}


def serve(url: str, port: int) -> subprocess.Popen:
    code = ("import uvicorn; from lucid_core.runtime.surfaces.api import create_app; "
            f"uvicorn.run(create_app({url!r}), host='127.0.0.1', port={port}, log_level='warning')")
    server = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/queue", timeout=30).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the API server did not come up")


async def burst(base: str, first: int, n: int, concurrency: int) -> tuple[list[tuple[int, str | None, float]], float]:
    """POST n jobs with `concurrency` in flight; (status, job id, latency s) each, and the wall time."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    results: list[tuple[int, str | None, float]] = []
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:
        async def one(i: int) -> None:
            async with gate:
                t0 = time.perf_counter()
                try:
                    reply = await client.post("/jobs", json=job_body(i))
                    job_id = reply.json().get("job_id") if reply.status_code == 201 else None
                    results.append((reply.status_code, job_id, time.perf_counter() - t0))
                except httpx.HTTPError as exc:
                    results.append((-1, type(exc).__name__, time.perf_counter() - t0))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(first + i) for i in range(n)))
        wall = time.perf_counter() - t0
    return results, wall


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class EmulatedHosts:
    """Executor stand-in on a virtual clock: runs end after their job's emulated duration."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.runs: dict[tuple[str, str], tuple[float, float]] = {}  # (host, run) -> (start, end)

    def launch(self, host: HostAddress, spec: LaunchSpec) -> LaunchResult:
        key = (host.name, spec.run_id)
        if key in self.runs:
            return LaunchResult(4242, already_launched=True)
        seed = zlib.crc32(spec.env.get("LUCID_JOB_ID", spec.run_id).encode())
        duration = 60.0 * (1 + seed % 120)  # 1 min .. 2 h
        self.runs[key] = (self.clock[0], self.clock[0] + duration)
        return LaunchResult(4242, already_launched=False)

    def poll(self, host: HostAddress, run_ids: Sequence[str]) -> dict[str, RunStatus]:
        out = {}
        for run_id in run_ids:
            span = self.runs.get((host.name, run_id))
            if span is None:
                out[run_id] = RunStatus("MISSING")
            elif self.clock[0] >= span[1]:
                out[run_id] = RunStatus("EXITED", exit_code=0)
            else:
                out[run_id] = RunStatus("RUNNING", pid=4242)
        return out

    def probe(self, host: HostAddress) -> None:
        """Every host answers."""

    def stop(self, host: HostAddress, run_id: str, reason: str, grace_s: float) -> RunStatus:
        span = self.runs.get((host.name, run_id))
        if span is not None:
            self.runs[(host.name, run_id)] = (span[0], min(span[1], self.clock[0]))
        return RunStatus("EXITED", exit_code=143, stop_requested=True)

    def read(self, host: HostAddress, run_id: str, name: str, max_bytes: int = 1 << 20) -> str:
        if name != "telemetry.jsonl":
            return ""
        seed = zlib.crc32(run_id.encode())
        util, mem = 10 + seed % 85, 5 + seed % 60
        return "\n".join(json.dumps({"t": i, "gpu": 0, "gpu_util": util, "mem_util": mem, "mem_used_mb": 3000.0,
                                     "job_mem_mb": 1000.0 + seed % 20000, "emulated": True}) for i in range(5))

    def read_front_lines(self, host: HostAddress, run_id: str, name: str, max_bytes: int, line_bytes: int,
                         scan_bytes: int) -> str:
        """The profile window's read: these emulated files hold only well-formed lines."""
        return self.read(host, run_id, name, max_bytes)

    def close(self) -> None:
        """Nothing to release."""


def check_store(store: Store, accepted: set[str]) -> dict[str, int]:
    """Nothing dropped or doubled: the job ids in the store are exactly the accepted ones."""
    with store.session() as s:
        ids = set(s.scalars(select(JobRow.job_id)))
        states = Counter(s.scalars(select(JobRow.state)))
        live = list(s.scalars(select(RunRow).where(RunRow.state.in_(("planned", "running")))))
    assert ids == accepted, f"store has {len(ids - accepted)} unexpected and lacks {len(accepted - ids)} jobs"
    per_job = Counter(r.job_id for r in live if r.node_rank == 0)
    assert max(per_job.values(), default=0) <= 1, "a job has two live runs"
    per_gpu = Counter((r.host, i) for r in live for i in r.gpu_indices)
    assert max(per_gpu.values(), default=0) <= 2, "a GPU holds more than two runs"
    return dict(states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--step", type=float, default=120.0, help="virtual seconds between rounds")
    parser.add_argument("--store", default=None, help="store URL (default: SQLite in a temporary directory)")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="lucid-load-")
    url = args.store or f"sqlite:///{tmp.name}/load.db"
    store = Store(url)
    setup_cluster(store)
    port = free_port()
    server = serve(url, port)
    bursts, accepted = [], set()
    try:
        first = 0
        while first < args.queued:
            n = min(args.burst, args.queued - first)
            results, wall = asyncio.run(burst(f"http://127.0.0.1:{port}", first, n, args.concurrency))
            codes = Counter(code if code != -1 else f"client {job_id}" for code, job_id, _ in results)
            ids = [job_id for code, job_id, _ in results if code == 201]
            assert len(ids) == len(set(ids)), "two submissions got the same job id"
            accepted.update(ids)
            lat = [t for code, _, t in results if code == 201] or [float("nan")]
            bursts.append({"n": n, "wall_s": wall, "accepted": len(ids), "per_s": len(ids) / wall,
                           "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * pct(lat, 0.99),
                           "codes": dict(codes), "server_rss_mb": peak_rss_mb(server.pid)})
            print(f"burst {len(bursts)}: {bursts[-1]}", flush=True)
            first += n
    finally:
        server.terminate()
        server.wait(timeout=30)
    states = check_store(store, accepted)
    print(f"after bursts: {len(accepted)} jobs in the store, states {states}", flush=True)

    clock = [time.time()]
    hosts = EmulatedHosts(clock)
    config = LucidConfig()
    rounds = []
    for r in range(args.rounds):
        report = SchedulingRound(store, hosts, config, RoundSettings(holder=f"load-{r}", lease_ttl_s=3600),
                                 clock=lambda: clock[0]).run()
        rounds.append({"round": r + 1, "total_ms": report.total_ms, "decide_ms": report.decide_ms,
                       "decisions": len(report.decisions), "launched": len(report.launched),
                       "ended": len(report.ended), "errors": len(report.errors),
                       "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        print(f"round {r + 1}: {rounds[-1]}", flush=True)
        clock[0] += args.step
    states = check_store(store, accepted)
    print(f"after rounds: states {states}", flush=True)
    store.dispose()
    tmp.cleanup()

    print("\n## Load figures\n")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"store: {'SQLite' if url.startswith('sqlite') else 'PostgreSQL'}; cluster: "
          f"{MAIN_HOSTS * GPUS_PER_HOST} main GPUs + {PROF_HOSTS * GPUS_PER_HOST} profiling GPUs, emulated.\n")
    print("| burst | submissions | in flight | accepted | other replies | wall s | accepted/s | p50 ms | p99 ms "
          "| server peak RSS MiB |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for i, b in enumerate(bursts, 1):
        other = {k: v for k, v in b["codes"].items() if k != 201} or "none"
        print(f"| {i} | {b['n']:,} | {args.concurrency} | {b['accepted']:,} | {other} | {b['wall_s']:.1f} | "
              f"{b['per_s']:.0f} | {b['p50_ms']:.0f} | {b['p99_ms']:.0f} | {b['server_rss_mb']:.0f} |")
    print(f"\n| round (jobs in store: {len(accepted):,}) | round ms | of which policy ms | decisions | launched "
          "| ended | errors | scheduler peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rounds:
        print(f"| {row['round']} | {row['total_ms']:.0f} | {row['decide_ms']:.0f} | {row['decisions']} | "
              f"{row['launched']} | {row['ended']} | {row['errors']} | {row['rss_mb']:.0f} |")
    print(f"\nEnd states: {states}. Every accepted id is in the store, no other rows; no job with two live runs; "
          "no GPU with more than two.")


if __name__ == "__main__":
    main()

"""Soak of "one writer at a time": several `lucid round --every 1s` processes on one PostgreSQL store.

    python benchmarks/bench_lease_soak.py --minutes 10 [--loops 3] [--ttl 4] [--stall 7]

Each loop is a real `lucid round --every 1s` process (local hosts: a 4-GPU profiling host and four
2-GPU main hosts, emulated telemetry). Once a minute one of the loops, in turn, stalls for `--stall`
seconds (past the lease TTL) between its snapshot and its writes, as a slow host read would stall it.
Meanwhile short jobs are submitted and some cancelled, and an admin loop adds a host, drains it to be
removed, removes it, and adds it again. A share of the jobs (`--preemptible-share`, default 0.3) are
submitted `--preemptible` and run longer, so they yield live to the short ones (the soak's config lets a job
yield after 1 s of run). Another share (`--time-limit-share`, default 0.1, drawn apart so the rest of the
stream stays as it was) carries a `--time-limit` of half its run, so rounds stop it past its limit. At the end
the queue is drained and every job and run is audited against the ledger the job processes wrote on their
hosts: a job started on the main pool more often than it yielded, or two runs of one job at once (double
starts), GPUs held by two runs at once, jobs not in exactly one terminal state. The last line is machine-readable:

    soak minutes=M jobs=N yields=Y double_starts=X overlapping_gpu=Y not_one_terminal=Z stalls=S
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("LUCID_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
CONFIG = ("[profiler]\ntprof_s = 1.0\nin_place = false\n[binder]\nsharing = \"off\"\n"
          "[forecast]\nmode_check_interval_s = 5.0\n[runtime]\nstop_grace_s = 1.0\ntelemetry_interval_s = 0.25\n"
          "launch_grace_s = 30.0\n[orchestrator]\nyield_margin = 1.0\nyield_min_run = 1.0\nyield_interval_s = 0.0\n"
          "[tiresias]\ncheckpoint_cost_s = 1.0\n")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def loop_child(index: int, loops: int, stall_s: float, stall_log: Path, argv: list[str]) -> int:
    """One `lucid round --every` loop whose round stalls after its snapshot when its turn of the minute comes."""
    from lucid_core.cli import main as lucid
    from lucid_core.runtime.round.scheduling_round import SchedulingRound

    original = SchedulingRound._crash
    stalled_minutes: set[int] = set()

    def stall(self: SchedulingRound, step: str) -> None:
        minute = int(time.time() // 60)
        if step == "after_snapshot" and minute % loops == index and minute not in stalled_minutes:
            stalled_minutes.add(minute)
            with stall_log.open("a") as log:
                log.write(f"{index} {time.time():.3f}\n")
            time.sleep(stall_s)
        original(self, step)

    SchedulingRound._crash = stall  # type: ignore[method-assign]
    return lucid(argv)


def ledger_job(ledger: Path, seconds: float) -> str:
    return (f'echo "S $LUCID_JOB_ID $LUCID_RUN_ID $CUDA_VISIBLE_DEVICES $PWD $(date +%s.%N)" >> {ledger}; '
            f'sleep {seconds}; echo "E $LUCID_JOB_ID $LUCID_RUN_ID $(date +%s.%N)" >> {ledger}')


def audit(store, ledger: Path, jobs: list[str]) -> dict[str, int]:
    """Count the three violations from the hosts' ledger and the store."""
    from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow

    with store.session() as s:
        rows = {j.job_id: j for j in s.scalars(sa.select(JobRow).where(JobRow.job_id.in_(jobs)))}
        endings = Counter(s.scalars(sa.select(JobEventRow.job_id).where(
            JobEventRow.kind.in_(("completed", "failed", "cancelled")))))
        ended_at = {r.run_id: r.ended_at for r in s.scalars(sa.select(RunRow))}
        yields = {j: (row.yields or 0) for j, row in rows.items()}
    starts: dict[str, list[str]] = defaultdict(list)
    launches: Counter = Counter()
    begun: dict[str, tuple[str, list[int], float]] = {}
    ends: dict[str, float] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        w = line.split()
        if w[0] == "S" and len(w) >= 6:
            launches[w[2]] += 1
            if "-main" in w[2]:
                starts[w[1]].append(w[2])
            host = re.search(r"/hosts/([^/]+)/", w[4] + "/").group(1)
            begun[w[2]] = (host, [int(i) for i in w[3].split(",")], float(w[5]))
        elif w[0] == "E" and len(w) >= 4:
            ends[w[2]] = float(w[3])
    per_gpu: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for run, (host, gpus, t0) in begun.items():
        t1 = ends.get(run) or ended_at.get(run) or float("inf")  # a stopped run writes no end: the store's
        for gpu in gpus:
            per_gpu[(host, gpu)].append((t0, t1))
    overlapping = 0
    for spans in per_gpu.values():
        spans.sort()
        overlapping += sum(1 for (_, a1), (b0, _) in itertools.pairwise(spans) if b0 < a1 - 0.05)
    spans_of = {run: (begun[run][2], ends.get(run) or ended_at.get(run) or float("inf")) for run in begun}

    def doubled(job: str, runs: list[str]) -> bool:
        """More main starts than the job yielded for, one run launched twice, or two of its runs at once."""
        spans = sorted(spans_of[r] for r in runs)
        return (len(runs) > yields.get(job, 0) + 1 or any(launches[r] > 1 for r in runs)
                or any(b0 < a1 - 0.05 for (_, a1), (b0, _) in itertools.pairwise(spans)))

    return {"double_starts": sum(1 for job, runs in starts.items() if doubled(job, runs)),
            "overlapping_gpu": overlapping,
            "not_one_terminal": sum(1 for j in jobs if j not in rows or rows[j].state not in TERMINAL
                                    or endings[j] != 1)}


def admin_loop(store, root: Path, stop: threading.Event, counts: Counter) -> None:
    """Add a host, drain it to be removed (a round deletes it once empty) or remove it outright; again."""
    from lucid_core.runtime.hosts import inventory
    from lucid_core.runtime.store.lease import LeaseHeld

    rng = random.Random(7)
    while not stop.is_set():
        try:
            names = {h["name"] for h in inventory.list_hosts(store)}
            if "x0" not in names:
                spec = inventory.HostSpec("x0", executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                                          workdir=str(root / "hosts" / "x0"))
                inventory.add_host(store, spec, wait_s=10)
                counts["add"] += 1
            elif rng.random() < 0.5:
                inventory.drain_host(store, "x0", remove=True, wait_s=10)
                counts["drain"] += 1
            else:
                inventory.remove_host(store, "x0", wait_s=10)
                counts["remove"] += 1
        except (inventory.InventoryError, LeaseHeld) as exc:
            counts["refused"] += 1
            counts[type(exc).__name__] += 1
        stop.wait(rng.uniform(2.0, 6.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--loops", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=4.0, help="lease TTL of the loops (s)")
    parser.add_argument("--stall", type=float, default=7.0, help="how long a stalled round sleeps (s), > --ttl")
    parser.add_argument("--gap", type=float, default=0.5,
                        help="mean seconds between submissions (0.5: queues build, so preemptible jobs yield)")
    parser.add_argument("--drain", type=float, default=600.0, help="seconds the queue may take to empty at the end")
    parser.add_argument("--store", default=None, help="PostgreSQL URL (default: a fresh database, dropped after)")
    parser.add_argument("--preemptible-share", type=float, default=0.3,
                        help="share of the jobs submitted --preemptible (they run 4-12 s and may yield)")
    parser.add_argument("--time-limit-share", type=float, default=0.1,
                        help="share of the jobs submitted with a time limit of half their run (they are stopped)")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        index, loops, stall_s, stall_log, *argv = args.child
        return loop_child(int(index), int(loops), float(stall_s), Path(stall_log), argv)

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

    root = Path(tempfile.mkdtemp(prefix="lucid-soak-"))
    dbname = f"lucid_soak_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    url = args.store
    if url is None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
        url = PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname
    store = Store(url)
    for name, pool in (("p0", "profiling"), ("m0", "main"), ("m1", "main"), ("m2", "main"), ("m3", "main")):
        add_host(store, HostSpec(name, executor="local", pool=pool, vc="vc-a", telemetry="emulated",
                                 gpus=4 if pool == "profiling" else 2, workdir=str(root / "hosts" / name)))
    config, ledger, stall_log = root / "lucid.toml", root / "ledger", root / "stalls"
    config.write_text(CONFIG)
    env = {**os.environ, "LUCID__RUNTIME__LEASE_TTL_S": str(args.ttl), "PYTHONPATH": str(REPO)}
    logs = [(root / f"loop{i}.err").open("w") for i in range(args.loops)]
    loops = [subprocess.Popen(
        [sys.executable, __file__, "--child", str(i), str(args.loops), str(args.stall), str(stall_log),
         "round", "--store", url, "--config", str(config), "--every", "1s"],
        env=env, stdout=subprocess.DEVNULL, stderr=logs[i]) for i in range(args.loops)]
    stop, counts = threading.Event(), Counter()
    admin_thread = threading.Thread(target=admin_loop, args=(store, root, stop, counts), daemon=True)
    admin_thread.start()
    rng, limits = random.Random(1), random.Random(2)
    jobs: list[str] = []
    began = time.monotonic()
    drained_s = float("nan")
    print(f"soak: {args.loops} round loops, lease TTL {args.ttl:g} s, stall {args.stall:g} s once a minute, "
          f"store {url.rsplit('/', 1)[-1]}, files in {root}", flush=True)
    try:
        while time.monotonic() - began < args.minutes * 60:
            gpus = 2 if rng.random() < 0.15 else 1
            resumes = rng.random() < args.preemptible_share
            seconds = round(rng.uniform(4.0, 12.0) if resumes else rng.uniform(0.3, 4.0), 2)
            limit = max(1.0, seconds / 2) if limits.random() < args.time_limit_share else None
            jobs.append(submit(store, JobRequest(ledger_job(ledger, seconds), gpus, f"u{rng.randint(1, 4)}", "vc-a",
                                                 name=f"soak-{'long' if resumes else 'short'}-{len(jobs)}",
                                                 preemptible=resumes, time_limit_s=limit)))
            if jobs and rng.random() < 0.1:
                try:
                    cancel(store, rng.choice(jobs))
                except Exception as exc:  # an unknown or finished job: say so, keep going
                    counts[f"cancel {type(exc).__name__}"] += 1
            time.sleep(rng.uniform(args.gap / 2, args.gap * 1.5))
            if len(jobs) % 50 == 0:
                print(f"  {time.monotonic() - began:6.0f} s: {len(jobs)} jobs submitted", flush=True)
        stop.set()
        drain_began = time.monotonic()
        drain_deadline = time.monotonic() + args.drain
        from lucid_core.runtime.store.schema import JobRow

        while time.monotonic() < drain_deadline:
            with store.session() as s:
                open_jobs = s.scalar(sa.select(sa.func.count()).where(JobRow.state.not_in(TERMINAL)))
            if not open_jobs:
                break
            time.sleep(1.0)
        drained_s = time.monotonic() - drain_began
    finally:
        stop.set()
        for loop in loops:
            loop.terminate()
        for loop in loops:
            try:
                loop.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loop.kill()
        for log in logs:
            log.close()
    failures = sum(log.read_text().count("round failed") for log in root.glob("loop*.err"))
    result = audit(store, ledger, jobs)
    from lucid_core.runtime.store.schema import JobRow as Jobs

    with store.session() as s:
        yielded = s.scalar(sa.select(sa.func.coalesce(sa.func.sum(Jobs.yields), 0)).where(Jobs.job_id.in_(jobs)))
        limited = s.scalar(sa.select(sa.func.count()).where(Jobs.job_id.in_(jobs), Jobs.state == "FAILED",
                                                           Jobs.end_reason.like("%time limit%")))
    stalls = len(stall_log.read_text().splitlines()) if stall_log.exists() else 0
    from lucid_core.runtime.store.schema import RoundRow

    with store.session() as s:
        fenced = s.scalar(sa.select(sa.func.count()).where(RoundRow.fenced.is_(True)))
        rounds = s.scalar(sa.select(sa.func.count()).select_from(RoundRow))
    minutes = (time.monotonic() - began) / 60
    print(f"rounds {rounds} (fenced {fenced}, failed {failures}), admin {dict(counts)}, "
          f"queue drained in {drained_s:.0f} s, {limited} jobs stopped past their time limit")
    store.dispose()
    if args.store is None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    print(f"soak minutes={minutes:.1f} jobs={len(jobs)} yields={yielded} double_starts={result['double_starts']} "
          f"overlapping_gpu={result['overlapping_gpu']} not_one_terminal={result['not_one_terminal']} stalls={stalls}")
    return 0 if not any(result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

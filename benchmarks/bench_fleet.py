"""A scheduling round against a fleet of hosts over real OpenSSH on loopback, PostgreSQL store.

    .venv/bin/python benchmarks/bench_fleet.py [--hosts 64,256,512] [--servers 4] [--deadline 5]

Per fleet size N: N host entries of 8 GPUs served by a few sshd processes on their own ports (each
entry its own work directory on the host side), one "silent" host (a loopback port that accepts TCP
and never speaks) and one slow host (real sshd behind a link that holds each chunk --slow-delay
seconds). The silent host holds a job it was running when it went silent, so every round polls it.
Most hosts run an 8-GPU job (a real process launched over SSH); each measured round
finds a few new jobs queued. The round is the live one (`SchedulingRound`, host calls fanned out,
--parallelism hosts at a time) driven step by step as `run()` does, with one executor kept across
the rounds (as `lucid round --every` does), so each host's connection is opened once.

Printed per N: the first round (connections opened), then steady rounds with the silent host and
without it (its entry removed), each split into reconcile / decide / execute, with the SSH calls
made. The last line per N is machine-readable:

    fleet hosts=N round_s=X round_s_without_silent=Y host_deadline_s=Z
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the loopback fleet (sshd servers, silent port, slow link)

from loopback_fleet import DelayedLink, SilentPort, SshdFleet  # noqa: E402

from lucid_core.config import LucidConfig  # noqa: E402
from lucid_core.domain import JobState, RunState  # noqa: E402
from lucid_core.runtime.hosts.calls import HostCall, HostCallPool  # noqa: E402
from lucid_core.runtime.hosts.executor import LaunchSpec  # noqa: E402
from lucid_core.runtime.hosts.inventory import HostSpec, add_host, host_address  # noqa: E402
from lucid_core.runtime.hosts.ssh_executor import ssh_executor  # noqa: E402
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound  # noqa: E402
from lucid_core.runtime.store.schema import GpuRow, HostRow, JobRow, RunRow  # noqa: E402
from lucid_core.runtime.store.store import Store  # noqa: E402
from lucid_core.runtime.surfaces.submission import JobRequest, submit  # noqa: E402

PG_ADMIN = os.environ.get("LUCID_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
GPUS = 8
JOB_S = 3600  # the seeded jobs outlive the benchmark; they are stopped at its end


@dataclass
class RoundTimes:
    reconcile_s: float
    decide_s: float
    execute_s: float
    total_s: float
    calls: int
    launched: int
    unreachable: list[str]

    def line(self, label: str) -> str:
        return (f"  {label:<22} total {self.total_s:6.2f} s = reconcile {self.reconcile_s:6.2f} + decide "
                f"{self.decide_s:5.2f} + execute {self.execute_s:5.2f}; SSH calls {self.calls:4d}, launched "
                f"{self.launched:3d}, unreachable {','.join(self.unreachable) or '-'}")


def timed_round(store: Store, executor, config: LucidConfig, settings: RoundSettings) -> RoundTimes:
    """One round, the steps of `SchedulingRound.run` in its order, timed by part."""
    rnd = SchedulingRound(store, executor, config, settings, close_executor=False)
    began = time.perf_counter()
    assert rnd.take_lease(), "the lease is free in this benchmark"
    try:
        rnd.open_round()
        rnd.load_hosts()
        rnd.repair_unknown_hosts()
        rnd.carry_out_pending()
        rnd.reconcile()
        rnd.give_up_lost_hosts()
        reconciled = time.perf_counter()
        rnd.decide()
        decided = time.perf_counter()
        rnd.carry_out_pending()
        rnd.remove_drained_hosts()
        done = time.perf_counter()
    finally:
        rnd.close()
        rnd.finish(began)
        rnd.give_back_lease()
    return RoundTimes(reconciled - began, decided - reconciled, done - decided, done - began,
                      rnd.report.host_calls, len(rnd.report.launched), sorted(rnd.report.unreachable))


def seed_running(store: Store, executor, hosts: list[str], parallelism: int, deadline_s: float) -> int:
    """Start an 8-GPU job on each of `hosts` over SSH (all at once) and record it as running in the store."""
    now = time.time()
    job_ids = {name: submit(store, JobRequest(f"sleep {JOB_S}", GPUS, "bench", "vc-a", name=f"seed-{name}"))
               for name in hosts}
    with store.session() as s:
        rows = {h.name: h for h in s.scalars(sa.select(HostRow))}
    pool = HostCallPool(parallelism)
    specs = {name: LaunchSpec(f"{job_ids[name]}-main1", f"sleep {JOB_S}", {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
             for name in hosts}
    addresses = {name: host_address(rows[name]) for name in hosts}
    results = pool.run({name: [HostCall(lambda a=addresses[name], sp=specs[name]: executor.launch(a, sp), deadline_s)]
                        for name in hosts})
    pool.close()
    started = 0
    with store.session() as s:
        for name in hosts:
            (result,) = results[name]
            job = s.get(JobRow, job_ids[name])
            if not result.ok:
                print(f"  seeding {name} failed: {result.error}", file=sys.stderr)
                job.state, job.end_time, job.end_reason = JobState.CANCELLED, now, "benchmark seeding failed"
                continue
            record_running(s, job, name, specs[name].run_id, result.value.pid, now)
            started += 1
    return started


def record_running(s, job: JobRow, host: str, run_id: str, pid: int, now: float) -> None:
    """The store's record of an 8-GPU job running on `host` (profiled, not to be shared)."""
    job.state, job.start_time, job.profiled, job.no_share = JobState.RUNNING, now, True, True
    job.gpu_util, job.mem_util, job.gpu_mem_mb, job.attempts = 60.0, 30.0, 8000.0, 1
    s.add(RunRow(run_id=run_id, host=host, job_id=job.job_id, kind="main", pool="main",
                 gpu_indices=list(range(GPUS)), node_rank=0, state=RunState.RUNNING, pid=pid,
                 planned_at=now, started_at=now))


def seed_silent_run(store: Store, host: str) -> None:
    """A job recorded as running on the silent host (it went silent while running it): every round polls it,
    so every round meets the silent host's deadline."""
    now = time.time()
    job_id = submit(store, JobRequest(f"sleep {JOB_S}", GPUS, "bench", "vc-a", name=f"seed-{host}"))
    with store.session() as s:
        record_running(s, s.get(JobRow, job_id), host, f"{job_id}-main1", 4242, now)


def queue_jobs(store: Store, count: int, tag: str) -> None:
    """Jobs for a round to place: profiled already and not to be shared (no telemetry agent beside them)."""
    ids = [submit(store, JobRequest(f"sleep {JOB_S}", 1 + i % 2, "bench", "vc-a", name=f"{tag}-{i}"))
           for i in range(count)]
    with store.session() as s:
        s.execute(sa.update(JobRow).where(JobRow.job_id.in_(ids)).values(
            state=JobState.QUEUED, profiled=True, no_share=True, gpu_util=50.0, mem_util=20.0, gpu_mem_mb=4000.0))


def one_fleet(n_hosts: int, servers: SshdFleet, args: argparse.Namespace, root: Path) -> str:
    """Build an N-host fleet in a fresh PostgreSQL database, run the rounds, print the figures."""
    dbname = f"lucid_fleet_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    store = Store(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname)
    silent, slow = SilentPort(), DelayedLink(servers.ports[0], args.slow_delay)
    servers.write_known_hosts({slow.port: 0})
    executor = ssh_executor(str(servers.known_hosts), connect_timeout_s=min(10.0, args.deadline),
                            timeout_s=args.deadline)
    try:
        names = [f"h{i:04d}" for i in range(n_hosts - 2)] + ["slow0", "silent0"]
        ports = {name: servers.port_of(i) for i, name in enumerate(names)}
        ports.update(slow0=slow.port, silent0=silent.port)
        for name in names:
            add_host(store, HostSpec(name, port=ports[name], user=servers.user, key_path=str(servers.client_key),
                                     vc="vc-a", pool="main", executor="ssh", telemetry="emulated",
                                     workdir=str(root / f"n{n_hosts}" / name), gpus=GPUS))
        busy = [*[n for n in names if n not in ("slow0", "silent0")][: int(args.busy * n_hosts)], "slow0"]
        seeded_at = time.perf_counter()
        # setup, not measured: its own executor with a generous deadline, so every busy host runs its job
        seeder = ssh_executor(str(servers.known_hosts), connect_timeout_s=30.0, timeout_s=120.0)
        seeded = seed_running(store, seeder, busy, args.parallelism, 120.0)
        seeder.close()
        seed_silent_run(store, "silent0")
        print(f"fleet of {n_hosts} hosts ({n_hosts * GPUS} GPUs, {len(servers.ports)} sshd): {seeded} 8-GPU jobs "
              f"running, seeded over SSH in {time.perf_counter() - seeded_at:.1f} s")
        config = LucidConfig().with_overrides({"binder.sharing": "off", "profiler.in_place": False})
        settings = RoundSettings(host_call_deadline_s=args.deadline, host_parallelism=args.parallelism,
                                 stop_grace_s=1.0, lease_ttl_s=300.0, host_lost_after_s=None,
                                 holder="bench-fleet")
        print(timed_round(store, executor, config, settings).line("first round"))
        with_silent: list[RoundTimes] = []
        for r in range(args.rounds):
            queue_jobs(store, args.new_jobs, f"r{r}")
            with_silent.append(timed_round(store, executor, config, settings))
            print(with_silent[-1].line(f"round {r + 1} (silent)"))
        with store.session() as s:  # the silent host leaves the inventory
            gone = list(s.scalars(sa.select(RunRow.job_id).where(RunRow.host == "silent0")))
            s.execute(sa.delete(RunRow).where(RunRow.host == "silent0"))
            s.execute(sa.update(JobRow).where(JobRow.job_id.in_(gone)).values(
                state=JobState.CANCELLED, end_time=time.time(), end_reason="benchmark: its host left the fleet"))
            s.execute(sa.delete(GpuRow).where(GpuRow.host == "silent0"))
            s.execute(sa.delete(HostRow).where(HostRow.name == "silent0"))
        without: list[RoundTimes] = []
        for r in range(args.rounds):
            queue_jobs(store, args.new_jobs, f"q{r}")
            without.append(timed_round(store, executor, config, settings))
            print(without[-1].line(f"round {r + 1} (no silent)"))
        round_s = statistics.median(t.total_s for t in with_silent)
        round_without = statistics.median(t.total_s for t in without)
        print(f"  median: {round_s:.2f} s with the silent host, {round_without:.2f} s without; "
              f"host call deadline {args.deadline:g} s; SSH connections opened {executor.transports['ssh'].connects}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        line = (f"fleet hosts={n_hosts} round_s={round_s:.2f} round_s_without_silent={round_without:.2f} "
                f"host_deadline_s={args.deadline:g}")
        print(line, flush=True)
        return line
    finally:
        stop_all(store, executor, args.parallelism)
        executor.close()
        store.dispose()
        silent.close()
        slow.close()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))


def stop_all(store: Store, executor, parallelism: int) -> None:
    """Stop every run the benchmark started (their processes would outlive it)."""
    with store.session() as s:
        runs = list(s.scalars(sa.select(RunRow).where(RunRow.state == RunState.RUNNING)))
        hosts = {h.name: h for h in s.scalars(sa.select(HostRow))}
    pool = HostCallPool(parallelism)
    batches: dict[str, list[HostCall]] = {}
    for run in runs:
        if run.host in hosts and run.host != "silent0":
            address = host_address(hosts[run.host])
            batches.setdefault(run.host, []).append(
                HostCall(lambda a=address, r=run: executor.stop(a, r.run_id, "benchmark over", 0.5), 30.0))
    pool.run(batches)
    pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="64,256,512", help="fleet sizes, comma-separated")
    parser.add_argument("--servers", type=int, default=4, help="sshd processes serving the host entries")
    parser.add_argument("--deadline", type=float, default=5.0, help="one host call's deadline, seconds")
    parser.add_argument("--parallelism", type=int, default=32, help="hosts called at once (runtime.host_parallelism)")
    parser.add_argument("--slow-delay", type=float, default=0.02, help="the slow host's added delay per chunk, s")
    parser.add_argument("--busy", type=float, default=0.9, help="share of hosts running an 8-GPU job")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds with and without the silent host")
    parser.add_argument("--new-jobs", type=int, default=8, help="jobs queued before each measured round")
    parser.add_argument("--login-rc", action="store_true",
                        help="let each SSH login read the account's ~/.bashrc (skipped by default: see loopback_fleet)")
    args = parser.parse_args()
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # the silent host's banner timeouts, each round
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the jobs and servers
    root = Path(tempfile.mkdtemp(prefix="lucid-fleet-"))
    servers = SshdFleet(root / "sshd", servers=args.servers, read_rc=args.login_rc).start()
    lines = []
    try:
        for n in [int(x) for x in args.hosts.split(",")]:
            lines.append(one_fleet(n, servers, args, root))
    finally:
        servers.stop()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

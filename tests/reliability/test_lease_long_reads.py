"""A round's pair-speed reads (one telemetry read per member of each sharing pair, before any write) can
outlast its lease on a slow network: the round renews as it reads, so a rival controller polling for the
lease does not take it over (and fence the round) while the round is alive and working.

Real processes: the rival is a separate process polling `lease.acquire` against the same store.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from fault_injection import add_local_hosts
from test_lease_fencing import REPO

from lucid_core.config import load_config
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.round.snapshot import load_snapshot
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

RIVAL = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lucid_core.runtime.store import lease
    from lucid_core.runtime.store.store import Store
    store, stop = Store(sys.argv[1], migrate=False), Path(sys.argv[2])
    print("READY", flush=True)
    sys.stdin.readline()  # the round takes its lease only once this process is up (its start can take seconds)
    while not stop.exists():
        if lease.acquire(store, "rival", 60.0, time.time()) is not None:
            print("TOOK", flush=True)
            break
        time.sleep(0.05)
""")


def test_slow_pair_reads_keep_the_lease(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_local_hosts(store, tmp_path / "hosts")
    now = time.time()
    jobs = [submit(store, JobRequest("sleep 1", 1, "u", "vc-a", name=f"j{i}")) for i in range(4)]
    with store.session() as s:
        for i, job_id in enumerate(jobs):
            s.get(JobRow, job_id).state, s.get(JobRow, job_id).gpu_util = "RUNNING", 40.0
            s.add(RunRow(run_id=f"{job_id}-main1", host="m0", job_id=job_id, kind="main", pool="main",
                         gpu_indices=[i // 2], node_rank=0, partner=jobs[i ^ 1], state="running",
                         planned_at=now - 100, started_at=now - 100))
    executor = local_executor()
    reads: list[float] = []

    def slow_read(*_args, **_kwargs) -> str:  # a host that answers, slowly
        reads.append(time.monotonic())
        time.sleep(1.2)
        return ""

    executor.read = slow_read  # type: ignore[method-assign]
    config = load_config(None)
    rnd = SchedulingRound(store, executor, config, RoundSettings(lease_ttl_s=3.0, holder="slow"))
    stop = tmp_path / "stop"
    rival = subprocess.Popen([sys.executable, "-c", RIVAL, store.url, str(stop)], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rival.stdout.readline().strip() == "READY"
        assert rnd.take_lease()
        rival.stdin.write("GO\n")
        rival.stdin.flush()
        rnd.load_hosts()
        rnd._observe_pairs(load_snapshot(rnd.store, now), now)  # 4 reads: 4.8 s, lease 3 s
        assert len(reads) == 4 and reads[-1] - reads[0] > 3.0, reads
        rnd.renew_lease()  # raises Fenced when the rival took the lease meanwhile
    finally:
        stop.touch()
        out, _ = rival.communicate(timeout=30)
    assert "TOOK" not in out
    rnd.give_back_lease()
    store.dispose()

"""A wide preemptible job whose yield stop reaches one node while another node's host does not answer. The
stopped node's peer then ends with an error of its own (as a distributed job's rank does when its peer
vanishes). The round that reached it used to judge that error as the job's failure, so the job that yielded
ended FAILED instead of waiting again (B44); it now counts as ended of the stop."""

from __future__ import annotations

import time

import pytest
from duration_stubs import FixedDurations
from lucid_invariants import check_invariants
from runtime_helpers import YIELD_NOW, fast_config, jobs_by_id, one_round, register, runs_of

from lucid_core.policy.lucid import LucidPolicy
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

pytestmark = pytest.mark.ssh



def test_a_wide_job_whose_node_dies_of_its_peers_yield_stop_waits_again(sshd_hosts, tmp_path):
    cluster = sshd_hosts
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, cluster, tmp_path / "hosts")
    config = fast_config(**YIELD_NOW)
    factory = lambda cfg, snapshot: LucidPolicy(  # noqa: E731
        cfg, duration_model=FixedDurations({"wide": 1.0, "short": 0.5}, key=lambda job: job.name))
    shared = tmp_path / "shared"
    shared.mkdir()
    # rank 0 trains; rank 1 fails (exit 1) once rank 0 is gone, as NCCL or gloo does when its peer vanishes
    body = (f'p={shared}/rank0-$LUCID_RUN_ID; trap "exit 143" TERM; '
            f'if [ "$LUCID_NODE_RANK" = 0 ]; then echo $$ > $p; while :; do sleep 0.1; done; fi; '
            'while [ ! -s $p ]; do sleep 0.1; done; r=$(cat $p); '
            'while kill -0 $r 2>/dev/null; do sleep 0.1; done; exit 1')
    wide = submit(store, JobRequest(body, 4, "ann", "vc-a", name="wide", preemptible=True))

    def rounds(done, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while not done():
            one_round(store, cluster, config, policy_factory=factory)
            assert time.monotonic() < deadline, [(r.run_id, r.host, r.state, r.outcome) for r in runs_of(store, wide)]
            time.sleep(0.25)

    rounds(lambda: sum(r.state == "running" for r in runs_of(store, wide)) == 2)
    rank1 = next(r for r in runs_of(store, wide) if r.node_rank == 1)
    time.sleep(2)  # far past its 1 s prediction: a short job may take its GPUs
    host = cluster.hosts[rank1.host]
    host.stop()  # the yield's stop cannot reach rank 1's host
    try:
        short = submit(store, JobRequest("sleep 0.5", 1, "ann", "vc-a", name="short"))
        rounds(lambda: jobs_by_id(store)[short].state == "COMPLETED")
        assert jobs_by_id(store)[wide].yields == 1
        time.sleep(0.5)  # rank 1 has seen rank 0 go and ended with its error
    finally:
        host.start()
    first = rank1.run_id
    rounds(lambda: all(r.state == "ended" for r in runs_of(store, wide) if r.run_id == first))
    row = jobs_by_id(store)[wide]
    assert row.state in ("QUEUED", "RUNNING"), (row.state, row.end_reason)  # it yielded: it waits again
    (node,) = [r for r in runs_of(store, wide) if r.run_id == first and r.host == rank1.host]
    assert node.outcome.startswith("stopped: it ended on its own (code 1)"), node.outcome
    cancel(store, wide)
    rounds(lambda: jobs_by_id(store)[wide].state == "CANCELLED")
    check_invariants(store, [wide, short])
    store.dispose()

"""Live yielding and lost hosts under faults, over real sshd hosts on loopback and real job processes.

What must hold whatever the jobs and hosts do: every job ends in exactly one terminal state, no job runs
twice at once, no process of a run the store counts as over is left on a host (see lucid_invariants).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from duration_stubs import FixedDurations
from lucid_invariants import check_invariants, ledger_command, ledger_starts
from runtime_helpers import SETTINGS, YIELD_NOW, fast_config, jobs_by_id, marked_processes, one_round, runs_of

from lucid_core.policy.lucid import LucidPolicy
from lucid_core.runtime.hosts.inventory import HostSpec, add_host, drain_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.round.settings import InjectedCrash
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit


@pytest.mark.ssh
def test_a_run_a_dead_round_launched_on_a_host_lost_since_is_stopped_when_the_host_returns(live):
    """A round launches a run and dies before recording it (the run stays planned, its process runs); the
    host is then cut off (sshd down, the process alive) past `host_lost_after_s`, and the job is requeued
    and runs elsewhere. When the host answers again, the first run's process is stopped, not left running
    beside the job's new run. Before: the planned run was ended as 'lost' without a reap, and ran on."""
    store, cluster, root = live
    ledger, first = root / "ledger", root / "first-started"
    settings = replace(SETTINGS, host_lost_after_s=1.0, requeue_lost=True)
    config = fast_config(**{"profiler.enabled": False})
    body = f"if [ -e {first} ]; then sleep 0.3; else touch {first}; sleep 60; fi"
    job = submit(store, JobRequest(ledger_command(ledger, body), 1, "u", "vc-a", name="j"))
    with pytest.raises(InjectedCrash):
        one_round(store, cluster, config, settings=settings, crash_at="after_launch")
    (planned,) = runs_of(store, job)
    assert planned.state == "planned"
    marker = (root / "hosts" / planned.host / planned.run_id / "marker").read_text().strip()
    assert marked_processes(f"LUCID_RUN_MARKER={marker}")  # the host runs it; the store does not know
    host = cluster.hosts[planned.host]
    time.sleep(SETTINGS.lease_ttl_s + 0.5)  # the dead round's lease lapses
    host.stop()
    try:
        deadline = time.monotonic() + 30
        while jobs_by_id(store)[job].state != "COMPLETED":
            one_round(store, cluster, config, settings=settings)
            assert time.monotonic() < deadline, [(r.run_id, r.state, r.outcome) for r in runs_of(store, job)]
            time.sleep(0.3)
    finally:
        host.start()
    one_round(store, cluster, config, settings=settings)  # the first round that reaches the host again
    time.sleep(0.3)
    assert marked_processes(f"LUCID_RUN_MARKER={marker}") == {}
    lost = next(r for r in runs_of(store, job) if r.run_id == planned.run_id)
    assert lost.state == "ended" and "reaped when the host returned" in lost.outcome, lost.outcome
    assert ledger_starts(ledger)[(planned.run_id, "0")] == 1  # started once, by the dead round's launch
    check_invariants(store, [job])  # (the ledger knows a start the store never recorded: the dead round's)


def _local_rounds(store, config, factory, done, timeout_s=30.0):
    """Local-executor rounds until `done(jobs)`."""
    deadline = time.monotonic() + timeout_s
    while True:
        SchedulingRound(store, local_executor(), config, SETTINGS, policy_factory=factory).run()
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.25)


def test_a_taker_is_never_placed_on_a_draining_host_a_wide_job_yields_from(tmp_path):
    """A 4-GPU preemptible job over two 2-GPU hosts yields to a short job while one of its hosts drains: the
    short job starts on the other host, never on the draining one. Before: the stop freed the draining host's
    GPUs too, and the taker was placed (and launched) there."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    for name in ("m0", "m1"):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                                 workdir=str(tmp_path / name)))
    config = fast_config(**YIELD_NOW)
    factory = lambda cfg, snapshot: LucidPolicy(  # noqa: E731
        cfg, duration_model=FixedDurations({"wide": 1.0, "short": 0.5}, key=lambda job: job.name))
    wide = submit(store, JobRequest("sleep 60", 4, "ann", "vc-a", name="wide", preemptible=True))
    _local_rounds(store, config, factory, lambda j: j[wide].state == "RUNNING")
    time.sleep(2)  # far past its 1 s prediction: a short job may take its GPUs
    drain_host(store, "m0")
    short = submit(store, JobRequest("sleep 0.5", 1, "ann", "vc-a", name="short"))
    _local_rounds(store, config, factory, lambda j: j[short].state == "COMPLETED")
    assert {r.host for r in runs_of(store, short)} == {"m1"}
    assert jobs_by_id(store)[wide].yields == 1  # it did yield, to a taker on its other host
    cancel(store, wide)
    _local_rounds(store, config, factory, lambda j: j[wide].state == "CANCELLED")
    check_invariants(store, [wide, short])
    store.dispose()


def test_a_job_never_shares_a_gpu_on_a_draining_host(tmp_path):
    """A draining host gets no new work, not even a partner for the light job it runs: the waiting light job
    stays queued. Before: the binder paired it there (and, on an unreachable host, planned it on a dead one)."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    config = fast_config()
    light = lambda job: (10.0, 5.0, 1000.0)  # noqa: E731 - Tiny: two of them may share a GPU

    def rounds(done):
        deadline = time.monotonic() + 30
        while not done():
            SchedulingRound(store, local_executor(), config, SETTINGS, emulated_profile=light).run()
            assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs_by_id(store).items()}
            time.sleep(0.25)

    first = submit(store, JobRequest("sleep 60", 1, "ann", "vc-a", name="first"))
    rounds(lambda: any(r.kind == "main" and r.state == "running" for r in runs_of(store, first)))
    drain_host(store, "m0")
    second = submit(store, JobRequest("sleep 5", 1, "ann", "vc-a", name="second"))
    rounds(lambda: jobs_by_id(store)[second].state not in ("SUBMITTED", "PROFILING"))  # profiled
    for _ in range(4):  # a partner was there to be had in each of these rounds
        SchedulingRound(store, local_executor(), config, SETTINGS, emulated_profile=light).run()
        time.sleep(0.25)
    assert [r.host for r in runs_of(store, second)] == ["p0"]  # its profiling run only
    assert jobs_by_id(store)[second].state == "QUEUED"
    cancel(store, first)
    cancel(store, second)
    rounds(lambda: {r.state for r in jobs_by_id(store).values()} == {"CANCELLED"})
    check_invariants(store, [first, second])
    store.dispose()

"""Host faults over real sshd hosts on loopback: sshd dies and returns; a host that never returns.

After each: every job ends in exactly one terminal state, no job runs twice, no GPU is double-booked
(see lucid_invariants). Jobs append to a ledger on the host side, so "ran twice" is checked against
what really started, not only against the store.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import replace

import pytest
from lucid_invariants import TERMINAL, check_invariants, ledger_command
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, pid_alive, runs_of
from sqlalchemy import select

from lucid_core.runtime.hosts.loss import LOST_RUN_STATE
from lucid_core.runtime.round.scheduling_round import RoundSettings
from lucid_core.runtime.store.schema import JobEventRow, RunRow
from lucid_core.runtime.surfaces.submission import JobRequest, submit

pytestmark = pytest.mark.ssh


def drive(store, cluster, done, timeout_s=40.0, hook=None, pause_s=0.25, settings=SETTINGS):
    """Rounds until `done(jobs)`; `hook()` runs after each round (a check, a fault)."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = one_round(store, cluster, fast_config(), settings=settings)
        if hook is not None:
            hook()
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        runs = [(r.run_id, r.host, r.state, r.outcome) for j in jobs for r in runs_of(store, j)]
        assert time.monotonic() < deadline, ({j: (r.state, r.pending_reason) for j, r in jobs.items()}, report, runs)
        time.sleep(pause_s)


def all_ended(jobs):
    return all(r.state in TERMINAL for r in jobs.values())


def running_main(store, job_ids):
    with store.session() as s:
        return list(s.scalars(select(RunRow).where(RunRow.job_id.in_(job_ids), RunRow.kind == "main",
                                                   RunRow.state == "running")))


def test_sshd_dies_mid_job_and_returns_nothing_lost_nothing_twice(live):
    store, cluster, root = live
    ledger = root / "ledger"
    jobs = [submit(store, JobRequest(ledger_command(ledger, f"sleep {d}"), 1, "u", "vc-a", name=f"j{i}"))
            for i, d in enumerate([4, 4, 0.3, 0.3])]
    drive(store, cluster, lambda j: bool(running_main(store, jobs[:2])))
    victim = running_main(store, jobs[:2])[0]
    host = cluster.hosts[victim.host]
    host.stop()
    down_at = time.time()
    try:
        late = [submit(store, JobRequest(ledger_command(ledger, "sleep 0.5"), 1, "u", "vc-a", name="late"))]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            report = one_round(store, cluster, fast_config())
            assert victim.host in report.unreachable
            assert jobs_by_id(store)[victim.job_id].state == "RUNNING"  # not given up, not restarted
            time.sleep(0.3)
    finally:
        host.start()
    with store.session() as s:
        placed_while_down = s.scalars(select(RunRow).where(RunRow.host == victim.host,
                                                           RunRow.planned_at > down_at)).all()
    assert placed_while_down == []  # an unreachable host gets no new work
    final = drive(store, cluster, all_ended)
    states = check_invariants(store, jobs + late, ledger)
    assert set(states.values()) == {"COMPLETED"}, {j: final[j].end_reason for j in states}
    assert [r.kind for r in runs_of(store, victim.job_id)] == ["profiling", "main"]


def test_profiling_host_sshd_down_across_the_window_end(live):
    """The profiling host cannot be reached when the job's window ends: no main run starts while the
    profiling run may still be alive; once the host is back the job either finished there (the pending
    placement is dropped) or is stopped there and runs once on the main pool."""
    store, cluster, root = live
    ledger = root / "ledger"
    job = submit(store, JobRequest(ledger_command(ledger, "sleep 4"), 1, "u", "vc-a", name="prof-outage"))
    drive(store, cluster, lambda j: j[job].state == "PROFILING")
    prof = runs_of(store, job)[0]
    host = cluster.hosts[prof.host]
    host.stop()
    try:
        deadline = time.monotonic() + 3  # the 2 s window ends while the host is unreachable
        while time.monotonic() < deadline:
            report = one_round(store, cluster, fast_config())
            assert prof.host in report.unreachable
            # the policy may place it now, but nothing starts while the profiling run may still be alive
            assert not [r for r in runs_of(store, job) if r.kind == "main" and r.started_at is not None]
            time.sleep(0.3)
    finally:
        host.start()
    final = drive(store, cluster, all_ended)
    assert final[job].state == "COMPLETED"
    started = [r for r in runs_of(store, job) if r.started_at is not None]
    assert started[0].kind == "profiling" and len(started) <= 2
    if len(started) == 2:  # still running when the host came back: stopped there, then placed
        assert started[1].kind == "main" and started[1].started_at >= started[0].ended_at
    else:  # it finished on the profiling host during the outage: the pending placement was dropped
        assert started[0].exit_code == 0 and final[job].exit_code == 0
    check_invariants(store, [job], ledger)


def _kill_run(run: RunRow) -> None:
    """The host's machine dies: its job processes go with it (the run's process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGKILL)


def lossy(lost_after_s: float, requeue: bool = False) -> RoundSettings:
    """The tests' round settings, giving up on hosts silent for `lost_after_s`."""
    return replace(SETTINGS, host_lost_after_s=lost_after_s, requeue_lost=requeue)


@pytest.mark.parametrize("requeue", [False, True], ids=["fail", "requeue"])
def test_host_that_never_returns_loses_its_jobs_after_the_timeout(live, requeue):
    store, cluster, root = live
    ledger = root / "ledger"
    settings = lossy(2.0, requeue)
    # long enough to outlast its 1 s profiling window even when rounds are slow (a loaded machine): at 3 s
    # it sometimes ended inside the window, before its stop came, and never reached the main pool
    long_job = submit(store, JobRequest(ledger_command(ledger, "sleep 6"), 1, "u", "vc-a", name="long"))
    drive(store, cluster, lambda j: bool(running_main(store, [long_job])), settings=settings)
    victim = running_main(store, [long_job])[0]
    other = submit(store, JobRequest(ledger_command(ledger, "sleep 0.3"), 1, "u", "vc-a", name="other"))
    cluster.hosts[victim.host].stop()
    _kill_run(victim)  # the machine died with its jobs
    down_at = time.time()

    def not_too_early():
        if time.time() - down_at < settings.host_lost_after_s - 0.5:  # inside the timeout: not given up
            assert jobs_by_id(store)[long_job].state == "RUNNING"

    final = drive(store, cluster, all_ended, hook=not_too_early, timeout_s=25, settings=settings)
    assert final[other].state == "COMPLETED"
    row = final[long_job]
    with store.session() as s:
        lost_run = s.get(RunRow, (victim.run_id, victim.host))
        kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == long_job))]
    assert lost_run.state == LOST_RUN_STATE and lost_run.outcome.startswith("lost: host")
    assert lost_run.ended_at - down_at >= settings.host_lost_after_s
    assert "lost" in kinds
    if requeue:
        assert row.state == "COMPLETED" and "requeued" in kinds
        again = [r for r in runs_of(store, long_job) if r.kind == "main" and r.run_id != victim.run_id]
        assert len(again) == 1 and again[0].host != victim.host
    else:
        assert row.state == "FAILED" and row.end_reason.startswith("lost: host") and "requeued" not in kinds
    check_invariants(store, [long_job, other], ledger)
    # the machine is rebuilt later: the first round that reaches it reaps the lost run
    cluster.hosts[victim.host].start()
    one_round(store, cluster, fast_config(), settings=settings)
    with store.session() as s:
        assert s.get(RunRow, (victim.run_id, victim.host)).state == "ended"


def test_a_partitioned_host_that_returns_has_its_lost_run_stopped(live):
    """The process outlived the partition: when the host answers again, the round stops the lost run."""
    store, cluster, _root = live
    settings = lossy(1.0)
    job = submit(store, JobRequest("sleep 60", 1, "u", "vc-a", name="orphan"))
    drive(store, cluster, lambda j: bool(running_main(store, [job])), timeout_s=20, settings=settings)
    victim = running_main(store, [job])[0]
    host = cluster.hosts[victim.host]
    host.stop()
    try:
        one_round(store, cluster, fast_config(), settings=settings)  # first seen down
        time.sleep(1.2)
        report = one_round(store, cluster, fast_config(), settings=settings)
        assert report.ended.get(job) == "FAILED" and jobs_by_id(store)[job].state == "FAILED"
        os.kill(victim.pid, 0)  # still alive behind the partition
    finally:
        host.start()
    one_round(store, cluster, fast_config(), settings=settings)
    time.sleep(0.2)
    assert not pid_alive(victim.pid)
    with store.session() as s:
        assert s.get(RunRow, (victim.run_id, victim.host)).state == "ended"
    check_invariants(store, [job])


def test_an_idle_unreachable_host_stays_unreachable_until_it_answers(live):
    store, cluster, _ = live
    cluster.hosts["main1"].stop()
    from lucid_core.runtime.store.schema import HostRow

    with store.session() as s:  # main1 failed to answer earlier and has nothing running now
        s.get(HostRow, "main1").reachable = False
    report = one_round(store, cluster, fast_config())
    with store.session() as s:
        host = s.get(HostRow, "main1")
    assert not host.reachable and "main1" in report.unreachable

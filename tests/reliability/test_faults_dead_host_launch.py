"""A host that died while idle still reads as reachable until something calls it: the round plans work there and
its launch cannot connect. Over real sshd hosts on loopback (a killed sshd is the dead host).

A launch that never reached its host (no SSH session was ever set up, and no earlier try of the run was made)
certainly started nothing: the run ends "not launched" and its job goes back to the queue at once, to run
elsewhere, instead of waiting for the host and failing when it is given up on. Wide jobs stop the node that did
start. A launch tried before (a round that died after launching, or a try that may have reached the host) keeps
the run planned until the host answers, as before: it may be running there.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from lucid_invariants import check_invariants, ledger_command
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, pid_alive, register, rounds_until, runs_of
from sqlalchemy import select, update

from lucid_core.runtime.hosts.executor import HostAddress, HostUnreachable
from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.round.base import InjectedCrash
from lucid_core.runtime.store.schema import JobEventRow, LeaseRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

pytestmark = pytest.mark.ssh

CONFIG = fast_config(**{"profiler.enabled": False, "binder.sharing": "off", "cluster.gpus_per_node": 2})
# a host silent for 3 s is given up on: the old behaviour failed the job planned there within the test
QUICK_LOSS = replace(SETTINGS, host_lost_after_s=3.0)


def address(cluster, name: str) -> HostAddress:
    host = cluster.hosts[name]
    return HostAddress(name, "127.0.0.1", host.port, cluster.user, str(cluster.client_key))


def test_unreachable_says_whether_the_call_ever_reached_the_host(sshd_hosts):
    """A refused connection reached nothing; a script that overran its deadline on a session did."""
    executor = ssh_executor(str(sshd_hosts.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    main1 = sshd_hosts.hosts["main1"]
    try:
        main1.stop()
        with pytest.raises(HostUnreachable) as refused:
            executor.transports["ssh"].run_script(address(sshd_hosts, "main1"), "echo hi\n", timeout_s=3)
        assert refused.value.reached is False, refused.value
        main1.start()
        with pytest.raises(HostUnreachable) as slow:
            executor.transports["ssh"].run_script(address(sshd_hosts, "main1"), "sleep 5\n", timeout_s=1.5)
        assert slow.value.reached is True, slow.value
    finally:
        if main1.process is None:
            main1.start()
        executor.close()


def test_a_job_planned_on_a_host_that_died_idle_goes_back_to_the_queue_and_runs_elsewhere(sshd_hosts, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    main0 = sshd_hosts.hosts["main0"]
    try:
        register(store, sshd_hosts, tmp_path / "hosts")
        ledger = tmp_path / "ledger"
        jobs = [submit(store, JobRequest(ledger_command(ledger, "sleep 2"), 2, "alice", "vc-a", name=f"j{i}"))
                for i in range(2)]
        main0.stop()  # dies while idle: the store still calls it reachable
        report = one_round(store, sshd_hosts, CONFIG, settings=QUICK_LOSS)
        assert "main0" in report.unreachable, report
        on_dead = [r for j in jobs for r in runs_of(store, j) if r.host == "main0"]
        assert len(on_dead) == 1, "no job was placed on the dead host: the case is not covered"
        dead_run = on_dead[0]
        assert dead_run.state == "ended" and dead_run.started_at is None, (dead_run.state, dead_run.outcome)
        assert dead_run.outcome.startswith("not launched: host main0 did not answer"), dead_run.outcome
        moved = dead_run.job_id
        assert moved in report.requeued and jobs_by_id(store)[moved].state == "QUEUED", report

        done = rounds_until(store, sshd_hosts, CONFIG, lambda js: all(js[j].state in ("COMPLETED", "FAILED")
                                                                       for j in jobs),
                            timeout_s=40, settings=QUICK_LOSS)
        assert {done[j].state for j in jobs} == {"COMPLETED"}, {j: done[j].end_reason for j in jobs}
        check_invariants(store, jobs, ledger)
        assert [r.host for r in runs_of(store, moved) if r.started_at is not None] == ["main1"]
        with store.session() as s:
            kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == moved))]
        assert "not_launched" in kinds and "launch_failed" not in kinds and "lost" not in kinds, kinds
    finally:
        if main0.process is None:
            main0.start()
        store.dispose()


@pytest.mark.parametrize("dead", ["main0", "main1"])
def test_a_wide_job_one_of_whose_hosts_died_idle_stops_its_started_node_and_runs_once_later(
        sshd_hosts, tmp_path, dead):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    host = sshd_hosts.hosts[dead]
    try:
        register(store, sshd_hosts, tmp_path / "hosts")
        ledger = tmp_path / "ledger"
        job = submit(store, JobRequest(ledger_command(ledger, "sleep 2"), 4, "alice", "vc-a", name="wide"))
        host.stop()
        report = one_round(store, sshd_hosts, CONFIG, settings=QUICK_LOSS)
        runs = {r.host: r for r in runs_of(store, job)}
        assert set(runs) == {"main0", "main1"}, runs
        assert job in report.requeued and jobs_by_id(store)[job].state == "QUEUED", report
        assert all(r.state == "ended" for r in runs.values()), {h: (r.state, r.outcome) for h, r in runs.items()}
        assert runs[dead].started_at is None and runs[dead].outcome.startswith("not launched"), runs[dead].outcome
        other = runs["main1" if dead == "main0" else "main0"]
        if runs[dead].node_rank == 1:  # the other node started first: the round stopped it
            assert other.pid is not None and other.outcome == "stopped", (other.pid, other.outcome)
            assert not pid_alive(other.pid)
        else:  # the first node did not start: the second was never launched
            assert other.started_at is None, other.outcome

        time.sleep(3.5)  # past the loss timeout while down: nothing of the job is left for it to fail
        one_round(store, sshd_hosts, CONFIG, settings=QUICK_LOSS)
        assert jobs_by_id(store)[job].state == "QUEUED", jobs_by_id(store)[job].end_reason
        host.start()
        done = rounds_until(store, sshd_hosts, CONFIG, lambda js: js[job].state in ("COMPLETED", "FAILED"),
                            timeout_s=40, settings=QUICK_LOSS)
        assert done[job].state == "COMPLETED", done[job].end_reason
        check_invariants(store, [job], ledger)
    finally:
        if host.process is None:
            host.start()
        store.dispose()


def test_a_launch_tried_before_keeps_its_run_planned_while_the_host_is_down(sshd_hosts, tmp_path):
    """A round died after its launch reached the host: the next round cannot connect, and since the run may be
    running there it stays planned (no requeue); once the host answers the launch finds it already running."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    try:
        register(store, sshd_hosts, tmp_path / "hosts")
        ledger = tmp_path / "ledger"
        job = submit(store, JobRequest(ledger_command(ledger, "sleep 3"), 2, "alice", "vc-a", name="once"))
        crashing = replace(SETTINGS, holder="crashing", lease_ttl_s=30)
        with pytest.raises(InjectedCrash):
            one_round(store, sshd_hosts, CONFIG, settings=crashing, crash_at="after_launch")
        (run,) = runs_of(store, job)
        assert run.state == "planned" and run.launch_tried_at is not None, (run.state, run.launch_tried_at)
        with store.session() as s:  # the dead round's lease lapses
            s.execute(update(LeaseRow).values(expires_at=time.time() - 1))
        host = sshd_hosts.hosts[run.host]
        host.stop()
        try:
            report = one_round(store, sshd_hosts, CONFIG)
            assert run.host in report.unreachable and job not in report.requeued, report
            (again,) = runs_of(store, job)
            assert again.state == "planned", (again.state, again.outcome)
            assert jobs_by_id(store)[job].state == "RUNNING"
        finally:
            host.start()
        done = rounds_until(store, sshd_hosts, CONFIG, lambda js: js[job].state in ("COMPLETED", "FAILED"),
                            timeout_s=40)
        assert done[job].state == "COMPLETED", done[job].end_reason
        check_invariants(store, [job], ledger)
        assert len(runs_of(store, job)) == 1
    finally:
        store.dispose()


def test_runs_planned_before_the_migration_count_as_tried(tmp_path):
    """An older round may have sent a planned run's launch: after the upgrade it is not taken for a first try."""
    from alembic import command

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import RunRow
    from lucid_core.runtime.store.store import _alembic_config

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("h0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "h0")))
    job = submit(store, JobRequest("true", 1, "alice", "vc-a"))
    with store.session() as s:
        for run_id, state in (("r-planned", "planned"), ("r-ended", "ended")):
            s.add(RunRow(run_id=run_id, host="h0", job_id=job, kind="main", pool="main", gpu_indices=[0],
                         node_rank=0, state=state, planned_at=123.0))
    with store.engine.begin() as conn:  # back to the revision before launch_tried_at
        command.downgrade(_alembic_config(conn), "0014")
    store.dispose()
    upgraded = Store(url)
    try:
        with upgraded.session() as s:
            tried = {r.run_id: r.launch_tried_at for r in s.scalars(select(RunRow))}
        assert tried == {"r-planned": 123.0, "r-ended": None}, tried
    finally:
        upgraded.dispose()

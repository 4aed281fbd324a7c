"""A wide job (4 GPUs over two 2-GPU sshd hosts) one of whose hosts refuses its launch once, for a reason
that may pass (its work directory cannot be made), over real sshd hosts on loopback.

The job must go back to the queue, nothing of its first try may keep running on the host that did start
its node (checked on the host: the process group and the job's own pid), and once the host is fixed the
job must run exactly once and complete (the store's runs and a ledger the job's processes write).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace

import pytest
from lucid_invariants import check_invariants, ledger_command
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, pid_alive, register, rounds_until, runs_of
from sqlalchemy import select

from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import JobEventRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

pytestmark = pytest.mark.ssh

CONFIG = fast_config(**{"profiler.enabled": False, "cluster.gpus_per_node": 2})  # 2-GPU hosts: 4 GPUs span two
# the refusing host cools down for a second only, so the job can come back to it once it is fixed
WIDE_SETTINGS = replace(SETTINGS, host_cooldown_s=1.0)


def live_pids(pgid: int | None = None, pids: set[int] | None = None) -> list[str]:
    """`ps` lines of the live (non-zombie) processes in process group `pgid` or with a pid in `pids`."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat=,args="], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        pid, group, stat = line.split(None, 3)[:3]
        if stat.startswith("Z"):
            continue
        if (pgid is not None and int(group) == pgid) or (pids and int(pid) in pids):
            found.append(line.strip())
    return found


def ledger_lines(ledger) -> list[list[str]]:
    return [line.split() for line in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.mark.parametrize("refusing", ["main1", "main0"])
def test_a_wide_job_one_of_whose_hosts_refuses_its_launch_once_is_requeued_stopped_and_runs_once(
        sshd_hosts, tmp_path, refusing):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    try:
        workroot = tmp_path / "hosts"
        workroot.mkdir()
        register(store, sshd_hosts, workroot)
        blocker = workroot / refusing  # a file where the host's work directory should be: mkdir -p fails
        blocker.write_text("not a directory\n")
        ledger = tmp_path / "ledger"
        job = submit(store, JobRequest(ledger_command(ledger, "sleep 3"), 4, "alice", "vc-a", name="wide"))

        report = one_round(store, sshd_hosts, CONFIG, settings=WIDE_SETTINGS)
        assert any("cannot create work directory" in e for e in report.errors), report
        assert job in report.requeued and job not in report.ended, report
        runs = {r.host: r for r in runs_of(store, job)}
        assert set(runs) == {"main0", "main1"}, runs
        assert jobs_by_id(store)[job].state == "QUEUED"
        assert all(r.state == "ended" for r in runs.values()), {h: (r.state, r.outcome) for h, r in runs.items()}
        other = runs["main0" if refusing == "main1" else "main1"]
        assert runs[refusing].started_at is None and runs[refusing].outcome.startswith("launch failed")
        time.sleep(0.5)  # room for a node that is (wrongly) still alive to show itself in the ledger
        job_pids = {int(w[3]) for w in ledger_lines(ledger) if w[0] == "S"}
        if runs[refusing].node_rank == 1:  # the other node started first: it must have been stopped
            assert other.pid is not None, "the first node was not launched: this case no longer covers the stop"
            assert not live_pids(pgid=other.pid, pids=job_pids), live_pids(pgid=other.pid, pids=job_pids)
            assert other.stop_reason == "peer_ended" and other.outcome == "stopped", (other.stop_reason, other.outcome)
        else:  # the first node was refused: the second must not start at all
            assert other.pid is None and other.started_at is None, (other.pid, other.outcome)
            assert not job_pids, ledger_lines(ledger)
        first_try = other.run_id
        assert not [w for w in ledger_lines(ledger) if w[0] == "E"], "a node of the first try ran to its end"

        blocker.unlink()  # the host is fixed
        jobs = rounds_until(store, sshd_hosts, CONFIG, lambda jobs: jobs[job].state in ("COMPLETED", "FAILED"),
                            timeout_s=40, settings=WIDE_SETTINGS)
        assert jobs[job].state == "COMPLETED", jobs[job].end_reason
        check_invariants(store, [job], ledger)
        ended = [(w[1], w[2]) for w in ledger_lines(ledger) if w[0] == "E"]
        assert len(ended) == 2 and {rank for _, rank in ended} == {"0", "1"}, ledger_lines(ledger)
        assert {run_id for run_id, _ in ended} != {first_try} and len({run_id for run_id, _ in ended}) == 1
        with store.session() as s:
            kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job))]
        assert kinds.count("launch_failed") == 1 and kinds.count("failed") == 0, kinds
    finally:
        store.dispose()


class HostDiesOnLaunchFailure(SchedulingRound):
    """A round in which `host` stops answering the moment another node's launch has failed: its sshd is
    killed and the round's open connections are dropped, so the stop of the node that started cannot reach it."""

    def __init__(self, *args, host, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dying_host = host

    def _launch_failed(self, run, why, final=False):
        if self.dying_host.process is not None:
            self.dying_host.stop()
            self.executor.close()
        return super()._launch_failed(run, why, final)


def start_wide_job_whose_first_host_dies(store: Store, sshd_hosts, tmp_path, body: str, settings):
    """Submit a 4-GPU job over main0 and main1 whose launch main1 refuses (its work directory is a file) while
    main0, whose node started, stops answering: returns (job, ledger, the blocking file, main0's node), that
    node still running with stop reason peer_ended and its process alive behind the dead sshd."""
    main0 = sshd_hosts.hosts["main0"]
    workroot = tmp_path / "hosts"
    workroot.mkdir()
    register(store, sshd_hosts, workroot)
    blocker = workroot / "main1"
    blocker.write_text("not a directory\n")
    ledger = tmp_path / "ledger"
    job = submit(store, JobRequest(ledger_command(ledger, body), 4, "alice", "vc-a", name="wide"))
    executor = ssh_executor(str(sshd_hosts.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    report = HostDiesOnLaunchFailure(store, executor, CONFIG, settings, host=main0).run()
    assert main0.process is None, "main1's launch did not fail: the fault was not injected"
    assert job in report.requeued and "main0" in report.unreachable, report
    first = next(r for r in runs_of(store, job) if r.host == "main0")
    assert (first.state, first.stop_reason) == ("running", "peer_ended"), (first.state, first.outcome)
    assert pid_alive(first.pid), "the node stopped without its host: the test no longer covers an unreachable one"
    return job, ledger, blocker, first


def test_a_started_node_whose_host_does_not_answer_the_stop_stays_stopping_until_it_does(sshd_hosts, tmp_path):
    """main1 refuses the launch and main0, whose node started, is unreachable for the stop: the node is not
    marked ended while it may still run, the job is not placed again meanwhile, and the first round that
    reaches main0 stops it; then the job runs once and completes."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    main0 = sshd_hosts.hosts["main0"]
    try:
        job, ledger, blocker, first = start_wide_job_whose_first_host_dies(store, sshd_hosts, tmp_path, "sleep 8",
                                                                          WIDE_SETTINGS)
        runs = {r.host: r for r in runs_of(store, job)}
        assert runs["main1"].node_rank == 1, "main0 was not launched first: this test no longer covers the stop"

        one_round(store, sshd_hosts, CONFIG, settings=WIDE_SETTINGS)  # main0 still down: nothing may change
        assert [(r.host, r.state) for r in runs_of(store, job)] == [("main0", "running"), ("main1", "ended")]
        assert jobs_by_id(store)[job].state == "QUEUED"

        main0.start()
        blocker.unlink()
        one_round(store, sshd_hosts, CONFIG, settings=WIDE_SETTINGS)
        first = next(r for r in runs_of(store, job) if r.run_id == first.run_id and r.host == "main0")
        assert (first.state, first.outcome) == ("ended", "stopped"), (first.state, first.outcome)
        assert not live_pids(pgid=first.pid), live_pids(pgid=first.pid)

        jobs = rounds_until(store, sshd_hosts, CONFIG, lambda jobs: jobs[job].state in ("COMPLETED", "FAILED"),
                            timeout_s=40, settings=WIDE_SETTINGS)
        assert jobs[job].state == "COMPLETED", jobs[job].end_reason
        check_invariants(store, [job], ledger)
        ended = {(w[1], w[2]) for w in ledger_lines(ledger) if w[0] == "E"}
        assert len(ended) == 2 and first.run_id not in {run_id for run_id, _ in ended}, ledger_lines(ledger)
    finally:
        if main0.process is None:
            main0.start()
        store.dispose()


def test_a_wide_job_a_host_keeps_refusing_fails_after_bounded_tries_with_nothing_left_running(sshd_hosts, tmp_path):
    """Tries are counted per run, also when the refused node is not rank 0 (its started peer ends as stopped)."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    try:
        workroot = tmp_path / "hosts"
        workroot.mkdir()
        register(store, sshd_hosts, workroot)
        (workroot / "main1").write_text("not a directory\n")  # never fixed
        ledger = tmp_path / "ledger"
        job = submit(store, JobRequest(ledger_command(ledger, "sleep 30"), 4, "alice", "vc-a", name="wide"))
        impatient = replace(SETTINGS, host_cooldown_s=0.1)
        jobs = rounds_until(store, sshd_hosts, CONFIG, lambda jobs: jobs[job].state in ("COMPLETED", "FAILED"),
                            timeout_s=40, settings=impatient)
        assert jobs[job].state == "FAILED" and "could not be launched (3 tries)" in jobs[job].end_reason
        runs = runs_of(store, job)
        assert len({r.run_id for r in runs}) == 3 and all(r.state == "ended" for r in runs)
        started = [r for r in runs if r.pid is not None]
        assert started and all(r.host == "main0" and r.outcome == "stopped" for r in started), [
            (r.run_id, r.host, r.outcome) for r in runs]
        job_pids = {int(w[3]) for w in ledger_lines(ledger) if w[0] == "S"}
        for run in started:
            assert not live_pids(pgid=run.pid, pids=job_pids), live_pids(pgid=run.pid, pids=job_pids)
        check_invariants(store, [job], ledger, allow_states=("FAILED",))
    finally:
        store.dispose()


@pytest.mark.parametrize("requeue", [False, True], ids=["fail", "requeue"])
def test_a_started_node_whose_host_never_answers_the_stop_is_lost_after_the_timeout(sshd_hosts, tmp_path, requeue):
    """As above, but main0 stays away past `host_lost_after_s`: its node is marked lost (its GPUs stay held, the
    process may live on behind the partition) and the job, queued again after the failed launch, ends FAILED as
    lost, once, or with `requeue_lost` stays queued and runs once when main0 is back. When main0 answers again,
    the first round stops what is left of the lost node before anything new lands there."""
    from lucid_core.runtime.hosts.loss import LOST_RUN_STATE

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    main0 = sshd_hosts.hosts["main0"]
    settings = replace(WIDE_SETTINGS, host_lost_after_s=2.0, requeue_lost=requeue)
    try:
        job, ledger, blocker, first = start_wide_job_whose_first_host_dies(store, sshd_hosts, tmp_path, "sleep 12",
                                                                          settings)
        down_at = time.time()
        blocker.unlink()  # main1 could take the job now; main0 cannot answer

        deadline = time.monotonic() + 30
        while True:
            one_round(store, sshd_hosts, CONFIG, settings=settings)
            node = next(r for r in runs_of(store, job) if r.run_id == first.run_id and r.host == "main0")
            state = jobs_by_id(store)[job].state
            if node.state == LOST_RUN_STATE:
                break
            assert time.time() - down_at < settings.host_lost_after_s + 20, "the node was never marked lost"
            assert state == "QUEUED", state  # frozen, not placed again, while its node may run
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert node.ended_at - down_at >= settings.host_lost_after_s - 0.5, (node.ended_at, down_at)
        assert pid_alive(first.pid)  # still alive behind the partition: its GPUs stay held
        row = jobs_by_id(store)[job]
        with store.session() as s:
            kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job))]
        if requeue:
            assert row.state == "QUEUED", (row.state, row.end_reason)
            one_round(store, sshd_hosts, CONFIG, settings=settings)  # main0's GPUs held by the lost node
            assert jobs_by_id(store)[job].state == "QUEUED"
        else:
            assert row.state == "FAILED" and row.end_reason.startswith("lost: host main0"), (row.state, row.end_reason)
            assert kinds.count("failed") == 1 and "requeued" not in kinds[kinds.index("lost"):], kinds

        main0.start()
        one_round(store, sshd_hosts, CONFIG, settings=settings)
        node = next(r for r in runs_of(store, job) if r.run_id == first.run_id and r.host == "main0")
        assert node.state == "ended" and "reaped" in node.outcome, (node.state, node.outcome)
        time.sleep(0.3)
        assert not live_pids(pgid=first.pid), live_pids(pgid=first.pid)
        if requeue:
            jobs = rounds_until(store, sshd_hosts, CONFIG, lambda jobs: jobs[job].state in ("COMPLETED", "FAILED"),
                                timeout_s=60, settings=settings)
            assert jobs[job].state == "COMPLETED", jobs[job].end_reason
        else:
            assert {r.run_id for r in runs_of(store, job)} == {first.run_id}  # no new try
            assert jobs_by_id(store)[job].state == "FAILED"
        check_invariants(store, [job], ledger if requeue else None)
        ended = {w[1] for w in ledger_lines(ledger) if w[0] == "E"}
        assert first.run_id not in ended and len(ended) == (1 if requeue else 0), ledger_lines(ledger)
    finally:
        if main0.process is None:
            main0.start()
        store.dispose()

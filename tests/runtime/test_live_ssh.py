"""The live scheduler against real sshd hosts on loopback, with real job processes."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from runtime_helpers import (
    SETTINGS,
    fast_config,
    jobs_by_id,
    one_round,
    pid_alive,
    register,
    rounds_until,
    runs_of,
)
from sqlalchemy import select, update

from lucid_core.domain import JobState
from lucid_core.runtime.round.scheduling_round import InjectedCrash, RoundSettings
from lucid_core.runtime.store.schema import DecisionRow, JobEventRow, LeaseRow, ProfileSampleRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

pytestmark = pytest.mark.ssh


def gated(root, then: str = "true") -> tuple[str, object]:
    """A command that runs until the test opens its gate (a file), then `then`: no race with round timing."""
    gate = root / f"gate-{time.monotonic_ns()}"
    return f"until [ -e {gate} ]; do sleep 0.05; done; {then}", gate


def terminal(job_id):
    return lambda jobs: jobs[job_id].state in ("COMPLETED", "FAILED", "CANCELLED")


def test_job_that_ends_inside_profiling_ends_there(live):
    store, cluster, _ = live
    job = submit(store, JobRequest("sleep 0.3; echo done", 1, "alice", "vc-a", name="debug"))
    jobs = rounds_until(store, cluster, fast_config(), terminal(job))
    row = jobs[job]
    assert row.state == "COMPLETED" and row.exit_code == 0 and row.ended_in_profiling
    assert not row.profiled  # it ended inside its window: no profile, as in the simulator
    runs = runs_of(store, job)
    assert [r.kind for r in runs] == ["profiling"] and runs[0].host == "prof0"


def _ends_unread(live, command: str, settings=None):
    """Submit `command`, launch it, let it end with no round between (its 1 s window over), then one round."""
    store, cluster, root = live
    kwargs = {} if settings is None else {"settings": settings}
    job = submit(store, JobRequest(command, 1, "alice", "vc-a", name="ends-unread"))
    rounds_until(store, cluster, fast_config(), lambda j: any(r.started_at for r in runs_of(store, job)), **kwargs)
    run = runs_of(store, job)[0]
    exit_file = root / "hosts" / run.host / run.run_id / "exit_code"
    deadline = time.monotonic() + 30
    while not exit_file.exists() or time.time() < run.profiling_until + 0.2:
        assert time.monotonic() < deadline, f"{exit_file} never written"
        time.sleep(0.1)
    one_round(store, cluster, fast_config(), **kwargs)
    return job, jobs_by_id(store)[job]


def test_a_job_that_outlives_its_window_but_ends_before_a_round_reads_it_is_profiled(live):
    """The simulator profiles every job that outlives its window; live, one that ends between the window's end
    and the next round must not lose its profile (the Update Engine trains on stored profiles)."""
    store = live[0]
    job, row = _ends_unread(live, "sleep 2")  # window: 1 s
    assert row.state == "COMPLETED" and row.profiled and row.profile_emulated and row.gpu_util > 0
    assert not row.ended_in_profiling  # it outlived its window (the simulator stops it there; it ends later)
    with store.session() as s:
        samples = s.scalars(select(ProfileSampleRow).where(ProfileSampleRow.job_id == job)).all()
        events = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job))]
    assert samples and "profiled" in events
    assert max(x.time for x in samples) - min(x.time for x in samples) >= 0.75  # the whole 1 s window, a sample less


def test_a_job_that_ended_inside_a_window_no_longer_than_a_sample_gets_no_profile(live):
    """A 1 s window sampled once a second: the agent's sample after the job's end must not pass for a whole
    window (the samples of a window no longer than an interval cannot tell)."""
    _, row = _ends_unread(live, "sleep 0.3", settings=replace(SETTINGS, telemetry_interval_s=1.0))
    assert row.state == "COMPLETED" and row.ended_in_profiling and not row.profiled


def test_long_job_is_profiled_then_placed_on_the_main_cluster(live):
    store, cluster, root = live
    command, gate = gated(root)
    job = submit(store, JobRequest(command, 1, "bob", "vc-a", name="train"))
    jobs = rounds_until(store, cluster, fast_config(), lambda j: j[job].state == "RUNNING", timeout_s=20)
    row = jobs[job]
    assert row.profiled and row.profile_emulated and row.share_class is not None
    assert row.predicted_duration is not None and row.known_min_duration > 0.5
    runs = runs_of(store, job)
    assert [r.kind for r in runs] == ["profiling", "main"]
    assert runs[0].state == "ended" and runs[0].outcome == "stopped" and runs[0].exit_code == 143
    assert runs[1].host in {"main0", "main1"}
    with store.session() as s:
        samples = s.scalars(select(ProfileSampleRow).where(ProfileSampleRow.job_id == job)).all()
        kinds = [d.kind for d in s.scalars(select(DecisionRow).where(DecisionRow.job_id == job))]
    assert samples and all(sample.emulated for sample in samples)
    assert kinds == ["StartProfiling", "StopProfiling", "Place"]
    gate.touch()
    jobs = rounds_until(store, cluster, fast_config(), terminal(job))
    assert jobs[job].state == "COMPLETED" and not jobs[job].ended_in_profiling


def test_two_tiny_jobs_share_one_gpu(sshd_hosts, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts", gpus={"prof0": 2, "main0": 1})
    tiny = lambda job: (12.0, 4.0, 1500.0)  # noqa: E731 - a light catalog profile: Tiny
    a = submit(store, JobRequest("sleep 30", 1, "carol", "vc-a", name="tiny-a"))
    b = submit(store, JobRequest("sleep 30", 1, "carol", "vc-a", name="tiny-b"))
    try:
        jobs = rounds_until(store, sshd_hosts, fast_config(),
                            lambda j: j[a].state == "RUNNING" and j[b].state == "RUNNING",
                            timeout_s=20, emulated_profile=tiny)
        assert jobs[a].share_class == 0 and jobs[b].share_class == 0
        main_a = next(r for r in runs_of(store, a) if r.kind == "main")
        main_b = next(r for r in runs_of(store, b) if r.kind == "main")
        assert (main_a.host, main_a.gpu_indices) == (main_b.host, main_b.gpu_indices) == ("main0", [0])
        assert {main_a.partner, main_b.partner} == {a, b}
        from lucid_core.runtime.surfaces.explain import explain

        for me, other in ((a, b), (b, a)):
            info = explain(store, me, fast_config(), time.time())
            assert info["partner"]["job_id"] == other and info["partner"]["why"]
            # a job its partner joined gives the partner's reason as the partner's, not as naming itself a partner
            why = info["partner"]["why"]
            assert f"shares with {me}" not in why or why.startswith(f"{other} was placed beside it"), why
            assert info["packing"]["class"] == "TINY"
        assert pid_alive(main_a.pid) and pid_alive(main_b.pid)
    finally:
        cancel(store, a)
        cancel(store, b)
        jobs = rounds_until(store, sshd_hosts, fast_config(), lambda j: terminal(a)(j) and terminal(b)(j))
        store.dispose()
    assert jobs[a].state == jobs[b].state == "CANCELLED"


def test_failing_job_reports_its_exit_code(live):
    store, cluster, root = live
    command, gate = gated(root, "echo oops >&2; exit 3")
    job = submit(store, JobRequest(command, 1, "dave", "vc-a"))
    rounds_until(store, cluster, fast_config(), lambda j: j[job].state == "RUNNING", timeout_s=20)
    gate.touch()
    jobs = rounds_until(store, cluster, fast_config(), terminal(job))
    assert jobs[job].state == "FAILED" and jobs[job].exit_code == 3 and not jobs[job].ended_in_profiling
    assert runs_of(store, job)[-1].exit_code == 3


def test_cancel_stops_a_running_job(live):
    store, cluster, _ = live
    job = submit(store, JobRequest("sleep 60", 1, "erin", "vc-a"))
    rounds_until(store, cluster, fast_config(), lambda j: j[job].state == "PROFILING")
    run = runs_of(store, job)[-1]
    assert pid_alive(run.pid)
    cancel(store, job)
    jobs = rounds_until(store, cluster, fast_config(), terminal(job))
    assert jobs[job].state == "CANCELLED"
    assert not pid_alive(run.pid)


def test_host_whose_sshd_dies_mid_job_loses_nothing(live):
    store, cluster, root = live
    command, gate = gated(root, "echo finished")
    job = submit(store, JobRequest(command, 1, "frank", "vc-a"))
    rounds_until(store, cluster, fast_config(), lambda j: j[job].state == "RUNNING", timeout_s=20)
    run = next(r for r in runs_of(store, job) if r.kind == "main")
    host = cluster.hosts[run.host]
    host.stop()
    try:
        report = one_round(store, cluster, fast_config())
        assert run.host in report.unreachable
        assert jobs_by_id(store)[job].state == "RUNNING"
        assert pid_alive(run.pid)  # the job itself is untouched by its host's sshd dying
        gate.touch()  # the job ends while its host cannot be reached
        deadline = time.monotonic() + 10
        while pid_alive(run.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        one_round(store, cluster, fast_config())
        assert jobs_by_id(store)[job].state == "RUNNING"
    finally:
        host.start()
    jobs = rounds_until(store, cluster, fast_config(), terminal(job))
    assert jobs[job].state == "COMPLETED" and jobs[job].exit_code == 0
    assert len(runs_of(store, job)) == 2  # nothing was launched again


@pytest.mark.parametrize("step", ["after_record", "after_launch"])
def test_crash_between_decision_and_launch_is_repaired_without_running_twice(live, step):
    store, cluster, root = live
    slow_window = fast_config(**{"profiler.tprof_s": 60})  # the window must not close during the test
    job = submit(store, JobRequest("sleep 30", 1, "gina", "vc-a"))
    settings = RoundSettings(stop_grace_s=1, telemetry_interval_s=0.25, lease_ttl_s=30, holder="crashing")
    with pytest.raises(InjectedCrash):
        one_round(store, cluster, slow_window, settings=settings, crash_at=step)
    with store.session() as s:
        pending = s.scalars(select(DecisionRow).where(DecisionRow.status == "pending")).all()
        planned = s.scalars(select(RunRow).where(RunRow.job_id == job)).all()
    assert [d.kind for d in pending] == ["StartProfiling"]
    assert [r.state for r in planned] == ["planned"]
    run_dir = root / "hosts" / planned[0].host / planned[0].run_id
    assert run_dir.exists() == (step == "after_launch")
    assert one_round(store, cluster, slow_window).acquired is False  # the dead round's lease still holds
    with store.session() as s:  # let the dead round's lease lapse (its TTL is tested elsewhere)
        s.execute(update(LeaseRow).values(expires_at=time.time() - 1))
    report = one_round(store, cluster, slow_window)
    assert report.acquired
    runs = runs_of(store, job)
    assert len(runs) == 1 and runs[0].state == "running" and pid_alive(runs[0].pid)
    assert report.launched == ([] if step == "after_launch" else [runs[0].run_id])
    assert (run_dir / "pid").read_text().strip() == str(runs[0].pid)
    with store.session() as s:
        launches = s.scalars(select(JobEventRow).where(JobEventRow.job_id == job,
                                                       JobEventRow.kind == "launched")).all()
        assert s.scalars(select(DecisionRow).where(DecisionRow.status == "pending")).all() == []
    assert len(launches) == 1


def test_unknown_host_key_is_refused(sshd_hosts, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts")
    job = submit(store, JobRequest("true", 1, "hank", "vc-a"))
    other = tmp_path / "known_hosts"
    lines = sshd_hosts.known_hosts.read_text().splitlines()
    port = sshd_hosts.hosts["prof0"].port
    other.write_text("\n".join(line for line in lines if f"]:{port} " not in line) + "\n")
    assert len(other.read_text().splitlines()) == len(lines) - 1
    cluster = type("Cluster", (), {"known_hosts": other, "hosts": sshd_hosts.hosts})()
    # no idle probe (it would find the key refused before any placement): the launch meets it
    report = one_round(store, cluster, fast_config(), settings=replace(SETTINGS, idle_probe_s=None))
    assert "prof0" in report.unreachable
    with store.session() as s:
        run = s.scalars(select(RunRow).where(RunRow.job_id == job)).one()
        from lucid_core.runtime.store.schema import HostRow

        host = s.get(HostRow, "prof0")
    assert not host.reachable and "known_hosts" in (host.last_error or "")
    # refused before any login, so nothing ran there: the run ends and the job waits for a host that answers
    assert run.state == "ended" and run.outcome.startswith("not launched: host prof0"), (run.state, run.outcome)
    assert jobs_by_id(store)[job].state == JobState.SUBMITTED.value
    store.dispose()


def test_an_idle_unreachable_host_is_probed_and_stays_out_until_it_answers(live):
    from lucid_core.runtime.store.schema import HostRow

    store, cluster, _ = live
    host = cluster.hosts["main1"]
    host.stop()
    try:
        with store.session() as s:
            s.get(HostRow, "main1").reachable = False
        report = one_round(store, cluster, fast_config())
        with store.session() as s:
            assert not s.get(HostRow, "main1").reachable
        assert "main1" in report.unreachable
    finally:
        host.start()
    report = one_round(store, cluster, fast_config())
    with store.session() as s:
        assert s.get(HostRow, "main1").reachable
    assert report.unreachable == []


def test_a_host_gone_too_long_loses_its_job_which_is_reaped_when_it_returns(live):
    store, cluster, _ = live
    settings = RoundSettings(stop_grace_s=1, telemetry_interval_s=0.25, lease_ttl_s=5, holder="test-round",
                             host_lost_after_s=0.5)
    job = submit(store, JobRequest("sleep 60", 1, "ivy", "vc-a"))
    rounds_until(store, cluster, fast_config(), lambda j: j[job].state == "PROFILING", settings=settings)
    run = runs_of(store, job)[-1]
    host = cluster.hosts[run.host]
    host.stop()
    try:
        one_round(store, cluster, fast_config(), settings=settings)  # first seen down
        time.sleep(0.6)
        report = one_round(store, cluster, fast_config(), settings=settings)
        row = jobs_by_id(store)[job]
        assert row.state == "FAILED" and "unreachable" in row.end_reason and report.ended == {job: "FAILED"}
        assert pid_alive(run.pid)  # nobody could stop it while its host was away
    finally:
        host.start()
    one_round(store, cluster, fast_config(), settings=settings)
    assert [r.state for r in runs_of(store, job)] == ["ended"]
    assert not pid_alive(run.pid)  # reaped once the host answered


def test_eta_neither_ends_a_run_on_an_unreachable_host_nor_places_work_there(live):
    """main0 and main1 have 2 GPUs each; a 2-GPU job runs on one of them, whose sshd then dies, and a 4-GPU job
    waits for both. Nobody knows when the run on the silent host ends, so the what-if never ends it: the wide job
    gets no start (it used to get one at the run's predicted end) and the answer names the host; the running job's
    end is not known either. Once the host answers again, eta gives times again."""
    from lucid_core.runtime.surfaces.eta import estimate

    store, cluster, root = live
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    command, gate = gated(root)
    running = submit(store, JobRequest(command, 2, "ann", "vc-a"))
    rounds_until(store, cluster, config, lambda j: j[running].state == "RUNNING", timeout_s=20)
    silent = next(r.host for r in runs_of(store, running) if r.state == "running")
    wide = submit(store, JobRequest("true", 4, "ann", "vc-a"))
    host = cluster.hosts[silent]
    host.stop()
    try:
        report = one_round(store, cluster, config)
        assert silent in report.unreachable and jobs_by_id(store)[wide].state == "QUEUED"
        eta = estimate(store, wide, config, time.time())
        assert (eta.start, eta.end) == (None, None), eta
        assert eta.note.startswith("not placed while hosts it could use take no new work") and \
            f"{silent} unreachable" in eta.note, eta.note
        eta = estimate(store, running, config, time.time())
        assert eta.end is None and eta.note.startswith("running on a host that does not answer"), eta
        assert silent in eta.note
    finally:
        host.start()
    one_round(store, cluster, config)
    assert estimate(store, wide, config, time.time()).start is not None
    gate.touch()

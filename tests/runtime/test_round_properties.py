"""Round properties with the local executor: wide jobs over several hosts, draining, refused launches,
and every submitted job ending in exactly one terminal state under churn."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from runtime_helpers import SETTINGS, fast_config, jobs_by_id, runs_of
from sqlalchemy import select

from lucid_core.runtime.hosts.inventory import HostSpec, add_host, drain_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import JobEventRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def _store(tmp_path, hosts):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    for name, pool, gpus in hosts:
        add_host(store, HostSpec(name, executor="local", pool=pool, vc="vc-a", telemetry="emulated", gpus=gpus,
                                 workdir=str(tmp_path / name)))
    return store


def _until(store, config, done, timeout_s=20.0, settings=SETTINGS):
    deadline = time.monotonic() + timeout_s
    while True:
        SchedulingRound(store, local_executor(), config, settings).run()
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)


def test_a_job_wider_than_a_node_runs_one_process_per_host_and_fails_as_one(tmp_path):
    store = _store(tmp_path, [("p0", "profiling", 1), ("m0", "main", 1), ("m1", "main", 1)])
    config = fast_config(**{"cluster.gpus_per_node": 1, "profiler.nprof_gpus": 1})
    out = tmp_path / "ranks"
    out.mkdir()
    ok = submit(store, JobRequest(f'echo "$LUCID_NODE_RANK/$LUCID_NUM_NODES $CUDA_VISIBLE_DEVICES" '
                                  f'> {out}/rank_$LUCID_NODE_RANK', 2, "u", "vc-a"))
    jobs = _until(store, config, lambda j: j[ok].state in TERMINAL)
    assert jobs[ok].state == "COMPLETED"
    runs = runs_of(store, ok)
    assert sorted((r.host, r.node_rank, r.kind) for r in runs) == [("m0", 0, "main"), ("m1", 1, "main")]
    assert sorted(p.read_text() for p in out.iterdir()) == ["0/2 0\n", "1/2 0\n"]
    bad = submit(store, JobRequest('[ "$LUCID_NODE_RANK" = 1 ] && exit 4; sleep 30', 2, "u", "vc-a"))
    jobs = _until(store, config, lambda j: j[bad].state in TERMINAL)
    assert (jobs[bad].state, jobs[bad].exit_code) == ("FAILED", 4)
    assert all(r.state == "ended" for r in runs_of(store, bad))  # rank 0 was taken down with it
    store.dispose()


def test_draining_hosts_get_no_new_jobs_until_undrained(tmp_path):
    store = _store(tmp_path, [("p0", "profiling", 1), ("m0", "main", 1), ("m1", "main", 1)])
    config = fast_config(**{"profiler.enabled": False})
    drain_host(store, "m0")
    drain_host(store, "m1")
    job = submit(store, JobRequest("sleep 0.2", 1, "u", "vc-a"))
    for _ in range(3):
        SchedulingRound(store, local_executor(), config, SETTINGS).run()
    row = jobs_by_id(store)[job]
    assert row.state == "QUEUED" and "no compact fit" in row.pending_reason
    drain_host(store, "m1", draining=False)
    jobs = _until(store, config, lambda j: j[job].state in TERMINAL)
    assert jobs[job].state == "COMPLETED" and [r.host for r in runs_of(store, job)] == ["m1"]
    store.dispose()


def test_a_job_whose_launch_is_refused_fails_after_bounded_tries(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the work directory should be")
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(blocker / "runs")))
    job = submit(store, JobRequest("true", 1, "u", "vc-a"))
    impatient = replace(SETTINGS, host_cooldown_s=0.1)
    jobs = _until(store, fast_config(**{"profiler.enabled": False}), lambda j: j[job].state in TERMINAL,
                  settings=impatient)
    assert jobs[job].state == "FAILED" and "could not be launched (3 tries)" in jobs[job].end_reason
    assert not jobs[job].ended_in_profiling
    store.dispose()


def test_a_host_that_refuses_a_launch_cools_down_and_the_job_runs_elsewhere(tmp_path):
    from lucid_core.runtime.store.schema import HostRow

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the work directory should be")
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("a-broken", executor="local", vc="vc-a", gpus=1, workdir=str(blocker / "runs")))
    add_host(store, HostSpec("b-healthy", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "ok")))
    drain_host(store, "b-healthy")  # first only the broken host is offered
    job = submit(store, JobRequest("true", 1, "u", "vc-a"))
    config = fast_config(**{"profiler.enabled": False})
    SchedulingRound(store, local_executor(), config, SETTINGS).run()
    with store.session() as s:
        broken = s.get(HostRow, "a-broken")
    assert broken.cooldown_until > time.time() + 60 and "launch refused" in broken.last_error
    assert jobs_by_id(store)[job].state == "QUEUED"
    drain_host(store, "b-healthy", draining=False)
    jobs = _until(store, config, lambda j: j[job].state in TERMINAL)
    assert jobs[job].state == "COMPLETED"
    assert [(r.host, r.outcome.split(":")[0]) for r in runs_of(store, job)] == [
        ("a-broken", "launch failed"), ("b-healthy", "exited with code 0")]
    store.dispose()


def test_every_job_ends_in_exactly_one_terminal_state_under_churn(tmp_path):
    rng = random.Random(5)
    store = _store(tmp_path, [("p0", "profiling", 2), ("m0", "main", 2), ("m1", "main", 2)])
    config = fast_config()
    jobs = []
    for i in range(14):
        kind = rng.choice(["ok", "fail", "long", "cancel"])
        command = {"ok": f"sleep {rng.uniform(0, 0.4):.2f}", "fail": f"exit {rng.randint(1, 9)}",
                   "long": "sleep 1.8", "cancel": "sleep 60"}[kind]
        jobs.append((submit(store, JobRequest(command, rng.choice([1, 1, 2]), f"u{i % 3}", "vc-a")), kind))
    deadline = time.monotonic() + 60
    cancelled = set()
    while True:
        SchedulingRound(store, local_executor(), config, SETTINGS).run()
        rows = jobs_by_id(store)
        for job_id, kind in jobs:
            if kind == "cancel" and job_id not in cancelled and rows[job_id].state in ("PROFILING", "RUNNING"):
                cancel(store, job_id)
                cancelled.add(job_id)
        if all(r.state in TERMINAL for r in rows.values()):
            break
        assert time.monotonic() < deadline, {j: r.state for j, r in rows.items()}
        time.sleep(0.2)
    with store.session() as s:
        endings = s.scalars(select(JobEventRow.job_id).where(
            JobEventRow.kind.in_(["completed", "failed", "cancelled"]))).all()
    assert sorted(endings) == sorted(j for j, _ in jobs)  # one ending each, no more
    for job_id, kind in jobs:
        expected = {"ok": "COMPLETED", "fail": "FAILED", "long": "COMPLETED", "cancel": "CANCELLED"}[kind]
        assert rows[job_id].state == expected, (job_id, kind, rows[job_id].state, rows[job_id].end_reason)
        assert all(r.state == "ended" for r in runs_of(store, job_id))
    store.dispose()


def test_a_job_marked_running_without_any_run_is_queued_again_not_stranded(tmp_path):
    from lucid_core.runtime.store.schema import JobRow

    store = _store(tmp_path, [("m0", "main", 1)])
    job = submit(store, JobRequest("true", 1, "u", "vc-a"))
    with store.session() as s:
        s.get(JobRow, job).state = "RUNNING"  # as if its run's rows were lost
    jobs = _until(store, fast_config(**{"profiler.enabled": False}), lambda j: j[job].state in TERMINAL)
    assert jobs[job].state == "COMPLETED" and len(runs_of(store, job)) == 1
    store.dispose()


def test_a_waiting_job_says_why_sharing_is_off(tmp_path):
    store = _store(tmp_path, [("m0", "main", 1)])
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    first = submit(store, JobRequest("sleep 30", 1, "u", "vc-a"))
    second = submit(store, JobRequest("sleep 30", 1, "u", "vc-a"))
    jobs = _until(store, config, lambda j: j[first].state == "RUNNING")
    reason = jobs[second].pending_reason
    assert "no compact fit for 1 GPU(s)" in reason
    assert "sharing is off (sharing disabled in the configuration)" in reason
    cancel(store, first)
    cancel(store, second)
    _until(store, config, lambda j: all(r.state in TERMINAL for r in j.values()))
    store.dispose()

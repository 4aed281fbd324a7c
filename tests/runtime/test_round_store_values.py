"""Values another controller or a hand edit can write into the store that its column types accept (JSON columns,
free strings, NaN, a run state or job state this version does not know): each is read as the one job's, run's or
key's problem, never the round's. The round goes on, no job runs twice, and a job that was not touched completes.
Real processes on a local host, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from runtime_helpers import SETTINGS, fast_config, jobs_by_id
from sqlalchemy import select, text, update
from sqlalchemy.exc import DataError

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.loss import UNREACHABLE_SINCE, lost_hosts
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import HostRow, JobRow, RunRow
from lucid_core.runtime.surfaces.submission import JobRequest, submit

CONFIG = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})


def _round(store):
    return SchedulingRound(store, local_executor(), CONFIG, SETTINGS).run()


def _rounds_until(store, done, timeout_s=20.0):
    deadline, reports = time.monotonic() + timeout_s, []
    while True:
        reports.append(_round(store))
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs, reports
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)


def _set_run(store, job_id, **values):
    with store.session() as s:
        s.execute(update(RunRow).where(RunRow.job_id == job_id, RunRow.state == "running").values(**values))


CORRUPTIONS = {
    # a run's row: the job sits out, its GPU stays held (a second copy would share it), the round goes on
    "run state unknown": lambda store, job: _set_run(store, job, state="stopping"),
    "run GPU indices text": lambda store, job: _set_run(store, job, gpu_indices=["0"]),
    "run GPU index past the host's": lambda store, job: _set_run(store, job, gpu_indices=[7]),
    "run pool unknown": lambda store, job: _set_run(store, job, pool="burst"),
    "run start time -Infinity": lambda store, job: _sql(store, "UPDATE runs SET started_at = '-Infinity' "
                                                             "WHERE job_id = :j AND state = 'running'", job),
    # hosts' rows: a cool-down that is no number closes no host (NaN used to close it for ever on PostgreSQL)
    "host cool-down NaN": lambda store, job: _sql(store, "UPDATE hosts SET cooldown_until = 'NaN'", job),
    # the policy's saved state: a bad key keeps its default
    "saved sharing mode unknown": lambda store, job: store.set_state("sharing_mode", "exclusive-v2"),
    "saved Tprof text": lambda store, job: store.set_state("tprof_s", "60s"),
    "saved mode check text": lambda store, job: store.set_state("last_mode_check", "2026-01-01"),
    "saved borrowed node runs a main job": lambda store, job: store.set_state("borrowed_nodes", ["m0"]),
    # the running job's own state: another controller's, left alone
    "job state unknown": lambda store, job: _set_job(store, job, state="SUSPENDED"),
}


def _sql(store, statement, job_id):
    """Raw SQL, so a value reaches the column as written (PostgreSQL reads 'NaN' as the float, SQLite keeps it)."""
    with store.session() as s:
        s.execute(text(statement), {"j": job_id})


def _set_job(store, job_id, **values):
    with store.session() as s:
        s.execute(update(JobRow).where(JobRow.job_id == job_id).values(**values))


#: Text a JSON column's type refuses on PostgreSQL and SQLite keeps (a hand edit): read as None (`stored_json`).
#: Every round failed on the first with a JSONDecodeError before.
SQLITE_CORRUPTIONS = {
    "run GPU indices not JSON": lambda store, job: _sql(store, "UPDATE runs SET gpu_indices = '[0,' "
                                                             "WHERE job_id = :j AND state = 'running'", job),
    "saved state not JSON": lambda store, job: _sql(store, "UPDATE scheduler_state SET value = '{' ", job),
}


@pytest.mark.parametrize("stored", ["x[", float("nan"), -1.0, 0, None])
def test_a_hosts_gpu_memory_that_is_no_positive_number_reads_as_the_configured_one(stored):
    """Text a hand edit left in `hosts.gpu_memory_mb` (SQLite) failed every round where the binder weighs memory
    (`placement.mem_free_on`: str - float); NaN or a negative size would open or close the host to pairs at random."""
    from types import SimpleNamespace

    from lucid_core.runtime.round.view_builder import _gpu_memory

    assert _gpu_memory(SimpleNamespace(gpu_memory_mb=stored), 24576.0) == 24576.0
    assert _gpu_memory(SimpleNamespace(gpu_memory_mb=40960), 24576.0) == 40960.0


@pytest.mark.parametrize("case", list(SQLITE_CORRUPTIONS))
def test_json_text_gone_bad_on_sqlite_stays_the_problem_of_its_own_run_or_key(tmp_path, case):
    from lucid_core.runtime.store.store import Store

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    try:
        _a_value_gone_bad(store, tmp_path, case, SQLITE_CORRUPTIONS[case])
    finally:
        store.dispose()


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_stored_value_gone_bad_stays_the_problem_of_its_own_job_or_key(store, tmp_path, case):
    _a_value_gone_bad(store, tmp_path, case, CORRUPTIONS[case])


def _a_value_gone_bad(store, tmp_path, case, corrupt):
    for name in ("m0", "m1"):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                                 workdir=str(tmp_path / name)))
    running = submit(store, JobRequest("sleep 4", 1, "ann", "vc-a", name="running"))
    _rounds_until(store, lambda jobs: jobs[running].state == "RUNNING")
    corrupt(store, running)
    later = submit(store, JobRequest("true", 1, "bob", "vc-a", name="later"))
    _, reports = _rounds_until(store, lambda jobs: jobs[later].state == "COMPLETED")
    with store.session() as s:
        runs = list(s.scalars(select(RunRow).where(RunRow.job_id == running)))
        later_runs = list(s.scalars(select(RunRow).where(RunRow.job_id == later)))
    assert len(runs) == 1, [(r.run_id, r.host, r.state) for r in runs]  # never placed a second time
    if case.startswith("run "):
        # its GPU is held while it may run: the later job ran on the other host, and the round said why
        assert later_runs and all(r.host != runs[0].host for r in later_runs)
        assert any(running in e and "cannot be read" in e for r in reports for e in r.errors)


def test_a_stored_env_that_is_not_a_mapping_fails_that_job_alone(store, tmp_path):
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    bad = submit(store, JobRequest("true", 1, "ann", "vc-a", name="bad"))
    _set_job(store, bad, env="A=1")
    good = submit(store, JobRequest("true", 1, "bob", "vc-a", name="good"))
    jobs, _ = _rounds_until(store, lambda jobs: jobs[good].state == "COMPLETED" and jobs[bad].state == "FAILED")
    assert "not a mapping" in jobs[bad].end_reason


def test_a_stored_submit_time_that_is_no_number_leaves_that_job_out(store, tmp_path):
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    bad = submit(store, JobRequest("true", 1, "ann", "vc-a", name="bad"))
    with store.session() as s:  # PostgreSQL reads 'NaN' as the float; SQLite keeps the text
        s.execute(text("UPDATE jobs SET submit_time = 'NaN' WHERE job_id = :j"), {"j": bad})
    good = submit(store, JobRequest("true", 1, "bob", "vc-a", name="good"))
    jobs, reports = _rounds_until(store, lambda jobs: jobs[good].state == "COMPLETED")
    assert jobs[bad].state == "SUBMITTED"
    assert any(bad in e and "submit time" in e for r in reports for e in r.errors)


@pytest.mark.parametrize("saved", [{"m0": 4e9}, {"m0": "2026-01-01"}, "m0"])
def test_when_a_host_went_down_is_counted_from_now_when_what_was_saved_is_bad(store, tmp_path, saved):
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    with store.session() as s:
        s.execute(update(HostRow).where(HostRow.name == "m0").values(reachable=False))
    store.set_state(UNREACHABLE_SINCE, saved)  # a time far in the future, a text, not a mapping at all
    now = time.time()
    assert lost_hosts(store, now, lost_after_s=60) == {}  # first seen down now
    assert list(lost_hosts(store, now + 120, lost_after_s=60)) == ["m0"]  # and given up on after the limit


def test_a_job_with_a_run_in_an_unknown_state_is_not_called_cancelled_while_that_run_may_live(store, tmp_path):
    """Cancelled, it used to end at once: its GPU then looked free while its process still ran on it."""
    from lucid_core.runtime.surfaces.submission import cancel

    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    running = submit(store, JobRequest("sleep 30", 1, "ann", "vc-a", name="running"))
    _rounds_until(store, lambda jobs: jobs[running].state == "RUNNING")
    _set_run(store, running, state="stopping")
    cancel(store, running)
    waiting = submit(store, JobRequest("true", 1, "bob", "vc-a", name="waiting"))
    for _ in range(3):
        report = _round(store)
        time.sleep(0.2)
    jobs = jobs_by_id(store)
    assert jobs[running].state == "RUNNING" and jobs[waiting].state != "COMPLETED"  # its GPU stays held
    assert any(running in e and "none this version knows" in e for e in report.errors)
    _sql(store, "UPDATE runs SET state = 'running' WHERE job_id = :j AND state = 'stopping'", running)  # repaired
    jobs, _ = _rounds_until(store, lambda jobs: jobs[waiting].state == "COMPLETED")
    assert jobs[running].state == "CANCELLED"


@pytest.mark.parametrize("since", ["'yesterday'", "0", "'NaN'", "'-Infinity'", "'Infinity'", "1e300"])
def test_a_stored_unreadable_since_gone_bad_stops_no_run_that_reads(store, tmp_path, since):
    """When a run's status began to read as garbage is the round's own record; another writer's value there
    (long ago, NaN, infinities, far ahead) stops nothing whose status reads: the run ends as it would have,
    and the value is dropped."""
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    running = submit(store, JobRequest("sleep 2", 1, "ann", "vc-a", name="running"))
    _rounds_until(store, lambda jobs: jobs[running].state == "RUNNING")
    statement = f"UPDATE runs SET unreadable_since = {since} WHERE job_id = :j"
    if since == "'yesterday'" and store.engine.dialect.name != "sqlite":  # only SQLite keeps text in a float column
        with pytest.raises(DataError):
            _sql(store, statement, running)
        return
    _sql(store, statement, running)
    settings = replace(SETTINGS, unreadable_stop_after_s=1.0)
    deadline = time.monotonic() + 20
    while jobs_by_id(store)[running].state == "RUNNING":
        SchedulingRound(store, local_executor(), CONFIG, settings).run()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert jobs_by_id(store)[running].state == "COMPLETED"
    with store.session() as s:
        (run,) = s.scalars(select(RunRow).where(RunRow.job_id == running))
        assert (run.stop_reason, run.unreadable_since) == (None, None)

"""`lucid submit --time-limit`: the duration people type, the submission's check, and real rounds that stop a job
past its limit (its process gone, the job FAILED saying why) while a job inside its limit completes."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from duration_stubs import FixedDurations
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, marked_processes, pid_alive
from sqlalchemy import select

from lucid_core.cli import main
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.round.time_limits import time_run
from lucid_core.runtime.store.schema import JobEventRow, RunRow
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, submit
from lucid_core.units import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("45s", 45), ("90m", 5400), ("90 min", 5400), ("1.5h", 5400), ("2d", 172800), ("2H", 7200),
    ("10:00", 600), ("90:30", 5430), ("1:30:00", 5400), ("2-00:00:00", 172800), ("1-12", 129600),
    ("1-2:30", 95400)])
def test_durations_read_as_slurm_and_people_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "", "1:60:00", "1-0:90", "abc", "-5m", "1:2:3:4", "1-", "\u0663m", "5 y",
                                  "-1:00", "-01:00:00", "\u0661-01:00", "\u00b2-01:00", "1-99:00", "1-24", "1--2"])
def test_a_duration_without_a_unit_or_out_of_range_is_refused(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_the_cli_refuses_a_bare_number_naming_the_forms(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as refused:
        main(["submit", "--gpus", "1", "--time-limit", "30", "--", "true"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--time-limit" in err and "90m" in err and "HH:MM:SS" in err


@pytest.mark.parametrize("limit", [0, -1, float("nan"), float("inf"), True, "1h", 367 * 86400.0])
def test_a_time_limit_that_is_no_time_is_refused_naming_the_field(store, tmp_path, limit):
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    with pytest.raises(SubmissionError) as refused:
        submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=limit))
    assert set(refused.value.errors) == {"time_limit_s"}


def test_the_api_takes_a_time_limit_in_seconds_and_refuses_text(store, tmp_path):
    from fastapi.testclient import TestClient

    from lucid_core.runtime.surfaces.api import create_app

    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    client = TestClient(create_app(store.url, store=store))
    body = {"command": "true", "gpus": 1, "user": "ann", "vc": "default"}
    made = client.post("/jobs", json={**body, "time_limit_s": 3600})
    assert made.status_code in (200, 201), made.text
    shown = client.get(f"/jobs/{made.json()['job_id']}").json()
    assert shown["time_limit_s"] == 3600
    refused = client.post("/jobs", json={**body, "time_limit_s": "1h"})
    assert refused.status_code == 422 and "time_limit_s" in refused.text


def _run(started, ended, state="ended", run_id="r1"):
    return SimpleNamespace(run_id=run_id, started_at=started, ended_at=ended, state=state)


def test_time_run_adds_runs_counts_a_wide_run_once_and_ignores_broken_times():
    now = 1000.0
    runs = [_run(100.0, 110.0, run_id="a"),  # 10 s, ended
            _run(900.0, None, state="running", run_id="b"), _run(905.0, None, state="running", run_id="b"),  # wide
            _run("x", 500.0, run_id="c"), _run(float("inf"), None, state="running", run_id="d"),
            _run(200.0, None, run_id="e"),  # ended without an end time: nothing
            _run(None, None, state="planned", run_id="f")]
    assert time_run(runs, now) == pytest.approx(10.0 + 100.0)


def test_a_job_past_its_limit_is_stopped_and_fails_and_one_inside_it_completes(store, tmp_path):
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    config = fast_config(**{"profiler.enabled": False})
    long = submit(store, JobRequest("sleep 120", 1, "ann", "default", time_limit_s=2.0))
    short = submit(store, JobRequest("sleep 0.5; echo done", 1, "ann", "default", time_limit_s=60.0))
    deadline, seen_running = time.monotonic() + 40, False
    while True:
        SchedulingRound(store, local_executor(), config, SETTINGS).run()
        jobs = jobs_by_id(store)
        if jobs[long].state == "RUNNING" and not seen_running:  # the check below can see its processes
            with store.session() as s:
                run_id = s.scalars(select(RunRow.run_id).where(RunRow.job_id == long)).one()
            marker = (tmp_path / "m0" / run_id / "marker").read_text().strip()
            seen_running = bool(marked_processes(f"LUCID_RUN_MARKER={marker}"))
        if jobs[long].state == "FAILED" and jobs[short].state == "COMPLETED":
            break
        assert time.monotonic() < deadline, {j: (r.state, r.end_reason) for j, r in jobs.items()}
        time.sleep(0.3)
    job = jobs[long]
    assert seen_running
    assert "ran past its time limit of 2 s (--time-limit)" in job.end_reason, job.end_reason
    assert 2.0 <= job.end_time - job.start_time < 20.0
    with store.session() as s:
        run = s.scalars(select(RunRow).where(RunRow.job_id == long)).one()
        kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == long))]
    assert run.stop_reason == "time_limit" and run.pid is not None and "stopping" in kinds
    marker = (tmp_path / "m0" / run.run_id / "marker").read_text().strip()
    assert not pid_alive(run.pid) and not marked_processes(f"LUCID_RUN_MARKER={marker}")  # `sleep 120` too
    assert jobs[short].exit_code == 0


def test_status_says_the_limit_and_a_job_that_used_it_up_between_runs_fails_before_placement(store, tmp_path,
                                                                                           capsys):
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    job = submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=5.0))
    now = time.time()
    with store.session() as s:  # an earlier run (before a yield) that ran 8 s: the job waits with no time left
        s.add(RunRow(run_id=f"{job}-main1", host="m0", job_id=job, kind="main", pool="main", gpu_indices=[0],
                     node_rank=0, state="ended", planned_at=now - 20, started_at=now - 19, ended_at=now - 11))
    code = main(["status", job, "--store", store.url])
    out = capsys.readouterr().out
    assert code == 0 and "time limit: 5 s, all its runs together" in out, out
    SchedulingRound(store, local_executor(), fast_config(**{"profiler.enabled": False}), SETTINGS).run()
    row = jobs_by_id(store)[job]
    assert row.state == "FAILED" and "used up its time limit of 5 s" in row.end_reason, row.end_reason
    with store.session() as s:
        assert len(s.scalars(select(RunRow).where(RunRow.job_id == job)).all()) == 1  # never placed again
    code = main(["status", job, "--store", store.url, "--json"])
    assert json.loads(capsys.readouterr().out)["time_limit_s"] == 5.0


def test_no_prediction_passes_a_jobs_time_limit_so_it_is_ordered_by_it(store, tmp_path):
    """A job stopped at 60 s runs at most 60 s: a model's 600 s for it put it behind a 120 s job."""
    from lucid_core.policy.lucid import LucidPolicy

    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    durations = {"hold": 600.0, "capped": 600.0, "plain": 120.0}

    def factory(cfg, snapshot):
        policy = LucidPolicy(cfg, duration_model=FixedDurations(durations, key=lambda job: job.name))
        policy.model_sources = {"duration": "fixed"}
        return policy

    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    hold = submit(store, JobRequest("sleep 30", 1, "ann", "default", name="hold"))
    SchedulingRound(store, local_executor(), config, SETTINGS, policy_factory=factory).run()
    plain = submit(store, JobRequest("true", 1, "ann", "default", name="plain"))
    capped = submit(store, JobRequest("true", 1, "ann", "default", name="capped", time_limit_s=60.0))
    SchedulingRound(store, local_executor(), config, SETTINGS, policy_factory=factory).run()
    jobs = jobs_by_id(store)
    assert jobs[hold].state == "RUNNING"
    assert (jobs[capped].predicted_duration, jobs[plain].predicted_duration) == (60.0, 120.0)
    assert (jobs[capped].queue_position, jobs[plain].queue_position) == (1, 2)
    from lucid_core.runtime.surfaces.submission import cancel

    cancel(store, hold)
    SchedulingRound(store, local_executor(), config, SETTINGS, policy_factory=factory).run()


def test_a_cancel_pending_on_a_job_that_used_up_its_limit_between_runs_stands(store, tmp_path):
    """The time-limit step ran before the cancels and failed such a job: a cancel that came first must stand."""
    from lucid_core.runtime.surfaces.submission import cancel

    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    job = submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=5.0))
    now = time.time()
    with store.session() as s:
        s.add(RunRow(run_id=f"{job}-main1", host="m0", job_id=job, kind="main", pool="main", gpu_indices=[0],
                     node_rank=0, state="ended", planned_at=now - 20, started_at=now - 19, ended_at=now - 11))
    cancel(store, job)
    SchedulingRound(store, local_executor(), fast_config(**{"profiler.enabled": False}), SETTINGS).run()
    assert jobs_by_id(store)[job].state == "CANCELLED"


def test_a_job_with_a_run_in_a_state_this_version_does_not_know_is_not_called_over(store, tmp_path):
    """Such a run may be running (another controller's): the job is not failed while it exists, as a cancel waits."""
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    job = submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=5.0))
    now = time.time()
    with store.session() as s:
        s.add(RunRow(run_id=f"{job}-main1", host="m0", job_id=job, kind="main", pool="main", gpu_indices=[0],
                     node_rank=0, state="ended", planned_at=now - 40, started_at=now - 39, ended_at=now - 31))
        s.add(RunRow(run_id=f"{job}-main2", host="m0", job_id=job, kind="main", pool="main", gpu_indices=[0],
                     node_rank=0, state="suspended", planned_at=now - 20, started_at=now - 19))
    SchedulingRound(store, local_executor(), fast_config(**{"profiler.enabled": False}), SETTINGS).run()
    assert jobs_by_id(store)[job].state not in ("FAILED", "COMPLETED", "CANCELLED")


@pytest.mark.parametrize("first_line", ["7" * 5000, "size=3", ""])
def test_no_line_of_a_log_is_read_as_its_size(tmp_path, first_line):
    """The size came as the output's first line: a log read while it was being rewritten gave its own first line
    (5,000 digits: int() refused it, and the page showed a ValueError)."""
    from lucid_core.runtime.hosts.executor import HostAddress

    (tmp_path / "w" / "r1").mkdir(parents=True)
    log = tmp_path / "w" / "r1" / "stdout.log"
    log.write_bytes(f"{first_line}\nrest\n".encode())
    address = HostAddress("h", executor="local", workdir=str(tmp_path / "w"))
    tail = local_executor().read_tail(address, "r1", "stdout.log", 100)
    assert tail.size == log.stat().st_size and tail.text.endswith("rest\n")
    assert tail.cut(100) == (log.stat().st_size > 100)
    log.unlink()
    assert local_executor().read_tail(address, "r1", "stdout.log", 100) == type(tail)("", None)


def test_an_answer_whose_first_line_is_no_size_marker_reads_as_a_size_not_known():
    """What a host answers when the log vanished between its check and `wc` (a job rewriting it): the log's own
    first line came where the size should be, and 5,000 digits made int() raise."""
    from lucid_core.runtime.hosts.executor import HostAddress, HostExecutor, ScriptResult

    class Canned:
        def __init__(self, out: str) -> None:
            self.out = out

        def run_script(self, host, script, timeout_s):
            return ScriptResult(0, self.out, "")

        def close(self) -> None:
            """Nothing held."""

    address = HostAddress("h", executor="local")
    for out, size in (("7" * 5000 + "\nrest\n", None), ("size=\nrest\n", None), ("size=" + "9" * 30 + "\nx", None),
                      ("size=12\nrest\n", 12)):
        tail = HostExecutor({"local": Canned(out)}).read_tail(address, "r1", "stdout.log", 100)
        assert tail.size == size, out[:20]
        assert tail.cut(100) is False  # no size known, or 12 bytes: the read is all there is to say


def test_explain_says_a_prediction_stops_at_the_time_limit(store, tmp_path, capsys):
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    hold = submit(store, JobRequest("sleep 30", 1, "ann", "default"))
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    SchedulingRound(store, local_executor(), config, SETTINGS).run()
    capped = submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=2.0))
    SchedulingRound(store, local_executor(), config, SETTINGS).run()
    assert jobs_by_id(store)[capped].predicted_duration == 2.0
    code = main(["explain", capped, "--store", store.url, "--set", "profiler.enabled=false"])
    out = capsys.readouterr().out
    assert code == 0 and "predicted no longer than its time limit of 2 s (--time-limit)" in out, out
    from lucid_core.runtime.surfaces.submission import cancel

    cancel(store, hold)
    SchedulingRound(store, local_executor(), config, SETTINGS).run()


def test_history_shows_a_jobs_time_limit_as_sacct_shows_timelimit(store, tmp_path, capsys):
    from lucid_core.runtime.surfaces.submission import cancel

    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    limited = submit(store, JobRequest("true", 1, "ann", "default", time_limit_s=5400.0))
    plain = submit(store, JobRequest("true", 1, "ann", "default"))
    for job in (limited, plain):
        cancel(store, job)
    SchedulingRound(store, local_executor(), fast_config(**{"profiler.enabled": False}), SETTINGS).run()
    assert main(["history", "--store", store.url, "--format", "JobID,Timelimit"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert rows == {limited: "01:30:00", plain: "-"}
    assert main(["history", "--store", store.url, "--json"]) == 0
    listed = {r["job_id"]: r["time_limit_s"] for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert listed == {limited: 5400.0, plain: None}

"""The invariant checks themselves catch what they claim to: a second terminal event, overlapping runs of
one job, a GPU held by two unpaired runs, a run started twice on a host (a check that cannot fail proves
nothing)."""

from __future__ import annotations

import pytest
from lucid_invariants import check_invariants

from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store


@pytest.fixture
def two_jobs(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    with store.session() as s:
        for i, job_id in enumerate(("a", "b")):
            s.add(JobRow(job_id=job_id, seq=i + 1, user="u", vc="v", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=0.0))
            s.flush()
            s.add(JobEventRow(job_id=job_id, time=9.0, kind="completed", message=""))
            s.add(RunRow(run_id=f"{job_id}-main1", host="h", job_id=job_id, kind="main", pool="main",
                         gpu_indices=[i], state="ended", planned_at=0.0, started_at=1.0, ended_at=5.0))
    yield store
    store.dispose()


def test_a_clean_history_passes(two_jobs):
    assert check_invariants(two_jobs, ["a", "b"]) == {"a": "COMPLETED", "b": "COMPLETED"}


def test_a_second_terminal_event_is_caught(two_jobs):
    with two_jobs.session() as s:
        s.add(JobEventRow(job_id="a", time=10.0, kind="failed", message=""))
    with pytest.raises(AssertionError, match="2 terminal events"):
        check_invariants(two_jobs, ["a", "b"])


def test_overlapping_runs_of_one_job_are_caught(two_jobs):
    with two_jobs.session() as s:
        s.add(RunRow(run_id="a-main2", host="h2", job_id="a", kind="main", pool="main", gpu_indices=[0],
                     state="ended", planned_at=0.0, started_at=4.0, ended_at=8.0))
    with pytest.raises(AssertionError, match="ran twice at once"):
        check_invariants(two_jobs, ["a", "b"])


def test_a_gpu_held_by_two_unpaired_runs_is_caught(two_jobs):
    with two_jobs.session() as s:
        s.get(RunRow, ("b-main1", "h")).gpu_indices = [0]
    with pytest.raises(AssertionError, match="double-booked"):
        check_invariants(two_jobs, ["a", "b"])
    with two_jobs.session() as s:  # the same two runs as a sharing pair are fine
        s.get(RunRow, ("a-main1", "h")).partner = "b"
    check_invariants(two_jobs, ["a", "b"])


def test_a_run_started_twice_on_a_host_is_caught(two_jobs, tmp_path):
    ledger = tmp_path / "ledger"
    ledger.write_text("S a-main1 0 11\nS b-main1 0 12\nS a-main1 0 13\n")
    with pytest.raises(AssertionError, match="more than once"):
        check_invariants(two_jobs, ["a", "b"], ledger)
    ledger.write_text("S a-main1 0 11\nS x-main9 0 12\n")
    with pytest.raises(AssertionError, match="never recorded"):
        check_invariants(two_jobs, ["a", "b"], ledger)


def test_a_job_left_running_is_caught(two_jobs):
    with two_jobs.session() as s:
        s.get(JobRow, "b").state = "RUNNING"
    with pytest.raises(AssertionError, match="ended in RUNNING"):
        check_invariants(two_jobs, ["a", "b"])

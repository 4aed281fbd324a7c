"""Hosts' disks do not fill: a round removes the files of runs long over (both rooms of each run), over real sshd
hosts with real job processes, and never those of a run whose wrapper still lives."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, pid_alive, rounds_until, runs_of
from sqlalchemy import update

from lucid_core.config import LucidConfig
from lucid_core.runtime.round.settings import RoundSettings
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.surfaces.cli.logs import _pruned_note
from lucid_core.runtime.surfaces.submission import JobRequest, submit

pytestmark = pytest.mark.ssh

NO_PROFILING = {"profiler.enabled": False}


def _keep(seconds: float | None) -> RoundSettings:
    return replace(SETTINGS, keep_ended_runs_s=seconds)


def test_the_files_of_a_run_long_over_are_removed_from_its_host_and_nothing_outside_them(live):
    store, cluster, root = live
    victim = root / "victim.txt"
    victim.write_text("not the job's")
    # the job leaves a file, a link to a file outside its rooms and a directory it made unreadable
    command = (f"echo hello; echo kept > scratch; ln -s {victim} link; mkdir locked; touch locked/f; "
               "chmod 000 locked")
    config = fast_config(**NO_PROFILING)
    job = submit(store, JobRequest(command, 1, "ann", "vc-a", name="leaves-files"))
    rounds_until(store, cluster, config, lambda j: j[job].state == "COMPLETED")
    (run,) = runs_of(store, job)
    control = root / "hosts" / run.host / run.run_id
    work = root / "hosts" / run.host / ".work" / run.run_id
    assert (control / "stdout.log").read_text() == "hello\n" and (work / "scratch").is_file()

    young = one_round(store, cluster, config, settings=_keep(3600.0))  # not over long enough yet
    assert young.pruned == [] and control.is_dir() and work.is_dir()
    assert _pruned_note(store, job) is None

    time.sleep(0.6)
    report = one_round(store, cluster, config, settings=_keep(0.5))
    assert report.pruned == [run.run_id], report.errors
    assert not control.exists() and not work.exists()
    assert victim.read_text() == "not the job's"  # the link was removed, not what it pointed at
    (after,) = runs_of(store, job)
    assert after.pruned_at is not None and after.pruned_at >= run.ended_at
    note = _pruned_note(store, job)
    assert note is not None and run.run_id in note and run.host in note and "keep_ended_runs_days" in note
    assert one_round(store, cluster, config, settings=_keep(0.5)).pruned == []  # once


def test_a_run_the_store_calls_ended_but_whose_wrapper_lives_keeps_its_files(live):
    store, cluster, root = live
    config = fast_config(**NO_PROFILING)
    job = submit(store, JobRequest("sleep 60", 1, "bob", "vc-a", name="still-running"))
    rounds_until(store, cluster, config, lambda j: j[job].state == "RUNNING")
    (run,) = runs_of(store, job)
    with store.session() as s:  # what a second controller or a hand edit could write (the job ended with it, so
        # no launch meets the run: one would stop it, see the test below)
        s.execute(update(RunRow).where(RunRow.run_id == run.run_id)
                  .values(state="ended", ended_at=time.time() - 100 * 86400))
        s.execute(update(JobRow).where(JobRow.job_id == job).values(state="COMPLETED", end_time=time.time()))
    report = one_round(store, cluster, config, settings=_keep(0.5))
    assert report.pruned == [], report.errors
    assert any(run.run_id in e and "wrapper still runs" in e for e in report.errors), report.errors
    assert (root / "hosts" / run.host / run.run_id / "pid.self").is_file()
    assert (root / "hosts" / run.host / ".work" / run.run_id).is_dir()
    assert runs_of(store, job)[0].pruned_at is None
    with store.session() as s:  # put it back, so that the fixture's cancel stops it
        s.execute(update(RunRow).where(RunRow.run_id == run.run_id).values(state="running", ended_at=None))
        s.execute(update(JobRow).where(JobRow.job_id == job).values(state="RUNNING", end_time=None))


def test_a_run_the_store_ended_that_still_runs_is_stopped_once_it_blocks_a_launch(live):
    """A run the store ended (a hand edit, a second controller) whose process lives on holds a GPU the store
    counts free: the host's ledger refuses the launch placed there, and the round stops that run, so the next
    round's launch goes through and every job completes. Before, the launch was refused round after round, and
    pruning left the run alone as LIVE."""
    store, cluster, _root = live
    config = fast_config(**NO_PROFILING)
    stale = submit(store, JobRequest("sleep 120", 1, "bob", "vc-a", name="ended-in-store"))
    rounds_until(store, cluster, config, lambda j: j[stale].state == "RUNNING")
    (run,) = runs_of(store, stale)
    assert pid_alive(run.pid)
    with store.session() as s:  # what a second controller or a hand edit could write
        s.execute(update(RunRow).where(RunRow.run_id == run.run_id).values(state="ended", ended_at=time.time()))
        s.execute(update(JobRow).where(JobRow.job_id == stale).values(state="COMPLETED", end_time=time.time()))
    fill = [submit(store, JobRequest("sleep 0.5", 1, "ana", "vc-a", name=f"fill-{i}")) for i in range(4)]
    errors: list[str] = []

    def done(jobs) -> bool:
        return all(jobs[j].state in ("COMPLETED", "FAILED", "CANCELLED") for j in fill)

    deadline = time.monotonic() + 60
    while not done(jobs_by_id(store)):
        assert time.monotonic() < deadline, ({j: jobs_by_id(store)[j].state for j in fill}, errors[-5:])
        errors += one_round(store, cluster, config).errors
        time.sleep(0.2)
    jobs = jobs_by_id(store)
    assert all(jobs[j].state == "COMPLETED" for j in fill), {j: (jobs[j].state, jobs[j].end_reason) for j in fill}
    refused = [e for e in errors if "CONFLICT" in e or "held by run" in e]
    assert refused and all(run.run_id in e for e in refused), errors  # the launch did meet the stale run
    assert any(f"run {run.run_id} on {run.host} still ran though the store had ended it" in e for e in errors), errors
    time.sleep(0.3)
    assert not pid_alive(run.pid), "the run the store ended still runs"
    assert len(refused) <= 2, refused  # stopped at the first refusal, not refused round after round


def test_keep_ended_runs_days_zero_keeps_files_for_ever():
    settings = RoundSettings.from_config(LucidConfig().with_overrides({"runtime.keep_ended_runs_days": 0}))
    assert settings.keep_ended_runs_s is None
    assert RoundSettings.from_config(LucidConfig()).keep_ended_runs_s == 14 * 86400.0


def test_another_installations_live_run_of_the_same_id_is_never_stopped(sshd_hosts, tmp_path):
    """Run ids repeat across stores (j000001-main1 in each): a second installation sharing the host's work directory
    runs one of the same id as a run this store ended. Its launch refusal names that run, but the live wrapper is
    not the one this store launched (another pid), so it is left alone, said so, and keeps running."""
    from runtime_helpers import register

    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import cancel

    ours, theirs = Store(f"sqlite:///{tmp_path / 'ours.db'}"), Store(f"sqlite:///{tmp_path / 'theirs.db'}")
    for store in (ours, theirs):
        register(store, sshd_hosts, tmp_path / "hosts", gpus={"main0": 2})  # one host, one work directory
    config = fast_config(**NO_PROFILING)
    try:
        first = submit(ours, JobRequest("sleep 0.3", 1, "ann", "vc-a", name="ours"))
        rounds_until(ours, sshd_hosts, config, lambda j: j[first].state == "COMPLETED")
        (ended,) = runs_of(ours, first)
        time.sleep(0.3)
        assert one_round(ours, sshd_hosts, config, settings=_keep(0.1)).pruned == [ended.run_id]
        other = submit(theirs, JobRequest("sleep 60", 2, "bob", "vc-a", name="theirs"))
        rounds_until(theirs, sshd_hosts, config, lambda j: j[other].state == "RUNNING")
        (live,) = runs_of(theirs, other)
        assert (live.run_id, live.host) == (ended.run_id, ended.host) and pid_alive(live.pid)
        submit(ours, JobRequest("sleep 0.3", 1, "ann", "vc-a", name="ours-again"))
        errors: list[str] = []
        for _ in range(3):
            errors += one_round(ours, sshd_hosts, config).errors
            time.sleep(0.3)
        assert pid_alive(live.pid), errors
        said = f"run {live.run_id} on {live.host} blocks a launch"
        assert any(said in e and "left alone" in e for e in errors), errors
    finally:
        for store in (ours, theirs):
            for job_id, row in jobs_by_id(store).items():
                if row.state not in ("COMPLETED", "FAILED", "CANCELLED"):
                    cancel(store, job_id)
            one_round(store, sshd_hosts, config)
            store.dispose()


def test_the_run_a_refusal_names_is_read_from_the_hosts_words_alone():
    """The ledger's words are untrusted: only a run id after "run" is taken, the last one (a job named "run"
    does not hide it), and words that are no run id (a path, nothing) name none."""
    from lucid_core.runtime.hosts.claims import conflict_holder

    def holder(line: str) -> str | None:
        return conflict_holder(line.split())

    assert holder("job j1 already runs on this host as run j1-main3") == "j1-main3"
    assert holder("GPU 0 is held by run j2-main5 of job run") == "j2-main5"
    assert holder("job run already runs on this host as run r-1") == "r-1"
    assert holder("the host's ledger of live runs stayed locked for 30 s") is None
    assert holder("GPU 0 is held by run ../../etc") is None
    assert holder("run") is None and holder("") is None

"""Hosts' disks do not fill: a round removes the files of runs long over (both rooms of each run), over real sshd
hosts with real job processes, and never those of a run whose wrapper still lives."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from runtime_helpers import SETTINGS, fast_config, one_round, rounds_until, runs_of
from sqlalchemy import update

from lucid_core.config import LucidConfig
from lucid_core.runtime.round.settings import RoundSettings
from lucid_core.runtime.store.schema import RunRow
from lucid_core.runtime.surfaces.cli.jobs import _pruned_note
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
    with store.session() as s:  # what a second controller or a hand edit could write
        s.execute(update(RunRow).where(RunRow.run_id == run.run_id)
                  .values(state="ended", ended_at=time.time() - 100 * 86400))
    report = one_round(store, cluster, config, settings=_keep(0.5))
    assert report.pruned == []
    assert any(run.run_id in e and "wrapper still runs" in e for e in report.errors), report.errors
    assert (root / "hosts" / run.host / run.run_id / "pid.self").is_file()
    assert (root / "hosts" / run.host / ".work" / run.run_id).is_dir()
    assert runs_of(store, job)[0].pruned_at is None
    with store.session() as s:  # put it back, so that the fixture's cancel stops it
        s.execute(update(RunRow).where(RunRow.run_id == run.run_id).values(state="running", ended_at=None))


def test_keep_ended_runs_days_zero_keeps_files_for_ever():
    settings = RoundSettings.from_config(LucidConfig().with_overrides({"runtime.keep_ended_runs_days": 0}))
    assert settings.keep_ended_runs_s is None
    assert RoundSettings.from_config(LucidConfig()).keep_ended_runs_s == 14 * 86400.0

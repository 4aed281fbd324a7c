"""Checkpointing is each job's own property: a trace column, a seeded what-if share, the store's flag."""

from __future__ import annotations

import re

import pytest

from lucid_core.cli import main
from lucid_core.sim.records import TraceRecord, stored_flag, with_preemptible_share
from lucid_core.sim.traces import parse_trace, read_trace

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def test_the_generic_format_reads_a_preemptible_column_and_reports_a_bad_value(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,gpus,preemptible\n"
                    "a,0,100,1,1\nb,10,100,1,no\nc,20,100,1,\nd,30,100,1,TRUE\ne,40,100,1,maybe\n")
    trace = read_trace(path, "generic")
    assert {r.job_id: r.preemptible for r in trace.records} == {"a": True, "b": False, "c": False, "d": True}
    assert [(p.row, p.column, p.value) for p in trace.problems] == [(6, "preemptible", "maybe")]
    assert [r.to_job().preemptible for r in trace.records] == [True, False, False, True]


def test_a_trace_without_the_column_has_no_preemptible_job(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(PHILLY_HEADER + "2017-10-01 00:00:00,600,1,600,vc1\n2017-10-01 00:10:00,600,2,1200,vc2\n")
    assert [r.preemptible for r in read_trace(path, "philly").records] == [False, False]


def test_one_parse_gives_the_same_windows_as_reading_each(tmp_path):
    path = tmp_path / "p.csv"
    rows = [f"2017-10-0{1 + i // 3} 0{i % 3}:00:00,{100 + i},1,1,vc" for i in range(9)]
    path.write_text(PHILLY_HEADER + "\n".join([*rows, "bad,row,x,y,z"]) + "\n")
    parsed = parse_trace(path, "philly")
    for start, end in ((None, "2017-10-02"), ("2017-10-02", "2017-10-03"), ("2017-10-02", None)):
        once, alone = parsed.window(start, end), read_trace(path, "philly", start, end)
        assert once.records == alone.records and once.epoch == alone.epoch
        assert [str(p) for p in once.problems] == [str(p) for p in alone.problems]
        assert once.outside_window == alone.outside_window


def test_the_drawn_share_is_seeded_nested_and_the_same_in_every_window():
    records = [TraceRecord(f"j{i}", float(i), 100.0, 1) for i in range(2000)]
    assert not any(r.preemptible for r in with_preemptible_share(records, 0.0))
    assert all(r.preemptible for r in with_preemptible_share(records, 1.0))
    half = {r.job_id for r in with_preemptible_share(records, 0.5, seed=3) if r.preemptible}
    quarter = {r.job_id for r in with_preemptible_share(records, 0.25, seed=3) if r.preemptible}
    assert 900 <= len(half) <= 1100 and quarter <= half  # a job drawn at 25% is drawn at 50% too
    assert half == {r.job_id for r in with_preemptible_share(records, 0.5, seed=3) if r.preemptible}
    assert half != {r.job_id for r in with_preemptible_share(records, 0.5, seed=4) if r.preemptible}
    window = {r.job_id for r in with_preemptible_share(records[500:700], 0.5, seed=3) if r.preemptible}
    assert window == {j for j in half if 500 <= int(j[1:]) < 700}
    with pytest.raises(ValueError, match="between 0 and 1"):
        with_preemptible_share(records, 1.5)


def _table_row(text: str, policy: str) -> dict[str, str]:
    lines = text.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    titles = re.split(r"\s{2,}", lines[header_at].strip())
    row = next(line for line in lines[header_at:] if line.split()[:1] == [policy])
    return dict(zip(titles, re.split(r"\s{2,}", row.strip()), strict=True))


def _contended_philly(path):
    """Two hours of 1-GPU jobs on a one-node cluster: a long job first, then many short ones queue behind it."""
    rows = ["2017-10-01 00:00:00,20000,8,160000,vc"]
    rows += [f"2017-10-01 00:{m:02d}:00,{300 + 7 * m},1,300,vc" for m in range(1, 59)]
    rows += [f"2017-09-30 2{h}:00:00,600,1,600,vc" for h in range(4)]  # history before the window
    path.write_text(PHILLY_HEADER + "\n".join(rows) + "\n")
    return path


def test_simulate_reports_no_preemption_for_lucid_unless_jobs_say_they_checkpoint(tmp_path, capsys):
    trace = _contended_philly(tmp_path / "p.csv")
    base = ["simulate", "--trace", str(trace), "--format", "philly", "--policy", "tiresias,lucid", "--start",
            "2017-10-01", "--nodes", "1", "--no-progress", "--set", "orchestrator.yield_min_run=0"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    plain = capsys.readouterr().out
    assert _table_row(plain, "lucid")["preemptions"] == "0"
    assert int(_table_row(plain, "tiresias")["preemptions"]) > 0
    assert "Checkpoints: tiresias preempts every job" in plain
    assert "Jobs marked preemptible (the only ones other policies may stop): 0." in plain
    assert main([*base, "--out", str(tmp_path / "b"), "--preemptible-share", "1"]) == 0
    every = capsys.readouterr().out
    assert int(_table_row(every, "lucid")["preemptions"]) > 0
    assert "Jobs marked preemptible (the only ones other policies may stop): 59." in every


def test_simulate_refuses_a_share_outside_zero_to_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--preemptible-share", "2", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "not between 0 and 1" in capsys.readouterr().err


def test_the_tuner_replays_each_stored_job_with_its_own_flag(tmp_path):
    """One flagged and one unflagged finished job in a real store: the replay's records keep both flags."""
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.tuner import records_from_jobs
    from lucid_core.update import extract_job_log

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    with store.session() as s:
        for seq, (job_id, flag) in enumerate((("resumes", True), ("plain", False)), start=1):
            s.add(JobRow(job_id=job_id, seq=seq, name=job_id, user="ann", vc="a", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=1000.0 + seq, start_time=1010.0 + seq,
                         end_time=1610.0 + seq, preemptible=flag))
    store.dispose()
    records = records_from_jobs(extract_job_log(url).to_dict("records"))
    assert {r.job_id: r.preemptible for r in records} == {"resumes": True, "plain": False}
    assert {r.job_id: r.to_job().preemptible for r in records} == {"resumes": True, "plain": False}


def test_the_tuner_replays_each_stored_job_with_its_time_limit_which_bounds_its_prediction(tmp_path):
    """A stored job's `--time-limit` bounds its predictions live (it is stopped there): the replay keeps it, so
    the tuner's Lucid orders that job as the live round does. A limit another writer broke is no limit."""
    from lucid_core.policy.orchestrator import floored_prediction
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.tuner import records_from_jobs
    from lucid_core.update import extract_job_log

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    with store.session() as s:
        for seq, (job_id, limit) in enumerate((("limited", 700.0), ("plain", None), ("broken", -5.0)), start=1):
            s.add(JobRow(job_id=job_id, seq=seq, name=job_id, user="ann", vc="a", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=1000.0 + seq, start_time=1010.0 + seq,
                         end_time=1610.0 + seq, time_limit_s=limit))
    store.dispose()
    jobs = {r.job_id: r.to_job() for r in records_from_jobs(extract_job_log(url).to_dict("records"))}
    assert {j: job.time_limit_s for j, job in jobs.items()} == {"limited": 700.0, "plain": None, "broken": None}
    assert [floored_prediction(jobs[j], 3600.0) for j in ("limited", "plain", "broken")] == [700.0, 3600.0, 3600.0]


@pytest.mark.parametrize(("value", "flag"), [(True, True), (1, True), (1.0, True), (False, False), (0, False),
                                             (None, False), (float("nan"), False), ("1", False), ("yes", False)])
def test_a_stored_flag_is_yes_only_when_it_is_a_real_yes(value, flag):
    assert stored_flag(value) is flag

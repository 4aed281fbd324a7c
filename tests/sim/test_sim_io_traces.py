"""Trace readers: tiny hand-written files with malformed rows, windows, formats, the real Philly file."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from lucid_core.sim.traces import TraceFormatError, detect_format, read_trace

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("LUCID_SHARED_DATA", REPO.parent / "shared" / "data"))
PHILLY = SHARED_DATA / "philly" / "philly_jobs_2017-09_2017-11.csv"


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


PHILLY_TINY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:10:00,100.0,1,100.0,vcA
2017-10-01 00:05:00,50.0,2,100.0,vcB
2017-10-01 00:20:00,,1,0,vcA
2017-10-01 00:21:00,-5,1,-5,vcA
2017-10-01 00:22:00,30,two,60,vcA
2017-10-01 00:23:00,1e12,1,1e12,vcA
yesterday,30,1,30,vcA
2017-10-01 00:24:00,30,1.5,45,vcA
2017-10-01 00:25:00,nan,1,30,vcA
2017-10-01 00:26:00,30,0,0,vcA
2017-10-01 00:27:00,30,1,30,vcA,extra
2017-10-01 00:30:00,7.5,8,60,
"""


def test_philly_rows_are_validated_sorted_and_given_stable_ids(tmp_path):
    trace = read_trace(write(tmp_path, "p.csv", PHILLY_TINY), "philly")
    assert [r.job_id for r in trace.records] == ["philly-000003", "philly-000002", "philly-000013"]
    assert [r.submit_time for r in trace.records] == [0.0, 300.0, 1500.0]
    assert trace.epoch == datetime(2017, 10, 1, 0, 5)
    first = trace.records[0]
    assert (first.duration, first.gpus, first.vc) == (50.0, 2, "vcB")
    assert trace.records[-1].vc == "default"  # blank cluster
    problems = {p.row: p for p in trace.problems}
    assert sorted(problems) == list(range(4, 13))
    assert (problems[4].column, problems[4].reason) == ("duration", "missing value")
    assert (problems[5].column, problems[5].value) == ("duration", "-5")
    assert "> 0" in problems[5].reason
    assert (problems[6].column, problems[6].value, problems[6].reason) == ("num_gpus", "two", "not a number")
    assert problems[7].column == "duration" and "366 days" in problems[7].reason
    assert (problems[8].column, problems[8].value) == ("timestamp", "yesterday")
    assert problems[8].reason.startswith("unparsable time")
    assert problems[9].reason == "GPU count must be a whole number"
    assert problems[10].reason == "not a finite number"
    assert problems[11].reason == "GPU count must be >= 1"
    assert problems[12].reason == "more cells than header columns"
    assert trace.rows_read == 12
    summary = trace.problem_summary()
    assert "9 skipped" in summary and "line 6" in summary


def test_bytes_that_are_not_utf8_are_reported_not_crashing(tmp_path):
    data = (b"timestamp,duration,num_gpus,gpu_time,cluster\n"
            b"2017-10-01 00:00:00,10,1,10,caf\xe9\n"
            b"2017-10-01 00:01:00,10,1,10,ok\n")
    trace = read_trace(write(tmp_path, "enc.csv", data), "philly")
    assert [r.vc for r in trace.records] == ["ok"]
    (problem,) = trace.problems
    assert (problem.row, problem.column, problem.reason) == (2, "cluster", "not valid UTF-8")
    assert problem.value == "caf\xe9"


HELIOS_TINY = """job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration
j1,alice,vcX,1,4,1,COMPLETED,2020-09-01 00:00:10,2020-09-01 00:00:20,2020-09-01 00:10:20,600
j2,bob,vcY,0,8,1,COMPLETED,2020-09-01 00:00:11,2020-09-01 00:00:20,2020-09-01 00:10:20,600
j3,bob,vcY,8,32,1,FAILED,2020-09-01 00:00:05,2020-09-01 00:01:00,2020-09-01 00:02:00,
j1,carol,vcX,2,4,1,COMPLETED,2020-09-01 00:00:30,2020-09-01 00:00:40,2020-09-01 00:00:50,10
,dave,vcX,2,4,1,COMPLETED,2020-09-01 00:00:31,2020-09-01 00:00:40,2020-09-01 00:00:50,10
"""


def test_helios_keeps_gpu_jobs_and_reports_duplicates(tmp_path):
    trace = read_trace(write(tmp_path, "cluster_log.csv", HELIOS_TINY), "helios")
    assert [r.job_id for r in trace.records] == ["j3", "j1"]
    j3, j1 = trace.records
    assert (j3.user, j3.vc, j3.gpus, j3.state, j3.duration) == ("bob", "vcY", 8, "FAILED", 60.0)  # end - start
    assert (j1.user, j1.submit_time, j1.duration) == ("alice", 5.0, 600.0)
    assert trace.non_gpu_rows == 1
    reasons = {p.row: (p.column, p.reason) for p in trace.problems}
    assert reasons[5] == ("job_id", "duplicate job_id (first on line 2)")
    assert reasons[6] == ("job_id", "missing value")


GENERIC_TINY = """name,job_id,submit_time,duration,gpus,vc,user
a,x1,2024-03-04T09:00:00,60,1,v1,u1
b,,2024-03-04 10:00:00,120,2,,u2
c,x3,1709546400,30,1,v1,u1
d,x4,2024-03-04T09:00:00+02:00,10,1,v1,u1
e,x5,2024-03-05 00:00:00,10,1,v1,u1
f,x6,2024-03-04 11:00:00,10,100000,v1,u1
"""


def test_generic_csv_accepts_iso_seconds_and_offsets(tmp_path):
    trace = read_trace(write(tmp_path, "g.csv", GENERIC_TINY), "generic")
    by_id = {r.job_id: r for r in trace.records}
    assert set(by_id) == {"x1", "job-3", "x3", "x4", "x5"}
    (huge,) = trace.problems
    assert (huge.row, huge.column, huge.value, huge.reason) == (7, "gpus", "100000", "GPU count above 4096")
    assert by_id["job-3"].vc == "default" and by_id["job-3"].name == "b" and by_id["job-3"].gpus == 2
    # 1709546400 s = 2024-03-04 10:00:00 UTC; 09:00+02:00 = 07:00 UTC, the earliest: the epoch
    assert trace.epoch == datetime(2024, 3, 4, 7, 0)
    assert by_id["x4"].submit_time == 0.0
    assert by_id["x1"].submit_time == 2 * 3600.0
    assert by_id["x3"].submit_time == 3 * 3600.0
    assert [r.submit_time for r in trace.records] == sorted(r.submit_time for r in trace.records)


def test_window_is_half_open_and_sets_the_epoch(tmp_path):
    path = write(tmp_path, "g.csv", GENERIC_TINY)
    trace = read_trace(path, "generic", start="2024-03-04 09:00", end=datetime(2024, 3, 5))
    assert sorted(r.job_id for r in trace.records) == ["job-3", "x1", "x3"]  # 09:00 in, 2024-03-05 00:00 out
    assert trace.epoch == datetime(2024, 3, 4, 9, 0)
    assert [r.submit_time for r in trace.records] == [0.0, 3600.0, 3600.0]
    assert trace.outside_window == 2
    with pytest.raises(TraceFormatError, match=r"no generic job submitted in the window: all \d+ valid rows are "
                                                r"outside it \(the trace's submissions run from 2024-03-04"):
        read_trace(path, "generic", start="2030-01-01")
    with pytest.raises(TraceFormatError, match="empty window"):
        read_trace(path, "generic", start="2024-03-05", end="2024-03-04")


def test_a_header_naming_a_column_twice_is_refused(tmp_path):
    """Two `gpus` columns: which is the job's? The last one won without a word (8 GPUs instead of 1)."""
    path = write(tmp_path, "dup.csv", "job_id,submit_time,duration,gpus,vc,gpus\na,2024-03-04 00:00:00,100,1,nlp,8\n")
    with pytest.raises(TraceFormatError, match=r"the header names \['gpus'\] more than once"):
        read_trace(path, "generic")


def test_a_quote_left_open_is_a_reported_row_not_a_swallowed_job(tmp_path):
    """An unterminated quote used to take every following row into one cell: job b vanished, 0 rows skipped."""
    text = ("job_id,submit_time,duration,gpus,vc,name\n"
            "a,2024-03-04 00:00:00,100,1,nlp,\"unterminated\n"
            "b,2024-03-04 00:01:00,100,1,nlp,n\n")
    with pytest.raises(TraceFormatError, match=r"1 rows skipped.*malformed CSV: unexpected end of data"):
        read_trace(write(tmp_path, "quote.csv", text), "generic")


def test_format_errors_are_clear(tmp_path):
    bad = write(tmp_path, "bad.csv", "timestamp,duration,num_gpus\nnever,-1,x\n")
    with pytest.raises(TraceFormatError, match=r"no valid philly job rows .*1 rows read"):
        read_trace(bad, "philly")
    with pytest.raises(TraceFormatError, match="header lacks"):
        read_trace(bad, "helios")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        read_trace(bad, "slurm")
    with pytest.raises(TraceFormatError, match="matches none"):
        detect_format(write(tmp_path, "other.csv", "a,b\n1,2\n"))
    assert detect_format(write(tmp_path, "p.csv", PHILLY_TINY)) == "philly"
    assert detect_format(write(tmp_path, "h.csv", HELIOS_TINY)) == "helios"
    assert read_trace(write(tmp_path, "g.csv", GENERIC_TINY)).fmt == "generic"


def test_whole_philly_file_reads_fast_and_matches_its_published_shape():
    if not PHILLY.exists():
        pytest.skip(f"Philly trace not found at {PHILLY} (set LUCID_SHARED_DATA)")
    started = time.perf_counter()
    trace = read_trace(PHILLY, "philly")
    elapsed = time.perf_counter() - started
    print(f"read {len(trace.records)} Philly jobs in {elapsed:.3f} s")  # the speed target: benchmarks/bench_sim.py
    assert len(trace.records) == 74167 and not trace.problems
    assert len({r.job_id for r in trace.records}) == 74167
    assert len({r.vc for r in trace.records}) == 15
    week = read_trace(PHILLY, "philly", start="2017-10-01", end="2017-10-08")
    mean_h = sum(r.duration for r in week.records) / len(week.records) / 3600
    assert round(mean_h, 2) == 2.17  # the lower bound on average JCT quoted for this week
    assert week.epoch == datetime(2017, 10, 1)
    assert week.records[0].submit_time >= 0.0 and week.records[-1].submit_time < 7 * 86400


def test_check_trace_command_reports_bad_rows(tmp_path, capsys):
    import argparse

    from lucid_core.sim.check_trace import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["check-trace", str(write(tmp_path, "p.csv", PHILLY_TINY)), "--format", "philly"])
    assert args.func(args) == 1
    out = capsys.readouterr().out
    assert "3 jobs kept of 12 rows" in out and "9 skipped" in out and "not a number" in out
    args = parser.parse_args(["check-trace", str(write(tmp_path, "g.csv", "a,b\n1,2\n"))])
    assert args.func(args) == 2 and "matches none" in capsys.readouterr().err  # errors go to stderr, one line


def test_arbitrary_bytes_never_crash_the_reader(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    folder = tmp_path_factory.mktemp("fuzz")
    valid = b"timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,10,1,10,a\n"

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.binary(max_size=300), st.sampled_from(["philly", "helios", "generic", "auto"]))
    def check(garbage: bytes, fmt: str) -> None:
        path = folder / "fuzz.csv"
        path.write_bytes(valid + garbage)
        try:
            trace = read_trace(path, fmt)
        except TraceFormatError:
            return
        assert trace.records and all(r.duration > 0 and r.gpus >= 1 for r in trace.records)

    check()


def test_header_names_are_trimmed_and_a_bom_is_ignored(tmp_path):
    text = "\ufeffsubmit_time , duration,gpus\n2024-03-04 00:00:00,5,1\n\n2024-03-04 00:00:09,7,x\n"
    trace = read_trace(write(tmp_path, "g.csv", text), "generic")
    assert [(r.job_id, r.duration) for r in trace.records] == [("job-2", 5.0)]
    assert [(p.row, p.column) for p in trace.problems] == [(4, "gpus")]  # blank line 3 is skipped


def test_philly_fast_path_reads_a_row_as_the_careful_checks_do_or_leaves_it_to_them():
    """Every Philly row is read by the fast path only when each cell passes the careful checks, to the same
    values; any odd cell (blank, spaced, NaN, infinite, fractional, out of range, a time zone) goes the careful
    way, which names the problem."""
    from lucid_core.sim import traces

    def careful(row: dict[str, str | None]) -> object:
        try:
            return (traces._timestamp(row, "timestamp"), traces._duration(row, "duration"),
                    traces._gpus(row, "num_gpus"), traces._cell(row, "cluster", required=False) or "default")
        except traces._BadValue as bad:
            return bad.reason

    stamps = ["2017-10-01 00:00:00", " 2017-10-01 00:00:00 ", "2017-10-01T02:00:00+02:00", "", "yesterday", None]
    durations = ["60", " 60 ", "0", "-1", "nan", "inf", "1e12", "3.5", "1_000", "", None]
    gpus = ["1", " 8 ", "1.0", "1.5", "0", "nan", "1e9", "-inf", "2e0", "", None]
    clusters = ["c1", " c2 ", "", None]
    fast_rows = 0
    for stamp in stamps:
        for duration in durations:
            for count in gpus:
                for cluster in clusters:
                    row = {"timestamp": stamp, "duration": duration, "num_gpus": count, "cluster": cluster}
                    expected = careful(row)
                    fast = traces._philly_fast(row, 2)
                    if fast is None:
                        continue
                    fast_rows += 1
                    assert not isinstance(expected, str), (row, expected)  # a row the checks refuse never passes
                    assert (fast.submit, fast.duration, fast.gpus, fast.vc) == expected, row
                    assert traces._philly_row(row, 2) == fast
    assert fast_rows > 50  # the common forms do take the fast path


def test_times_out_of_range_and_lone_carriage_returns_are_rows_not_crashes(tmp_path):
    """A time zone that carries a time past year 9999 (or before year 1), and seconds before year 1, are bad rows
    named as such (they raised OverflowError out of the reader); a file whose lines end in a lone \\r is read row
    by row (every row after the header was one malformed line)."""
    from lucid_core.sim.traces import parse_trace

    philly = tmp_path / "philly.csv"
    philly.write_text("timestamp,duration,num_gpus\n9999-12-31T23:59:59-01:00,60,1\n"
                      "0001-01-01T00:00:00+01:00,60,1\n2017-10-01 00:00:00,60,1\n")
    parsed = parse_trace(philly, "philly")
    assert len(parsed.rows) == 1 and [(p.row, p.reason) for p in parsed.problems] == [
        (2, "time out of range (years 1 to 9999, in UTC)"), (3, "time out of range (years 1 to 9999, in UTC)")]
    generic = tmp_path / "generic.csv"
    generic.write_text("submit_time,duration,gpus\n-99999999999,60,1\n5,60,1\n")
    parsed = parse_trace(generic, "generic")
    assert len(parsed.rows) == 1 and [p.row for p in parsed.problems] == [2]
    lone = tmp_path / "lone_cr.csv"
    lone.write_bytes(b"timestamp,duration,num_gpus\r2017-10-01 00:00:00,60,1\r2017-10-01 00:00:01,x,2\r"
                     b"2017-10-01 00:00:02,60,2\r")
    parsed = parse_trace(lone, "philly")
    assert [r.gpus for r in parsed.rows] == [1, 2] and [(p.row, p.column) for p in parsed.problems] == [(3, "duration")]

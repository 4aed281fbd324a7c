"""The System Tuner replays stored jobs: an odd row (a hand edit, another controller) is left out and counted,
never fails the whole sweep (an infinite end, a NaN submit or 0 GPUs failed every configuration; an end at
1e300 s made every average JCT 3e298 s, so the ranking meant nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lucid_core.tuner import (
    MAX_RUN_S,
    MAX_WAIT_S,
    ConfigResult,
    TunerSettings,
    records_from_jobs,
    run_configuration,
    write_report,
)

REPO = Path(__file__).resolve().parents[1]
NORMAL = 20
METRICS = {"avg_jct_s": 600.0, "avg_queue_delay_s": 60.0, "p999_queue_delay_s": 300.0, "gpu_utilization": 0.5,
           "ended_in_profiling": 0.0, "jobs_shared": 0.0, "jobs": 20.0}


def _row(k: int, **changes: Any) -> dict[str, Any]:
    """A normal finished job as `extract_job_log` yields it (a few minutes' run), with `changes` made."""
    submit = 1000.0 + 60 * k
    row = {"job_id": f"j{k:02d}", "submit_time": submit, "start_time": submit + 10, "end_time": submit + 600 + 37 * k,
           "gpus": 1 + k % 4, "vc": "a", "user": "ann", "name": "n", "state": "COMPLETED", "preemptible": False}
    return {**row, **changes}


#: Rows no replay can use, each a kind the tuner must leave out and count (the job id says which).
ODD_ROWS = {
    "end inf": {"end_time": math.inf},
    "start inf": {"start_time": math.inf},
    "start -inf": {"start_time": -math.inf},
    "submit nan": {"submit_time": math.nan},
    "submit inf": {"submit_time": math.inf},
    "submit none": {"submit_time": None},
    "end 1e300": {"end_time": 1e300},
    "run a second over 30 days": {"start_time": 1010.0, "end_time": 1010.0 + MAX_RUN_S + 1},
    "end before start": {"end_time": 900.0},
    "start before submit": {"start_time": 990.0},
    "submit -1e300": {"submit_time": -1e300},
    "a wait a second over a year": {"submit_time": 1010.0 - MAX_WAIT_S - 1},
    "end not a number": {"end_time": "soon"},
    "gpus 0": {"gpus": 0},
    "gpus -4": {"gpus": -4},
    "gpus 2.5": {"gpus": 2.5},
    "gpus nan": {"gpus": math.nan},
    "gpus none": {"gpus": None},
    "gpus text": {"gpus": "four"},
}


@pytest.mark.parametrize("odd", list(ODD_ROWS.values()), ids=list(ODD_ROWS))
@pytest.mark.parametrize("where", [0, 5, NORMAL], ids=["first", "middle", "last"])
def test_one_odd_row_is_left_out_and_counted(odd, where):
    """Wherever the odd row sits (a NaN submit first or last shifted every other job's clock), the others
    are all replayed on a clock from the first good submit."""
    rows = [_row(k) for k in range(NORMAL)]
    rows.insert(where, _row(99, **odd))
    records = records_from_jobs(rows)
    assert [r.job_id for r in records] == [f"j{k:02d}" for k in range(NORMAL)]
    assert records.odd_jobs == 1
    assert records[0].submit_time == 0.0
    assert all(math.isfinite(r.submit_time) and 1.0 <= r.duration <= MAX_RUN_S for r in records)


def test_good_edge_rows_are_kept_and_unfinished_ones_are_not_odd():
    """A run of exactly 30 days, a zero-length run and 2.0 GPUs (a float column) are replayed; a job with no
    start or end (cancelled while queued: NULL, which a pandas frame holds as NaN) is not replayed and is
    not counted as odd."""
    rows = [_row(0, end_time=1010.0 + MAX_RUN_S), _row(1, end_time=1070.0), _row(2, gpus=2.0),
            _row(3, start_time=None), _row(4, start_time=math.nan), _row(5, end_time=None)]
    records = records_from_jobs(rows)
    assert [(r.job_id, r.duration, r.gpus) for r in records] == [("j00", MAX_RUN_S, 1), ("j01", 1.0, 2),
                                                                  ("j02", 590 + 74, 2)]
    assert records.odd_jobs == 0


def test_a_wait_of_zero_and_of_exactly_a_year_are_replayed():
    """The wait bounds are inclusive: a job started the second it was submitted, and one that waited exactly
    MAX_WAIT_S (which then sets the replay clock's origin, a year before the others)."""
    rows = [_row(0, start_time=1000.0), _row(1, submit_time=1070.0 - MAX_WAIT_S), _row(2)]
    records = records_from_jobs(rows)
    assert records.odd_jobs == 0
    assert [(r.job_id, r.submit_time) for r in records] == [("j01", 0.0), ("j00", MAX_WAIT_S - 70.0),
                                                            ("j02", MAX_WAIT_S + 50.0)]


def test_the_job_log_suite_and_the_tuner_share_the_30_day_limit():
    """The Update Engine's job-log suite refuses runs over the same bound the tuner leaves out."""
    suite = json.loads((REPO / "include" / "gx" / "job_log.json").read_text(encoding="utf-8"))
    bounds = [e["kwargs"]["max_value"] for e in suite["expectations"]
              if e["type"] == "expect_column_values_to_be_between" and e["kwargs"]["column"] == "duration"]
    assert bounds == [MAX_RUN_S]


def _seed(url: str, odd: dict[str, dict[str, Any]]) -> float:
    """NORMAL finished jobs of the last hour in a real store, then the `odd` ones (by job id) edited in by hand."""
    import sqlalchemy as sa

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    store = Store(url)
    now = store.now()
    ids = [f"j{k:02d}" for k in range(NORMAL)] + list(odd)
    shift = now - 3600 - _row(0)["submit_time"]
    with store.session() as s:
        for k, job_id in enumerate(ids):
            row = _row(k)
            s.add(JobRow(job_id=job_id, seq=k + 1, name="n", user="ann", vc="a", gpus=row["gpus"], command="true",
                         env={}, state="COMPLETED", submit_time=row["submit_time"] + shift,
                         start_time=row["start_time"] + shift, end_time=row["end_time"] + shift))
    with store.session() as s:
        for job_id, values in odd.items():
            s.execute(sa.update(JobRow).where(JobRow.job_id == job_id).values(**values))
    store.dispose()
    return now


def _stored_odd_rows(url: str, now: float) -> dict[str, dict[str, Any]]:
    """One odd row of each kind a store can hold (SQLite stores a NaN as NULL, refused for a submit time)."""
    odd = {"end-inf": {"end_time": math.inf}, "start-inf": {"start_time": math.inf},
           "end-1e300": {"end_time": 1e300}, "end-31-days": {"end_time": now + 31 * 86400.0},
           "end-before-start": {"end_time": now - 7200.0}, "gpus-0": {"gpus": 0}, "gpus-neg": {"gpus": -4}}
    if url.startswith("postgresql"):
        odd["submit-nan"] = {"submit_time": math.nan}  # NaN sorts above every number: it passes `>= since`
    return odd


#: odd rows of `_stored_odd_rows` the window a sweep replays (jobs submitted and finished in it) leaves out
AFTER_THE_WINDOW = {"end-inf", "end-1e300", "end-31-days", "submit-nan"}


def test_a_sweep_replays_a_real_store_with_odd_rows(store_url, monkeypatch, tmp_path):
    """The tuner's own trace loading (`load_tuner_trace`, the store's last 7 days) on SQLite and PostgreSQL:
    the odd rows are left out and counted, the normal ones all replayed, one configuration simulates, and
    its report says how many stored jobs were left out."""
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    import lucid_airflow.connections
    from lucid_airflow.tuning import load_tuner_trace

    from lucid_core.runtime.store.store import Store

    store = Store(store_url)
    now = store.now()
    store.dispose()
    odd = _stored_odd_rows(store_url, now)
    _seed(store_url, odd)
    monkeypatch.setattr(lucid_airflow.connections, "store_url", lambda *_: store_url)

    records = load_tuner_trace({"window_days": 7})
    assert sorted(r.job_id for r in records) == [f"j{k:02d}" for k in range(NORMAL)]
    # rows that end (or, NaN, are submitted) after the sweep's window are outside it before they could be odd
    odd = {job: values for job, values in odd.items() if job not in AFTER_THE_WINDOW}
    assert records.odd_jobs == len(odd) >= 4

    settings = TunerSettings(main_nodes=4, objective="avg_jct")
    result = run_configuration(records, {}, settings)
    assert result.error is None
    assert result.metrics["jobs"] == NORMAL
    assert result.metrics["avg_jct_s"] < 86400.0
    assert result.odd_jobs == len(odd)

    summary = write_report([result], settings, tmp_path)
    assert summary["odd_jobs"] == len(odd)
    said = f"{len(odd)} stored jobs left out: non-finite or impossible times or GPU counts"
    assert said in (tmp_path / "report.md").read_text(encoding="utf-8")
    assert said in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_the_report_takes_the_count_from_the_configurations_it_ran(tmp_path):
    """The count travels in each configuration's result (an Airflow XCom), so the report task can say it."""
    result = ConfigResult(0, {}, metrics=dict(METRICS), odd_jobs=1)
    back = ConfigResult.from_dict(json.loads(json.dumps(result.to_dict())))
    summary = write_report([back], TunerSettings(main_nodes=2), tmp_path)
    assert summary["odd_jobs"] == 1
    assert "1 stored job left out: non-finite or impossible times or GPU counts" in (
        tmp_path / "report.md").read_text(encoding="utf-8")
    clean = write_report([ConfigResult(0, {}, metrics=dict(METRICS))], TunerSettings(main_nodes=2),
                         tmp_path / "clean")
    assert clean["odd_jobs"] == 0
    assert "stored job" not in (tmp_path / "clean" / "report.md").read_text(encoding="utf-8")


def test_every_task_of_a_sweep_replays_the_same_jobs_though_one_finishes_between_them(store_url, monkeypatch):
    """The window is fixed once for the sweep (`tuner_window`, in expand_grid): each mapped task computing its own
    "now" replayed 20 jobs in one task and 21 in the next when a job finished between them."""
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    import lucid_airflow.connections
    from lucid_airflow.tuning import load_tuner_trace, tuner_window

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    _seed(store_url, {})
    monkeypatch.setattr(lucid_airflow.connections, "store_url", lambda *_: store_url)
    params = {"window_days": 7}
    window = tuner_window(params)
    first = sorted(r.job_id for r in load_tuner_trace(params, window))
    store = Store(store_url)
    now = store.now()
    with store.session() as s:  # a job submitted in the window finishes after the sweep began
        s.add(JobRow(job_id="late", seq=999, name="n", user="ann", vc="a", gpus=1, command="true", env={},
                     state="COMPLETED", submit_time=window["until"] - 60, start_time=window["until"] - 50,
                     end_time=max(now, window["until"]) + 1))
    store.dispose()
    assert len(first) == NORMAL
    assert sorted(r.job_id for r in load_tuner_trace(params, window)) == first  # the late job is not in it
    assert tuner_window({"trace_path": "x.csv"}) is None  # a trace file's window is the form's


def test_a_window_of_only_odd_jobs_says_they_were_left_out_not_that_there_were_none(store_url, monkeypatch):
    """Every finished job of the window odd (0 GPUs, a hand edit): the sweep stops saying how many were left out
    and why, not "the store has no finished job" (which sent a user looking for jobs that were there)."""
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    import lucid_airflow.connections
    import sqlalchemy as sa
    from lucid_airflow.tuning import load_tuner_trace

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    _seed(store_url, {})
    store = Store(store_url)
    with store.session() as s:
        s.execute(sa.update(JobRow).values(gpus=0))
    store.dispose()
    monkeypatch.setattr(lucid_airflow.connections, "store_url", lambda *_: store_url)
    with pytest.raises(ValueError, match=f"can be replayed: {NORMAL} stored jobs left out: non-finite or impossible"):
        load_tuner_trace({"window_days": 7})


def test_an_empty_store_window_says_so_in_utc_as_the_quiet_week_the_dag_skips(store_url, monkeypatch):
    """A window with no finished job raises NothingToReplay (the System Tuner's first task skips the run on it),
    its time in UTC with the zone: time.ctime gave the worker's local time, with no zone, in every mapped task."""
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    import lucid_airflow.connections
    from lucid_airflow.tuning import NothingToReplay, load_tuner_trace

    _seed(store_url, {})  # every job finished within the last hour: none in 1970
    monkeypatch.setattr(lucid_airflow.connections, "store_url", lambda *_: store_url)
    with pytest.raises(NothingToReplay) as raised:
        load_tuner_trace({"window_days": 7}, {"since": 86400.0, "until": 2 * 86400.0})
    assert str(raised.value) == "the store has no finished job since 1970-01-02 00:00:00 UTC: nothing to replay"

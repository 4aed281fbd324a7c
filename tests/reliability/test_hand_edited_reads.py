"""Every read surface over a store a hand edit has left odd values in: no page, API answer or `lucid` read
command fails whole. One odd job or run is shown as unreadable or said to be, never a 500 or a traceback, and
the other jobs are listed as they are. SQLite keeps text in number and JSON columns; PostgreSQL keeps NaN and
infinities in float columns. Found by sweeping these surfaces over such a store (2026-12-07): text in a waiting
job's GPUs, a run's start time or measured speed, and unparseable GPU indices each failed the running page, the
metrics, the job's API answer, its ETA or every round."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lucid_core.cli import main
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.api import create_app

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "runtime"))
from test_plain_views import _fill  # noqa: E402  (the 70-job store with pairs now and past)

#: (table, row, column, value): each a value the column's type would refuse on PostgreSQL, which SQLite keeps.
EDITS = [("jobs", "seq = 2", "queue_position", "soon"), ("jobs", "seq = 2", "predicted_duration", "long"),
         ("jobs", "seq = 2", "submit_time", "x"), ("jobs", "seq = 3", "gpus", "many"),
         ("jobs", "seq = 3", "share_class", "z"), ("jobs", "seq = 4", "end_time", "later"),
         ("jobs", "seq = 4", "exit_code", "x"), ("runs", "run_id = 'r-b'", "started_at", "x"),
         ("runs", "run_id = 'r-b'", "observed_speed", "fast"), ("runs", "run_id = 'r-c'", "gpu_indices", "[0,"),
         ("runs", "run_id = 'r-a'", "observed_speed_at", "x"),  # its speed (0.83) readable, its time not
         ("runs", "run_id = 'r-d0' AND host = 'm1'", "gpu_indices", '["a", null]'),
         ("jobs", "seq = 1", "known_min_duration", "x"),
         ("runs", "run_id = 'r-f'", "stop_reason", 7),  # a stop pending for a reason no round writes
         ("hosts", "name = 'm1'", "cooldown_until", "soon")]


#: The same on PostgreSQL, whose column types refuse text but keep a float's NaN and infinities, and any integer.
PG_EDITS = [("jobs", "seq = 2", "predicted_duration", "NaN"), ("jobs", "seq = 2", "submit_time", "Infinity"),
            ("jobs", "seq = 3", "gpus", -4), ("jobs", "seq = 4", "end_time", "-Infinity"),
            ("jobs", "seq = 5", "start_time", "NaN"), ("runs", "run_id = 'r-b'", "started_at", "NaN"),
            ("runs", "run_id = 'r-b'", "observed_speed", "Infinity"),
            ("runs", "run_id = 'r-c'", "gpu_indices", '{"gpus": [0]}'),
            ("runs", "run_id = 'r-a'", "observed_speed_at", "NaN"),  # its speed (0.83) readable, its time not
            ("runs", "run_id = 'r-d0' AND host = 'm1'", "gpu_indices", "[null]"),
            ("hosts", "name = 'm1'", "cooldown_until", "NaN")]


@pytest.fixture
def odd_store(store_url, monkeypatch, tmp_path) -> tuple[str, list[str]]:
    """`_fill`'s store with the edits of its backend made by hand."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "none.toml"))
    ids = _fill(store_url)
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            for table, where, column, value in EDITS:
                assert conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (value,)).rowcount == 1
        return store_url, ids
    import sqlalchemy as sa

    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        for table, where, column, value in PG_EDITS:
            value_sql = "CAST(:v AS json)" if column == "gpu_indices" else ":v"
            assert conn.execute(sa.text(f"UPDATE {table} SET {column} = {value_sql} WHERE {where}"),
                                {"v": value}).rowcount == 1
    engine.dispose()
    return store_url, ids


def test_no_page_or_api_answer_fails_on_hand_edited_values(odd_store, tmp_path):
    url, ids = odd_store
    if str(REPO / "plugins") not in sys.path:
        sys.path.insert(0, str(REPO / "plugins"))
    from lucid_airflow.web import create_lucid_app

    pages = TestClient(create_lucid_app(lambda: url, lambda: tmp_path / "reports", protect=False),
                       raise_server_exceptions=False)
    api = TestClient(create_app(url), raise_server_exceptions=False)
    failed = []
    for path in ["/queue", "/running", "/jobs", "/models", *(f"/jobs/{i}" for i in ids)]:
        if (reply := pages.get(path)).status_code >= 500:
            failed.append(("page", path, reply.status_code))
    for path in ["/queue", "/history", "/metrics", "/hosts", *(f"/jobs/{i}" for i in ids),
                 *(f"/jobs/{i}/{what}" for i in ids for what in ("explain", "eta"))]:
        if (reply := api.get(path)).status_code >= 500:
            failed.append(("api", path, reply.status_code))
    assert failed == []
    running = pages.get("/running").text
    assert "unreadable" in running or "not measured yet" in running
    assert api.get("/jobs/j002/explain").status_code == 422  # its submit time is no time: said so


def test_no_read_command_fails_whole_on_hand_edited_values(odd_store, capsys):
    url, ids = odd_store
    commands = [["queue"], ["queue", "--json"], ["history"], ["history", "--json"], ["metrics"],
                *(["status", i] for i in ids[:12]), *(["eta", i] for i in ids[:6]), *(["explain", i] for i in ids[:6])]
    for argv in commands:
        code = main([*argv, "--store", url])
        out, err = capsys.readouterr()
        assert code in (0, 2) and (code == 2 or out.strip()), (argv, err[-1500:])
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, (argv, err[-1500:])
    Store(url).dispose()


def test_pages_and_commands_say_which_runs_are_being_stopped(store_url, monkeypatch, tmp_path, capsys):
    """A run kept for a stop after its launch went unanswered has no start time: it reads as being stopped, with
    why, not as starting; a started run being stopped says why too."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "none.toml"))
    ids = _fill(store_url)
    if str(REPO / "plugins") not in sys.path:
        sys.path.insert(0, str(REPO / "plugins"))
    from lucid_airflow.web import create_lucid_app

    pages = TestClient(create_lucid_app(lambda: store_url, lambda: tmp_path / "reports", protect=False))
    running = pages.get("/running").text
    assert "stopping: its job was cancelled; its launch went unanswered" in running
    assert "no start reported" in running and "stopping: it yields its GPUs to other work" in running
    api = TestClient(create_app(store_url))
    runs = {r["run_id"]: r for job_id in ids for r in api.get(f"/jobs/{job_id}/explain").json()["runs"]}
    assert runs["r-e"]["stopping"].startswith("stopping: its job was cancelled")
    job_of_e = next(job_id for job_id in ids
                    if any(r["run_id"] == "r-e" for r in api.get(f"/jobs/{job_id}").json()["runs"]))
    assert "stopping: its job was cancelled" in pages.get(f"/jobs/{job_of_e}").text
    assert main(["status", job_of_e, "--store", store_url]) == 0
    assert ("r-e on m1 GPUs [6]: running (stopping: its job was cancelled; its launch went unanswered"
            in capsys.readouterr().out)
    Store(store_url).dispose()

"""The plugin's pages render what the store and the reports hold (auth is tested end to end elsewhere)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from lucid_af_support import SAMPLE_TRACE


def test_views_show_queue_gpu_map_job_explanation_tuner_and_drift(lucid_home, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient
    from lucid_airflow import round_steps
    from lucid_airflow.web import create_lucid_app

    from lucid_core.alerts import check_drift
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit
    from lucid_core.sim.traces import read_trace
    from lucid_core.tuner import TunerSettings, run_configuration, write_report
    from lucid_core.update import save_drift_history

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    config = tmp_path / "lucid.toml"
    config.write_text('[profiler]\nenabled = false\n[binder]\nsharing = "on"\n')
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    store = Store(url)
    add_host(store, HostSpec("main0", executor="local", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "main0")))
    ids = [submit(store, JobRequest("sleep 4", gpus=1, user=f"u{k}", vc="default", name=f"sweep-{k}"))
           for k in range(4)]
    for _ in range(2):  # first round places, the second pairs / records reasons for the rest
        decided = round_steps.profile_bind_and_place(url, round_steps.reconcile(url))
        round_steps.carry_out(url, decided)
        time.sleep(0.5)

    reports = lucid_home / "reports"
    records = read_trace(SAMPLE_TRACE, "generic").records
    settings = TunerSettings(main_nodes=2)
    results = [run_configuration(records, {"profiler.tprof_s": t}, settings, index=i)
               for i, t in enumerate((100, 300))]
    write_report(results, settings, reports / "tuner" / "manual_run")
    drift = check_drift("duration", [0.5] * 20, [1.5] * 20, {"gpus": [1.0] * 40}, {"gpus": [8.0] * 40})
    # an input whose PSI passes the threshold but not the spread its training window showed: under its bar
    bursty = check_drift("throughput", [0.5] * 20, [0.5] * 20, {"submit_gpu_job": list(range(40))},
                         {"submit_gpu_job": [3.0] * 40}, input_spread={"submit_gpu_job": 50.0})
    save_drift_history(reports / "drift", "manual__1", [r.to_dict() | {"body": r.body} for r in (drift, bursty)],
                       "ops@example.org")

    client = TestClient(create_lucid_app(lambda: url, lambda: reports, protect=False))
    queue = client.get("/queue")
    assert queue.status_code == 200 and '<table id="queue">' in queue.text
    waiting = [i for i in ids if i in queue.text]
    assert waiting, "some jobs wait behind the one GPU"
    assert "sweep-" in queue.text
    one = next(i for i in ids if i in waiting)
    user = f"u{ids.index(one)}"
    mine = client.get("/queue", params={"user": user})
    assert mine.status_code == 200 and one in mine.text and f"value='{user}'" in mine.text
    assert not any(i in mine.text for i in waiting if i != one) and "matching the filter" in mine.text
    assert all(i in client.get("/queue", params={"vc": "default"}).text for i in waiting)
    refused = client.get("/queue", params={"user": "a\x00b"})
    assert refused.status_code == 422 and "invalid-input" in refused.text

    running = client.get("/running")
    assert running.status_code == 200 and "gpumap-main0" in running.text
    assert "GPU 0" in running.text and any(i in running.text for i in ids)
    assert "<th>speed while shared</th>" in running.text

    detail = client.get(f"/jobs/{ids[0]}")
    assert detail.status_code == 200 and "Why it is where it is" in detail.text
    assert "Priority" in detail.text or "No duration predicted" in detail.text
    assert "Explanation unavailable" not in detail.text, detail.text[-2000:]
    assert "Used when the round placed it" in detail.text and "predicted" in detail.text  # as the decision used it
    assert client.get("/jobs/nope").status_code == 404

    listing = client.get("/tuner")
    assert "manual_run" in listing.text
    report = client.get("/tuner/manual_run")
    assert report.status_code == 200 and "System Tuner" in report.text and "tprof_s" in report.text
    plot = client.get("/files/tuner/manual_run/objective.png")
    assert plot.status_code == 200 and plot.content[:4] == b"\x89PNG"
    assert client.get("/files/tuner/../../lucid.db").status_code == 404

    history = client.get("/drift")
    assert "ALERT" in history.text and "3.000" in history.text and "ops@example.org" in history.text
    assert "shifted" in history.text and "submit_gpu_job" in history.text and "(bar 50.000)" in history.text
    drift_rows = {row.split("</td>")[1].rsplit(">", 1)[-1]: row for row in history.text.split("<tr>")[2:]}
    assert "ops@example.org" in drift_rows["duration"] and "ops@example.org" not in drift_rows["throughput"]
    assert not bursty.drifted and bursty.shifts[0].psi > 0.2
    assert client.get("/models").status_code == 200
    # a promoted version whose file lies outside LUCID_HOME/models: rounds do not load it, and the page says so
    from lucid_core.runtime.store.store import record_promotion

    with store.session() as s:
        record_promotion(s, "duration", "v9", str(tmp_path / "elsewhere.joblib"), {}, "by hand")
        record_promotion(s, "throughput_forecaster", "v2", str(lucid_home / "models" / "registry" / "x.joblib"),
                         {"reference_mae": 1.23456, "reference_errors": [0.778761452826715] * 200, "train_rows": 4210,
                          "recent_rows": 88, "fit_seconds": 2.5, "training_window": [1764547200.0, 1765152000.0],
                          "reference_inputs": {"gpus": [1.0] * 100}}, "by the engine")
    rows = {row.split("</td>")[0].rsplit(">", 1)[-1]: row for row in client.get("/models").text.split("<tr>")[2:]}
    assert "not loaded: its file lies outside LUCID_HOME/models" in rows["duration"]
    assert "not loaded" not in rows["throughput_forecaster"] and "<td>yes</td>" in rows["throughput_forecaster"]
    # its metrics in words: error, rows, fit time, window; not the per-job errors cut mid-number
    assert ("MAE 1.235; trained on 4,210 jobs; 88 recent; fit in 2.5 s; window 2025-12-01 00:00 to 2025-12-08 00:00"
            in rows["throughput_forecaster"]), rows["throughput_forecaster"]
    assert "0.7787" not in rows["throughput_forecaster"]
    api = client.get("/api/queue")
    assert api.status_code == 200 and isinstance(api.json(), list | dict), api.text
    assert json.dumps(api.json())

    # a pair with the speed a round keeps for it (the round's own write is tested over sshd in
    # tests/runtime/test_pair_speed_live.py): a waiting job is entered as the running one's partner
    from sqlalchemy import select, update

    from lucid_core.runtime.store.schema import RunRow

    with store.session() as s:
        [alone] = s.scalars(select(RunRow).where(RunRow.kind == "main", RunRow.state == "running")).all()
        other = next(i for i in ids if i != alone.job_id)
        s.add(RunRow(run_id=f"{other}-main1", host=alone.host, job_id=other, kind="main", pool="main",
                     gpu_indices=alone.gpu_indices, node_rank=0, partner=alone.job_id, state="running",
                     planned_at=time.time(), started_at=time.time()))
        s.execute(update(RunRow).where(RunRow.run_id == alone.run_id).values(
            partner=other, observed_speed=0.57, observed_speed_at=time.time() - 90, observed_speed_samples=12,
            observed_speed_emulated=True))
    running = client.get("/running").text
    assert "0.57 <span class='muted'>(1.5 min ago, 12 samples, emulated)</span>" in running
    assert "not measured yet" in running  # the partner's speed is not known yet
    assert f"{alone.job_id} <span class='muted'>@ 0.57</span>" in running  # in the GPU map cell too
    detail = client.get(f"/jobs/{alone.job_id}").text
    assert f"speed while shared with {other}: 0.57 of its speed alone" in detail
    assert "over 12 samples of emulated telemetry" in detail


def test_job_history_page_filters_pages_and_links_each_job(lucid_home, tmp_path):
    from fastapi.testclient import TestClient
    from lucid_af_support import seed_finished_jobs
    from lucid_airflow.web import HISTORY_PAGE_SIZE, create_lucid_app

    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.queries import HistoryQuery, history

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    seeded = seed_finished_jobs(url, limit=120)
    client = TestClient(create_lucid_app(lambda: url, lambda: lucid_home / "reports", protect=False))
    first = client.get("/jobs")
    assert first.status_code == 200 and '<table id="history">' in first.text
    assert f"page 1 of {-(-seeded // HISTORY_PAGE_SIZE)} ({seeded} job(s))" in first.text
    rows = first.text.split("<tbody>")[1].count("<tr>")
    assert rows == HISTORY_PAGE_SIZE and first.text.count('href="/lucid/jobs/job-') == HISTORY_PAGE_SIZE
    assert "older &rarr;" in first.text and "page=2" in first.text
    # the page and `lucid history` read the same query: the same filter gives the same jobs
    store = Store(url)
    with store.session() as s:
        failed = history(s, HistoryQuery(states=("FAILED",), vc="nlp", limit=500))
    store.dispose()
    assert 0 < failed.total < seeded
    page = client.get("/jobs", params={"state": "FAILED", "vc": "nlp"}).text
    assert f"({failed.total} job(s))" in page
    assert all(f">{r['job_id']}</a>" in page for r in failed.rows[:HISTORY_PAGE_SIZE])
    assert "COMPLETED" not in page.split("<tbody>")[1]
    late = client.get("/jobs", params={"since": "2030-01-01"}).text
    assert "No finished job matches" in late
    refused = client.get("/jobs", params={"since": "yester\x1bday", "user": "ann"})
    assert refused.status_code == 422 and "id='invalid-input'" in refused.text
    notice = refused.text.split("id='invalid-input'>")[1].split("</p>")[0]
    assert "yester\\x1bday" in notice and "\x1b" not in notice  # quoted as typed, visibly
    assert "<form class='filters'" in refused.text and "value='ann'" in refused.text  # the filters, to correct


def test_empty_models_and_drift_pages_say_how_they_get_filled(lucid_home):
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    from lucid_core.runtime.store.store import Store

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    Store(url).dispose()
    client = TestClient(create_lucid_app(lambda: url, lambda: lucid_home / "reports", protect=False))
    models = client.get("/models").text
    assert "id='models-hint'" in models and "lucid_update_engine" in models
    drift = client.get("/drift").text
    assert "id='drift-hint'" in drift and "lucid_update_engine" in drift


STORE_PAGES = ("/queue", "/running", "/jobs", "/jobs/j000001", "/models")
STORE_PASSWORD = "Pw-pages-3b9d"  # a recognisable secret: it must never show up on a page


def _store_down_pages(url: str, reports: Path, words: str) -> None:
    """Each page reading the store answers a 503 page of the UI (navigation, heading) with `words`, not a bare 500."""
    import html

    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    client = TestClient(create_lucid_app(lambda: url, lambda: reports, protect=False), raise_server_exceptions=False)
    for path in STORE_PAGES:
        reply = client.get(path, headers={"accept": "text/html"})
        assert reply.status_code == 503 and reply.headers["content-type"].startswith("text/html"), (path, reply.text)
        assert reply.text.startswith("<!doctype html>") and "<nav>" in reply.text, reply.text
        assert "<h1>Lucid store unavailable</h1>" in reply.text
        assert f"<p class='hint bad' id='store-unavailable'>{html.escape(words)}" in reply.text, reply.text
        assert STORE_PASSWORD not in reply.text


def test_pages_and_api_say_a_store_that_cannot_be_reached_without_its_password(tmp_path):
    """A PostgreSQL server down (or a wrong database): a 503 page and a JSON 503 at /api saying where and why,
    never the URL's password. They answered a bare text/plain 500 "Internal Server Error"."""
    import socket

    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    with socket.socket() as probe:  # a loopback port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg2://lucid:{STORE_PASSWORD}@127.0.0.1:{port}/lucid"
    _store_down_pages(url, tmp_path, f"The Lucid store at 127.0.0.1:{port}/lucid cannot be read: ")
    client = TestClient(create_lucid_app(lambda: url, lambda: tmp_path, protect=False), raise_server_exceptions=False)
    for path in ("/api/queue", "/api/jobs/j000001/logs"):  # the API built at the first request, then in use
        reply = client.get(path)
        assert reply.status_code == 503 and reply.headers["content-type"] == "application/json", (path, reply.text)
        detail = reply.json()["detail"]
        assert detail.startswith(f"The Lucid store at 127.0.0.1:{port}/lucid cannot be read: "), detail
        assert "refused" in detail and STORE_PASSWORD not in reply.text


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_pages_say_a_store_never_set_up_and_how_to_set_it_up(tmp_path, kind, request):
    """A store with no tables yet (nothing has migrated it): each page says so and what creates them."""
    if kind == "sqlite":
        url, place = f"sqlite:///{tmp_path / 'empty.db'}", str(tmp_path / "empty.db")
    else:
        from sqlalchemy.engine import make_url

        url = request.getfixturevalue("empty_pg_url")  # emptied for this test (skipped without a server)
        parts = make_url(url)
        place = f"{parts.host}:{parts.port}/{parts.database}"
    _store_down_pages(url, tmp_path, f"The Lucid store at {place} is not set up yet: it has no tables (")


def test_api_reference_is_served_without_internet(lucid_home):
    """The API's docs page is rendered by the app itself: no script or style from another host."""
    import re

    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    from lucid_core.runtime.store.store import Store

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    Store(url).dispose()
    client = TestClient(create_lucid_app(lambda: url, lambda: lucid_home / "reports", protect=False))
    docs = client.get("/api/docs")
    assert docs.status_code == 200 and "POST" in docs.text and "/jobs" in docs.text and "/history" in docs.text
    assert not re.search(r"<(script|link)[^>]+(src|href)=['\"]?https?://", docs.text), "assets from another host"
    assert "<script" not in docs.text
    assert "command" in docs.text  # the request body's fields are listed
    assert client.get("/api/openapi.json").json()["info"]["title"] == "Lucid scheduler"


def test_a_report_file_cut_short_is_shown_unreadable_and_the_pages_still_answer(lucid_home):
    """A task killed while writing its report.json, or a drift record gone bad: the page listing them all used to
    answer 500 for every report."""
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    reports = lucid_home / "reports"
    (reports / "tuner" / "cut").mkdir(parents=True)
    (reports / "tuner" / "cut" / "report.json").write_text('{"objective": "avg_j')
    (reports / "tuner" / "cut" / "report.html").write_text("<p>partial report</p>")
    (reports / "tuner" / "odd").mkdir()
    (reports / "tuner" / "odd" / "report.json").write_text('["not", "a", "summary"]')
    (reports / "drift").mkdir()
    (reports / "drift" / "manual__9.json").write_text('{"reports": [{"model": "duration"}]}')
    huge = {"model": "duration", "reference_mae": 10**400, "recent_mae": 1, "mae_ratio": 1, "psi_threshold": 0.2,
            "drifted": True, "in_a_row": 1, "checks_to_alert": 2}
    (reports / "drift" / "manual__8.json").write_text(json.dumps({"reports": [huge]}))  # past a float's range
    (reports / "drift" / "manual__7.json").write_text('{"reports": ' + "[" * 100_000 + "]" * 100_000 + "}")
    client = TestClient(create_lucid_app(lambda: f"sqlite:///{lucid_home / 'lucid.db'}", lambda: reports,
                                         protect=False))
    listing = client.get("/tuner")
    assert listing.status_code == 200 and listing.text.count("its report.json cannot be read") == 2
    one = client.get("/tuner/cut")
    assert one.status_code == 200 and "partial report" in one.text
    drift = client.get("/drift")
    assert drift.status_code == 200 and drift.text.count("this record cannot be read") == 2  # the deep one: none


def _serve_at_lucid(app) -> tuple[str, object]:
    """`app` mounted at /lucid on a loopback port, as Airflow mounts it (uvicorn in a thread); (base, server)."""
    import socket
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Mount("/lucid", app=app)]), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.1)
    return f"http://127.0.0.1:{port}", server


def test_refusal_pages_read_right_in_headless_chromium(lucid_home, tmp_path):
    """What a person sees: `?page=abc` is a page of the UI (not FastAPI's JSON) naming the parameter, and an id
    holding a NUL or an escape is shown with them escaped (a raw NUL is dropped by the browser: another id)."""
    import shutil

    import pytest

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("websockets.sync.client", reason="the CDP driver needs websockets (the dev extra)")
    from cdp_browser import Browser
    from lucid_airflow.web import create_lucid_app

    from lucid_core.runtime.store.store import Store

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    Store(url).dispose()
    base, server = _serve_at_lucid(create_lucid_app(lambda: url, lambda: lucid_home / "reports", protect=False))
    browser = Browser(tmp_path / "profile")
    try:
        browser.navigate(f"{base}/lucid/jobs?page=abc")
        browser.wait_for("document.getElementById('invalid-input')", what="the 422 page")
        assert browser.evaluate("document.querySelector('h1').innerText") == "Invalid request"
        assert (browser.evaluate("document.getElementById('invalid-input').innerText")
                == "page must be a whole number, 1 or more, got 'abc'")
        assert browser.evaluate("document.querySelectorAll('nav a').length") >= 5, "the UI's navigation"
        assert browser.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")

        browser.navigate(f"{base}/lucid/jobs/a%00b%1B%5B31mc")
        browser.wait_for("document.getElementById('not-found')", what="the 404 page")
        assert (browser.evaluate("document.getElementById('not-found').innerText")
                == "There is no job a\\x00b\\x1b[31mc in the Lucid store.")
    finally:
        browser.close()
        server.should_exit = True


def test_pages_and_api_warn_when_rounds_have_stalled(lucid_home, tmp_path, monkeypatch):
    """`lucid queue` and `status` warned when rounds had stalled; the queue, running and job pages and the API's
    /queue and /jobs/{id} showed the stale state as current. Now the pages say it atop (a job page only for a job
    not yet ended) and the API sends a `Warning: 299` header; while rounds keep their pace neither does."""
    from fastapi.testclient import TestClient
    from lucid_airflow import round_steps
    from lucid_airflow.web import create_lucid_app
    from sqlalchemy import update

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import RoundRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.api import create_app, warning_header
    from lucid_core.runtime.surfaces.queries import status
    from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    store = Store(url)
    add_host(store, HostSpec("main0", executor="local", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "main0")))

    def rounds_until(done) -> None:
        deadline = time.monotonic() + 30
        while True:
            round_steps.carry_out(url, round_steps.profile_bind_and_place(url, round_steps.reconcile(url)))
            if done():
                return
            assert time.monotonic() < deadline
            time.sleep(0.3)

    ended = submit(store, JobRequest("true", gpus=1, user="ana", vc="default"))
    pages = TestClient(create_lucid_app(lambda: url, lambda: lucid_home / "reports", protect=False))
    api = TestClient(create_app(url, store=store))
    assert "No scheduling round has run yet" in pages.get("/queue").text  # a job waits and no round ever ran
    assert api.get("/queue").headers.get("Warning", "").startswith('299 lucid "no scheduling round has run yet')
    rounds_until(lambda: status(store, ended)["state"] == "COMPLETED")
    running = submit(store, JobRequest("sleep 60", gpus=1, user="ana", vc="default"))
    rounds_until(lambda: status(store, running)["state"] == "RUNNING")
    try:
        for path in ("/queue", "/running", f"/jobs/{running}"):
            assert "id='rounds-stalled'" not in pages.get(path).text, path
        for path in ("/queue", f"/jobs/{running}"):
            assert "Warning" not in api.get(path).headers, path
        with store.session() as s:  # then they stopped, ten minutes ago
            s.execute(update(RoundRow).values(started_at=RoundRow.started_at - 600.0,
                                              ended_at=RoundRow.ended_at - 600.0))
        for path in ("/queue", "/running", f"/jobs/{running}"):
            page = pages.get(path).text
            assert "id='rounds-stalled'>Rounds stalled: no scheduling round has started for 10." in page, path
        assert "id='rounds-stalled'" not in pages.get(f"/jobs/{ended}").text  # its page is not out of date
        for path in ("/queue", f"/jobs/{running}"):
            warning = api.get(path).headers.get("Warning", "")
            assert warning.startswith('299 lucid "rounds stalled: no scheduling round has started for 10.'), path
        assert "Warning" not in api.get(f"/jobs/{ended}").headers
        assert warning_header('a\x00"b\\\r\nc é\x7f') == '299 lucid "a \\"b\\\\ c ?"'  # quoted, printable
    finally:
        cancel(store, running)
        rounds_until(lambda: status(store, running)["state"] == "CANCELLED")
        store.dispose()


def test_the_plugins_api_never_migrates_the_store(lucid_home):
    """The first /lucid/api request, a Viewer's GET too, created and migrated the Lucid tables in whatever database
    `lucid_db` named (the Airflow metadata database, by a typo); the round owns the schema."""
    import sqlalchemy as sa
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    lucid_home.mkdir(parents=True, exist_ok=True)
    path = lucid_home / "not-a-store.db"
    sa.create_engine(f"sqlite:///{path}").dispose()
    client = TestClient(create_lucid_app(lambda: f"sqlite:///{path}", lambda: lucid_home / "reports",
                                         protect=False), raise_server_exceptions=False)
    assert client.get("/api/queue").status_code != 200
    engine = sa.create_engine(f"sqlite:///{path}")
    assert sa.inspect(engine).get_table_names() == []
    engine.dispose()

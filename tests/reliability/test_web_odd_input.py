"""Odd values in the URLs and bodies of the plugin's pages and the runtime API get a clear 4xx on SQLite and
PostgreSQL, never a 500 or a misleading page: an id no store could hold is an unknown job (404), a filter no job
could match or a page out of range is refused naming it (422), a file name the OS refuses is not found (404),
a query value of the wrong form is a 422 page of the UI naming the parameter (the JSON API keeps JSON), a control
character of a requested id is shown escaped, and an unknown key or a value of another JSON type in a submission is
refused naming the field."""

from __future__ import annotations

import html
import json
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.schema import JobRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces import queries
from lucid_core.runtime.surfaces.api import create_app
from lucid_core.runtime.surfaces.submission import UnknownJob, cancel

REPO = Path(__file__).resolve().parents[2]
FINISHED = 60  # two pages of the history page
NUL_IDS = ["%00", "a%00b"]


def _seed_finished(store: Store, count: int = FINISHED) -> None:
    """`count` completed jobs in VC `nlp`, the newest ending last."""
    with store.session() as s:
        for k in range(count):
            s.add(JobRow(job_id=f"job-{k:05d}", seq=k + 1, name=f"n{k}", user="u1", vc="nlp", gpus=1,
                         command="true", env={}, state="COMPLETED", submit_time=1000.0 + k,
                         start_time=1010.0 + k, end_time=1100.0 + k))


def _plugins_importable() -> None:
    """The Airflow plugin's package on the import path (Airflow puts it there from its plugins folder)."""
    if str(REPO / "plugins") not in sys.path:
        sys.path.insert(0, str(REPO / "plugins"))


def _plugin(url: str, reports: Path) -> TestClient:
    """The Airflow plugin's app without Airflow's auth (its /api mount is the runtime API)."""
    _plugins_importable()
    from lucid_airflow.web import create_lucid_app

    return TestClient(create_lucid_app(lambda: url, lambda: reports, protect=False), raise_server_exceptions=False)


@pytest.fixture
def lucid_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A LUCID_HOME and no config file (the plugin loads the live config)."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "lucid"))
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("LUCID_REPORTS_DIR", raising=False)
    return tmp_path


@pytest.fixture
def seeded(store: Store, lucid_env: Path) -> Iterator[tuple[Store, TestClient, TestClient]]:
    """The store with finished jobs, the plugin's pages and the runtime API on it."""
    _seed_finished(store)
    yield store, _plugin(store.url, lucid_env / "reports"), TestClient(create_app(store.url, store=store),
                                                                      raise_server_exceptions=False)


def caller_ana(request: Request) -> None:
    """The plugin's auth naming a user who is no operator (cancel checks the job's owner first)."""
    request.state.lucid_user, request.state.lucid_operator = "ana", False


def test_an_id_no_store_could_hold_is_an_unknown_job(seeded):
    store, pages, api = seeded
    with_user = TestClient(create_app(store.url, store=store, auth=caller_ana), raise_server_exceptions=False)
    for raw in NUL_IDS:
        replies = {"page": pages.get(f"/jobs/{raw}"), "api": api.get(f"/jobs/{raw}"),
                   "eta": api.get(f"/jobs/{raw}/eta"), "explain": api.get(f"/jobs/{raw}/explain"),
                   "cancel": api.post(f"/jobs/{raw}/cancel"), "cancel as ana": with_user.post(f"/jobs/{raw}/cancel"),
                   "plugin api": pages.get(f"/api/jobs/{raw}")}
        assert {what: r.status_code for what, r in replies.items()} == dict.fromkeys(replies, 404), raw
        assert "There is no job" in replies["page"].text and "no job" in replies["api"].json()["detail"]
    for lookup in (queries.status, queries.job_record, queries.latest_run, cancel):
        with pytest.raises(UnknownJob):
            lookup(store, "a\x00b")


@pytest.mark.parametrize(("raw", "shown"), [
    ("a%00b", "a\\x00b"), ("a%1B%5B31mb", "a\\x1b[31mb"), ("a%0Ab%0D", "a\\nb\\r"), ("a%09b", "a\\tb"),
    ("a%7Fb", "a\\x7fb"), ("a%C2%85b", "a\\x85b"), ("a%E2%80%AEb", "a\\u202eb"),
])
def test_an_invisible_character_in_a_requested_id_is_shown_escaped(raw, shown, seeded):
    """The 404 page printed a NUL (and any control character) of the id raw: html.escape leaves them, and a
    browser drops a NUL, so the page named another id than the one asked for. Each is shown as its escape."""
    _, pages, _ = seeded
    reply = pages.get(f"/jobs/{raw}")
    assert reply.status_code == 404 and "id='not-found'" in reply.text
    assert f"There is no job {shown} in the Lucid store." in reply.text
    body = reply.text.split("<body>", 1)[1]
    assert [c for c in body if unicodedata.category(c) == "Cc" or unicodedata.bidirectional(c) == "RLO"] == []
    nowhere = pages.get(f"/nowhere/{raw}")  # no route: the page names the path, escaped the same way
    assert nowhere.status_code == 404 and f"There is no page /nowhere/{shown}." in nowhere.text


def test_shown_text_keeps_printable_characters_and_escapes_markup():
    _plugins_importable()
    from lucid_airflow.web import shown

    assert shown("ü名 o'neil <b>&") == "ü名 o&#x27;neil &lt;b&gt;&amp;"
    assert shown("j\x00<\x1b") == "j\\x00&lt;\\x1b"


def test_a_filter_no_job_could_match_is_refused_naming_it(seeded):
    _, pages, api = seeded
    for field in ("user", "vc"):
        page = pages.get("/jobs", params={field: "a\x00b"})
        assert page.status_code == 422 and f"{field} must be UTF-8 encodable text without NUL" in page.text
        reply = api.get("/history", params={field: "\x00"})
        assert reply.status_code == 422 and reply.json()["detail"].startswith(f"{field} must be"), reply.text
    assert api.get("/history", params={"user": "u1"}).json()["total"] == FINISHED  # a plain filter still works


def test_huge_offsets_are_refused_and_the_largest_allowed_one_answers(seeded):
    _, _, api = seeded
    for offset in (10**22, 2**63, 2**31):  # past the stores' integers, and past the bound
        reply = api.get("/history", params={"offset": offset})
        assert reply.status_code == 422 and reply.json()["detail"].startswith("offset must be at most"), reply.text
    largest = api.get("/history", params={"offset": queries.MAX_HISTORY_ROWS})
    assert largest.status_code == 200 and largest.json() == {"total": FINISHED, "offset": queries.MAX_HISTORY_ROWS,
                                                            "jobs": []}
    with pytest.raises(ValueError, match="limit must be at most"):
        queries.HistoryQuery(limit=10**22)


def test_history_times_must_be_finite(seeded):
    _, _, api = seeded
    for field, value in (("since", "nan"), ("since", "inf"), ("until", "-inf"), ("until", "NaN")):
        reply = api.get("/history", params={field: value})
        assert reply.status_code == 422, (field, value, reply.text)
        assert reply.json()["detail"].startswith(f"{field} must be a finite time"), reply.text
    assert api.get("/history", params={"since": "0", "until": "1e12"}).json()["total"] == FINISHED


def test_a_history_page_past_the_end_shows_the_last_page_and_says_so(seeded):
    _, pages, _ = seeded
    for number in (3, 999, 10**22):
        page = pages.get("/jobs", params={"page": number})
        assert page.status_code == 200, (number, page.status_code)
        assert f"There is no page {number}; showing the last page, 2." in page.text
        assert "page 2 of 2 (60 job(s))" in page.text and "No finished job matches" not in page.text
        assert page.text.split("<tbody>")[1].count("<tr>") == FINISHED - 50  # the last page's jobs, shown
        assert "older &rarr;" not in page.text and "page=1" in page.text
    assert "page-note" not in pages.get("/jobs", params={"page": 2}).text


def test_a_history_page_below_one_is_refused(seeded):
    _, pages, _ = seeded
    for number in (0, -3):
        page = pages.get("/jobs", params={"page": number})
        assert page.status_code == 422 and f"page must be 1 or more, got '{number}'" in html.unescape(page.text)


def _refusal_text(reply) -> str:
    """The sentence of a page of the UI refusing a request (its notice), unescaped; fails on any other answer."""
    assert reply.headers["content-type"].startswith("text/html"), reply.text[:300]
    assert reply.text.startswith("<!doctype html>") and "<nav>" in reply.text, "a page of the UI"
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.text)
    notice = reply.text.split("id='invalid-input'>", 1)[1].split("</p>", 1)[0]
    return html.unescape(notice)


@pytest.mark.parametrize(("value", "rule"), [
    ("abc", "a whole number, 1 or more"), ("1.5", "a whole number, 1 or more"), ("", "a whole number, 1 or more"),
    ("1e3", "a whole number, 1 or more"), ("0x10", "a whole number, 1 or more"),
    ("9" * 5000, "a whole number of at most 4300 digits"), ("0", "1 or more"), ("-3", "1 or more"),
])
def test_a_page_parameter_of_the_wrong_form_is_a_page_of_the_ui_naming_it(value, rule, seeded):
    """`/jobs?page=abc` answered FastAPI's raw JSON 422; now a page in the UI's style (the 404 page's layout)
    with status 422 that names the parameter, what it must be, and the value (cut short when long)."""
    _, pages, _ = seeded
    reply = pages.get("/jobs", params={"page": value})
    assert reply.status_code == 422
    shown = value if len(value) <= 80 else value[:80] + "..."
    assert _refusal_text(reply) == f"page must be {rule}, got '{shown}'"
    assert "<h1>Invalid request</h1>" in reply.text and "href='/lucid/jobs'" in reply.text
    assert "<style>" in reply.text and "class='hint bad'" in reply.text


def test_a_refused_parameter_is_shown_with_its_control_characters_escaped(seeded):
    _, pages, _ = seeded
    reply = pages.get("/jobs", params={"page": "a\x00\x1b[31m"})
    assert reply.status_code == 422
    assert _refusal_text(reply) == "page must be a whole number, 1 or more, got 'a\\x00\\x1b[31m'"


def test_the_json_api_keeps_answering_json_for_a_malformed_parameter(seeded):
    """The plugin's HTML handler is the pages' only: the runtime API, alone or mounted at /api, answers JSON."""
    _, pages, api = seeded
    for client, route in ((api, "/history"), (pages, "/api/history")):
        reply = client.get(route, params={"limit": "abc"})
        assert reply.status_code == 422 and reply.headers["content-type"] == "application/json", reply.text
        assert [e["loc"] for e in reply.json()["detail"]] == [["query", "limit"]]


def test_names_the_os_refuses_are_not_found(lucid_env):
    reports = lucid_env / "reports"
    (reports / "tuner" / "run1").mkdir(parents=True)
    (reports / "models").mkdir()
    (reports / "tuner" / "run1" / "ok.png").write_bytes(b"PNG-ok")
    pages = _plugin(f"sqlite:///{lucid_env / 'l.db'}", reports)
    for path in ["/tuner/%00", "/tuner/a%00b", "/tuner/" + "n" * 5000, "/files/tuner/%00.png",
                 "/files/tuner/run1/" + "p" * 300 + ".png", "/files/models/" + "a/" * 3000 + "x.png",
                 "/files/tuner/run1", "/tuner/run1"]:
        reply = pages.get(path)
        assert reply.status_code == 404 and "id='not-found'" in reply.text, (path[:40], reply.status_code)
    assert pages.get("/files/tuner/run1/ok.png").content == b"PNG-ok"


def test_a_submission_with_an_unknown_key_is_refused_naming_it(store, lucid_env):
    add_host(store, HostSpec("m0", executor="local", vc="default", gpus=1, workdir=str(lucid_env / "m0")))
    body = {"command": "true", "gpus": 1, "user": "u", "vc": "default"}
    for client, route in ((TestClient(create_app(store.url, store=store)), "/jobs"),
                          (_plugin(store.url, lucid_env / "reports"), "/api/jobs")):
        reply = client.post(route, json={**body, "preemptable": True})
        assert reply.status_code == 422, reply.text
        assert [e["loc"] for e in reply.json()["detail"]] == [["body", "preemptable"]]
        with store.session() as s:
            assert s.scalar(select(func.count()).select_from(JobRow)) == 0
    assert TestClient(create_app(store.url, store=store)).post("/jobs", json=body).status_code == 201


def _submit_clients(store: Store, reports: Path) -> list[tuple[TestClient, str]]:
    """The runtime API alone and as the plugin mounts it, each with its submit route."""
    return [(TestClient(create_app(store.url, store=store)), "/jobs"), (_plugin(store.url, reports), "/api/jobs")]


def _jobs_stored(store: Store) -> int:
    with store.session() as s:
        return s.scalar(select(func.count()).select_from(JobRow))


@pytest.mark.parametrize(("field", "value"), [
    ("gpus", 1.0), ("gpus", "1"), ("gpus", True), ("gpus", 1.5), ("gpus", "one"), ("amp", "yes"),
    ("preemptible", 1), ("long_cold_start", "false"),
])
def test_a_submission_value_of_another_json_type_is_refused_naming_the_field(field, value, store, lucid_env):
    """`"gpus": 1.0` and `"gpus": "1"` were read as 1 (and `"amp": "yes"` as true): the body is JSON, so a value
    of another type than the field's is refused naming the field, and no job is written."""
    add_host(store, HostSpec("m0", executor="local", vc="default", gpus=1, workdir=str(lucid_env / "m0")))
    body = {"command": "true", "gpus": 1, "user": "u", "vc": "default"}
    for client, route in _submit_clients(store, lucid_env / "reports"):
        reply = client.post(route, json={**body, field: value})
        assert reply.status_code == 422, (route, reply.text)
        assert [e["loc"] for e in reply.json()["detail"]] == [["body", field]], reply.text
        assert _jobs_stored(store) == 0
    assert TestClient(create_app(store.url, store=store)).post("/jobs", json=body).status_code == 201


@pytest.mark.parametrize(("field", "value", "where"), [
    ("workload", {"model": "resnet18", "batch_size": 32}, ["body", "workload"]),
    ("env", {"A": {"nested": "x"}}, ["body", "env", "A"]),
    ("command", ["python", {"script": "x.py"}], ["body", "command"]),
])
def test_a_mapping_where_the_body_takes_none_is_refused_naming_where(field, value, where, store, lucid_env):
    """The body has no nested settings: the workload is a catalog key and env maps names to text, so a mapping
    inside any of them (its keys unknown to everything) is refused naming where, not stored or dropped."""
    add_host(store, HostSpec("m0", executor="local", vc="default", gpus=1, workdir=str(lucid_env / "m0")))
    body = {"command": "true", "gpus": 1, "user": "u", "vc": "default", field: value}
    for client, route in _submit_clients(store, lucid_env / "reports"):
        reply = client.post(route, json=body)
        assert reply.status_code == 422, (route, reply.text)
        assert all(e["loc"][:len(where)] == where for e in reply.json()["detail"]), reply.text
    assert _jobs_stored(store) == 0


def test_every_model_of_the_submit_body_forbids_unknown_keys_and_is_strict():
    """A settings model nested in the body later must refuse unknown keys (naming them) like the body itself."""
    from typing import get_args

    from pydantic import BaseModel

    from lucid_core.runtime.surfaces.api import SubmitBody

    def models(annotation: object) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation, *(m for f in annotation.model_fields.values() for m in models(f.annotation))]
        return [m for arg in get_args(annotation) for m in models(arg)]

    found = models(SubmitBody)
    assert SubmitBody in found
    assert {m.__name__: (m.model_config.get("extra"), m.model_config.get("strict")) for m in found} == {
        m.__name__: ("forbid", True) for m in found}


def test_text_in_a_time_column_is_shown_as_unreadable_not_a_500(tmp_path, lucid_env):
    """A hand edit leaves text in a finished job's start and end time (SQLite keeps it): the history page, the
    API's history and `lucid history` list that job with its times unreadable and the others as they are."""
    import sqlite3

    from lucid_core.cli import main

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    store = Store(url)
    _seed_finished(store, 5)
    store.dispose()
    with sqlite3.connect(tmp_path / "odd.db") as conn:
        conn.execute("UPDATE jobs SET start_time = 'soon', end_time = 'later' WHERE job_id = 'job-00002'")
    page = _plugin(url, lucid_env / "reports").get("/jobs")
    assert page.status_code == 200, page.text[-2000:]
    assert page.text.count("unreadable") == 1 and page.text.split("<tbody>")[1].count("<tr>") == 5
    api = TestClient(create_app(url), raise_server_exceptions=False).get("/history")
    assert api.status_code == 200 and api.json()["total"] == 5
    odd = next(r for r in api.json()["jobs"] if r["job_id"] == "job-00002")
    assert odd["queued_s"] is None and odd["elapsed_s"] is None
    assert main(["history", "--store", url, "--format", "jobid,start,end,elapsed"]) == 0


def test_text_in_a_waiting_jobs_gpus_or_prediction_keeps_the_queue_listed(tmp_path, lucid_env, capsys):
    """A hand edit leaves text in a queued job's GPU count and predicted duration (SQLite keeps it): `lucid queue`,
    the API's queue and the queue page list every job, that one's priority unknown and its prediction unreadable
    (`'many' * 300.0` failed all three)."""
    import sqlite3

    from lucid_core.cli import main

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    store = Store(url)
    with store.session() as s:
        for k in range(3):
            s.add(JobRow(job_id=f"q{k}", seq=k + 1, name=f"n{k}", user="u1", vc="nlp", gpus=2, command="true",
                         env={}, state="QUEUED", submit_time=1000.0 + k, predicted_duration=300.0, queue_position=k + 1,
                         pending_reason="waits"))
    store.dispose()
    with sqlite3.connect(tmp_path / "odd.db") as conn:
        conn.execute("UPDATE jobs SET gpus = 'many', predicted_duration = 'long' WHERE job_id = 'q1'")
    page = _plugin(url, lucid_env / "reports").get("/queue")
    assert page.status_code == 200, page.text[-2000:]
    assert page.text.count("unreadable") == 1 and all(f">q{k}<" in page.text for k in range(3))
    api = TestClient(create_app(url), raise_server_exceptions=False).get("/queue")
    assert api.status_code == 200, api.text
    rows = {r["job_id"]: r for r in api.json()}
    assert rows["q1"]["priority_gpu_s"] is None and rows["q0"]["priority_gpu_s"] == 600.0
    capsys.readouterr()
    assert main(["queue", "--store", url]) == 0
    shown = capsys.readouterr().out
    assert len(shown.splitlines()) == 4 and "unreadable" in shown.splitlines()[2]


def test_eta_of_a_job_whose_row_cannot_be_read_says_why(tmp_path, lucid_env, capsys):
    """`lucid eta` of a queued job with text in its submit time named a pending stop; it says what the round says."""
    import sqlite3

    from lucid_core.cli import main

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, vc="nlp",
                             workdir=str(tmp_path / "m0")))
    with store.session() as s:
        s.add(JobRow(job_id="q0", seq=1, name="n", user="u1", vc="nlp", gpus=1, command="true", env={},
                     state="QUEUED", submit_time=1000.0))
    store.dispose()
    with sqlite3.connect(tmp_path / "odd.db") as conn:
        conn.execute("UPDATE jobs SET submit_time = 'x' WHERE job_id = 'q0'")
    capsys.readouterr()
    assert main(["eta", "q0", "--store", url]) == 0
    shown = capsys.readouterr().out
    assert "submit time 'x' is not a finite number" in shown and "stop pending" not in shown

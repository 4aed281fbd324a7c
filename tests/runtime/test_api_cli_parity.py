"""The HTTP API answers as the CLI does (a walkthrough of both as a team's users found where they parted):
cancels of ended jobs, idempotency keys reused for another job, history filters in the CLI's forms, the only
VC, a factory that finds the store as the CLI does; and `lucid explain` of a failed job says how it ended."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from lucid_core.cli import main
from lucid_core.runtime.api import create_app
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.schema import JobRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit


def _job(store: Store, job_id: str) -> JobRow:
    with store.session() as s:
        return s.get(JobRow, job_id)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def ran(tmp_path, capsys, monkeypatch):
    """A local 1-GPU main host (no profiling) that ran a job failing with exit 3 after a second."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    bad = submit(store, JobRequest("sleep 1; echo oops >&2; exit 3", gpus=1, user="ana", vc="default",
                                 name="bad-run"))
    deadline = time.monotonic() + 30
    while _job(store, bad).state != "FAILED":
        assert _cli(capsys, "round", "--store", url)[0] == 0
        assert time.monotonic() < deadline
        time.sleep(0.3)
    yield store, url, bad
    store.dispose()


def test_explain_of_a_failed_job_says_how_it_ended(ran, capsys):
    _, url, bad = ran
    code, out, _ = _cli(capsys, "explain", bad, "--store", url)
    assert code == 0 and out.splitlines()[1].startswith("ended ") and "exited with code 3" in out.splitlines()[1]


def test_api_cancel_of_an_ended_job_requests_nothing_and_a_cancel_names_who_asked(ran):
    store, url, bad = ran
    client = TestClient(create_app(url, store=store))
    answer = client.post(f"/jobs/{bad}/cancel").json()
    assert answer == {"job_id": bad, "state": "FAILED", "outcome": "ended", "cancel_requested": False}
    waiting = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    assert client.post(f"/jobs/{waiting}/cancel").json()["outcome"] == "requested"
    again = client.post(f"/jobs/{waiting}/cancel").json()
    assert again["outcome"] == "already_requested" and again["cancel_requested"] is True


def test_a_cli_cancel_records_who_asked(ran, capsys):
    import getpass

    store, url, _ = ran
    waiting = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    assert _cli(capsys, "cancel", waiting, "--store", url)[0] == 0
    code, out, _ = _cli(capsys, "explain", waiting, "--store", url, "--json")
    assert code == 0
    events = [e["message"] for e in json.loads(out)["events"] if e["kind"] == "cancel_requested"]
    assert events == [f"cancel requested by {getpass.getuser()} (lucid cancel)"]


def test_a_cancelled_job_ends_naming_who_cancelled_it(ran, capsys):
    """Its end reason said "cancelled" (or "cancelled by request") whoever asked: a team reading `lucid history`
    could not tell a colleague's cancel from an Airflow task's. Running or waiting, it now names who asked."""
    import getpass

    store, url, _ = ran
    running = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    deadline = time.monotonic() + 30
    while _job(store, running).state != "RUNNING":
        assert _cli(capsys, "round", "--store", url)[0] == 0 and time.monotonic() < deadline
    waiting = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    assert _cli(capsys, "cancel", running, waiting, "--store", url)[0] == 0
    client = TestClient(create_app(url, store=store))
    while {_job(store, j).state for j in (running, waiting)} != {"CANCELLED"}:
        assert _cli(capsys, "round", "--store", url)[0] == 0 and time.monotonic() < deadline + 30
        time.sleep(0.2)
    for job in (running, waiting):
        assert client.get(f"/jobs/{job}").json()["end_reason"] == f"cancelled by {getpass.getuser()} (lucid cancel)"


def test_an_idempotency_key_reused_for_another_job_is_refused(ran):
    store, url, _ = ran
    client = TestClient(create_app(url, store=store))
    body = {"command": "sleep 2", "gpus": 1, "user": "ana", "vc": "default", "name": "idem"}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    same = client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == same.status_code == 201 and first.json() == same.json()
    other = client.post("/jobs", json={**body, "command": "sleep 99", "name": "different"},
                        headers={"Idempotency-Key": "k1"})
    assert other.status_code == 422
    said = other.json()["errors"]["idempotency_key"]
    assert first.json()["job_id"] in said and "command, name" in said
    # the same key from another user is that user's own key
    assert client.post("/jobs", json={**body, "user": "bo"}, headers={"Idempotency-Key": "k1"}).status_code == 201


def test_api_history_takes_the_cli_forms_of_states_and_times(ran):
    store, url, bad = ran
    client = TestClient(create_app(url, store=store))
    for state in ("F", "failed", "FAILED,CA"):
        answer = client.get("/history", params={"state": state})
        assert answer.status_code == 200 and [r["job_id"] for r in answer.json()["jobs"]] == [bad], state
    assert client.get("/history", params={"since": "1h"}).json()["total"] == 1
    assert client.get("/history", params={"until": "1h"}).json()["total"] == 0
    assert client.get("/history", params={"since": "0"}).json()["total"] == 1  # epoch seconds, as before
    refused = client.get("/history", params={"since": "yesterday"})
    assert refused.status_code == 422 and "age" in refused.json()["detail"]
    assert client.get("/history", params={"user": "ana,bo"}).json()["total"] == 1  # several, as /queue takes


def test_api_submit_takes_the_only_vc_and_names_them_when_there_are_several(ran, tmp_path):
    store, url, _ = ran
    client = TestClient(create_app(url, store=store))
    answer = client.post("/jobs", json={"command": "true", "gpus": 1, "user": "ana"})
    assert answer.status_code == 201 and _job(store, answer.json()["job_id"]).vc == "default"
    add_host(store, HostSpec("v0", executor="local", telemetry="emulated", gpus=1, vc="vision",
                             workdir=str(tmp_path / "v0")))
    refused = client.post("/jobs", json={"command": "true", "gpus": 1, "user": "ana"})
    assert refused.status_code == 422 and "default, vision" in refused.json()["errors"]["vc"]


def test_the_factory_finds_the_store_as_the_cli_does(ran, monkeypatch):
    _, url, bad = ran
    monkeypatch.setenv("LUCID_STORE_URL", url)
    client = TestClient(create_app())
    assert client.get(f"/jobs/{bad}").json()["state"] == "FAILED"


def test_hosts_add_warns_of_a_key_file_it_cannot_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    code, out, err = _cli(capsys, "hosts", "add", "g0", "--key", str(tmp_path / "missing_key"), "--gpus", "1",
                          "--store", url)
    assert code == 0 and out.startswith("added g0") and "key file" in err and "cannot be read here" in err


def test_status_says_when_a_runs_host_does_not_answer_on_both_read_paths(ran, capsys):
    from lucid_core.runtime.store.schema import HostRow

    store, url, _ = ran
    job = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    deadline = time.monotonic() + 30
    while _job(store, job).state != "RUNNING":
        assert _cli(capsys, "round", "--store", url)[0] == 0
        assert time.monotonic() < deadline
        time.sleep(0.2)
    code, out, _ = _cli(capsys, "status", job, "--store", url)
    assert code == 0 and "unreachable" not in out
    with store.session() as s:  # what a round writes of a host whose calls fail
        host = s.get(HostRow, "m0")
        host.reachable, host.last_seen, host.last_error = False, store.now() - 90, "connection refused"
    code, out, _ = _cli(capsys, "status", job, "--store", url)
    run_line = next(line for line in out.splitlines() if line.strip().startswith("run "))
    assert code == 0 and "running [host m0 unreachable, last answered 9" in run_line, out
    assert run_line.endswith(" ago: connection refused; the run is as last seen there]"), run_line
    with store.session() as s:  # a host's error is untrusted text: said on one short line
        s.get(HostRow, "m0").last_error = "boom\nforged line " + "x" * 500
    code, out, _ = _cli(capsys, "status", job, "--store", url)
    assert code == 0 and "forged line" in out and "\nforged" not in out and "x" * 100 not in out
    client = TestClient(create_app(url, store=store))
    (run,) = client.get(f"/jobs/{job}").json()["runs"]
    assert run["host_down"].startswith("host m0 unreachable")
    with store.session() as s:
        s.get(HostRow, "m0").reachable = True
    assert _cli(capsys, "cancel", job, "--store", url)[0] == 0
    assert _cli(capsys, "round", "--store", url)[0] == 0


def test_history_shows_the_hosts_and_run_time_and_status_the_run_time(ran, capsys):
    _, url, bad = ran
    code, out, _ = _cli(capsys, "history", "--store", url, "-o", "JobID,Ran,NodeList")
    header, line = out.splitlines()[:2]
    assert code == 0 and header.split() == ["JOBID", "RAN", "NODELIST"] and line.split()[0] == bad
    assert line.split()[2] == "m0" and line.split()[1].startswith("00:00:0")
    code, out, _ = _cli(capsys, "history", "--store", url, "--json")
    (row,) = json.loads(out)["jobs"]
    assert row["hosts"] == "m0" and 0 < row["ran_s"] < 10
    code, out, _ = _cli(capsys, "status", bad, "--store", url)
    assert code == 0 and " ran " in out.splitlines()[1] and out.splitlines()[1].endswith(" in all")


def test_the_api_reads_a_jobs_logs(ran):
    store, url, bad = ran
    client = TestClient(create_app(url, store=store))
    answer = client.get(f"/jobs/{bad}/logs", params={"lines": 5})
    assert answer.status_code == 200
    logs = answer.json()
    assert logs["stderr"] == "oops" and logs["stdout"] == "" and logs["host"] == "m0" and logs["problem"] is None
    assert client.get("/jobs/nope/logs").status_code == 404
    assert client.get(f"/jobs/{bad}/logs", params={"lines": 0}).status_code == 422
    waiting = submit(store, JobRequest("true", gpus=1, user="bo", vc="default"))
    assert client.get(f"/jobs/{waiting}/logs").json()["problem"] == "no run of it has started"


def test_a_keyed_retry_finds_its_job_whatever_the_fleet_became(ran, tmp_path):
    """The first request went to the only VC; a second VC since (or a host removed) must not turn its exact retry
    into a refusal, and a retry naming another VC is still another job's body."""
    store, url, _ = ran
    client = TestClient(create_app(url, store=store))
    body = {"command": "sleep 2", "gpus": 1, "user": "ana"}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "run-42"})
    assert first.status_code == 201
    add_host(store, HostSpec("v0", executor="local", telemetry="emulated", gpus=1, vc="vision",
                             workdir=str(tmp_path / "v0")))
    again = client.post("/jobs", json=body, headers={"Idempotency-Key": "run-42"})
    assert again.status_code == 201 and again.json() == first.json()
    named = client.post("/jobs", json={**body, "vc": "default"}, headers={"Idempotency-Key": "run-42"})
    assert named.status_code == 201 and named.json() == first.json()
    other = client.post("/jobs", json={**body, "vc": "vision"}, headers={"Idempotency-Key": "run-42"})
    assert other.status_code == 422 and "vc" in other.json()["errors"]["idempotency_key"]


def test_a_cancel_reason_from_a_hand_written_event_is_one_printable_line(ran):
    """The end reason is read from a stored event (untrusted): bounded, one line, no terminal escapes; the first
    request names who asked, not a later one."""
    from lucid_core.runtime.round.base import cancelled_reason
    from lucid_core.runtime.store.schema import JobEventRow
    from lucid_core.runtime.surfaces.submission import request_cancel

    store, _url, _ = ran
    job = submit(store, JobRequest("sleep 30", gpus=1, user="bo", vc="default"))
    request_cancel(store, job, message="cancel requested by " + "x\n\x1b[31m" * 5000)
    with store.session() as s:
        s.add(JobEventRow(job_id=job, time=time.time(), kind="cancel_requested", message="cancel requested by eve"))
    with store.session() as s:
        reason = cancelled_reason(s, job)
    assert reason.startswith("cancelled by x ?[31mx") and len(reason) <= 200 and reason.isprintable(), reason

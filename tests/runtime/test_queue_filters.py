"""A shared fleet seen by one of its users: `lucid queue --me`, `-u`, `--vc`, `-t` and `lucid cancel` of several
jobs or of a selection, as squeue and scancel take them; the API's queue takes the same filters."""

from __future__ import annotations

import getpass
import json

import pytest
from fastapi.testclient import TestClient

from lucid_core.cli import main
from lucid_core.runtime.api import create_app
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.job_views import QueueQuery
from lucid_core.runtime.surfaces.submission import JobRequest, submit


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def team(tmp_path, capsys, monkeypatch):
    """A 1-GPU main host (no profiling) shared by three users: after a round, ana's job runs there and bo's two
    wait; mine runs on VC `other`'s 1-GPU host."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "m0")))
    add_host(store, HostSpec("o0", executor="local", telemetry="emulated", gpus=1, vc="other",
                             workdir=str(tmp_path / "o0")))
    me = getpass.getuser()
    jobs = {"ana": submit(store, JobRequest("sleep 60", gpus=1, user="ana", vc="default", name="a-run")),
            "bo1": submit(store, JobRequest("sleep 60", gpus=1, user="bo", vc="default", name="b-one")),
            "bo2": submit(store, JobRequest("sleep 60", gpus=1, user="bo", vc="default", name="b-two")),
            "me": submit(store, JobRequest("sleep 60", gpus=1, user=me, vc="other", name="mine"))}
    store.dispose()
    common = ("--store", url, "--config", str(config))
    assert _cli(capsys, "round", *common)[0] == 0
    yield url, common, jobs
    _cli(capsys, "cancel", *jobs.values(), "--store", url)
    _cli(capsys, "round", *common)


def _queued(capsys, url: str, *filters: str) -> dict[str, dict]:
    code, out, err = _cli(capsys, "queue", "--store", url, "--json", *filters)
    assert code == 0, err
    return {row["job_id"]: row for row in json.loads(out)}


def test_queue_filters_by_user_vc_and_state_keeping_each_jobs_place(team, capsys):
    url, _, jobs = team
    everyone = _queued(capsys, url)
    assert set(everyone) == set(jobs.values())
    assert everyone[jobs["ana"]]["state"] == "RUNNING"
    bo = _queued(capsys, url, "-u", "bo")
    assert set(bo) == {jobs["bo1"], jobs["bo2"]}
    assert {j: r["position"] for j, r in bo.items()} == {j: everyone[j]["position"] for j in bo}  # place among all
    assert set(_queued(capsys, url, "--me")) == {jobs["me"]}
    assert set(_queued(capsys, url, "--user", "ana,bo", "-t", "PD")) == {jobs["bo1"], jobs["bo2"]}
    assert set(_queued(capsys, url, "-t", "r")) == {jobs["ana"], jobs["me"]}
    assert set(_queued(capsys, url, "--vc", "other")) == {jobs["me"]}
    code, out, _ = _cli(capsys, "queue", "--store", url, "-u", "nobody")
    assert code == 0 and out.startswith("no running or waiting job matches")
    code, out, _ = _cli(capsys, "queue", "--store", url, "-u", "bo")
    assert code == 0 and "ana" not in out and out.count("bo ") == 2


def test_pending_is_every_state_before_the_main_cluster_profiling_included():
    assert set(QueueQuery.of_text(states="PD").states) == {"SUBMITTED", "PROFILING", "QUEUED"}
    assert QueueQuery.of_text(states="pr,r").states == ("PROFILING", "RUNNING")


def test_queue_refuses_a_state_no_waiting_job_has(team, capsys):
    url, _, _ = team
    code, out, err = _cli(capsys, "queue", "--store", url, "-t", "CD")
    assert code == 2 and out == "" and "not a waiting or running state" in err and "lucid history" in err
    with pytest.raises(ValueError, match="user"):
        QueueQuery.of_text(users="a\x00b")


def test_cancel_takes_several_jobs_and_says_each(team, capsys):
    url, common, jobs = team
    code, out, err = _cli(capsys, "cancel", jobs["bo1"], jobs["bo2"], "missing-7", "--store", url)
    lines = out.splitlines()
    assert code == 2 and len(lines) == 2 and all("cancel requested" in line for line in lines)
    assert err.strip() == "lucid cancel: error: no job 'missing-7'"
    assert _cli(capsys, "round", *common)[0] == 0
    left = _queued(capsys, url)
    assert jobs["bo1"] not in left and jobs["bo2"] not in left and jobs["ana"] in left


def test_cancel_of_a_selection_touches_only_what_it_selects(team, capsys):
    url, common, jobs = team
    code, out, _ = _cli(capsys, "cancel", "-u", "bo", "-t", "PD", "--store", url, "--json")
    answers = json.loads(out)
    assert code == 0 and {a["job_id"] for a in answers} == {jobs["bo1"], jobs["bo2"]}
    assert all(a["outcome"] == "requested" for a in answers)
    # named jobs and a filter: the named ones the filter selects (ana's job is not mine: said to be left)
    code, out, _ = _cli(capsys, "cancel", jobs["ana"], jobs["me"], "--me", "--store", url, "--json")
    assert code == 0 and {a["job_id"]: a["outcome"] for a in json.loads(out)} == {
        jobs["ana"]: "not_selected", jobs["me"]: "requested"}
    assert _cli(capsys, "round", *common)[0] == 0
    assert set(_queued(capsys, url)) == {jobs["ana"]}
    # one job named: one object, as scripts read it
    code, out, _ = _cli(capsys, "cancel", jobs["ana"], "--store", url, "--json")
    assert code == 0 and json.loads(out)["outcome"] == "requested"


def test_cancel_with_nothing_named_or_selected_is_refused(team, capsys):
    url, _, jobs = team
    code, out, err = _cli(capsys, "cancel", "--store", url)
    assert code == 2 and out == "" and "name the jobs to cancel" in err
    # a state or a VC alone would reach every user's jobs (scancel -t PD reaches one's own): refused
    for selection in (("-t", "PD"), ("--vc", "default")):
        code, out, err = _cli(capsys, "cancel", *selection, "--store", url)
        assert code == 2 and out == "" and "say whose with --me" in err
    for job in jobs.values():
        assert json.loads(_cli(capsys, "status", job, "--store", url, "--json")[1])["cancel_requested"] is False
    # an unknown id named beside a filter still fails, alone
    code, out, err = _cli(capsys, "cancel", "nope", jobs["bo1"], "-u", "bo", "--store", url)
    assert code == 2 and "cancel requested" in out and "no job 'nope'" in err
    code, out, _ = _cli(capsys, "cancel", "-u", "nobody", "--store", url)
    assert code == 0 and out.startswith("no waiting or running job matches")


def test_the_api_queue_takes_the_same_filters(team):
    url, _, jobs = team
    store = Store(url, migrate=False)
    try:
        client = TestClient(create_app(url, store=store))
        answer = client.get("/queue", params={"user": "bo", "state": "PD"})
        assert answer.status_code == 200 and {r["job_id"] for r in answer.json()} == {jobs["bo1"], jobs["bo2"]}
        assert {r["job_id"] for r in client.get("/queue", params={"vc": "other"}).json()} == {jobs["me"]}
        refused = client.get("/queue", params={"state": "COMPLETED"})
        assert refused.status_code == 422 and "not a waiting or running state" in refused.json()["detail"]
        assert len(client.get("/queue").json()) == 4
    finally:
        store.dispose()


def test_history_takes_me_too(team, capsys):
    url, common, jobs = team
    assert _cli(capsys, "cancel", jobs["me"], jobs["bo2"], "--store", url)[0] == 0
    assert _cli(capsys, "round", *common)[0] == 0
    code, out, _ = _cli(capsys, "history", "--me", "--store", url, "--json")
    assert code == 0 and [r["job_id"] for r in json.loads(out)["jobs"]] == [jobs["me"]]
    # several users, as queue and cancel take them; --me adds me
    code, out, _ = _cli(capsys, "history", "--me", "-u", "bo", "--store", url, "--json")
    assert code == 0 and {r["job_id"] for r in json.loads(out)["jobs"]} == {jobs["me"], jobs["bo2"]}
    code, out, _ = _cli(capsys, "history", "-u", f"bo,{getpass.getuser()}", "--store", url, "--json")
    assert code == 0 and json.loads(out)["total"] == 2
    code, out, _ = _cli(capsys, "history", "--vc", "other,nowhere", "--store", url, "--json")
    assert code == 0 and [r["job_id"] for r in json.loads(out)["jobs"]] == [jobs["me"]]

"""The HTTP API acts as the authenticated caller: users submit and cancel only their own jobs."""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.api import create_app

PEOPLE = {"ana-token": ("ana", False), "bob-token": ("bob", False), "ops-token": ("olga", True)}


def identity(request: Request) -> None:
    """What the Airflow plugin's auth does: name the caller and say whether they operate the cluster."""
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token not in PEOPLE:
        raise HTTPException(401, "not authenticated")
    request.state.lucid_user, request.state.lucid_operator = PEOPLE[token]


def test_jobs_are_submitted_and_cancelled_as_the_caller(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    client = TestClient(create_app(store.url, store=store, auth=identity))
    as_ = lambda who: {"Authorization": f"Bearer {who}-token"}  # noqa: E731
    body = {"command": "sleep 1", "gpus": 1, "vc": "vc-a"}

    mine = client.post("/jobs", json=body, headers=as_("ana"))
    assert mine.status_code == 201
    job = mine.json()["job_id"]
    assert client.get(f"/jobs/{job}", headers=as_("ana")).json()["user"] == "ana"
    spoof = client.post("/jobs", json={**body, "user": "bob"}, headers=as_("ana"))
    assert spoof.status_code == 403 and "only as yourself" in spoof.json()["detail"]
    assert len(client.get("/queue", headers=as_("ana")).json()) == 1  # the spoofed job was not written

    assert client.post(f"/jobs/{job}/cancel", headers=as_("bob")).status_code == 403
    assert client.get(f"/jobs/{job}", headers=as_("bob")).json()["state"] == "SUBMITTED"
    assert client.post(f"/jobs/{job}/cancel", headers=as_("ops")).json()["cancel_requested"] is True
    on_behalf = client.post("/jobs", json={**body, "user": "carl"}, headers=as_("ops"))
    assert on_behalf.status_code == 201  # an operator may submit for someone else
    assert client.get(f"/jobs/{on_behalf.json()['job_id']}", headers=as_("ops")).json()["user"] == "carl"
    store.dispose()


def test_a_retried_submission_with_the_same_idempotency_key_makes_one_job(tmp_path):
    """A client that lost the answer (a dropped connection) can send the same request again."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    client = TestClient(create_app(store.url, store=store, auth=identity))
    body = {"command": "sleep 1", "gpus": 1, "vc": "vc-a"}
    ana = {"Authorization": "Bearer ana-token", "Idempotency-Key": "run-42"}
    first = client.post("/jobs", json=body, headers=ana).json()["job_id"]
    again = client.post("/jobs", json=body, headers=ana).json()["job_id"]
    assert first == again and len(client.get("/queue", headers=ana).json()) == 1
    bob = {"Authorization": "Bearer bob-token", "Idempotency-Key": "run-42"}  # keys are per user
    assert client.post("/jobs", json=body, headers=bob).json()["job_id"] != first
    fresh = client.post("/jobs", json=body, headers={"Authorization": "Bearer ana-token"}).json()["job_id"]
    assert fresh not in {first}
    bad = client.post("/jobs", json=body, headers={**ana, "Idempotency-Key": "k" * 200})
    assert bad.status_code == 422 and "idempotency_key" in bad.json()["errors"]
    assert len(client.get("/queue", headers=ana).json()) == 3
    store.dispose()


def test_a_jobs_output_is_read_only_by_its_user_and_operators(tmp_path):
    """Training logs carry tokens and paths: the logs endpoint answers the job's user and operators, and refuses
    anyone else naming the rule, as cancelling does. Served without identity, it answers everyone, as before."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    client = TestClient(create_app(store.url, store=store, auth=identity))
    as_ = lambda who: {"Authorization": f"Bearer {who}-token"}  # noqa: E731
    body = {"command": "sleep 1", "gpus": 1, "vc": "vc-a"}
    job = client.post("/jobs", json=body, headers=as_("ana")).json()["job_id"]

    refused = client.get(f"/jobs/{job}/logs", headers=as_("bob"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"] == (f"the output of job {job} (its stdout and stderr) is ana's: only ana and "
                                        "operators may read it")
    for who in ("ana", "ops"):
        mine = client.get(f"/jobs/{job}/logs", headers=as_(who))
        assert mine.status_code == 200 and mine.json()["problem"] == "no run of it has started", (who, mine.text)
    assert client.get(f"/jobs/{job}", headers=as_("bob")).status_code == 200, "its status stays public"
    assert client.get("/jobs/j999999/logs", headers=as_("bob")).status_code == 404
    anonymous = TestClient(create_app(store.url, store=store)).get(f"/jobs/{job}/logs")
    assert anonymous.status_code == 200 and anonymous.json()["problem"] == "no run of it has started"
    store.dispose()

"""Access: every route of the runtime API and of the plugin refuses unauthenticated and wrong-role
requests; log and file downloads cannot leave the job's run directory (or the reports directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastapi import Header, HTTPException, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from lucid_core.runtime.hosts.executor import HostAddress, LaunchSpec
from lucid_core.runtime.hosts.inputs import check_run_id
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.reads import read_script
from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.api import create_app
from lucid_core.runtime.surfaces.submission import JobRequest, submit

REPO = Path(__file__).resolve().parents[2]
TOKENS = {"admin-token": "admin", "viewer-token": "viewer"}
READ_METHODS = {"GET", "HEAD", "OPTIONS"}


def role_auth(request: Request, authorization: str = Header(default="")) -> str:
    """A bearer-token dependency with two roles: viewers read, admins also write."""
    scheme, _, token = authorization.partition(" ")
    role = TOKENS.get(token) if scheme.lower() == "bearer" else None
    if role is None:
        raise HTTPException(401, "not authenticated", headers={"WWW-Authenticate": "Bearer"})
    if role != "admin" and request.method not in READ_METHODS:
        raise HTTPException(403, "your role may not change anything")
    return role


def _counts(store: Store) -> tuple[int, int, int]:
    with store.session() as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) for t in (JobRow, JobEventRow, RunRow))


def test_every_runtime_api_route_refuses_unauthenticated_and_wrong_role_requests(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    job = submit(store, JobRequest("true", 1, "u", "vc-a"))
    app = create_app(store.url, store=store, auth=role_auth)
    client = TestClient(app)
    routes = [(method, route.path) for route in app.routes if isinstance(route, APIRoute)
              for method in route.methods if route.path not in {"/openapi.json", "/docs", "/redoc"}]
    assert {("POST", "/jobs"), ("POST", "/jobs/{job_id}/cancel"), ("GET", "/queue")} <= set(routes)
    body = {"command": "touch /tmp/never", "gpus": 1, "user": "u", "vc": "vc-a"}
    before = _counts(store)
    for method, path in routes:
        url = path.replace("{job_id}", job)
        for headers in ({}, {"Authorization": "Bearer forged"}, {"Authorization": "Basic admin-token"}):
            reply = client.request(method, url, headers=headers, json=body)
            assert reply.status_code == 401, (method, url, headers, reply.status_code)
        viewer = client.request(method, url, headers={"Authorization": "Bearer viewer-token"}, json=body)
        assert viewer.status_code == (200 if method in READ_METHODS else 403), (method, url, viewer.text)
    assert _counts(store) == before  # nothing written by any refused request
    with store.session() as s:
        assert not s.get(JobRow, job).cancel_requested
    admin = client.post("/jobs", headers={"Authorization": "Bearer admin-token"}, json=body)
    assert admin.status_code == 201  # the same request with the right role goes through
    store.dispose()


@pytest.mark.airflow
def test_every_plugin_route_refuses_unauthenticated_requests(tmp_path):
    """Each view, file route and the mounted API answer 401 without an Airflow token (Airflow in a child)."""
    pytest.importorskip("airflow")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / 'plugins')!r})
        from fastapi.testclient import TestClient
        from starlette.routing import Mount
        from lucid_airflow.web import create_lucid_app
        from pathlib import Path
        app = create_lucid_app(lambda: "sqlite:///{tmp_path / 'lucid.db'}", lambda: Path("{tmp_path}"))
        client = TestClient(app)
        paths = []
        for route in app.routes:
            path = route.path.replace("{{job_id}}", "j000001").replace("{{name}}", "x").replace("{{area}}", "tuner")
            path = path.replace("{{path:path}}", "x/a.png")
            methods = ["GET"] if isinstance(route, Mount) else sorted(getattr(route, "methods", None) or ["GET"])
            if isinstance(route, Mount):
                paths += [("GET", path + "/queue"), ("POST", path + "/jobs"), ("POST", path + "/jobs/j000001/cancel")]
            else:
                paths += [(m, path) for m in methods]
        bad = [(m, p, client.request(m, p).status_code) for m, p in paths]
        print(len(paths), [b for b in bad if b[2] != 401])
    """)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    count, refused_not = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) >= 10 and refused_not == "[]", done.stdout


ROLE_SCRIPT = """
import json, sys
sys.path.insert(0, {plugins!r})
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import init_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from lucid_core.runtime.store.store import Store
from lucid_airflow.web import create_lucid_app

Store({url!r}).dispose()  # an empty, migrated store behind the pages
from airflow import settings
from airflow.models.revoked_token import RevokedToken
RevokedToken.__table__.create(settings.engine, checkfirst=True)  # the only metadata table token checks read
manager = init_auth_manager()
token = {{role: manager.generate_jwt(SimpleAuthManagerUser(username=role or "nobody", role=role))
         for role in ("viewer", "op", "admin", None)}}
client = TestClient(create_lucid_app(lambda: {url!r}, lambda: __import__("pathlib").Path({root!r})))
reads = ["/", "/queue", "/running", "/models", "/tuner", "/drift", "/api/queue", "/api/hosts"]
writes = [("POST", "/api/jobs"), ("POST", "/api/jobs/j000001/cancel")]
body = {{"command": "true", "gpus": 1, "user": "u", "vc": "none"}}
seen = {{}}
for role, value in token.items():
    for how in ("header", "cookie"):
        kwargs = ({{"headers": {{"Authorization": "Bearer " + value}}}} if how == "header"
                  else {{"cookies": {{"_token": value}}}})
        client.cookies.clear()
        for path in reads:
            seen[f"{{role}} {{how}} GET {{path}}"] = client.get(path, **kwargs).status_code
        for method, path in writes:
            reply = client.request(method, path, json=body, **kwargs)
            seen[f"{{role}} {{how}} {{method}} {{path}}"] = reply.status_code
forged = token["admin"][:-6] + ("AAAAAA" if not token["admin"].endswith("AAAAAA") else "BBBBBB")
for method, path in [("GET", p) for p in reads] + writes:
    client.cookies.clear()
    seen[f"forged {{method}} {{path}}"] = client.request(method, path, json=body,
                                                     headers={{"Authorization": "Bearer " + forged}}).status_code
print(json.dumps(seen))
"""


@pytest.mark.airflow
def test_every_plugin_route_refuses_forged_tokens_and_roles_without_the_right(tmp_path):
    """Airflow's simple auth manager in a child: viewers read but never write, no-role users and forged
    tokens get nothing, on every view and API route, by header or by the UI's cookie."""
    pytest.importorskip("airflow")
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    script = ROLE_SCRIPT.format(plugins=str(REPO / "plugins"), url=url, root=str(tmp_path))
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
           "AIRFLOW__CORE__AUTH_MANAGER":
               "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viewer:viewer,op:op,admin:admin",
           "AIRFLOW__API_AUTH__JWT_SECRET": "reliability-test-secret-" + "x" * 16,
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for key, code in seen.items():
        who, *_, method, _path = key.split(" ")
        if who == "forged" or who == "None":
            assert code in (401, 403), (key, code)
        elif method == "GET":
            assert code == 200, (key, code)
        elif who == "viewer":
            assert code == 403, (key, code)
        else:  # op and admin may change things: the request reaches the API (which judges the body)
            assert code not in (401, 403), (key, code)


OUTPUT_SCRIPT = """
import json, sys
sys.path.insert(0, {plugins!r})
from pathlib import Path
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import init_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow import settings
from airflow.models.revoked_token import RevokedToken
from lucid_airflow.web import create_lucid_app

RevokedToken.__table__.create(settings.engine, checkfirst=True)  # the only metadata table token checks read
manager = init_auth_manager()
client = TestClient(create_lucid_app(lambda: {url!r}, lambda: Path({root!r})))
seen = {{}}
for name, role in {people!r}.items():
    bearer = {{"Authorization": "Bearer " + manager.generate_jwt(SimpleAuthManagerUser(username=name, role=role))}}
    for what, path in (("page", "/jobs/{job}"), ("logs", "/api/jobs/{job}/logs"), ("status", "/api/jobs/{job}"),
                       ("explain", "/api/jobs/{job}/explain")):
        reply = client.get(path, headers=bearer)
        seen[name + " " + what] = [reply.status_code, reply.text]
print(json.dumps(seen))
"""


@pytest.mark.airflow
def test_a_jobs_output_is_shown_only_to_its_user_and_operators(tmp_path):
    """Real Airflow JWTs (simple auth manager, in a child): a job's stdout and stderr carry tokens and paths, so its
    page shows them to its user and to operators only; another user or a viewer sees the rest of the page with a
    note whose output it is and who may read it, and the API's logs answer them 403 naming the rule. Its status and
    explanation carry no log text."""
    pytest.importorskip("airflow")
    store, job = _ended_job(tmp_path, 'echo "token=$((6*7))-secret"; echo "path=/home/ann/$((6*7))-key" >&2', "ann")
    store.dispose()
    people = {"ann": "user", "bo": "user", "vic": "viewer", "ops": "op"}
    script = OUTPUT_SCRIPT.format(plugins=str(REPO / "plugins"), url=store.url, root=str(tmp_path), job=job,
                                  people=people)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
           "AIRFLOW__CORE__AUTH_MANAGER":
               "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{n}:{r}" for n, r in people.items()),
           "AIRFLOW__API_AUTH__JWT_SECRET": "reliability-test-secret-" + "x" * 16,
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    secrets = ("token=42-secret", "/home/ann/42-key")
    rule = f"the output of job {job} (its stdout and stderr) is ann's: only ann and operators may read it"
    for who in ("ann", "ops"):
        page, logs = seen[f"{who} page"], seen[f"{who} logs"]
        assert page[0] == 200 and all(secret in page[1] for secret in secrets), (who, page)
        assert logs[0] == 200 and all(secret in logs[1] for secret in secrets), (who, logs)
        assert "id='output-withheld'" not in page[1]
    for who in ("bo", "vic"):
        page, logs = seen[f"{who} page"], seen[f"{who} logs"]
        assert page[0] == 200 and not any(secret in page[1] for secret in secrets), (who, page)
        assert f"<p class='hint' id='output-withheld'>Not shown: {rule}" in page[1].replace("&#x27;", "'"), page
        assert "id='stdout'" not in page[1] and "<h2>State history</h2>" in page[1], "the rest of the page stays"
        assert logs[0] == 403 and json.loads(logs[1])["detail"] == rule, (who, logs)
    for key, (code, text) in seen.items():
        if key.endswith(("status", "explain")):
            assert code == 200 and not any(secret in text for secret in secrets), (key, code, text)


# ------------------------------------------------------------------------------------------ traversal
def test_plugin_file_routes_stay_inside_the_reports_directory(tmp_path):
    sys.path.insert(0, str(REPO / "plugins"))
    from lucid_airflow.web import create_lucid_app

    reports = tmp_path / "reports"
    (reports / "tuner" / "run1").mkdir(parents=True)
    (reports / "tuner" / "run1" / "ok.png").write_bytes(b"PNG-ok")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"TOP-SECRET")
    (reports / "tuner" / "run1" / "link.png").symlink_to(secret)
    (reports / "tuner" / "escape").symlink_to(tmp_path, target_is_directory=True)
    client = TestClient(create_lucid_app(lambda: f"sqlite:///{tmp_path / 'l.db'}", lambda: reports, protect=False))
    assert client.get("/files/tuner/run1/ok.png").content == b"PNG-ok"
    for path in ["/files/tuner/../../secret.png", "/files/tuner/..%2F..%2Fsecret.png",
                 "/files/tuner/%2e%2e/%2e%2e/secret.png", "/files/tuner/run1/link.png",
                 "/files/tuner/escape/secret.png",
                 f"/files/tuner/{secret}", f"/files/tuner//{secret}",
                 "/files/tuner/run1/..%5c..%5c..%5csecret.png", "/tuner/..%2F..%2F", "/files/etc/passwd"]:
        reply = client.get(path)
        assert b"TOP-SECRET" not in reply.content and reply.status_code in (404, 400), (path, reply.status_code)


def test_log_reads_refuse_names_and_ids_that_leave_the_run_directory():
    from lucid_core.runtime.surfaces.queries import logs

    for name in ["../stdout.log", "/etc/passwd", "stdout.log/../../x", "pid", ""]:
        with pytest.raises(ValueError):
            read_script("/w", "r1", name, 100)
    for run_id in ["..", "../r1", "r1/../../x", "/etc", ".hidden", "a b", "~probe", "x" * 97]:
        with pytest.raises(ValueError):
            check_run_id(run_id)
    with pytest.raises(ValueError, match="stdout or stderr"):
        logs(None, None, "j1", "../../etc/passwd")  # refused before the store is even asked


def _finished_job_with(tmp_path: Path, body: str) -> tuple[Store, str]:
    """A real job on a local host whose command `body` runs in its run's control directory (reached on
    purpose: its working directory is elsewhere), then ends."""
    return _ended_job(tmp_path, f'echo own output; cd "$LUCID_WORKDIR/../../$LUCID_RUN_ID" && {body}', "mallory")


def _ended_job(tmp_path: Path, command: str, user: str, wait_s: float = 60.0) -> tuple[Store, str]:
    """A real job of `user` running `command` on a local host, run by scheduling rounds until it has ended."""
    from runtime_helpers import SETTINGS, fast_config

    from lucid_core.runtime.round.scheduling_round import SchedulingRound

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "runs")))
    job = submit(store, JobRequest(command, 1, user, "vc-a"))
    config = fast_config(**{"profiler.enabled": False})
    deadline = time.monotonic() + wait_s
    while True:
        SchedulingRound(store, local_executor(), config, SETTINGS).run()
        with store.session() as s:
            if s.get(JobRow, job).state in ("COMPLETED", "FAILED"):
                return store, job
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_job_cannot_make_its_log_download_read_outside_its_run_directory(tmp_path):
    """The job swaps its stdout.log for a symlink to a host file; `lucid logs` must not follow it."""
    from lucid_core.runtime.surfaces.queries import logs

    secret = tmp_path / "outside" / "stdout.log"
    secret.parent.mkdir()
    secret.write_text("TOP-SECRET host file\n")
    store, job = _finished_job_with(tmp_path, f"rm -f stdout.log; ln -s {secret} stdout.log")
    assert "TOP-SECRET" not in logs(store, local_executor(), job, "stdout").text
    store.dispose()


@pytest.mark.parametrize("escape", ["symlinked file", "symlinked run directory", "file of another run"])
def test_reading_a_run_file_through_the_executor_is_confined(tmp_path, escape):
    """Whatever the job does to its run directory, a read returns only files inside it."""
    executor = local_executor()
    host = HostAddress("h", executor="local", workdir=str(tmp_path / "w"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdout.log").write_text("TOP-SECRET")
    executor.launch(host, LaunchSpec("other", "echo TOP-SECRET of another job"))
    body = {"symlinked file": f"rm -f stdout.log; ln -s {outside / 'stdout.log'} stdout.log",
            "symlinked run directory": f'cd ..; mv r1 r1.moved; ln -s {outside} r1',
            "file of another run": "rm -f stdout.log; ln -s ../other/stdout.log stdout.log"}[escape]
    control = tmp_path / "w" / "r1"  # reached on purpose: the job's working directory is elsewhere
    executor.launch(host, LaunchSpec("r1", f"echo mine; cd {control} && {body}"))
    deadline = time.monotonic() + 10
    time.sleep(0.3)  # past the wrapper's exec (the poll checks the pid runs run.sh)
    while executor.poll(host, ["r1"])["r1"].state == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    assert "TOP-SECRET" not in executor.read(host, "r1", "stdout.log")
    assert "TOP-SECRET" in executor.read(host, "other", "stdout.log")  # a plain run file still reads

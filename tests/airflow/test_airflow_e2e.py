"""End to end on a real Airflow: scheduler + API server + DAG processor on a throwaway PostgreSQL
metadata DB. Triggers the tuner through the REST API with conf, reads its report through XCom and the
plugin, checks the plugin refuses unauthenticated requests, and renders every plugin page in headless
Chromium (DOM and screenshot checked)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from lucid_af_support import REPO, SAMPLE_TRACE

PG_ADMIN = os.environ.get("LUCID_TEST_PG_ADMIN_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(method: str, url: str, **kwargs):
    """One API call, retried on timeouts: the API server answers slowly when CI's cores are busy."""
    import httpx

    kwargs.setdefault("timeout", 60)
    for attempt in range(3):
        try:
            return httpx.request(method, url, **kwargs)
        except (httpx.TimeoutException, httpx.ConnectError):
            if attempt == 2:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def _postgres_or_skip():
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        connection = psycopg2.connect(PG_ADMIN, connect_timeout=3)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL on 127.0.0.1:5432 is not reachable ({exc}); the e2e test needs it")
    connection.autocommit = True
    return connection


@pytest.fixture(scope="module")
def airflow_stack(tmp_path_factory):
    """Airflow 3 (LocalExecutor, SimpleAuthManager) with its three processes; yields (base url, token, env)."""
    import httpx

    admin = _postgres_or_skip()
    database = f"lucid_af_e2e_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{database}"')
    root = tmp_path_factory.mktemp("e2e")
    port = _free_port()
    passwords = root / "passwords.json"
    passwords.write_text(json.dumps({"admin": "e2e-secret", "viewer": "viewer-secret"}))
    store_db = root / "lucid" / "lucid.db"
    bin_dir = Path(os.environ["PATH"].split(os.pathsep)[0])
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "LUCID_HOME": str(root / "lucid"),
        "LUCID_TRACES_DIR": str(SAMPLE_TRACE.parent),  # the tuner run below replays the sample trace
        "AIRFLOW_CONN_LUCID_DB": json.dumps({"conn_type": "sqlite", "host": str(store_db)}),
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    })
    subprocess.run([str(bin_dir / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    _seed_queue(f"sqlite:///{store_db}")
    logs = root / "logs"
    logs.mkdir()
    procs = []
    for command in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"]):
        handle = (logs / f"{command[0]}.log").open("w")
        procs.append(subprocess.Popen([str(bin_dir / "airflow"), *command], env=env, stdout=handle,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        token = None
        while time.monotonic() < deadline:
            try:
                reply = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "e2e-secret"},
                                   timeout=5)
                if reply.status_code in (200, 201):
                    token = reply.json()["access_token"]
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert token, "API server did not come up: " + (logs / "api-server.log").read_text()[-3000:]
        yield base, token, env, root
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def _seed_queue(url: str) -> None:
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = Store(url)
    add_host(store, HostSpec("main0", executor="local", telemetry="emulated", gpus=2,
                             workdir=str(Path(url.removeprefix("sqlite:///")).parent / "main0")))
    for k in range(4):
        submit(store, JobRequest("sleep 60", gpus=2, user=f"user{k}", vc="default", name=f"resnet-sweep-{k}"))
    store.dispose()
    from lucid_airflow.round_steps import profile_bind_and_place

    decided = profile_bind_and_place(url, {"acquired": True})  # order, priorities and pending reasons
    assert decided["decisions"], decided
    from lucid_core.runtime.store.lease import release

    store = Store(url)
    # as carry_out would (the holder round_steps names outside a task): later inventory changes must not wait
    # out the lease's TTL
    release(store, f"airflow:{os.getpid()}")
    store.dispose()


def _wait_for_dag(base: str, headers: dict, dag_id: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _call("GET", f"{base}/api/v2/dags/{dag_id}", headers=headers).status_code == 200:
            return
        time.sleep(2)
    raise AssertionError(f"{dag_id} never appeared in the API")


def test_tuner_triggered_over_rest_writes_a_report_the_plugin_shows(airflow_stack):

    base, token, _, root = airflow_stack
    headers = {"Authorization": f"Bearer {token}"}
    _wait_for_dag(base, headers, "lucid_system_tuner")
    unpaused = _call("PATCH", f"{base}/api/v2/dags/lucid_system_tuner", headers=headers, json={"is_paused": False})
    assert unpaused.status_code == 200, unpaused.text
    conf = {"trace_path": str(SAMPLE_TRACE), "trace_format": "generic", "main_nodes": 2,
            "tprof_s": [100, 300], "sharing": ["auto", "off"], "objective": "p999_queue_delay"}
    reply = _call("POST", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns", headers=headers,
                  json={"logical_date": None, "conf": conf})
    assert reply.status_code in (200, 201), reply.text
    run_id = reply.json()["dag_run_id"]
    deadline = time.monotonic() + 480
    state = ""
    while time.monotonic() < deadline:
        state = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run_id}", headers=headers).json()["state"]
        if state in ("success", "failed"):
            break
        time.sleep(3)
    assert state == "success", (root / "logs" / "scheduler.log").read_text()[-4000:]
    mapped = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run_id}/taskInstances",
                       headers=headers, params={"task_id": "simulate_configuration"}).json()
    # four configurations, and the current one under three workload draws (the run-to-run noise)
    assert sum(1 for ti in mapped["task_instances"] if ti["task_id"] == "simulate_configuration") == 4 + 3
    xcom = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run_id}/taskInstances/write_report/"
                     "xcomEntries/return_value", headers=headers)
    assert xcom.status_code == 200, xcom.text
    summary = xcom.json()["value"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert summary["configurations"] == 4 and summary["objective"] == "p999_queue_delay"
    name = Path(summary["directory"]).name
    page = _call("GET", f"{base}/lucid/tuner/{name}", headers=headers)
    assert page.status_code == 200 and "System Tuner" in page.text and "objective.png" in page.text
    listing = _call("GET", f"{base}/lucid/tuner", headers=headers)
    assert name in listing.text
    # one Trigger, one run: unpausing a fresh DAG must not add a scheduled run for an earlier date
    runs = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns", headers=headers).json()["dag_runs"]
    assert [r["run_type"] for r in runs if r["run_type"] != "manual"] == [], runs


def test_plugin_is_loaded_with_its_app_and_nav_entries(airflow_stack):

    base, token, _, _ = airflow_stack
    plugins = _call("GET", f"{base}/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}).json()
    lucid = next(p for p in plugins["plugins"] if p["name"] == "lucid")
    assert [app["url_prefix"] for app in lucid["fastapi_apps"]] == ["/lucid"]
    hrefs = {view["href"] for view in lucid["external_views"]}
    assert {"/lucid/queue", "/lucid/running", "/lucid/models", "/lucid/tuner", "/lucid/drift"} <= hrefs
    assert all(view["destination"] == "nav" for view in lucid["external_views"])


def test_plugin_refuses_unauthenticated_and_forged_requests(airflow_stack):

    base, token, _, _ = airflow_stack
    for path in ("/lucid/queue", "/lucid/tuner", "/lucid/api/jobs", "/lucid/files/tuner/x/objective.png"):
        assert _call("GET", base + path).status_code == 401, path
    forged = {"Authorization": "Bearer " + token[:-4] + "abcd"}
    assert _call("GET", base + "/lucid/queue", headers=forged).status_code in (401, 403)
    assert _call("GET", base + "/lucid/queue", cookies={"_token": token}).status_code == 200
    viewer = _call("POST", f"{base}/auth/token", json={"username": "viewer", "password": "viewer-secret"})
    viewer_headers = {"Authorization": "Bearer " + viewer.json()["access_token"]}
    assert _call("GET", base + "/lucid/queue", headers=viewer_headers).status_code == 200
    refused = _call("POST", base + "/lucid/api/jobs", headers=viewer_headers, json={})
    assert refused.status_code == 403, refused.text


class _AuthProxy(http.server.BaseHTTPRequestHandler):
    """Forwards GETs to the API server with the bearer token, as a logged-in browser session would."""

    target = ""
    token = ""

    def do_GET(self) -> None:
        import httpx

        reply = httpx.get(self.target + self.path, headers={"Authorization": f"Bearer {self.token}"}, timeout=120)
        self.send_response(reply.status_code)
        self.send_header("Content-Type", reply.headers.get("content-type", "text/html"))
        self.end_headers()
        self.wfile.write(reply.content)

    def log_message(self, *args) -> None:
        return


def _render(url: str, shot: Path, profile: Path) -> str:
    """The DOM headless Chromium builds for `url` (scripts run), and a 1200x700 screenshot of it."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1200,700", f"--user-data-dir={profile}"]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=180)
    return dom.stdout + dom.stderr[-2000:]


def _check_screenshot(shot: Path, name: str) -> None:
    from PIL import Image

    image = Image.open(shot).convert("L")
    assert image.size == (1200, 700)
    extrema = image.getextrema()
    assert extrema[1] - extrema[0] > 100, f"screenshot of {name} is blank"
    # a rendered table or map has many distinct shades (text anti-aliasing); an error page has few
    assert len(set(image.getdata())) > 20, f"screenshot of {name} shows almost nothing"
    keep = os.environ.get("LUCID_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{name}.png")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_every_plugin_page_renders_in_headless_chromium(airflow_stack, tmp_path):
    base, token, _, _ = airflow_stack
    waiting = _call("GET", f"{base}/lucid/api/queue", headers={"Authorization": f"Bearer {token}"}).json()
    job_id = next(j["job_id"] for j in waiting if j["name"].startswith("resnet-sweep-"))
    # page -> what its DOM must hold
    pages = {
        "queue": ("/lucid/queue", '<table id="queue">'),
        "running": ("/lucid/running", 'id="gpumap-main0"'),
        "job": (f"/lucid/jobs/{job_id}", '<pre id="explanation">'),
        "models": ("/lucid/models", '<table id="models">'),
        "tuner": ("/lucid/tuner", '<table id="tuner-reports">'),
        "drift": ("/lucid/drift", '<table id="drift">'),
    }
    handler = type("Proxy", (_AuthProxy,), {"target": base, "token": token})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    doms = {}
    try:
        for name, (path, marker) in pages.items():
            doms[name] = _render(proxy + path, tmp_path / f"{name}.png", tmp_path / "profile")
            assert marker in doms[name], f"{name}: {doms[name][:2000]}"
            assert "Internal Server Error" not in doms[name], name
            _check_screenshot(tmp_path / f"{name}.png", name)
    finally:
        server.shutdown()
    rows = [row for row in doms["queue"].split("<tr>") if "resnet-sweep-" in row]
    assert len(rows) >= 3, doms["queue"][:3000]
    assert sum("<td></td></tr>" not in row for row in rows) >= 2, "waiting jobs show their pending reason"
    assert "GPU 0" in doms["running"] and "GPU 1" in doms["running"], "the GPU map lists every GPU of main0"
    assert job_id in doms["job"] and "Decisions" in doms["job"]


def _page_screenshot_is_a_page(shot: Path, name: str) -> None:
    """A real page: many shades (text) over a wide range, and kept in LUCID_SCREENSHOT_DIR when set."""
    from PIL import Image

    image = Image.open(shot).convert("L")
    low, high = image.getextrema()
    assert high - low > 100 and len(set(image.getdata())) > 20, f"screenshot of {name} shows almost nothing"
    keep = os.environ.get("LUCID_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{name}.png")


def _the_users_fleet_with_recent_jobs(root: Path) -> int:
    """The demo's fleet (prof0 profiling, main0 and main1 main, 2 GPUs each) and jobs that ended this week."""
    from lucid_af_support import seed_finished_jobs

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.sim.traces import read_trace

    url = f"sqlite:///{root / 'lucid' / 'lucid.db'}"
    store = Store(url)
    for name, pool in (("prof0", "profiling"), ("main1", "main")):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated", gpus=2,
                                 workdir=str(root / "lucid" / name)))
    store.dispose()
    epoch = read_trace(SAMPLE_TRACE, "generic").epoch.timestamp()
    return seed_finished_jobs(url, limit=60, gpus=1, offset_s=time.time() - 2 * 86400 - epoch, prefix="done-")


def _report_rows(directory: str) -> list[dict]:
    return json.loads((Path(directory) / "report.json").read_text())["ranked"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_tuner_triggered_from_its_form_with_the_defaults_reports_on_the_users_fleet(airflow_stack, tmp_path):
    """What a new user does: open a Lucid page (sent to log in and back), open the tuner's trigger form,
    press Trigger without touching a field, wait, read the report. Headless Chromium over CDP."""
    pytest.importorskip("websockets.sync.client", reason="the CDP driver needs websockets (the dev extra)")
    from cdp_browser import Browser

    base, token, _, root = airflow_stack
    headers = {"Authorization": f"Bearer {token}"}
    seeded = _the_users_fleet_with_recent_jobs(root)
    _wait_for_dag(base, headers, "lucid_system_tuner")
    assert _call("PATCH", f"{base}/api/v2/dags/lucid_system_tuner", headers=headers,
                 json={"is_paused": False}).status_code == 200
    before = {r["dag_run_id"] for r in _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns",
                                             headers=headers).json()["dag_runs"]}
    shots = tmp_path / "shots"
    browser = Browser(tmp_path / "profile", log=root / "logs" / "chromium.log")
    try:
        # no session: the Lucid page sends the browser to Airflow's login, which sends it back
        browser.navigate(f"{base}/lucid/jobs")
        browser.wait_for("document.querySelector('input[name=password]')", what="the login form")
        assert "/auth/login" in browser.location() and "next=" in browser.location(), browser.location()
        browser.screenshot(shots / "login.png")
        browser.fill("input[name=username]", "admin")
        browser.fill("input[name=password]", "e2e-secret")
        browser.click("document.querySelector('button[type=submit]')")
        browser.wait_for("document.location.pathname === '/lucid/jobs' && document.getElementById('history')",
                         what="the job history page after logging in")
        _page_screenshot_is_a_page(browser.screenshot(shots / "job-history.png"), "job-history")
        assert browser.evaluate("document.body.innerText.includes('done-')"), "finished jobs are listed"

        # the trigger form, untouched: its Trigger button is enabled and starts a run
        browser.navigate(f"{base}/dags/lucid_system_tuner")
        browser.click(browser.button("Trigger"))
        dialog = "[...document.querySelectorAll('[role=dialog]')].find(d => d.innerText.includes('Run Parameters'))"
        browser.wait_for(f"({dialog}) && ({dialog}).innerText.includes('trace_path') && "
                         f"{browser.button('Trigger', f'({dialog})')}", what="the trigger form and its fields")
        _page_screenshot_is_a_page(browser.screenshot(shots / "trigger-form.png"), "trigger-form")
        submit = browser.button("Trigger", f"({dialog})")
        browser.evaluate(f"{submit}.scrollIntoView({{block: 'center'}})")
        _page_screenshot_is_a_page(browser.screenshot(shots / "trigger-form-bottom.png"), "trigger-form-bottom")
        assert browser.evaluate(f"!{submit}.disabled"), "the form's Trigger button is disabled with its defaults"
        browser.click(submit)
        deadline, run = time.monotonic() + 540, None
        while time.monotonic() < deadline:
            runs = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns", headers=headers).json()["dag_runs"]
            # the form's run (unpausing may also start a scheduled one: not the one asked for)
            run = next((r for r in runs if r["dag_run_id"] not in before and r["run_type"] == "manual"), None)
            if run is not None and run["state"] in ("success", "failed"):
                break
            time.sleep(3)
        assert run is not None, "the form's Trigger started no run"
        assert run["state"] == "success", (root / "logs" / "scheduler.log").read_text()[-4000:]
        conf = run.get("conf") or {}
        assert not conf.get("trace_path") and conf.get("main_nodes") is None, conf
        xcom = _call("GET", f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run['dag_run_id']}/taskInstances/"
                            "write_report/xcomEntries/return_value", headers=headers)
        summary = xcom.json()["value"]
        summary = json.loads(summary) if isinstance(summary, str) else summary
        assert "VC default: 2 main hosts, 4 GPUs; profiling pool: 1 host, 2 GPUs" in summary["cluster"], summary
        assert summary["configurations"] == 8 and summary["verdict"]  # Tprof x sharing around the current, less it

        # the report, as the user opens it: verdict, the current configuration's row, every column on screen
        name = Path(summary["directory"]).name
        browser.navigate(f"{base}/lucid/tuner/{name}")
        browser.wait_for("document.getElementById('tuner-table')", what="the tuner report")
        _page_screenshot_is_a_page(browser.screenshot(shots / "tuner-report.png"), "tuner-report")
        text = browser.evaluate("document.body.innerText")
        assert "Cluster: the live fleet (VC default: 2 main hosts" in text and summary["verdict"][:40] in text
        assert browser.evaluate("document.querySelector('#tuner-table tr.current').innerText.includes('current')")
        right, width = browser.evaluate("[document.getElementById('tuner-table').getBoundingClientRect().right, "
                                        "window.innerWidth]")
        assert right <= width, f"the report table is {right:.0f} px wide on a {width} px page"
        assert all(r["metrics"]["jobs"] == seeded for r in _report_rows(summary["directory"]))

        # the other new or changed pages, for a person to look at
        for page, ready in (("/lucid/api/docs", "document.querySelector('.op')"),
                            ("/lucid/models", "document.getElementById('models')"),
                            ("/lucid/drift", "document.getElementById('drift')")):
            browser.navigate(base + page)
            browser.wait_for(ready, what=page)
            label = page.strip("/").replace("/", "-")
            _page_screenshot_is_a_page(browser.screenshot(shots / f"{label}.png"), label)
        assert browser.evaluate("![...document.scripts].some(s => s.src && !s.src.startsWith(location.origin))")
    finally:
        browser.close()

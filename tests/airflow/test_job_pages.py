"""The job page and the GPU map are for people: a running job's command, user, VC, state history, last log
lines, ETA and partner; per-GPU utilization on the map; a 404 page in the UI's style; every job-supplied text
escaped; hosts that do not answer said so within a deadline. Rendered in headless Chromium too."""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# untrusted text a job controls: its command and what it writes; a page that does not escape it runs it
XSS_OUT = "<script>window.__lucid_xss=1</script>"
XSS_ERR = "<img src=x onerror=window.__lucid_xss=2>"
COMMAND = f'echo "step 1 loss 0.91"; echo "{XSS_OUT}"; echo "{XSS_ERR}" >&2; echo "warn & <b>x</b>" >&2; sleep 40'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Fleet:
    """A store with one local host (one GPU) running a job that writes a script payload to its logs."""

    def __init__(self, url: str, store, job: str, partner: str, run_id: str, run_dir: Path, pids: list[int]) -> None:
        self.url, self.store, self.job, self.partner = url, store, job, partner
        self.run_id, self.run_dir, self.pids = run_id, run_dir, pids

    def client(self, reports: Path, **kwargs):
        """The plugin's app without Airflow's auth, as a test client."""
        from fastapi.testclient import TestClient
        from lucid_airflow.web import create_lucid_app

        return TestClient(create_lucid_app(lambda: self.url, lambda: reports, protect=False, **kwargs))


def _wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fleet(lucid_home, tmp_path, monkeypatch):
    from lucid_airflow import round_steps
    from sqlalchemy import select, update

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import RunRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    config = tmp_path / "lucid.toml"
    config.write_text('[profiler]\nenabled = false\n[binder]\nsharing = "on"\n')
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    store = Store(url)
    workdir = tmp_path / "main0"
    add_host(store, HostSpec("main0", executor="local", telemetry="emulated", gpus=1, workdir=str(workdir)))
    job = submit(store, JobRequest(COMMAND, gpus=1, user="alice", vc="default", name="xss-probe"))
    partner = submit(store, JobRequest("sleep 40", gpus=1, user="bob", vc="default", name="neighbour"))
    round_steps.carry_out(url, round_steps.profile_bind_and_place(url, round_steps.reconcile(url)))
    pids: list[int] = []
    try:
        with store.session() as s:
            run = s.scalars(select(RunRow).where(RunRow.job_id == job, RunRow.state == "running")).first()
            assert run is not None, "the first round launches the first job"
            run_id, gpus = run.run_id, run.gpu_indices
            pids.append(run.pid)
        run_dir = workdir / run_id
        _wait_for(lambda: (run_dir / "stderr.log").is_file() and "warn" in (run_dir / "stderr.log").read_text(),
                  30, "the job's output")
        # the round's pair, as its records hold it (tests/runtime covers the round writing them)
        with store.session() as s:
            s.add(RunRow(run_id=f"{partner}-main1", host="main0", job_id=partner, kind="main", pool="main",
                         gpu_indices=gpus, node_rank=0, partner=job, state="running", planned_at=time.time(),
                         started_at=time.time()))
            s.execute(update(RunRow).where(RunRow.run_id == run_id).values(partner=partner))
        yield Fleet(url, store, job, partner, run_id, run_dir, pids)
    finally:
        for pid in pids:  # the job's wrapper leads its process group
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, signal.SIGTERM)
        store.dispose()


def _telemetry(run_dir: Path, util: float, at: float) -> None:
    """Samples as the telemetry agent beside the job writes them (EmulatedBackend's records, timed)."""
    from lucid_core.runtime.hosts.telemetry_agent import EmulatedBackend

    lines = []
    for k, t in enumerate((at - 10, at)):
        for record in EmulatedBackend([0], util + k, 41.0, 5120.0, noise=0.0).sample(None):
            lines.append(json.dumps(record | {"t": t}))
    (run_dir / "telemetry.jsonl").write_text("\n".join(lines) + "\n")


def _section(text: str, ident: str) -> str:
    """The element whose id is `ident`, up to the next heading (enough to scope an assertion)."""
    found = [i for i in (text.find(f"id='{ident}'"), text.find(f'id="{ident}"')) if i >= 0]
    assert found, f"no element {ident!r} on the page"
    start = min(found)
    end = text.find("<h2>", start)
    return text[start:end if end > 0 else None]


def test_job_page_shows_command_user_vc_history_logs_eta_and_partner(fleet, lucid_home):
    page = fleet.client(lucid_home / "reports").get(f"/jobs/{fleet.job}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    # the command, escaped: the page has no script of its own, so none at all may appear
    assert f"<pre class='command' id='command'>{html.escape(COMMAND)}</pre>" in text
    assert "<script" not in text and "<img src=x" not in text and "<b>x</b>" not in text
    assert "<th>user</th><td>alice</td>" in text and "<th>VC</th><td>default</td>" in text
    assert "<th>state</th><td><b>RUNNING</b></td>" in text
    history = _section(text, "state-history")
    assert "<td>submitted</td>" in history and "<td>launched</td>" in history
    assert "main0" in history, "the launch's reason names where it runs"
    assert history.index("<td>submitted</td>") < history.index("<td>launched</td>"), "oldest first"
    stdout, stderr = _section(text, "stdout"), _section(text, "stderr")
    assert "step 1 loss 0.91" in stdout and html.escape(XSS_OUT) in stdout
    assert html.escape(XSS_ERR) in stderr and "warn &amp; &lt;b&gt;x&lt;/b&gt;" in stderr
    assert "sleep" not in stdout, "the log's lines, not the command"
    assert f"<code>lucid logs {fleet.job}</code>" in text, "the command to read all of it names the job"
    eta = _section(text, "eta")
    assert "ends " in eta and "estimate" in eta and "predicted duration" in eta, eta
    partner = _section(text, "partner")
    assert f">{fleet.partner}</a> on main0 GPU(s) 0, now" in partner


def test_partner_stays_named_after_the_pair_ends(fleet, lucid_home):
    from sqlalchemy import update

    from lucid_core.runtime.store.schema import RunRow

    with fleet.store.session() as s:
        s.execute(update(RunRow).where(RunRow.job_id == fleet.partner).values(state="ended", ended_at=time.time()))
    text = fleet.client(lucid_home / "reports").get(f"/jobs/{fleet.job}").text
    assert f">{fleet.partner}</a> on main0 GPU(s) 0 (the pair has ended)" in text
    assert f"shared a GPU with {fleet.partner} on main0 GPU 0 for" in text


def test_a_partner_that_ended_before_the_job_started_is_not_shown_as_shared(fleet, lucid_home):
    from sqlalchemy import select, update

    from lucid_core.runtime.store.schema import RunRow

    with fleet.store.session() as s:  # the partner ended inside its profiling window before the job started
        began = s.scalar(select(RunRow.started_at).where(RunRow.run_id == fleet.run_id))
        s.execute(update(RunRow).where(RunRow.job_id == fleet.partner).values(
            state="ended", started_at=began - 100, ended_at=began - 90))
    text = fleet.client(lucid_home / "reports").get(f"/jobs/{fleet.job}").text
    facts = _section(text, "job")
    assert "id='partner'" not in facts and "shared a GPU with" not in facts
    assert f"placed to share with {fleet.partner}" in facts


def test_a_waiting_jobs_page_says_it_has_no_output_yet_and_when_it_may_start(fleet, lucid_home):
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    job = submit(fleet.store, JobRequest("python eval.py", gpus=1, user="dana", vc="default"))
    text = fleet.client(lucid_home / "reports").get(f"/jobs/{job}").text
    assert "No output yet: no run of it has started." in text and "id='stdout'" not in text
    eta = _section(text, "eta")
    assert any(words in eta for words in ("starts 20", "could start now", "no start estimated")), eta
    assert "nobody: it has not shared a GPU" in text
    assert "<th>exit code</th>" not in _section(text, "job"), "facts it does not have yet are left out"


def test_gpu_map_shows_each_gpus_utilization(fleet, lucid_home):
    client = fleet.client(lucid_home / "reports")
    before = client.get("/running").text
    assert "util: no sample" in _section(before, "gpu-main0-0"), "no agent wrote a sample yet"
    _telemetry(fleet.run_dir, 63.0, time.time() - 5)
    cell = _section(client.get("/running").text, "gpu-main0-0")
    assert "util 64%, mem 41%, 5.0 GB" in cell, cell  # the newest of the two samples
    assert "<i style='width:64%'></i>" in cell and "emulated" in cell


def test_unknown_job_is_a_404_page_in_the_uis_style(fleet, lucid_home):
    client = fleet.client(lucid_home / "reports")
    missing = client.get("/jobs/job-that-never-was")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert missing.text.startswith("<!doctype html>") and "<nav>" in missing.text
    assert "<h1>Not found</h1>" in missing.text
    assert "There is no job job-that-never-was in the Lucid store." in missing.text
    with pytest.raises(json.JSONDecodeError):
        json.loads(missing.text)
    hostile = client.get("/jobs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert hostile.status_code == 404 and "<img" not in hostile.text
    assert "There is no job &lt;img src=x onerror=alert(1)&gt; in the Lucid store." in hostile.text
    elsewhere = client.get("/jobs/%3Cscript%3Ealert(1)%3C%2Fscript%3E")  # a "/" inside: no route matches
    assert elsewhere.status_code == 404 and "<script>" not in elsewhere.text
    assert "There is no page /jobs/&lt;script&gt;alert(1)&lt;/script&gt;." in elsewhere.text
    assert client.get("/api/jobs/job-that-never-was").json()["detail"], "the JSON API keeps JSON errors"


class _SilentServer:
    """A TCP port that accepts connections and never says a word (an SSH host that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.sock.accept()[0])

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_a_host_that_does_not_answer_is_said_so_within_the_deadline(fleet, lucid_home, tmp_path, monkeypatch):
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import RunRow
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    known = tmp_path / "known_hosts"
    known.write_text("")
    monkeypatch.setenv("LUCID_KNOWN_HOSTS", str(known))  # present: the transport really connects, and waits
    silent = _SilentServer()
    try:
        add_host(fleet.store, HostSpec("gpu9", address="127.0.0.1", port=silent.port, executor="ssh", gpus=1,
                                       vc="far"))
        job = submit(fleet.store, JobRequest("python train.py", gpus=1, user="carol", vc="far"))
        with fleet.store.session() as s:
            s.add(RunRow(run_id=f"{job}-main1", host="gpu9", job_id=job, kind="main", pool="main", gpu_indices=[0],
                         node_rank=0, state="running", planned_at=time.time(), started_at=time.time()))
        client = fleet.client(lucid_home / "reports", host_read_deadline_s=2.0)
        started = time.monotonic()
        page = client.get(f"/jobs/{job}")
        took = time.monotonic() - started
        assert page.status_code == 200 and took < 8, f"the job page took {took:.1f} s"
        problem = _section(page.text, "log-problem")
        assert "Logs of run" in problem and "host gpu9" in problem
        assert "unreachable" in problem or "in time" in problem, problem
        assert "python train.py" in page.text, "the rest of the page is there"
        started = time.monotonic()
        running = client.get("/running").text
        assert time.monotonic() - started < 8
        assert "Utilization not read: host gpu9" in running
        assert "util 64%" not in running and "util: host did not answer" in _section(running, "gpu-gpu9-0")
    finally:
        silent.close()


def test_models_and_drift_pages_say_what_the_last_update_engine_run_found(lucid_home):
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    from lucid_core.runtime.store.store import Store
    from lucid_core.update import minimum_rows

    url = f"sqlite:///{lucid_home / 'lucid.db'}"
    Store(url).dispose()
    reports = lucid_home / "reports"
    client = TestClient(create_lucid_app(lambda: url, lambda: reports, protect=False))
    assert "models-training" not in client.get("/models").text, "no Update Engine run yet: nothing to report"
    batch = reports / "update" / "manual__1"
    batch.mkdir(parents=True)
    (batch / "jobs.csv").write_text("job_id,user\nj1,a\nj2,b\n")
    need = minimum_rows("job_log")
    for path, ident in (("/models", "models-training"), ("/drift", "drift-training")):
        hint = _section(client.get(path).text, ident)
        assert f"The last Update Engine run found 2 of {need} finished jobs" in hint, hint
        assert "training waits for more" in hint


def _serve(app) -> tuple[str, object]:
    """The app mounted at /lucid on a loopback port (uvicorn in a thread); (base URL, server)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Mount("/lucid", app=app)]), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    _wait_for(lambda: server.started, 30, "the test server")
    return f"http://127.0.0.1:{port}", server


def _looks_like_a_page(shot: Path, name: str) -> None:
    """Sized as asked, not blank: many shades (text) over a wide range; kept in LUCID_SCREENSHOT_DIR when set."""
    from PIL import Image

    image = Image.open(shot).convert("L")
    assert image.size == (1400, 900), image.size
    low, high = image.getextrema()
    shades = image.histogram()
    assert high - low > 100 and sum(1 for n in shades if n) > 20, f"screenshot of {name} shows almost nothing"
    dark = sum(shades[:128]) / (image.size[0] * image.size[1])
    assert 0.002 < dark < 0.5, f"screenshot of {name}: {dark:.3%} dark pixels is no page of text"
    keep = os.environ.get("LUCID_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{name}.png")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_job_page_gpu_map_and_404_in_headless_chromium(fleet, lucid_home, tmp_path):
    pytest.importorskip("websockets.sync.client", reason="the CDP driver needs websockets (the dev extra)")
    from cdp_browser import Browser
    from lucid_airflow.web import create_lucid_app

    _telemetry(fleet.run_dir, 63.0, time.time() - 5)
    base, server = _serve(create_lucid_app(lambda: fleet.url, lambda: lucid_home / "reports", protect=False))
    browser = Browser(tmp_path / "profile")
    shots = tmp_path / "shots"
    try:
        browser.navigate(f"{base}/lucid/jobs/{fleet.job}")
        browser.wait_for("document.getElementById('stdout')", what="the job page's log")
        _looks_like_a_page(browser.screenshot(shots / "job-page.png"), "job-page")
        # the payloads are text on the page, never elements, and ran nothing
        assert browser.evaluate("document.getElementById('stdout').innerText").count(XSS_OUT) == 1
        assert XSS_ERR in browser.evaluate("document.getElementById('stderr').innerText")
        assert browser.evaluate("document.getElementById('command').innerText") == COMMAND
        assert browser.evaluate("window.__lucid_xss === undefined && document.scripts.length === 0 "
                                "&& document.querySelectorAll('pre img, pre b').length === 0")
        facts = browser.evaluate("document.getElementById('job').innerText")
        assert "alice" in facts and "RUNNING" in facts and fleet.partner in facts and "ends " in facts
        width = browser.evaluate("document.documentElement.scrollWidth")
        assert width <= 1400, f"the job page is {width} px wide on a 1400 px window"

        browser.navigate(f"{base}/lucid/running")
        browser.wait_for("document.getElementById('gpu-main0-0')", what="the GPU map")
        _looks_like_a_page(browser.screenshot(shots / "gpu-map.png"), "gpu-map")
        assert "util 64%" in browser.evaluate("document.getElementById('gpu-main0-0').innerText")
        bar = browser.evaluate("document.querySelector('#gpu-main0-0 .util i').getBoundingClientRect().width / "
                               "document.querySelector('#gpu-main0-0 .util').getBoundingClientRect().width")
        assert abs(bar - 0.64) < 0.02, bar

        browser.navigate(f"{base}/lucid/jobs/job-that-never-was")
        browser.wait_for("document.getElementById('not-found')", what="the 404 page")
        _looks_like_a_page(browser.screenshot(shots / "not-found.png"), "not-found")
        assert browser.evaluate("document.querySelector('h1').innerText") == "Not found"
        assert browser.evaluate("document.querySelectorAll('nav a').length") >= 5, "the UI's navigation"
        assert browser.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")
    finally:
        browser.close()
        server.should_exit = True

"""The Lucid web views mounted in Airflow at /lucid: queue, GPU map, job detail, models, tuner, drift.

Pages are plain server-rendered HTML (no JavaScript, inline CSS) read from the Lucid store and the
report directory; the runtime's JSON API is mounted under /lucid/api. The auth middleware refuses
every request Airflow does not authenticate, the mounted API included, and names the caller: a job's output is
shown only to its user and to operators. A store that cannot be read is a 503 page saying why.
"""

from __future__ import annotations

import html
import json
import tempfile
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lucid_airflow.auth import airflow_auth_middleware
from lucid_core.policy.view import saved_float, saved_indices
from lucid_core.runtime.surfaces.history_table import UNREADABLE

if TYPE_CHECKING:  # the store's modules load at the first request
    from sqlalchemy.orm import Session

    from lucid_core.runtime.surfaces.queries import HistoryPage, HistoryQuery

esc = html.escape

# bidirectional formatting characters: they reorder the text around them, so a shown id reads as another one
_BIDI_CONTROLS = frozenset({"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})

_STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fff}
nav a{margin-right:14px}
table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{border:1px solid #bbb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#e8eef6}
.gpu{display:inline-block;width:170px;min-height:44px;margin:3px;padding:4px;border:1px solid #888;
 border-radius:4px;font-size:12px;background:#f4f4f4}
.gpu.busy{background:#d8f0d8}.gpu.shared{background:#fde7b0}
.muted{color:#777}pre{background:#f6f6f6;padding:8px;overflow:auto;white-space:pre-wrap}
img{max-width:720px;border:1px solid #ddd;margin:4px}
.scroll{overflow-x:auto;max-width:100%}
table.tuner{font-size:13px}table.tuner td,table.tuner th{padding:3px 6px;white-space:nowrap}
tr.current td{background:#eef6ff;font-weight:600}
.verdict{padding:8px 10px;border-radius:4px;max-width:1000px}.verdict.keep{background:#eef6ee;border:1px solid #9c9}
.verdict.change{background:#fff6e0;border:1px solid #db6}
form.filters label{margin-right:10px}form.filters input{width:110px}
.pager a,.pager span{margin-right:12px}
.hint{background:#f4f7fb;border:1px solid #cdd8e6;padding:8px 10px;border-radius:4px;max-width:1000px}
.hint.bad{background:#fff1f0;border-color:#e0a8a3}
.util{display:block;height:6px;background:#e2e2e2;border-radius:3px;margin-top:3px}
.util i{display:block;height:6px;background:#3b7dd8;border-radius:3px}
table#job th{width:150px}pre.log{max-height:420px;margin:4px 0 12px;font-size:12px}
pre.command{margin:0;padding:4px 6px}table#state-history td:first-child{white-space:nowrap}
"""

HOST_READ_DEADLINE_S = 5.0  # the longest a page waits for the GPU hosts (logs, utilization)
NAV = [("queue", "Queue"), ("running", "Running & GPU map"), ("jobs", "Job history"), ("models", "Models"),
       ("tuner", "Tuner reports"), ("drift", "Drift history")]
HISTORY_PAGE_SIZE = 50


def page(title: str, body: str, prefix: str) -> HTMLResponse:
    """A page of the UI: navigation, `title` (plain text) as its heading, `body` (already-escaped HTML)."""
    links = "".join(f'<a href="{prefix}/{path}">{esc(label)}</a>' for path, label in NAV)
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>Lucid: {shown(title)}</title>"
                        f"<style>{_STYLE}</style></head><body><nav>{links}</nav><h1>{shown(title)}</h1>{body}"
                        f"</body></html>")


def shown(text: str) -> str:
    """`text` as HTML that shows every character it holds: escaped, and each invisible one written as its Python
    escape (`\\x00`, `\\x1b`, `\\u202e`). html.escape leaves a NUL or an escape raw; a browser drops a NUL and
    shows most controls as nothing, so a page quoting a requested id would name another id than the one asked for
    (and a bidi override would reverse the text after it)."""
    return esc("".join(_visible(char) for char in text))


def _visible(char: str) -> str:
    """`char` itself, or its escape when a browser would not show it as itself: a control character (Unicode Cc,
    NUL and newline included: the messages are one line), a lone surrogate, a bidirectional formatting one."""
    hidden = (unicodedata.category(char) in ("Cc", "Cs")
              or unicodedata.bidirectional(char) in _BIDI_CONTROLS)
    return char.encode("unicode_escape").decode("ascii") if hidden else char


def table(header: list[str], rows: list[list[str]], table_id: str = "") -> str:
    """An HTML table; cells are already-escaped HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hours(seconds: float | None) -> str:
    """Seconds as hours or minutes; n/a for none, unreadable for text a hand edit left in the store (a 500 before)."""
    if seconds is None:
        return "<span class='muted'>n/a</span>"
    number = saved_float(seconds)
    if number is None:
        return f"<span class='muted'>{UNREADABLE}</span>"
    return f"{number / 3600:.2f} h" if number >= 3600 else f"{number / 60:.1f} min"


def create_lucid_app(store_url: Callable[[], str], reports_root: Callable[[], Path], prefix: str = "/lucid",
                     protect: bool = True, host_read_deadline_s: float = HOST_READ_DEADLINE_S) -> FastAPI:
    """The plugin's FastAPI app; `store_url` and `reports_root` are resolved lazily, at the first request.

    Pages that read from the GPU hosts (job logs, GPU utilization) wait at most `host_read_deadline_s`.
    """
    app = FastAPI(title="Lucid", description="Lucid GPU scheduler views and API (behind Airflow auth)")
    if protect:
        app.middleware("http")(airflow_auth_middleware)

    @app.exception_handler(StarletteHTTPException)
    async def error_page(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        """Errors of the pages (an unknown job, page or file) as a page of the UI, not JSON."""
        if exc.status_code != 404:
            return error_response(exc, prefix)
        if exc.detail != "Not Found":
            return not_found_page(str(exc.detail), prefix)
        # the path as asked for: request.url drops a newline or tab and quotes a backslash (%5C)
        return not_found_page(f"There is no page {request.scope['path']}.", prefix)

    @app.exception_handler(RequestValidationError)
    async def invalid_input(request: Request, exc: RequestValidationError) -> HTMLResponse:
        """A query or path value a page cannot take (`?page=abc`) as a page of the UI naming the parameter and
        what it must be, not FastAPI's JSON 422 (the mounted JSON API has its own handlers and keeps JSON)."""
        problems = [parameter_problem(error, parameter_limits(request, _parameter_name(error)))
                    for error in exc.errors()]
        return invalid_input_page(problems, prefix)

    from lucid_airflow.connections import ConnectionProblem

    @app.exception_handler(ConnectionProblem)
    async def store_unusable(request: Request, exc: ConnectionProblem) -> HTMLResponse:
        """A store connection the pages cannot use (a conn type no store has), named on a page: not a bare 500."""
        return store_down_page(f"The Lucid store cannot be opened: {exc}", prefix)

    from sqlalchemy.exc import DBAPIError

    @app.exception_handler(DBAPIError)
    async def store_unreadable(request: Request, exc: DBAPIError) -> HTMLResponse:
        """A store the pages cannot read (its server down, a wrong database, no tables yet) named on a 503 page,
        not a bare 500; any other database error stays a server error."""
        from lucid_core.runtime.store.unreadable import unreadable_words

        words = unreadable_words(store().url, exc)
        if words is None:
            raise exc
        return store_down_page(words, prefix)

    @cache
    def store():
        from lucid_core.runtime.store.store import Store

        return Store(store_url(), migrate=False)

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        items = "".join(f'<li><a href="{prefix}/{path}">{esc(label)}</a></li>' for path, label in NAV)
        return page("Lucid", f"<ul>{items}</ul><p>JSON API: <a href='{prefix}/api/docs'>{prefix}/api</a></p>",
                    prefix)

    @app.get("/queue", response_class=HTMLResponse)
    def queue(user: str = "", vc: str = "") -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import QueueQuery, waiting

        form = queue_form(prefix, user, vc)
        try:
            query = QueueQuery.of_text(users=user, vcs=vc)
        except ValueError as exc:  # the filters again, as typed, with what is wrong in them
            refused = page("Queue", form + f"<p class='hint bad' id='invalid-input'>{shown(str(exc))}</p>", prefix)
            refused.status_code = 422
            return refused
        db = store()
        jobs = waiting(db, query)
        rows = []
        for j in jobs:
            priority = j["priority_gpu_s"]
            rows.append([
                esc(str(j["position"] if j["position"] is not None else "-")),
                f'<a href="{prefix}/jobs/{esc(j["job_id"])}">{esc(j["job_id"])}</a>', esc(j["name"]),
                esc(j["user"]), esc(j["vc"]), str(j["gpus"]), esc(j["state"]), hours(j["predicted_duration_s"]),
                f"{priority:.0f}" if priority is not None else "<span class='muted'>n/a</span>",
                esc(j["pending_reason"] or ""),
            ])
        profiling = sum(1 for j in jobs if j["state"] == "PROFILING")
        also = f", {profiling} of them being profiled (also on the Running page)" if profiling else ""
        of = " matching the filter" if query.narrows else ""
        body = (_stalled_banner(db) + form
                + f"<p>{len(rows)} job(s){of} not yet on the main cluster{also}. Lower priority value runs "
                "first (GPUs x predicted duration); the order is each job's place among all waiting jobs.</p>"
                + table(["order", "job", "name", "user", "VC", "GPUs", "state", "predicted duration",
                         "priority (GPU-s)", "reason"], rows, "queue"))
        return page("Queue", body, prefix)

    @app.get("/running", response_class=HTMLResponse)
    def running() -> HTMLResponse:
        from lucid_core.runtime.surfaces.host_reads import gpu_utilization
        from lucid_core.runtime.surfaces.job_views import stopping_words
        from lucid_core.runtime.surfaces.queries import gpu_map

        db = store()
        found = gpu_map(db)
        with host_executor(host_read_deadline_s) as executor:
            util = gpu_utilization(found, executor, host_read_deadline_s)
        now = db.now()
        runs, shared, hosts, gpus, names = found.runs, found.shared, found.hosts, found.gpus, found.names
        on_gpu: dict[tuple[str, int], list[Any]] = {}
        for r in runs:
            for index in saved_indices(r.gpu_indices):
                on_gpu.setdefault((r.host, index), []).append(r)
        rows = [[f'<a href="{prefix}/jobs/{esc(r.job_id)}">{esc(r.job_id)}</a>',
                 esc(names.get(r.job_id, "")), esc(r.kind), esc(r.host),
                 esc(",".join(str(i) for i in saved_indices(r.gpu_indices))), esc(r.partner or ""),
                 _shared_speed_cell(shared.get(r.job_id) if r.kind == "main" else None, now),
                 esc(r.state) + (f"<br><span class='muted'>{esc(stop)}</span>" if (stop := stopping_words(r)) else ""),
                 _running_for(r.started_at, now, stopping=stop is not None)] for r in runs]
        cards = []
        for host in hosts:
            cells = []
            for g in (g for g in gpus if g.host == host.name):
                here = on_gpu.get((host.name, g.index), [])
                cls = "gpu shared" if len(here) > 1 else "gpu busy" if here else "gpu"
                who = "<br>".join(esc(r.job_id) + _speed_suffix(shared.get(r.job_id) if r.kind == "main" else None)
                                  for r in here) or "<span class='muted'>idle</span>"
                reading = _util_cell(util.readings.get((host.name, g.index)), util.problems.get(host.name), now)
                cells.append(f"<div class='{cls}' id='gpu-{esc(host.name)}-{g.index}'><b>GPU {g.index}</b><br>{who}"
                             f"{reading}</div>")
            flag = " (draining)" if host.draining else "" if host.reachable else " (unreachable)"
            problem = util.problems.get(host.name)
            note = f"<p class='hint bad'>Utilization not read: {esc(problem)}</p>" if problem else ""
            cards.append(f"<h3>{esc(host.name)} <span class='muted'>{esc(host.pool)} pool, VC {esc(host.vc)}"
                         f"{flag}</span></h3>{note}<div id='gpumap-{esc(host.name)}'>{''.join(cells)}</div>")
        body = (_stalled_banner(db) + table(["job", "name", "run", "host", "GPUs", "shares with",
                                             "speed while shared", "state", "running for"], rows, "running")
                + "<p>Speed while shared: the job's speed beside its partner relative to running alone, as its "
                  "telemetry last measured it.</p>"
                + "<h2>GPU map</h2><p>Green: one job; amber: two jobs sharing the GPU (with the speed measured "
                  "there). Utilization: the GPU's newest sample (whole GPU, every job on it) from the telemetry agent "
                  "of a job running there, read from the host now; a job running without an agent (not profiled, "
                  "or never sharing) leaves its GPU without one, and a job alone after its profile writes no new "
                  "ones: the sample's age says how old it is.</p>" + "".join(cards))
        return page("Running jobs and GPU map", body, prefix)

    @app.get("/jobs", response_class=HTMLResponse)
    def job_history(user: str = "", vc: str = "", state: str = "", since: str = "", until: str = "",
                    number: int = Query(1, alias="page", ge=1)) -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import HistoryQuery

        try:
            query = HistoryQuery(user=user.strip() or None, vc=vc.strip() or None,
                                 states=tuple(x for x in state.split(",") if x), since=_day_start(since),
                                 until=_day_start(until), limit=HISTORY_PAGE_SIZE)
        except ValueError as exc:  # the filters again, as typed, with what is wrong in them
            refused = page("Job history", history_form(prefix, user, vc, state, since, until)
                           + f"<p class='hint bad' id='invalid-input'>{shown(str(exc))}</p>", prefix)
            refused.status_code = 422
            return refused
        with store().session() as s:
            found, number, note = _history_page(s, query, number)
        rows = [[f'<a href="{prefix}/jobs/{esc(r["job_id"])}">{esc(r["job_id"])}</a>', esc(r["name"]),
                 esc(r["user"]), esc(r["vc"]), str(r["gpus"]), esc(r["state"]),
                 esc(_utc(r["end_time"])), hours(r["queued_s"]), hours(r["elapsed_s"]),
                 esc("" if r["exit_code"] is None else str(r["exit_code"])), esc(r["end_reason"] or "")]
                for r in found.rows]
        filters = {"user": user, "vc": vc, "state": state, "since": since, "until": until}
        form = history_form(prefix, user, vc, state, since, until)
        last = _last_page(found.total)

        def link(to: int, label: str) -> str:
            from urllib.parse import urlencode

            target = urlencode({**{k: v for k, v in filters.items() if v}, "page": to})
            return f"<a href='{prefix}/jobs?{esc(target)}'>{label}</a>"

        pager = (f"<p class='pager'>{link(number - 1, '&larr; newer') if number > 1 else ''}"
                 f"<span>page {number} of {last} ({found.total} job(s))</span>"
                 f"{link(number + 1, 'older &rarr;') if number < last else ''}</p>")
        empty = ("" if rows else "<p class='hint'>No finished job matches. Jobs appear here once they complete, "
                 "fail or are cancelled; waiting and running ones are on the Queue and Running pages.</p>")
        past = f"<p class='hint' id='page-note'>{esc(note)}</p>" if note else ""
        body = (form + past + pager + table(["job", "name", "user", "VC", "GPUs", "state", "ended", "queued", "ran",
                                             "exit code", "end reason"], rows, "history") + empty
                + "<p class='muted'>The same list on the command line: <code>lucid history</code> "
                  "(<code>--user</code>, <code>--state</code>, <code>--since</code>, <code>--format</code>).</p>")
        return page("Job history", body, prefix)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_detail(job_id: str, request: Request) -> HTMLResponse:
        from lucid_core.runtime.surfaces.job_views import ACTIVE_STATES
        from lucid_core.runtime.surfaces.queries import job_record, status
        from lucid_core.runtime.surfaces.submission import UnknownJob

        db = store()
        try:
            data = status(db, job_id)
            record = job_record(db, job_id)
        except UnknownJob:
            raise HTTPException(404, f"There is no job {job_id} in the Lucid store.") from None
        output = _output_section(db, job_id, data["user"], request, host_read_deadline_s)
        now = db.now()
        facts = _job_facts(data, record.job, _eta_cell(db, job_id, record.job, now), prefix)
        explanation = _explanation(store_url(), job_id)
        dec = table(["round", "decision", "reason", "status"], [[str(d.round_id), esc(d.kind), esc(d.reason),
                                                                 esc(d.status)] for d in record.decisions],
                    "decisions")
        stalled = _stalled_banner(db) if data["state"] in ACTIVE_STATES else ""
        body = (f"{stalled}{facts}<h2>Output</h2>{output}"
                f"<h2>State history</h2>{_state_history(record.events)}"
                f"<h2>Why it is where it is</h2><pre id='explanation'>{esc(explanation)}</pre>"
                f"<h2>Runs</h2>{_runs_table(data['runs'])}<h2>Decisions</h2>{dec}")
        return page(f"Job {job_id}", body, prefix)

    @app.get("/models", response_class=HTMLResponse)
    def models() -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import model_versions

        versions = model_versions(store())
        rows = [[esc(v.kind), esc(v.version), promoted_words(v), esc(metrics_words(v.metrics)),
                 esc(v.note)] for v in versions]
        root = reports_root() / "models"
        pictures = sorted(root.glob("**/*.png")) if root.is_dir() else []
        texts = sorted(root.glob("**/*.txt")) if root.is_dir() else []
        imgs = "".join(f"<figure><img src='{prefix}/files/models/{esc(str(p.relative_to(root)))}'>"
                       f"<figcaption>{esc(str(p.relative_to(root)))}</figcaption></figure>" for p in pictures)
        trees = "".join(f"<h3>{esc(p.name)}</h3><pre>{esc(p.read_text(encoding='utf-8')[:20000])}</pre>"
                        for p in texts)
        hint = ("" if rows else "<p class='hint' id='models-hint'>No model trained yet. The "
                "<code>lucid_update_engine</code> DAG fills this page: daily it extracts finished jobs from the store, "
                "validates them, trains the duration and packing models and promotes them when they beat the current "
                "ones. It needs enough finished jobs (its log says how many it found and how many it needs); until "
                "then the scheduler predicts from job history. Trigger it from <code>/dags/lucid_update_engine</code> "
                "or train by hand with <code>lucid models train-duration</code> and <code>train-packing</code>.</p>"
                + _training_hint(reports_root(), "models-training"))
        body = (hint + table(["model", "version", "promoted", "metrics", "note"], rows, "models")
                + "<h2>Shape functions and trees</h2>" + (imgs + trees or "<p class='muted'>none yet</p>"))
        return page("Models", body, prefix)

    @app.get("/tuner", response_class=HTMLResponse)
    def tuner_list() -> HTMLResponse:
        root = reports_root() / "tuner"
        reports = sorted(root.glob("*/report.json"), key=lambda p: p.stat().st_mtime, reverse=True) \
            if root.is_dir() else []
        from lucid_core.tuner import proposal_text

        rows = []
        for path in reports:
            link = f'<a href="{prefix}/tuner/{esc(path.parent.name)}">{esc(path.parent.name)}</a>'
            summary = _report_json(path)
            try:
                rows.append([link, esc(summary["objective"]), str(summary["configurations"]),
                             str(summary["failed"]), esc(proposal_text(summary)), esc(_applied_words(path.parent)),
                             esc(", ".join(map(str, summary.get("workers", []))))])
            except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):  # cut short, not one of ours
                rows.append([link, "", "", "", "its report.json cannot be read", "", ""])
        return page("System Tuner reports", table(["run", "objective", "configurations", "failed", "proposal",
                                                   "applied", "workers"], rows, "tuner-reports"), prefix)

    @app.get("/tuner/{name}", response_class=HTMLResponse)
    def tuner_report(name: str) -> HTMLResponse:
        report = _inside(reports_root() / "tuner", f"{name}/report.html", f"no tuner report {name}")
        plots = _report_json(report.parent / "report.json").get("plots", [])
        imgs = "".join(f"<img src='{prefix}/files/tuner/{esc(name)}/{esc(str(p))}' alt='{esc(str(p))}'>"
                       for p in (plots if isinstance(plots, list) else []))
        applied = _applied_words(report.parent)
        head = f"<p class='hint' id='applied'>{esc(applied)}</p>" if applied else ""
        return page(f"Tuner report {name}", head + report.read_text(encoding="utf-8") + imgs, prefix)

    def _shift_text(shift: dict[str, Any], threshold: float) -> str:
        """One input's PSI and, where chance or the training window's own spread set a higher bar than the
        threshold, that bar (records written before the bar was kept show the PSI alone)."""
        bar = max(float(threshold), float(shift.get("noise", 0.0)), float(shift.get("spread", 0.0)))
        text = f"{shift['feature']} {shift['psi']:.3f}"
        if bar > float(threshold):
            text += f" (bar {bar:.3f})"
        return text + (" shifted" if shift.get("shifted") else "")

    def _drift_state(report: dict[str, Any]) -> str:
        """ALERT where the check alerted (a record from before checks were counted: where it drifted), else
        how many checks in a row drifted of how many the alert waits for, else ok."""
        if report.get("alert", report["drifted"]):
            return "ALERT"
        if report["drifted"]:
            return esc(f"drift ({int(report['in_a_row'])} of {int(report['checks_to_alert'])} checks in a row)")
        return "ok"

    @app.get("/drift", response_class=HTMLResponse)
    def drift() -> HTMLResponse:
        root = reports_root() / "drift"
        rows = []
        for path in sorted(root.glob("*.json"), reverse=True) if root.is_dir() else []:
            data = _report_json(path)
            try:
                for report in data.get("reports", []):
                    shifts = ", ".join(_shift_text(s, report["psi_threshold"]) for s in report.get("shifts", []))
                    state = _drift_state(report)
                    version = report.get("version")
                    model = str(report["model"]) + (f" v{version}" if version not in (None, "") else "")
                    rows.append([esc(str(data.get("run_id", path.stem))), esc(model),
                                 f"{report['reference_mae']:.4g}", f"{report['recent_mae']:.4g}",
                                 f"{report['mae_ratio']:.3f}", esc(shifts), state,
                                 # the mail was of the models that alerted: not of a row that was ok
                                 esc(str(data.get("alert_sent_to", ""))) if state == "ALERT" else ""])
            except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):  # cut short, not one of ours,
                # or numbers past a float's range (a 400-digit integer, an infinite count)
                rows.append([esc(path.stem), "", "", "", "", "", "this record cannot be read", ""])
        hint = ("" if rows else "<p class='hint' id='drift-hint'>No drift check yet. Each run of the "
                "<code>lucid_update_engine</code> DAG that has a promoted model compares its error on recent jobs "
                "with its error when trained and writes a row here (and mails an alert when it drifted). The first "
                "run trains the models, so rows start with the second run that has enough finished jobs.</p>"
                + _training_hint(reports_root(), "drift-training"))
        return page("Drift history", hint + table(["run", "model", "reference MAE", "recent MAE", "ratio", "PSI",
                                                   "state", "alert sent to"], rows, "drift"), prefix)

    @app.get("/files/{area}/{path:path}")
    def files(area: str, path: str) -> FileResponse:
        if area not in {"tuner", "models"}:
            raise HTTPException(404, "unknown area")
        target = _inside(reports_root() / area, path)
        if target.suffix not in {".png", ".csv", ".json", ".md", ".txt"}:
            raise HTTPException(404, "no such file")
        return FileResponse(target)

    app.mount("/api", _LazyApp(lambda: _runtime_api(store_url())))
    return app


#: a promoted model's metrics people read, in this order, with how each is written (the per-job errors and inputs
#: the drift check keeps are left out: hundreds of numbers, cut mid-number at the cell's end before)
METRIC_WORDS = (("reference_mae", "MAE {:.4g}"), ("train_rows", "trained on {:,} jobs"),
                ("recent_rows", "{:,} recent"), ("fit_seconds", "fit in {:.1f} s"))


def metrics_words(metrics: Any) -> str:
    """A model version's metrics in a line: its error, what it was trained on and when, other single values by
    name; what another writer left that is no mapping, as text cut to 300 characters."""
    if not isinstance(metrics, dict):
        return str(metrics)[:300]
    words = []
    for key, pattern in METRIC_WORDS:
        try:
            words.append(pattern.format(metrics[key]))
        except (KeyError, TypeError, ValueError, ArithmeticError):  # ArithmeticError: an int past a float's range
            continue
    window = metrics.get("training_window")
    if isinstance(window, list | tuple) and len(window) == 2 and all(saved_time(t) for t in window):
        words.append("window " + " to ".join(time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in window))
    known = {key for key, _ in METRIC_WORDS} | {"training_window"}
    words += [f"{key} {value}" for key, value in metrics.items()
              if key not in known and isinstance(value, str | int | float) and not isinstance(value, bool)]
    return "; ".join(words)[:300]


def saved_time(value: Any) -> bool:
    """Whether `value` is a time `time.gmtime` can show (a finite number within years 1970-9999)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 253402300800


def promoted_words(version) -> str:
    """The models table's "promoted" cell: a promoted version whose file lies outside LUCID_HOME/models is not
    loaded by rounds (they fall back), and the page says so."""
    from lucid_core.models.registry import artifact_within, models_root

    if not version.active:
        return ""
    try:
        artifact_within(version.path, models_root())
    except ValueError:
        return "<span class='bad'>yes, not loaded: its file lies outside LUCID_HOME/models</span>"
    return "yes"


def queue_form(prefix: str, user: str, vc: str) -> str:
    """The queue page's filter form (users and VCs comma-separated, as `lucid queue -u`), holding them as given."""
    return (f"<form class='filters' method='get' action='{prefix}/queue'>"
            f"<label>user <input name='user' value='{esc(user)}'></label>"
            f"<label>VC <input name='vc' value='{esc(vc)}'></label>"
            f"<button type='submit'>Filter</button> <a href='{prefix}/queue'>clear</a></form>")


def history_form(prefix: str, user: str, vc: str, state: str, since: str, until: str) -> str:
    """The job history's filter form, holding the filters as given."""
    states = "".join(f"<option value='{v}'{' selected' if v == state else ''}>{label}</option>"
                     for v, label in (("", "any end"), ("COMPLETED", "completed"), ("FAILED", "failed"),
                                      ("CANCELLED", "cancelled")))
    return (f"<form class='filters' method='get' action='{prefix}/jobs'>"
            f"<label>user <input name='user' value='{esc(user)}'></label>"
            f"<label>VC <input name='vc' value='{esc(vc)}'></label>"
            f"<label>state <select name='state'>{states}</select></label>"
            f"<label>ended from <input name='since' type='date' value='{esc(since)}'></label>"
            f"<label>before <input name='until' type='date' value='{esc(until)}'></label>"
            f"<button type='submit'>Filter</button> <a href='{prefix}/jobs'>clear</a></form>")


def not_found_page(what: str, prefix: str) -> HTMLResponse:
    """A 404 as a page of the UI: what was not found and where to look instead."""
    return refusal_page("Not found", f"<p class='hint' id='not-found'>{shown(what)}</p>", 404, prefix)


def invalid_input_page(problems: list[str], prefix: str) -> HTMLResponse:
    """A 422 as a page of the UI, laid out as the 404 page: each parameter refused and what it must be."""
    lines = "<br>".join(shown(problem) for problem in problems)
    return refusal_page("Invalid request", f"<p class='hint bad' id='invalid-input'>{lines}</p>", 422, prefix)


def refusal_page(title: str, notice: str, status_code: int, prefix: str) -> HTMLResponse:
    """A page answering a request no page can serve: `notice` (escaped HTML) and where to look instead."""
    body = (f"{notice}<p>Waiting and running jobs are on the <a href='{prefix}/queue'>queue</a> and "
            f"<a href='{prefix}/running'>running</a> pages, finished ones in the <a href='{prefix}/jobs'>job "
            f"history</a>. On the command line: <code>lucid queue</code>, <code>lucid history</code>.</p>")
    response = page(title, body, prefix)
    response.status_code = status_code
    return response


# what a parameter must be, by the type of pydantic's error about it (its `ctx` fills the braces)
PARAMETER_RULES = {
    "int_parsing": "a whole number", "int_type": "a whole number", "int_from_float": "a whole number",
    "int_parsing_size": "a whole number of at most 4300 digits", "float_parsing": "a number",
    "float_type": "a number", "bool_parsing": "true or false", "bool_type": "true or false",
    "greater_than_equal": "{ge} or more", "greater_than": "more than {gt}", "less_than_equal": "at most {le}",
    "less_than": "less than {lt}", "string_too_long": "at most {max_length} characters",
    "string_too_short": "at least {min_length} characters", "enum": "one of {expected}",
    "literal_error": "one of {expected}",
}
# errors whose rule already says the range: the declared limits are not added to them
RANGE_ERRORS = frozenset({"greater_than_equal", "greater_than", "less_than_equal", "less_than",
                          "int_parsing_size"})
LIMIT_WORDS = (("ge", "{} or more"), ("gt", "more than {}"), ("le", "at most {}"), ("lt", "less than {}"))
SHOWN_INPUT_CHARS = 80  # a refused value longer than this is quoted cut short


def parameter_problem(error: Mapping[str, Any], limits: str = "") -> str:
    """One of FastAPI's validation errors as a sentence: the parameter, what it must be, the value it got.

    `limits` (the parameter's declared range in words) is added to a type error, so that `page=abc` learns
    the whole rule ("a whole number, 1 or more"), not only that it must be a number."""
    name = _parameter_name(error)
    if error.get("type") == "missing":
        return f"{name} must be given"
    rule = PARAMETER_RULES.get(str(error.get("type")))
    try:
        wanted = rule.format(**(error.get("ctx") or {})) if rule else None
    except (KeyError, IndexError):  # a context without the value the rule names
        wanted = None
    if wanted and limits and error.get("type") not in RANGE_ERRORS:
        wanted = f"{wanted}, {limits}"
    said = f"must be {wanted}" if wanted else f"is refused: {error.get('msg', 'invalid value')}"
    return f"{name} {said}, got {_quoted(error.get('input'))}"


def parameter_limits(request: Request, name: str) -> str:
    """The range the matched route declares for its query or path parameter `name` ("1 or more"); "" when it
    declares none or the route cannot be read."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    fields = [*getattr(dependant, "query_params", ()), *getattr(dependant, "path_params", ())]
    words = [template.format(getattr(constraint, attribute))
             for field in fields if getattr(field, "alias", None) == name
             for constraint in getattr(getattr(field, "field_info", None), "metadata", ())
             for attribute, template in LIMIT_WORDS if getattr(constraint, attribute, None) is not None]
    return " and ".join(words)


def _parameter_name(error: Mapping[str, Any]) -> str:
    """The name of the parameter an error is about (the last part of its location)."""
    location = error.get("loc") or ()
    return str(location[-1]) if location else "a parameter"


def _quoted(value: Any) -> str:
    """A refused value, quoted and cut to SHOWN_INPUT_CHARS (a 5000-digit page number is not shown whole)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return f"'{text[:SHOWN_INPUT_CHARS]}...'" if len(text) > SHOWN_INPUT_CHARS else f"'{text}'"


def store_down_page(words: str, prefix: str) -> HTMLResponse:
    """A 503 as a page of the UI: the Lucid store cannot be opened or read, and why (`words`, plain text)."""
    response = page("Lucid store unavailable", f"<p class='hint bad' id='store-unavailable'>{shown(words)}</p>",
                    prefix)
    response.status_code = 503
    return response


def error_response(exc: StarletteHTTPException, prefix: str) -> HTMLResponse:
    """Any other HTTP error of a page, as a page of the UI with its status (and headers, e.g. Allow)."""
    response = page(f"Error {exc.status_code}", f"<p class='hint bad' id='error'>{shown(str(exc.detail))}</p>",
                    prefix)
    response.status_code = exc.status_code
    response.headers.update(exc.headers or {})
    return response


@contextmanager
def host_executor(deadline_s: float) -> Iterator[Any]:
    """The round's executor (SSH hosts through their Airflow connections) for one page's reads, then closed."""
    from lucid_airflow.round_steps import host_executor as round_executor

    with tempfile.TemporaryDirectory(prefix="lucid-web-ssh-") as tmp:
        executor = round_executor(Path(tmp), deadline_s)
        try:
            yield executor
        finally:
            executor.close()


def _stalled_banner(db: Any) -> str:
    """A warning atop a page of waiting and running jobs when the scheduler's rounds have stalled (`round_age`):
    what it shows may be out of date, and nothing starts until they resume. Empty while they keep their pace."""
    from lucid_core.runtime.surfaces.round_age import stalled_note

    note = stalled_note(db)
    return f"<p class='hint bad' id='rounds-stalled'>{esc(note[0].upper() + note[1:])}</p>" if note else ""


def _utc(moment: float | None) -> str:
    """An epoch time as a UTC date-time ("" for None, "unreadable" for text a hand edit left in a time column:
    one such row failed the whole history page)."""
    if moment is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(moment))
    except (TypeError, ValueError, OverflowError, OSError):
        return UNREADABLE


def _util_cell(reading: Any, problem: str | None, now: float) -> str:
    """A GPU map cell's utilization: the newest sample with its age and a bar, or why there is none."""
    if reading is None:
        why = "host did not answer" if problem else "no sample"
        return f"<br><span class='muted util-none'>util: {why}</span>"
    tag = ", emulated" if reading.emulated else ""
    memory = "" if reading.mem_used_mb is None else f", {reading.mem_used_mb / 1024:.1f} GB"
    width = max(0.0, min(100.0, reading.gpu_util))
    return (f"<br><span class='util-value'>util {reading.gpu_util:.0f}%, mem {reading.mem_util:.0f}%{memory}</span>"
            f"<span class='util' title='GPU utilization {reading.gpu_util:.0f}%'><i style='width:{width:.0f}%'></i>"
            f"</span><span class='muted'>{hours(max(0.0, now - reading.at))} ago{tag}</span>")


def _job_facts(data: dict[str, Any], job: Any, eta: str, prefix: str) -> str:
    """The job's summary table: command, user, VC, state, times, ETA and the job it shares GPUs with."""
    from lucid_core.runtime.round.pending import pending_text

    exit_code = "" if data["exit_code"] is None else str(data["exit_code"])
    rows = [("command", f"<pre class='command' id='command'>{esc(data['command'])}</pre>"),
            ("name", esc(data["name"] or "")), ("user", esc(data["user"])), ("VC", esc(data["vc"])),
            ("GPUs", str(data["gpus"])), ("state", f"<b>{esc(data['state'])}</b>"),
            ("submitted", esc(_utc(data["submit_time"]))), ("started", esc(_utc(data["start_time"]))),
            ("ended", esc(_utc(data["end_time"]))), ("exit code", esc(exit_code)),
            ("end reason", esc(data["end_reason"] or "")), ("time limit", esc(_limit_words(data))),
            ("waiting because", esc(pending_text(job) or "")),
            ("ETA", eta), ("shares GPUs with", _partner_cell(data["shared_spans"], data["sharing"], prefix))]
    always = {"command", "user", "VC", "state", "ETA", "shares GPUs with"}
    cells = "".join(f"<tr><th>{esc(label)}</th><td>{value}</td></tr>" for label, value in rows
                    if value or label in always)
    return f"<table id='job'><tbody>{cells}</tbody></table>"


def _limit_words(data: dict[str, Any]) -> str:
    """The job's time limit in words, all its runs together ('' when it has none or a writer broke it)."""
    from lucid_core.policy.view import saved_time_limit
    from lucid_core.units import duration_words

    limit = saved_time_limit(data.get("time_limit_s"))
    return f"{duration_words(limit)}, all its runs together" if limit is not None else ""


def _partner_cell(spans: list[dict[str, Any]], sharing: str | None, prefix: str) -> str:
    """Whom it shared a GPU with, by the run records (`status`'s spans: both ran there at once): now, or the
    last such partner; a planned partner that never ran beside it is no partner (the summary says so)."""
    if not spans:
        text = sharing or "nobody: it has not shared a GPU"
        return f"<span class='muted'>{esc(text)}</span>"
    last = spans[-1]
    link = f"<a href='{prefix}/jobs/{esc(last['partner'])}'>{esc(last['partner'])}</a>"
    gpus = ",".join(str(i) for i in last["gpus"])
    where = f"on {esc(last['host'])} GPU(s) {esc(gpus)}"
    said = f" <span class='muted'>({esc(sharing)})</span>" if sharing else ""
    return (f"<span id='partner'>{link} {where}, now</span>{said}" if last["ongoing"]
            else f"<span id='partner'>{link} {where} (the pair has ended)</span>{said}")


def _eta_cell(store: Any, job_id: str, job: Any, now: float) -> str:
    """When the job starts and ends, as `lucid eta` estimates it (a what-if of the live policy)."""
    from lucid_core.config import load_live_config
    from lucid_core.domain import JobState
    from lucid_core.runtime.surfaces.eta import estimate
    from lucid_core.units import duration_words

    try:
        eta = estimate(store, job_id, load_live_config(), now)
    except Exception as exc:  # an estimate failing must not take the page down
        return f"<span class='muted' id='eta'>not estimated: {esc(type(exc).__name__)}: {esc(str(exc))}</span>"
    if eta.note == "already ended":
        return "<span class='muted' id='eta'>none: the job has ended</span>"
    parts = []
    if eta.state != JobState.RUNNING.value:
        parts.append("could start now" if eta.start is not None and eta.start <= now else "no start estimated"
                     if eta.start is None else f"starts {_utc(eta.start)} (in {duration_words(eta.start - now)})")
    if eta.end is None:
        parts.append("no end estimated")
    elif eta.end >= now:
        parts.append(f"ends {_utc(eta.end)} (in {duration_words(eta.end - now)})")
    else:
        parts.append(f"predicted end {_utc(eta.end)} passed {duration_words(now - eta.end)} ago (it runs longer "
                     "than predicted)")
    basis = f"estimate: {eta.note}, from the what-if run of the live policy (<code>lucid eta</code>)"
    if eta.predicted_duration is not None:
        source = (job.predicted_by or "").split(";")[0].removeprefix("duration: ")
        basis += (f"; predicted duration {esc(duration_words(eta.predicted_duration))}"
                  + (f" by {esc(source)}" if source else " by the current duration model"))
    return f"<span id='eta'><b>{esc('; '.join(parts))}</b><br><span class='muted'>{basis}</span></span>"


def _output_section(db: Any, job_id: str, owner: str, request: Request, deadline_s: float) -> str:
    """The job page's output: its last log lines, read from its host, for its user and operators (or anyone
    when the app runs without Airflow's auth); for others a note whose output it is, read from no host."""
    from lucid_core.runtime.surfaces.host_reads import log_tail
    from lucid_core.runtime.surfaces.output_access import may_read_output

    user = getattr(request.state, "lucid_user", None)
    if not may_read_output(owner, user, bool(getattr(request.state, "lucid_operator", False))):
        return _withheld_html(job_id, owner)
    with host_executor(deadline_s) as executor:
        return _log_html(log_tail(db, executor, job_id, deadline_s=deadline_s), job_id)


def _withheld_html(job_id: str, owner: str) -> str:
    """The note in place of a job's output for a caller who may not read it (training logs carry secrets)."""
    from lucid_core.runtime.surfaces.output_access import output_rule

    rule = output_rule(job_id, owner)
    return (f"<p class='hint' id='output-withheld'>Not shown: {shown(rule)} (operators: Airflow users who may edit "
            "Airflow's configuration: the Op and Admin roles under the simple auth manager).</p>")


def _log_html(tail: Any, job_id: str) -> str:
    """The last lines of stdout and stderr (escaped: a job writes what it likes), or why they are not shown."""
    where = f" of run {esc(tail.run_id)} on {esc(tail.host)}" if tail.run_id else ""
    if tail.problem and tail.run_id is None:
        return f"<p class='hint' id='log-problem'>No output yet: {esc(tail.problem)}.</p>"
    if tail.problem:
        return f"<p class='hint bad' id='log-problem'>Logs{where} not shown: {esc(tail.problem)}</p>"
    blocks = []
    for stream, text in (("stdout", tail.stdout), ("stderr", tail.stderr)):
        block = (f"<pre class='log' id='{stream}'>{esc(text)}</pre>" if text
                 else f"<p class='muted' id='{stream}'>{stream} is empty</p>")
        blocks.append(f"<h3>Last lines of {stream}{where}</h3>{block}")
    return "".join(blocks) + (f"<p class='muted'>All of it: <code>lucid logs {esc(job_id)}</code> "
                              f"(<code>lucid logs {esc(job_id)} --stderr</code>).</p>")


def _state_history(events: list[Any]) -> str:
    """The job's events, oldest first: each state change and decision with its reason."""
    rows = [[esc(_utc(e.time)), esc(e.kind), esc(e.message)] for e in events]
    return table(["time", "what happened", "reason"], rows, "state-history")


def _runs_table(runs: list[dict[str, Any]]) -> str:
    """The job's runs (profiling and main, one per host), oldest first."""
    rows = [[esc(r["run_id"]), esc(r["kind"]), esc(r["host"]), esc(",".join(str(i) for i in r["gpus"] or [])),
             esc(r["state"]), esc("" if r["exit_code"] is None else str(r["exit_code"])),
             esc(r["stopping"] or r["outcome"] or "")
             + (f"<br><span class='hint bad'>{esc(r['host_down'])}</span>" if r.get("host_down") else "")]
            for r in runs]
    return table(["run", "kind", "host", "GPUs", "state", "exit code", "outcome"], rows, "runs")


def _training_hint(root: Path, ident: str) -> str:
    """What the last Update Engine run found against what training needs ("" before its first run)."""
    try:
        from lucid_core.update import training_status

        said = training_status(root / "update")
    except Exception as exc:  # a hint failing must not take the page down
        said = f"the Update Engine's last batch could not be read ({type(exc).__name__}: {exc})"
    return f"<p class='hint' id='{ident}'>{esc(said[:1].upper() + said[1:])}.</p>" if said else ""


def _running_for(started_at: Any, now: float, stopping: bool = False) -> str:
    """How long a run has run; "starting" before it has ("no start reported" for a launch that went unanswered
    and is being stopped), unreadable for text a hand edit left."""
    if started_at is None:
        return "no start reported" if stopping else "starting"
    start = saved_float(started_at)
    return hours(max(0.0, now - start)) if start is not None else f"<span class='muted'>{UNREADABLE}</span>"


def _shared_speed_cell(shared: Any, now: float) -> str:
    """The running page's "speed while shared" cell: the measured speed, its age and sample count."""
    if shared is None:
        return ""
    if shared.speed is None:
        return "<span class='muted'>not measured yet</span>"
    age = hours(max(0.0, now - (shared.measured_at or 0.0)))
    tag = ", emulated" if shared.emulated else ""
    return f"{shared.speed:.2f} <span class='muted'>({age} ago, {shared.samples} samples{tag})</span>"


def _speed_suffix(shared: Any) -> str:
    """A GPU map cell's note of a sharing job's measured speed ("" when alone or not measured)."""
    return "" if shared is None or shared.speed is None else f" <span class='muted'>@ {shared.speed:.2f}</span>"


def _day_start(text: str) -> float | None:
    """A form's date (YYYY-MM-DD, or a date-time) as epoch seconds, UTC; None when empty."""
    from datetime import UTC, datetime

    text = text.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _applied_words(directory: Path) -> str:
    """Whether a tuner run's proposal changed the live config, as its apply step recorded ('' before that step,
    or for a run from before it recorded one)."""
    from lucid_airflow.tuning import APPLIED_FILE

    data = _report_json(directory / APPLIED_FILE)
    if not data:
        return ""
    stamp = saved_float(data.get("time"))
    when = f" on {_utc(stamp)}" if stamp is not None else ""
    if data.get("applied") is True:
        return f"Applied{when}: the live config file {data.get('path')} now holds this proposal."
    return f"Not applied: {data.get('why') or 'nothing was changed'}."


def _report_json(path: Path) -> dict:
    """A report file a task wrote, or {} where it is missing or cut short (a task killed while writing it): one
    bad file is shown as unreadable, never a 500 for the page that lists them all."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return {}
    return data if isinstance(data, dict) else {}


def _inside(root: Path, relative: str, missing: str = "no such file") -> Path:
    """The file `root/relative`; a 404 (`missing`) when it escapes `root`, is no file, or is a name the OS
    refuses (a NUL, a name or path too long): an odd URL is a page not found, not a server error."""
    try:
        target = (root / relative).resolve()
        found = target.is_relative_to(root.resolve()) and target.is_file()
    except (OSError, ValueError):
        found = False
    if not found:
        raise HTTPException(404, missing)
    return target


def _last_page(total: int) -> int:
    """The number of the last history page for `total` jobs (1 when there are none)."""
    return max(1, -(-total // HISTORY_PAGE_SIZE))


def _history_page(session: Session, query: HistoryQuery, number: int) -> tuple[HistoryPage, int, str]:
    """Page `number` of the jobs `query` matches, the page's number and a note: past the end, the last page and
    a note saying so (a stale or hand-typed link shows jobs, not "page 999 of 2" beside none)."""
    from dataclasses import replace

    from lucid_core.runtime.surfaces.queries import MAX_HISTORY_ROWS, history

    wanted = min(number, MAX_HISTORY_ROWS // HISTORY_PAGE_SIZE + 1)  # a huge page overflows the store's integers
    found = history(session, replace(query, offset=(wanted - 1) * HISTORY_PAGE_SIZE))
    last = _last_page(found.total)
    if number <= last:
        return found, number, ""
    note = f"There is no page {number}; showing the last page, {last}."
    return history(session, replace(query, offset=(last - 1) * HISTORY_PAGE_SIZE)), last, note


def _explanation(url: str, job_id: str) -> str:
    """The runtime's explanation of a job (the same models the round uses), as lines a person reads."""
    try:
        from lucid_core.config import load_live_config
        from lucid_core.runtime.store.store import Store
        from lucid_core.runtime.surfaces.explain import explain

        store = Store(url, migrate=False)
        try:
            data = explain(store, job_id, load_live_config(), store.now())
        finally:
            store.dispose()
    except Exception as exc:  # an explanation failing must not take the page down
        return f"Explanation unavailable: {type(exc).__name__}: {exc}"
    return explanation_text(data)


def explanation_text(data: dict[str, Any]) -> str:
    """Priority, its duration terms, packing class and tree path, partner and pending reason."""
    lines = []
    from lucid_core.runtime.round.prediction_words import explain_terms
    from lucid_core.units import duration_words

    priority = data.get("priority") or {}
    if priority.get("value_gpu_s") is not None:
        lines.append(f"Priority {priority['value_gpu_s'] / 3600:.2f} GPU-h = {priority['gpus']} GPU(s) x predicted "
                     f"{duration_words(priority['predicted_duration_s'])} ({priority.get('formula', '')})")
    else:
        lines.append("No duration predicted yet (not profiled or not yet considered by a round).")
    recorded = priority.get("recorded")
    if recorded:
        lines.append(f"Used when the round placed it ({_utc(recorded['time'])}): {recorded['note']}")
    now_says = explain_terms(priority.get("duration") or {})
    if now_says and not (recorded and len(now_says) == 1 and now_says[0] in recorded["note"]):
        lines.append("The duration model now says (it has seen more jobs since):" if recorded
                     else "The duration model says:")
        lines += [f"  {line}" for line in now_says]
    profile = data.get("profile")
    if profile:
        lines.append(f"Profile: GPU util {profile['gpu_util']:.1f}%, memory util {profile['mem_util']:.1f}%, "
                     f"{profile['gpu_mem_mb']:.0f} MB" + (" (emulated)" if profile.get("emulated") else ""))
    packing = data.get("packing") or {}
    if packing.get("class"):
        lines.append(f"Packing class: {packing['class']}")
        lines += [f"  {step}" for step in packing.get("path") or []]
    partner = data.get("partner")
    if partner:
        lines.append(f"Shares GPUs with {partner['job_id']}: {partner.get('why') or ''}")
    if data.get("shared"):
        from lucid_core.runtime.surfaces.explain import shared_speed_line

        lines.append(shared_speed_line(data["shared"]) or "")
    pending = data.get("pending")
    if pending:
        lines.append(f"Waiting (position {pending.get('position')}): {pending.get('reason')}")
    return "\n".join(lines)


class StoreUnreadable(RuntimeError):
    """The runtime API could not be built: its store cannot be read (the words say where and why)."""


def _runtime_api(url: str):
    """The runtime's JSON API on the store at `url`, never migrating it (the round owns the schema: a GET must not
    run DDL, and an API server upgraded first must not migrate the store under older rounds); StoreUnreadable when
    opening it finds the store unreadable (a request that finds it so is answered a JSON 503 by the API itself)."""
    from sqlalchemy.exc import DBAPIError

    from lucid_core.config import load_live_config
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.store.unreadable import unreadable_words
    from lucid_core.runtime.surfaces.api import create_app

    try:
        return create_app(url, config=load_live_config(), store=Store(url, migrate=False),
                          executor=lambda: host_executor(HOST_READ_DEADLINE_S))
    except DBAPIError as exc:
        words = unreadable_words(url, exc)
        if words is None:
            raise
        raise StoreUnreadable(words) from exc


class _LazyApp:
    """An ASGI app built on first use (the store URL is only known once Airflow is configured)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.app: Any = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return
        if self.app is None:
            from lucid_airflow.connections import ConnectionProblem

            try:
                self.app = self.factory()
            except (ImportError, ConnectionProblem, StoreUnreadable) as exc:  # built again at the next request
                from starlette.responses import JSONResponse

                detail = str(exc) if isinstance(exc, StoreUnreadable) else f"runtime API unavailable: {exc}"
                await JSONResponse({"detail": detail}, status_code=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)

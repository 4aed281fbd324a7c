"""The Lucid web views mounted in Airflow at /lucid: queue, GPU map, job detail, models, tuner, drift.

Pages are plain server-rendered HTML (no JavaScript, inline CSS) read from the Lucid store and the
report directory; the runtime's JSON API is mounted under /lucid/api. The auth middleware refuses
every request Airflow does not authenticate, the mounted API included.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, HTMLResponse

from lucid_airflow.auth import airflow_auth_middleware

esc = html.escape

_STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fff}
nav a{margin-right:14px}
table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{border:1px solid #bbb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#e8eef6}
.gpu{display:inline-block;width:150px;min-height:44px;margin:3px;padding:4px;border:1px solid #888;
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
"""

NAV = [("queue", "Queue"), ("running", "Running & GPU map"), ("jobs", "Job history"), ("models", "Models"),
       ("tuner", "Tuner reports"), ("drift", "Drift history")]
HISTORY_PAGE_SIZE = 50


def page(title: str, body: str, prefix: str) -> HTMLResponse:
    links = "".join(f'<a href="{prefix}/{path}">{esc(label)}</a>' for path, label in NAV)
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>Lucid: {esc(title)}</title>"
                        f"<style>{_STYLE}</style></head><body><nav>{links}</nav><h1>{esc(title)}</h1>{body}"
                        f"</body></html>")


def table(header: list[str], rows: list[list[str]], table_id: str = "") -> str:
    """An HTML table; cells are already-escaped HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hours(seconds: float | None) -> str:
    if seconds is None:
        return "<span class='muted'>n/a</span>"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def create_lucid_app(store_url: Callable[[], str], reports_root: Callable[[], Path], prefix: str = "/lucid",
                     protect: bool = True) -> FastAPI:
    """The plugin's FastAPI app; `store_url` and `reports_root` are resolved lazily, at the first request."""
    app = FastAPI(title="Lucid", description="Lucid GPU scheduler views and API (behind Airflow auth)")
    if protect:
        app.middleware("http")(airflow_auth_middleware)

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
    def queue() -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import waiting

        jobs = waiting(store())
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
        body = (f"<p>{len(rows)} waiting job(s). Lower priority value runs first (GPUs x predicted duration).</p>"
                + table(["order", "job", "name", "user", "VC", "GPUs", "state", "predicted duration",
                         "priority (GPU-s)", "reason"], rows, "queue"))
        return page("Queue", body, prefix)

    @app.get("/running", response_class=HTMLResponse)
    def running() -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import gpu_map

        found = gpu_map(store())
        runs, shared, hosts, gpus, names = found.runs, found.shared, found.hosts, found.gpus, found.names
        on_gpu: dict[tuple[str, int], list[Any]] = {}
        for r in runs:
            for index in r.gpu_indices or []:
                on_gpu.setdefault((r.host, int(index)), []).append(r)
        rows = [[f'<a href="{prefix}/jobs/{esc(r.job_id)}">{esc(r.job_id)}</a>',
                 esc(names.get(r.job_id, "")), esc(r.kind), esc(r.host),
                 esc(",".join(str(i) for i in r.gpu_indices or [])), esc(r.partner or ""),
                 _shared_speed_cell(shared.get(r.job_id) if r.kind == "main" else None), esc(r.state),
                 hours(time.time() - r.started_at) if r.started_at else "starting"] for r in runs]
        cards = []
        for host in hosts:
            cells = []
            for g in (g for g in gpus if g.host == host.name):
                here = on_gpu.get((host.name, g.index), [])
                cls = "gpu shared" if len(here) > 1 else "gpu busy" if here else "gpu"
                who = "<br>".join(esc(r.job_id) + _speed_suffix(shared.get(r.job_id) if r.kind == "main" else None)
                                  for r in here) or "<span class='muted'>idle</span>"
                cells.append(f"<div class='{cls}'><b>GPU {g.index}</b><br>{who}</div>")
            flag = " (draining)" if host.draining else "" if host.reachable else " (unreachable)"
            cards.append(f"<h3>{esc(host.name)} <span class='muted'>{esc(host.pool)} pool, VC {esc(host.vc)}"
                         f"{flag}</span></h3><div id='gpumap-{esc(host.name)}'>{''.join(cells)}</div>")
        body = (table(["job", "name", "run", "host", "GPUs", "shares with", "speed while shared", "state",
                       "running for"], rows, "running")
                + "<p>Speed while shared: the job's speed beside its partner relative to running alone, as its "
                  "telemetry last measured it.</p>"
                + "<h2>GPU map</h2><p>Green: one job; amber: two jobs sharing the GPU (with the speed measured "
                  "there).</p>" + "".join(cards))
        return page("Running jobs and GPU map", body, prefix)

    @app.get("/jobs", response_class=HTMLResponse)
    def job_history(user: str = "", vc: str = "", state: str = "", since: str = "", until: str = "",
                    number: int = Query(1, alias="page")) -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import HistoryQuery, history

        number = max(1, number)
        try:
            query = HistoryQuery(user=user.strip() or None, vc=vc.strip() or None,
                                 states=tuple(x for x in state.split(",") if x), since=_day_start(since),
                                 until=_day_start(until), limit=HISTORY_PAGE_SIZE,
                                 offset=(number - 1) * HISTORY_PAGE_SIZE)
        except ValueError as exc:
            refused = page("Job history", f"<p class='hint'>{esc(str(exc))}</p>", prefix)
            refused.status_code = 422
            return refused
        with store().session() as s:
            found = history(s, query)
        rows = [[f'<a href="{prefix}/jobs/{esc(r["job_id"])}">{esc(r["job_id"])}</a>', esc(r["name"]),
                 esc(r["user"]), esc(r["vc"]), str(r["gpus"]), esc(r["state"]),
                 esc(_field_text("end_time", r["end_time"])), hours(r["queued_s"]), hours(r["elapsed_s"]),
                 esc("" if r["exit_code"] is None else str(r["exit_code"])), esc(r["end_reason"] or "")]
                for r in found.rows]
        filters = {"user": user, "vc": vc, "state": state, "since": since, "until": until}
        states = "".join(f"<option value='{v}'{' selected' if v == state else ''}>{label}</option>"
                         for v, label in (("", "any end"), ("COMPLETED", "completed"), ("FAILED", "failed"),
                                          ("CANCELLED", "cancelled")))
        form = (f"<form class='filters' method='get' action='{prefix}/jobs'>"
                f"<label>user <input name='user' value='{esc(user)}'></label>"
                f"<label>VC <input name='vc' value='{esc(vc)}'></label>"
                f"<label>state <select name='state'>{states}</select></label>"
                f"<label>ended from <input name='since' type='date' value='{esc(since)}'></label>"
                f"<label>before <input name='until' type='date' value='{esc(until)}'></label>"
                f"<button type='submit'>Filter</button> <a href='{prefix}/jobs'>clear</a></form>")
        last = max(1, -(-found.total // HISTORY_PAGE_SIZE))

        def link(to: int, label: str) -> str:
            from urllib.parse import urlencode

            target = urlencode({**{k: v for k, v in filters.items() if v}, "page": to})
            return f"<a href='{prefix}/jobs?{esc(target)}'>{label}</a>"

        pager = (f"<p class='pager'>{link(number - 1, '&larr; newer') if number > 1 else ''}"
                 f"<span>page {number} of {last} ({found.total} job(s))</span>"
                 f"{link(number + 1, 'older &rarr;') if number < last else ''}</p>")
        empty = ("" if rows else "<p class='hint'>No finished job matches. Jobs appear here once they complete, "
                 "fail or are cancelled; waiting and running ones are on the Queue and Running pages.</p>")
        body = (form + pager + table(["job", "name", "user", "VC", "GPUs", "state", "ended", "queued", "ran",
                                      "exit code", "end reason"], rows, "history") + empty
                + "<p class='muted'>The same list on the command line: <code>lucid history</code> "
                  "(<code>--user</code>, <code>--state</code>, <code>--since</code>, <code>--format</code>).</p>")
        return page("Job history", body, prefix)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_detail(job_id: str) -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import job_record
        from lucid_core.runtime.surfaces.submission import UnknownJob

        try:
            record = job_record(store(), job_id)
        except UnknownJob:
            raise HTTPException(404, f"no job {job_id}") from None
        job, events, decisions = record.job, record.events, record.decisions
        fields = ["job_id", "name", "user", "vc", "gpus", "state", "submit_time", "start_time", "end_time",
                  "exit_code", "end_reason", "ended_in_profiling", "gpu_util", "mem_util", "gpu_mem_mb",
                  "share_class", "predicted_duration", "pending_reason"]
        from lucid_core.runtime.round.pending import pending_text

        values = {f: getattr(job, f) for f in fields}
        values["pending_reason"] = pending_text(job)
        facts = table(["field", "value"], [[esc(f), esc(_field_text(f, values[f]))] for f in fields], "job")
        explanation = _explanation(store_url(), job_id)
        ev = table(["time", "kind", "message"], [[esc(time.strftime("%H:%M:%S", time.localtime(e.time))),
                                                  esc(e.kind), esc(e.message)] for e in events], "events")
        dec = table(["round", "decision", "reason", "status"], [[str(d.round_id), esc(d.kind), esc(d.reason),
                                                                 esc(d.status)] for d in decisions], "decisions")
        body = (f"{facts}<h2>Why it is where it is</h2><pre id='explanation'>{esc(explanation)}</pre>"
                f"<h2>Decisions</h2>{dec}<h2>Events</h2>{ev}")
        return page(f"Job {job_id}", body, prefix)

    @app.get("/models", response_class=HTMLResponse)
    def models() -> HTMLResponse:
        from lucid_core.runtime.surfaces.queries import model_versions

        versions = model_versions(store())
        rows = [[esc(v.kind), esc(v.version), "yes" if v.active else "", esc(json.dumps(v.metrics)[:300]),
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
                "or train by hand with <code>lucid models train-duration</code> and <code>train-packing</code>.</p>")
        body = (hint + table(["model", "version", "promoted", "metrics", "note"], rows, "models")
                + "<h2>Shape functions and trees</h2>" + (imgs + trees or "<p class='muted'>none yet</p>"))
        return page("Models", body, prefix)

    @app.get("/tuner", response_class=HTMLResponse)
    def tuner_list() -> HTMLResponse:
        root = reports_root() / "tuner"
        reports = sorted(root.glob("*/report.json"), key=lambda p: p.stat().st_mtime, reverse=True) \
            if root.is_dir() else []
        rows = []
        for path in reports:
            summary = json.loads(path.read_text(encoding="utf-8"))
            best = summary.get("best") or {}
            rows.append([f'<a href="{prefix}/tuner/{esc(path.parent.name)}">{esc(path.parent.name)}</a>',
                         esc(summary["objective"]), str(summary["configurations"]), str(summary["failed"]),
                         esc(json.dumps(best.get("overrides", {}))), esc(", ".join(summary.get("workers", [])))])
        return page("System Tuner reports", table(["run", "objective", "configurations", "failed", "best",
                                                   "workers"], rows, "tuner-reports"), prefix)

    @app.get("/tuner/{name}", response_class=HTMLResponse)
    def tuner_report(name: str) -> HTMLResponse:
        directory = _inside(reports_root() / "tuner", name)
        report = directory / "report.html"
        if not report.is_file():
            raise HTTPException(404, f"no tuner report {name}")
        summary = json.loads((directory / "report.json").read_text(encoding="utf-8"))
        imgs = "".join(f"<img src='{prefix}/files/tuner/{esc(name)}/{esc(p)}' alt='{esc(p)}'>"
                       for p in summary.get("plots", []))
        return page(f"Tuner report {name}", report.read_text(encoding="utf-8") + imgs, prefix)

    @app.get("/drift", response_class=HTMLResponse)
    def drift() -> HTMLResponse:
        root = reports_root() / "drift"
        rows = []
        for path in sorted(root.glob("*.json"), reverse=True) if root.is_dir() else []:
            data = json.loads(path.read_text(encoding="utf-8"))
            for report in data.get("reports", []):
                shifts = ", ".join(f"{s['feature']} {s['psi']:.3f}" for s in report.get("shifts", []))
                rows.append([esc(data.get("run_id", path.stem)), esc(report["model"]),
                             f"{report['reference_mae']:.4g}", f"{report['recent_mae']:.4g}",
                             f"{report['mae_ratio']:.3f}", esc(shifts), "ALERT" if report["drifted"] else "ok",
                             esc(data.get("alert_sent_to", ""))])
        hint = ("" if rows else "<p class='hint' id='drift-hint'>No drift check yet. Each run of the "
                "<code>lucid_update_engine</code> DAG that has a promoted model compares its error on recent jobs "
                "with its error when trained and writes a row here (and mails an alert when it drifted). The first "
                "run trains the models, so rows start with the second run that has enough finished jobs.</p>")
        return page("Drift history", hint + table(["run", "model", "reference MAE", "recent MAE", "ratio", "PSI",
                                                   "state", "alert sent to"], rows, "drift"), prefix)

    @app.get("/files/{area}/{path:path}")
    def files(area: str, path: str) -> FileResponse:
        if area not in {"tuner", "models"}:
            raise HTTPException(404, "unknown area")
        target = _inside(reports_root() / area, path)
        if not target.is_file() or target.suffix not in {".png", ".csv", ".json", ".md", ".txt"}:
            raise HTTPException(404, "no such file")
        return FileResponse(target)

    app.mount("/api", _LazyApp(lambda: _runtime_api(store_url())))
    return app


def _shared_speed_cell(shared: Any) -> str:
    """The running page's "speed while shared" cell: the measured speed, its age and sample count."""
    if shared is None:
        return ""
    if shared.speed is None:
        return "<span class='muted'>not measured yet</span>"
    age = hours(max(0.0, time.time() - (shared.measured_at or 0.0)))
    tag = ", emulated" if shared.emulated else ""
    return f"{shared.speed:.2f} <span class='muted'>({age} ago, {shared.samples} samples{tag})</span>"


def _speed_suffix(shared: Any) -> str:
    """A GPU map cell's note of a sharing job's measured speed ("" when alone or not measured)."""
    return "" if shared is None or shared.speed is None else f" <span class='muted'>@ {shared.speed:.2f}</span>"


def _field_text(name: str, value: Any) -> str:
    """Times as UTC date-times, durations and measurements rounded, the rest as is."""
    if value is None:
        return ""
    if name.endswith("_time") and isinstance(value, int | float):
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
    if name == "predicted_duration" and isinstance(value, int | float):
        return f"{value:.0f} s"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


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


def _inside(root: Path, relative: str) -> Path:
    """`root/relative`, refusing paths that escape `root`."""
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise HTTPException(404, "no such file")
    return target


def _explanation(url: str, job_id: str) -> str:
    """The runtime's explanation of a job (the same models the round uses), as lines a person reads."""
    try:
        from lucid_core.config import load_live_config
        from lucid_core.runtime.store.store import Store
        from lucid_core.runtime.surfaces.explain import explain

        store = Store(url, migrate=False)
        try:
            data = explain(store, job_id, load_live_config(), time.time())
        finally:
            store.dispose()
    except Exception as exc:  # an explanation failing must not take the page down
        return f"Explanation unavailable: {type(exc).__name__}: {exc}"
    return explanation_text(data)


def explanation_text(data: dict[str, Any]) -> str:
    """Priority, its duration terms, packing class and tree path, partner and pending reason."""
    lines = []
    from lucid_core.runtime.round.prediction_words import duration_words, explain_terms

    priority = data.get("priority") or {}
    if priority.get("value_gpu_s") is not None:
        lines.append(f"Priority {priority['value_gpu_s'] / 3600:.2f} GPU-h = {priority['gpus']} GPU(s) x predicted "
                     f"{duration_words(priority['predicted_duration_s'])} ({priority.get('formula', '')})")
    else:
        lines.append("No duration predicted yet (not profiled or not yet considered by a round).")
    recorded = priority.get("recorded")
    if recorded:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(recorded["time"]))
        lines.append(f"Used when the round placed it ({at}): {recorded['note']}")
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


def _runtime_api(url: str):
    from lucid_core.config import load_live_config
    from lucid_core.runtime.surfaces.api import create_app

    return create_app(url, config=load_live_config())


class _LazyApp:
    """An ASGI app built on first use (the store URL is only known once Airflow is configured)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.app: Any = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return
        if self.app is None:
            try:
                self.app = self.factory()
            except ImportError as exc:
                from starlette.responses import JSONResponse

                await JSONResponse({"detail": f"runtime API unavailable: {exc}"}, status_code=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)

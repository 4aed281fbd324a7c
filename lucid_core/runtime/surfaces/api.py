"""HTTP API of the live scheduler (FastAPI). The Airflow plugin mounts it and supplies `auth`.

create_app(store_url, auth=...) takes any FastAPI dependency as `auth`; it guards every route.
When the auth layer names the caller (`request.state.lucid_user`), jobs are submitted as that
user and only that user's jobs may be cancelled or have their output (logs) read, unless
`request.state.lucid_operator` is true. A store that cannot be read (its server down, a wrong database, no tables
yet) is a JSON 503 saying so, not a bare 500.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError

from lucid_core.config import LucidConfig, load_live_config
from lucid_core.runtime.hosts.executor import HostExecutor
from lucid_core.runtime.hosts.inventory import list_hosts
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.store.unreadable import unreadable_words
from lucid_core.runtime.surfaces import prometheus, queries
from lucid_core.runtime.surfaces.eta import estimate
from lucid_core.runtime.surfaces.explain import explain
from lucid_core.runtime.surfaces.output_access import may_read_output, output_rule
from lucid_core.runtime.surfaces.submission import (
    JobRequest,
    SubmissionError,
    UnknownJob,
    keyed_job,
    only_vc,
    request_cancel,
    submit,
)


class SubmitBody(BaseModel):
    """A job submission; an unknown key (a misspelt "preemptable") is refused naming it, not dropped.

    Strict types: a JSON body says what it means, so `"gpus": 1.0`, `"gpus": "1"` or `"gpus": true` is a 422
    naming `gpus` (and `"amp": "yes"` one naming `amp`), not silently read as 1 or true. Any model nested here
    must forbid unknown keys too (tests/reliability/test_web_odd_input.py checks every one). The CLI and the
    Airflow operator build a JobRequest themselves and do not pass through this model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    command: str | list[str] = Field(description="shell command line, or an argv list")
    gpus: int
    user: str = Field("", description="defaults to the authenticated caller")
    vc: str = Field("", description="defaults to the only VC when the cluster has one")
    name: str = ""
    amp: bool = False
    long_cold_start: bool = False
    preemptible: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    workload: str | None = None
    time_limit_s: float | None = Field(None, description="the longest it may run, all its runs together, in "
                                       "seconds; past it the job is stopped and fails")


MAX_LOG_LINES = 2000  # the most lines /jobs/{id}/logs answers (the whole log: `lucid logs JOB --all`)
LOG_READ_BYTES = 1 << 20  # the tail of each log it reads from the host


@contextmanager
def _ssh_reads() -> Iterator[HostExecutor]:
    """An executor for one request's host reads (LUCID_KNOWN_HOSTS's keys), closed after it."""
    from lucid_core.runtime.hosts.ssh_executor import ssh_executor

    reads = ssh_executor(timeout_s=10.0, connect_timeout_s=5.0)
    try:
        yield reads
    finally:
        reads.close()


def warning_header(text: str) -> str:
    """`text` as an HTTP Warning header value (RFC 7234's form, deprecated by RFC 9111 but what the Kubernetes API
    server still sends: code 299, agent, quoted text), printable ASCII only: no control character reaches it."""
    printable = "".join(c if " " <= c < "\x7f" else "?" if c > "\x7f" else " " for c in text)
    quoted = " ".join(printable.split()).replace("\\", "\\\\").replace('"', '\\"')
    return f'299 lucid "{quoted}"'


def create_app(store_url: str | None = None, *, config: LucidConfig | None = None,
               auth: Callable[..., Any] | None = None, store: Store | None = None,
               clock: Callable[[], float] | None = None,
               executor: Callable[[], AbstractContextManager[HostExecutor]] | None = None) -> FastAPI:
    """The app; `auth` (a FastAPI dependency) runs before every endpoint when given. Times are the
    database's (`Store.now`) unless a test gives a `clock`. Without a store URL or config it finds them as the
    CLI does (LUCID_STORE_URL, else SQLite in LUCID_HOME; LUCID_CONFIG, else LUCID_HOME/lucid.toml), so
    `uvicorn --factory lucid_core.runtime.api:create_app` serves the CLI's store."""
    from lucid_core.runtime.store.location import default_store_url

    store = store or Store(store_url or default_store_url())
    clock = clock or store.now
    config = config if config is not None else load_live_config()
    executor = executor or _ssh_reads
    # no CDN-hosted Swagger UI: the reference page below is rendered here and works offline
    app = FastAPI(title="Lucid scheduler", version="1", docs_url=None, redoc_url=None)

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        from lucid_core.runtime.surfaces.api_docs import api_reference_html

        return HTMLResponse(api_reference_html(app.openapi(), request.scope.get("root_path", "")))

    @app.exception_handler(DBAPIError)
    async def store_unreadable(request: Request, exc: DBAPIError) -> JSONResponse:
        """A store that cannot be read (unreachable, a wrong database, never set up) as a JSON 503 saying why; any
        other database error stays a server error."""
        words = unreadable_words(store.url, exc)
        if words is None:
            raise exc
        return JSONResponse(status_code=503, content={"detail": words})
    router = APIRouter(dependencies=[Depends(auth)] if auth is not None else [])

    def known(job_id: str) -> None:
        try:
            queries.status(store, job_id)
        except UnknownJob as exc:
            raise HTTPException(status_code=404, detail=f"no job {job_id!r}") from exc

    def warn_if_stalled(response: Response) -> None:
        """A `Warning` header (code 299, as the Kubernetes API server warns) when rounds have stalled and jobs wait
        or run: what the answer shows may be out of date, and nothing starts until rounds resume."""
        from lucid_core.runtime.surfaces.round_age import stalled_note

        note = stalled_note(store)
        if note is not None:
            response.headers["Warning"] = warning_header(note)

    def caller(request: Request) -> tuple[str | None, bool]:
        """(authenticated user name or None when the app runs without identity, may act for others)."""
        return getattr(request.state, "lucid_user", None), bool(getattr(request.state, "lucid_operator", False))

    def output_readable(job_id: str, request: Request) -> None:
        """403 naming the rule unless the caller may read the job's output (`may_read_output`)."""
        user, operator = caller(request)
        owner = queries.status(store, job_id)["user"]
        if not may_read_output(owner, user, operator):
            raise HTTPException(status_code=403, detail=output_rule(job_id, owner))

    @router.post("/jobs", status_code=201)
    def submit_job(body: SubmitBody, request: Request,
                   idempotency_key: str | None = Header(default=None, alias="Idempotency-Key")) -> Any:
        """Record a job. Send an `Idempotency-Key` header to make retries safe: the same key (same
        user) returns the job the first request made."""
        fields = {**body.model_dump(), "idempotency_key": idempotency_key}
        user, operator = caller(request)
        if user is not None and not operator:
            if fields["user"] and fields["user"] != user:
                raise HTTPException(status_code=403, detail=f"you may submit only as yourself ({user!r})")
            fields["user"] = user
        elif user is not None and not fields["user"]:
            fields["user"] = user
        if not fields["vc"]:
            try:  # a retry finds its job before the VC is chosen again
                existing = keyed_job(store, JobRequest(**fields))
            except SubmissionError as exc:
                return JSONResponse(status_code=422, content={"detail": "invalid submission", "errors": exc.errors})
            if existing is not None:
                return {"job_id": existing}
            try:
                fields["vc"] = only_vc(store)
            except ValueError as exc:
                return JSONResponse(status_code=422, content={"detail": "invalid submission",
                                                              "errors": {"vc": str(exc)}})
        try:
            job_id = submit(store, JobRequest(**fields), now=clock())
        except SubmissionError as exc:
            return JSONResponse(status_code=422, content={"detail": "invalid submission", "errors": exc.errors})
        return {"job_id": job_id}

    @router.post("/jobs/{job_id}/cancel")
    def cancel_job(job_id: str, request: Request) -> Any:
        user, operator = caller(request)
        if user is not None and not operator:
            known(job_id)
            owner = queries.status(store, job_id)["user"]
            if owner != user:
                raise HTTPException(status_code=403, detail=f"job {job_id} belongs to {owner!r}, not to you")
        try:
            answer = request_cancel(store, job_id, now=clock(),
                                    message=f"cancel requested by {user} (API)" if user else "cancel requested (API)")
        except UnknownJob as exc:
            raise HTTPException(status_code=404, detail=f"no job {job_id!r}") from exc
        # `cancel_requested`: a cancel waits for the next round (false for a job that had ended)
        return {"job_id": job_id, "state": answer.state, "outcome": answer.outcome,
                "cancel_requested": answer.pending}

    @router.get("/queue")
    def get_queue(response: Response, user: str | None = None, vc: str | None = None,
                  state: str | None = None) -> Any:
        """Waiting and running jobs in the policy's order (`user`, `vc`, `state`: comma-separated filters); a
        `Warning` header says when rounds have stalled."""
        try:
            query = queries.QueueQuery.of_text(users=user, vcs=vc, states=state)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        jobs = queries.queue(store, query)
        warn_if_stalled(response)
        return jobs

    @router.get("/history")
    def get_history(user: str | None = None, vc: str | None = None, state: str | None = None,
                    since: str | None = None, until: str | None = None, limit: int = 50,
                    offset: int = 0) -> Any:
        """Finished, failed and cancelled jobs, latest end first. `state`: comma-separated, as `lucid history
        -s` takes them (CD, F, CA too); `since`/`until`: epoch seconds, a date, a date-time or an age (3d)."""
        from lucid_core.runtime.surfaces.history_table import STATE_ALIASES, parse_since

        def moment(text: str | None) -> float | None:
            if text is None or not text.strip():
                return None
            try:
                return float(text)
            except ValueError:
                return parse_since(text, clock())

        try:
            states = tuple(STATE_ALIASES.get(x.strip().upper(), x.strip().upper())
                           for x in (state or "").split(",") if x.strip())
            query = queries.HistoryQuery(user=user, vc=vc, states=states, since=moment(since), until=moment(until),
                                         limit=min(limit, 500), offset=offset)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        with store.session() as session:
            page = queries.history(session, query)
        return {"total": page.total, "offset": offset, "jobs": page.rows}

    @router.get("/jobs/{job_id}")
    def get_job(job_id: str, response: Response) -> Any:
        """The job's status; for a job not yet ended, a `Warning` header says when rounds have stalled (its state
        may be out of date)."""
        from lucid_core.runtime.surfaces.job_views import ACTIVE_STATES

        try:
            found = queries.status(store, job_id)
        except UnknownJob as exc:
            raise HTTPException(status_code=404, detail=f"no job {job_id!r}") from exc
        if found.get("state") in ACTIVE_STATES:
            warn_if_stalled(response)
        return found

    @router.get("/jobs/{job_id}/explain")
    def get_explain(job_id: str) -> Any:
        known(job_id)
        try:
            return explain(store, job_id, config, clock())
        except ValueError as exc:  # its stored row cannot be read (a hand edit): said, as `lucid explain` says it
            raise HTTPException(status_code=422, detail=f"job {job_id!r}: {exc}") from exc

    @router.get("/jobs/{job_id}/eta")
    def get_eta(job_id: str) -> Any:
        known(job_id)
        try:
            return asdict(estimate(store, job_id, config, clock()))
        except ValueError as exc:  # the store's view cannot be built (a hand edit): said, as `lucid eta` says it
            raise HTTPException(status_code=422, detail=f"job {job_id!r}: {exc}") from exc

    @router.get("/jobs/{job_id}/logs")
    def get_logs(job_id: str, request: Request, lines: int = Query(100, ge=1, le=MAX_LOG_LINES)) -> Any:
        """The last `lines` of the stdout and stderr of the job's latest run, as a terminal shows them (a
        progress bar's last state), read from its host; `problem` says why they could not be read. Only the job's
        user and operators may read them (a 403 for anyone else) when the auth layer names the caller."""
        from lucid_core.runtime.surfaces.host_reads import log_tail

        known(job_id)
        output_readable(job_id, request)
        with executor() as reads:
            return asdict(log_tail(store, reads, job_id, lines=lines, read_bytes=LOG_READ_BYTES))

    @router.get("/hosts")
    def get_hosts() -> Any:
        return list_hosts(store)

    @router.get("/metrics")
    def get_metrics() -> Response:
        """Prometheus text exposition (see `lucid_core.runtime.surfaces.prometheus`)."""
        return Response(prometheus.render(store, clock()), media_type=prometheus.CONTENT_TYPE_LATEST)

    app.include_router(router)
    return app

"""Airflow authentication for the Lucid app: every request needs a valid Airflow JWT.

The token comes as `Authorization: Bearer ...` (API clients) or the UI's `_token` cookie (a browser
logged in to Airflow). A browser opening a page without a (valid) session is sent to Airflow's
login and back; API clients get 401 as before. Reading pages needs the auth manager's permission on the `Lucid` custom
view; changing anything (POST, PUT, DELETE) also needs edit rights on the scheduling-round DAG.
Plugin FastAPI apps are not protected by Airflow by themselves, hence this middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

READ_METHODS = {"GET", "HEAD", "OPTIONS"}
ROUND_DAG_ID = "lucid_scheduling_round"
COOKIE_NAME = "_token"


def request_token(request: Request) -> str | None:
    """The JWT the request carries: an explicit bearer header wins over the session cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(COOKIE_NAME) or None


def browser_page_visit(request: Request) -> bool:
    """A person's browser asking for a page (GET, HTML accepted, no bearer header), not an API client."""
    accepts_html = "text/html" in request.headers.get("accept", "")
    has_bearer = request.headers.get("authorization", "").lower().startswith("bearer ")
    return request.method.upper() == "GET" and accepts_html and not has_bearer


def login_redirect(request: Request, manager) -> Response:
    """To the auth manager's login page, coming back to the page asked for."""
    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(manager.get_url_login(next_url=back), status_code=302)


async def authorize(request: Request) -> Response | None:
    """None when the request may proceed, else the login redirect (browsers) or the 401/403 response."""
    from airflow.api_fastapi.app import get_auth_manager
    from jwt import ExpiredSignatureError, InvalidTokenError

    token = request_token(request)
    if not token:
        if browser_page_visit(request):
            return login_redirect(request, get_auth_manager())
        return JSONResponse({"detail": "Not authenticated: log in to Airflow first"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})
    manager = get_auth_manager()
    try:
        user = await manager.get_user_from_token(token)
    except (ExpiredSignatureError, InvalidTokenError) as exc:
        if browser_page_visit(request):  # a stale session cookie: log in again
            return login_redirect(request, manager)
        if isinstance(exc, ExpiredSignatureError):
            return JSONResponse({"detail": "Token expired"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return JSONResponse({"detail": "Invalid token"}, status_code=403)
    method = request.method.upper()
    allowed = manager.is_authorized_custom_view(method="GET", resource_name="Lucid", user=user)
    if allowed and method not in READ_METHODS:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

        allowed = manager.is_authorized_dag(method="PUT", details=DagDetails(id=ROUND_DAG_ID), user=user)
    if not allowed:
        return JSONResponse({"detail": "Forbidden: your Airflow role may not do this in Lucid"}, status_code=403)
    # who is asking, for the API: users act on their own jobs; operators (config edit rights) on any
    request.state.lucid_user = user.get_name()
    request.state.lucid_operator = manager.is_authorized_configuration(method="PUT", user=user)
    return None


async def airflow_auth_middleware(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """FastAPI HTTP middleware refusing any request that Airflow does not authenticate."""
    refusal = await authorize(request)
    if refusal is not None:
        return refusal
    return await call_next(request)

"""The operations console: server-rendered pages, no build step.

Sign-in takes an API token and opens a server-side session: the browser's HttpOnly, SameSite=Strict cookie
holds a random session ID, never the token. Sign-in and sign-out are refused unless the browser says the
form came from this site (``Origin`` / ``Sec-Fetch-Site``) and it carries its anti-forgery token. Pages
read through the same operations as the JSON API; Cancel and bulk cancel post to the JSON API from the page.
"""

from __future__ import annotations

import hmac
import re
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import COOKIE_NAME, console_caller, same_origin
from api.switches import banner_for
from domain.listing import ExportFilter
from domain.models import JobStatus
from service.auth import SESSION_TTL_SECONDS, Caller, close_session, csrf_token_for, open_session
from service.commands import NAME_PATTERN
from service.exports import ID_PREFIX_PATTERN, Exports, Page, decode_cursor
from service.permissions import Action, may
from service.views import cancel_can_matter, count_text, count_title, short, stamp, status_line, too_slow

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

router = APIRouter(prefix="/console", include_in_schema=False)

LOGIN_CSRF_COOKIE = "fenced_login_csrf"
PAGE_SIZE = 50
LIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DELIVERING)


def _ops(request: Request) -> Exports:
    return request.app.state.exports


def _to_login() -> RedirectResponse:
    return RedirectResponse("/console/login", status_code=303)


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _login_page(request: Request, error: str | None, status_code: int = 200) -> Response:
    csrf = secrets.token_urlsafe(32)
    response = templates.TemplateResponse(
        request, "login.html", {"error": error, "csrf": csrf}, status_code=status_code
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        csrf,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/console/login",
    )
    return response


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    return _login_page(request, None)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    csrf: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not same_origin(request) or not expected or not hmac.compare_digest(expected, csrf):
        # A page on another site posting this form: refuse, set nothing.
        return _login_page(
            request, "Sign-in refused: the form did not come from this console. Sign in here.", 403
        )
    opened = await open_session(_ops(request).store, token.strip())
    if opened is None:
        return _login_page(request, "Unknown token.", 401)
    session_id, _ = opened
    response = RedirectResponse("/console", status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        session_id,
        max_age=SESSION_TTL_SECONDS,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/console/login")
    return response


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form(max_length=100)] = "") -> Response:
    session_id = request.cookies.get(COOKIE_NAME, "")
    if (
        not same_origin(request)
        or not session_id
        or not hmac.compare_digest(csrf_token_for(session_id), csrf)
    ):
        return Response("Sign-out refused: the form did not come from this console.", status_code=403)
    await close_session(_ops(request).store, session_id)
    response = _to_login()
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


def _page_context(request: Request, caller: Caller) -> dict[str, Any]:
    session_id = request.cookies.get(COOKIE_NAME, "")
    return {
        "caller": caller,
        "csrf": csrf_token_for(session_id) if session_id else "",
        # what the page offers follows the role (a viewer reads); the service refuses the rest anyway
        "may_cancel": may(caller.role, Action.CANCEL),
        "may_switch": may(caller.role, Action.SWITCH),
    }


def _filters(
    status: list[str], destination: str | None, list_name: str | None, q: str | None
) -> ExportFilter:
    """The list's filters from the query string; a value that cannot match anything is dropped."""
    statuses = tuple(JobStatus(s) for s in dict.fromkeys(status) if s in JobStatus._value2member_map_)
    destination_id = None
    if destination:
        try:
            destination_id = UUID(destination)
        except ValueError:
            destination_id = None
    return ExportFilter(
        statuses=statuses,
        destination_id=destination_id,
        list_name=(list_name or "").strip() or None,
        id_prefix=(q or "").strip().lower() if q and re.match(ID_PREFIX_PATTERN, q.strip()) else None,
    )


def _counts_url(filters: ExportFilter) -> str | None:
    """``GET /export-counts`` with the same filters, for the page's refresh of its counts (``None`` when the
    list name is one the API's schema refuses: the counts then stay as the page was rendered)."""
    if filters.list_name is not None and not re.match(NAME_PATTERN, filters.list_name):
        return None
    query = [("status", s.value) for s in filters.statuses]
    if filters.destination_id is not None:
        query.append(("destination_id", str(filters.destination_id)))
    if filters.list_name is not None:
        query.append(("list_name", filters.list_name))
    if filters.id_prefix is not None:
        query.append(("q", filters.id_prefix))
    return "/export-counts" + (f"?{urlencode(query)}" if query else "")


async def _rows_context(
    request: Request,
    caller: Caller,
    filters: ExportFilter,
    before: str | None,
) -> dict[str, Any]:
    """What the rows need: the page (or that it ran past its bound) and the destinations' names."""
    ops = _ops(request)
    bound = decode_cursor(before) if before else None
    page = await ops.page(caller, PAGE_SIZE, before=bound, filters=filters)
    query = request.query_params
    base = [(k, v) for k, v in query.multi_items() if k != "before"]
    return {
        **_page_context(request, caller),
        "page": page,
        "jobs": page.jobs,
        "timed_out": page.timed_out,
        "too_slow": too_slow(ops.list_timeout_ms),
        "too_slow_ms": ops.list_timeout_ms,
        "destinations": await ops.destination_names(caller.tenant_id),
        "next_query": [*base, ("before", page.next)] if page.next else None,
        "first_query": base if bound else None,
        "paged": bound is not None,
        "status_line": lambda job: status_line(job, []),
        "cancel_can_matter": lambda job: may(caller.role, Action.CANCEL) and cancel_can_matter(job),
    }


async def _list_context(
    request: Request, caller: Caller, filters: ExportFilter, q: str | None, before: str | None
) -> dict[str, Any]:
    """The whole page: the rows, how many match (in total and per status), the filter's choices."""
    ops = _ops(request)
    context = await _rows_context(request, caller, filters, before)
    page: Page = context["page"]
    counts = await ops.counts(caller, filters, known=page.counted(filters, first=not context["paged"]))
    return {
        **context,
        "tenant_name": await ops.tenant_name(caller.tenant_id),
        "list_names": await ops.list_names(caller),
        "filters": filters,
        "selected": [s.value for s in filters.statuses],
        "all_statuses": [s.value for s in JobStatus],
        "q": q or "",
        "counts": counts,
        "counts_url": _counts_url(filters),
        "count_text": count_text,
        "count_title": lambda c: count_title(c, counts.exact_up_to, ops.list_timeout_ms),
        "live_statuses": [s.value for s in LIVE_STATUSES],
    }


@router.get("", response_class=HTMLResponse)
async def export_list(
    request: Request,
    status: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    destination: str | None = None,
    list_name: Annotated[str | None, Query(alias="list")] = None,
    q: str | None = None,
    before: str | None = None,
) -> Response:
    caller = await console_caller(request)
    if caller is None:
        return _to_login()
    filters = _filters(status, destination, list_name, q)
    context = await _list_context(request, caller, filters, q, before)
    context["switch_banner"] = await banner_for(request, caller)
    return templates.TemplateResponse(request, "list.html", context)


@router.get("/rows", response_class=HTMLResponse)
async def export_rows(
    request: Request,
    status: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    destination: str | None = None,
    list_name: Annotated[str | None, Query(alias="list")] = None,
    q: str | None = None,
    before: str | None = None,
) -> Response:
    """The list's rows alone, for the page's live refresh (polling; no build step)."""
    caller = await console_caller(request)
    if caller is None:
        return Response(status_code=401)
    filters = _filters(status, destination, list_name, q)
    context = await _rows_context(request, caller, filters, before)
    return templates.TemplateResponse(request, "rows.html", context)


@router.get("/exports/{export_id}", response_class=HTMLResponse)
async def export_detail(request: Request, export_id: str) -> Response:
    caller = await console_caller(request)
    if caller is None:
        return _to_login()
    try:
        job_id = UUID(export_id)
    except ValueError:
        job_id = None
    detail = await _ops(request).detail(caller, job_id) if job_id else None
    if detail is None:
        return templates.TemplateResponse(
            request, "not_found.html", _page_context(request, caller), status_code=404
        )
    return templates.TemplateResponse(
        request,
        "detail.html",
        {
            **_page_context(request, caller),
            "d": detail,
            "can_cancel": may(caller.role, Action.CANCEL) and cancel_can_matter(detail.job),
        },
    )

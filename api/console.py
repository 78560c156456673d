"""The operations console: server-rendered pages, no build step.

Sign-in takes an API token and keeps it in an HttpOnly, SameSite=Strict cookie; pages read through the
same operations as the JSON API, and the Cancel button posts to the JSON API from the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import COOKIE_NAME
from api.switches import banner_for
from service.auth import Caller, caller_for_token
from service.exports import Exports
from service.views import short, stamp, status_line

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

router = APIRouter(prefix="/console", include_in_schema=False)

_COOKIE_MAX_AGE = 8 * 3600


async def _caller(request: Request) -> Caller | None:
    token = request.cookies.get(COOKIE_NAME)
    if not token:
        return None
    return await caller_for_token(_ops(request).store, token)


def _ops(request: Request) -> Exports:
    return request.app.state.exports


def _to_login() -> RedirectResponse:
    return RedirectResponse("/console/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, token: Annotated[str, Form(max_length=200)]) -> Response:
    caller = await caller_for_token(_ops(request).store, token.strip())
    if caller is None:
        return templates.TemplateResponse(request, "login.html", {"error": "Unknown token."}, status_code=401)
    response = RedirectResponse("/console", status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        token.strip(),
        max_age=_COOKIE_MAX_AGE,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = _to_login()
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


@router.get("", response_class=HTMLResponse)
async def export_list(request: Request) -> Response:
    caller = await _caller(request)
    if caller is None:
        return _to_login()
    ops = _ops(request)
    jobs = await ops.store.list_tenant_jobs(caller.tenant_id, 200)
    return templates.TemplateResponse(
        request,
        "list.html",
        {
            "caller": caller,
            "tenant_name": await ops.tenant_name(caller.tenant_id),
            "destinations": await ops.destination_names(caller.tenant_id),
            "jobs": jobs,
            "status_line": lambda job: status_line(job, []),
            "switch_banner": await banner_for(request, caller),
        },
    )


@router.get("/exports/{export_id}", response_class=HTMLResponse)
async def export_detail(request: Request, export_id: str) -> Response:
    caller = await _caller(request)
    if caller is None:
        return _to_login()
    try:
        job_id = UUID(export_id)
    except ValueError:
        job_id = None
    detail = await _ops(request).detail(caller, job_id) if job_id else None
    if detail is None:
        return templates.TemplateResponse(request, "not_found.html", {"caller": caller}, status_code=404)
    return templates.TemplateResponse(request, "detail.html", {"caller": caller, "d": detail})

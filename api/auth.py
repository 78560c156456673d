"""Authenticating an HTTP request: a bearer token, or the console's session cookie.

The JSON API reads ``Authorization: Bearer <token>``. The console's cookie holds a random session ID
(never the token), bound server-side to the token it was opened with (:mod:`service.auth`); it is
HttpOnly and SameSite=Strict. A state-changing request authenticated by that cookie must also carry the
``X-Console-Request`` header, which a cross-site form cannot send, and must not come from another origin.
The console's own forms (sign-in, sign-out) are checked by :func:`same_origin` and an anti-forgery token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import Caller, caller_for_session, caller_for_token

COOKIE_NAME = "fenced_console"
CONSOLE_HEADER = "X-Console-Request"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}

# Declares the scheme in the OpenAPI document; the header itself is read below, so a malformed one gets
# a clear 401 rather than being ignored.
bearer_scheme = HTTPBearer(auto_error=False, description="A token minted with `python starter.py token`")


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the Authorization header must be 'Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return value.strip()


def same_origin(request: Request) -> bool:
    """Whether a browser says this request comes from this site: ``Origin`` equal to our own origin, or
    else ``Sec-Fetch-Site`` of ``same-origin`` (or ``none``: typed or bookmarked by the person). A request
    with neither header is not from a browser page (browsers send ``Origin`` on every POST)."""
    origin = request.headers.get("origin")
    if origin is not None:
        own = f"{request.url.scheme}://{request.url.netloc}"
        return origin == own
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    return True


async def authenticate(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Caller:
    """FastAPI dependency: the caller of a JSON API request, from its bearer token or console session."""
    store = request.app.state.exports.store
    token = _bearer(request)
    if token is not None:
        caller = await caller_for_token(store, token)
        if caller is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "unknown token", headers={"WWW-Authenticate": "Bearer"}
            )
        return caller
    session_id = request.cookies.get(COOKIE_NAME)
    if session_id is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
        )
    if request.method not in _SAFE_METHODS and (
        CONSOLE_HEADER not in request.headers or not same_origin(request)
    ):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"a console request must come from the console and carry {CONSOLE_HEADER}",
        )
    caller = await caller_for_session(store, session_id)
    if caller is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the console session ended; sign in again",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller


async def console_caller(request: Request) -> Caller | None:
    """The console page's caller, from its session cookie, or ``None`` (then the page asks to sign in)."""
    session_id = request.cookies.get(COOKIE_NAME)
    if not session_id:
        return None
    return await caller_for_session(request.app.state.exports.store, session_id)

"""Authenticating an HTTP request: a bearer token, or the console's cookie.

The JSON API reads ``Authorization: Bearer <token>``. The console keeps the same token in an HttpOnly,
SameSite=Strict cookie; a state-changing request authenticated by that cookie must also carry the
``X-Console-Request`` header, which a cross-site form cannot send. Tokens and callers are
:mod:`service.auth`'s.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, status

from service.auth import Caller, caller_for_token

COOKIE_NAME = "fenced_console"
CONSOLE_HEADER = "X-Console-Request"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


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


async def authenticate(request: Request) -> Caller:
    """FastAPI dependency: the caller of a JSON API request, from its bearer token or console cookie."""
    token = _bearer(request)
    if token is None:
        token = request.cookies.get(COOKIE_NAME)
        if (
            token is not None
            and request.method not in _SAFE_METHODS
            and CONSOLE_HEADER not in request.headers
        ):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"a console request must carry {CONSOLE_HEADER}")
    if token is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
        )
    caller = await caller_for_token(request.app.state.exports.store, token)
    if caller is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown token", headers={"WWW-Authenticate": "Bearer"}
        )
    return caller

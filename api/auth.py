"""Bearer tokens bound to a tenant, a named principal and a role, stored as SHA-256 only.

The JSON API reads ``Authorization: Bearer <token>``. The console keeps the same token in an HttpOnly,
SameSite=Strict cookie; a state-changing request authenticated by that cookie must also carry the
``X-Console-Request`` header, which a cross-site form cannot send.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

import psycopg
from fastapi import HTTPException, Request, status
from psycopg_pool import AsyncConnectionPool

from api.sql import run

Role = Literal["operator", "reconciler"]

COOKIE_NAME = "fenced_console"
CONSOLE_HEADER = "X-Console-Request"
_MAX_TOKEN_LENGTH = 200
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


@dataclass(frozen=True)
class Caller:
    """Who is asking: the tenant every read and write is scoped to, the principal recorded, the role."""

    tenant_id: UUID
    principal: str
    role: Role


def token_sha256(token: str) -> bytes:
    """The stored form of a token: its SHA-256 digest."""
    return hashlib.sha256(token.encode("utf-8")).digest()


async def mint_token(admin_url: str, *, tenant_id: UUID, principal: str, role: Role) -> str:
    """Create a new random token for ``principal`` in ``tenant_id`` and store only its hash.

    Needs an administrator's connection (no application role may insert tokens); the token itself is
    returned once and never stored or logged.
    """
    token = "fx_" + secrets.token_urlsafe(32)
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await run(
            conn,
            "insert_api_token",
            {
                "token_sha256": token_sha256(token),
                "tenant_id": tenant_id,
                "principal": principal,
                "role": role,
            },
        )
    return token


async def caller_for_token(pool: AsyncConnectionPool, token: str) -> Caller | None:
    """The caller a token is bound to, or ``None`` for an unknown or malformed token."""
    if not token or len(token) > _MAX_TOKEN_LENGTH or not token.isascii():
        return None
    async with pool.connection() as conn:
        rows = await run(conn, "find_api_token", {"token_sha256": token_sha256(token)})
    if not rows:
        return None
    row = rows[0]
    return Caller(tenant_id=row["tenant_id"], principal=row["principal"], role=row["role"])


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
    caller = await caller_for_token(request.app.state.api_store.pool, token)
    if caller is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown token", headers={"WWW-Authenticate": "Bearer"}
        )
    return caller

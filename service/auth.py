"""Who is asking: bearer tokens bound to a tenant, a named principal and a role, stored as SHA-256 only."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from uuid import UUID

from db.admin import ADMINISTRATOR, insert_token
from db.stores.api import ApiStore
from service.permissions import ROLES, Role

MAX_TOKEN_LENGTH = 200


@dataclass(frozen=True)
class Caller:
    """Who is asking: the tenant every read and write is scoped to, the principal recorded, the role."""

    tenant_id: UUID
    principal: str
    role: Role


def token_sha256(token: str) -> bytes:
    """The stored form of a token: its SHA-256 digest."""
    return hashlib.sha256(token.encode("utf-8")).digest()


async def mint_token(
    admin_url: str,
    *,
    tenant_id: UUID,
    principal: str,
    role: Role,
    minted_by: str = ADMINISTRATOR,
    request_id: str | None = None,
) -> str:
    """Create a new random token for ``principal`` in ``tenant_id`` and store only its hash, recorded in the
    ledger of operator actions as ``minted_by``'s (the administrator's name; never the token).

    Needs an administrator's connection (no application role may insert tokens); the token itself is
    returned once and never stored or logged.
    """
    token = "fx_" + secrets.token_urlsafe(32)
    await insert_token(
        admin_url,
        token_sha256=token_sha256(token),
        tenant_id=tenant_id,
        principal=principal,
        role=role,
        minted_by=minted_by,
        request_id=request_id,
    )
    return token


async def caller_for_token(store: ApiStore, token: str) -> Caller | None:
    """The caller a token is bound to, or ``None`` for an unknown or malformed token.

    Raises ``TransientStoreError`` when the database does not answer (the API answers 503).
    """
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None
    row = await store.find_token(token_sha256(token))
    if row is None or row.role not in ROLES:
        return None
    return Caller(tenant_id=row.tenant_id, principal=row.principal, role=row.role)


SESSION_TTL_SECONDS = 8 * 3600
_SESSION_ID_LENGTH = 43  # secrets.token_urlsafe(32)


def session_sha256(session_id: str) -> bytes:
    """The stored form of a console session ID: its SHA-256 digest."""
    return hashlib.sha256(session_id.encode("ascii")).digest()


def csrf_token_for(session_id: str) -> str:
    """The anti-forgery token of a console session: derived from its ID, so nothing more is stored, and
    unknowable to a page that cannot read the session's HttpOnly cookie."""
    return hashlib.sha256(b"csrf:" + session_id.encode("ascii")).hexdigest()


async def open_session(store: ApiStore, token: str) -> tuple[str, Caller] | None:
    """Sign a console in with a token: a new random session ID bound to the token's hash (only the
    session ID's hash is stored), or ``None`` for an unknown token. The ID goes in the cookie; the token
    never does."""
    caller = await caller_for_token(store, token)
    if caller is None:
        return None
    session_id = secrets.token_urlsafe(32)
    await store.open_console_session(session_sha256(session_id), token_sha256(token), SESSION_TTL_SECONDS)
    return session_id, caller


def _plausible_session(session_id: str) -> bool:
    return len(session_id) == _SESSION_ID_LENGTH and session_id.isascii()


async def caller_for_session(store: ApiStore, session_id: str) -> Caller | None:
    """The caller a live console session is bound to, or ``None`` (unknown, expired, signed out, or its
    token gone)."""
    if not _plausible_session(session_id):
        return None
    row = await store.find_console_session(session_sha256(session_id))
    if row is None or row.role not in ROLES:
        return None
    return Caller(tenant_id=row.tenant_id, principal=row.principal, role=row.role)


async def close_session(store: ApiStore, session_id: str) -> bool:
    """Sign a console session out: its row is deleted. Whether there was one."""
    if not _plausible_session(session_id):
        return False
    return await store.close_console_session(session_sha256(session_id))

"""Who is asking: bearer tokens bound to a tenant, a named principal and a role, stored as SHA-256 only."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from db.admin import insert_token
from db.store import JobStore

Role = Literal["operator", "reconciler"]
ROLES: tuple[Role, ...] = ("operator", "reconciler")
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


async def mint_token(admin_url: str, *, tenant_id: UUID, principal: str, role: Role) -> str:
    """Create a new random token for ``principal`` in ``tenant_id`` and store only its hash.

    Needs an administrator's connection (no application role may insert tokens); the token itself is
    returned once and never stored or logged.
    """
    token = "fx_" + secrets.token_urlsafe(32)
    await insert_token(
        admin_url, token_sha256=token_sha256(token), tenant_id=tenant_id, principal=principal, role=role
    )
    return token


async def caller_for_token(store: JobStore, token: str) -> Caller | None:
    """The caller a token is bound to, or ``None`` for an unknown or malformed token.

    Raises ``TransientStoreError`` when the database does not answer (the API answers 503).
    """
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None
    row = await store.find_token(token_sha256(token))
    if row is None or row.role not in ROLES:
        return None
    role: Role = "reconciler" if row.role == "reconciler" else "operator"
    return Caller(tenant_id=row.tenant_id, principal=row.principal, role=role)

"""What only an administrator's connection does: seed tenants, destinations and contacts, store tokens.

No application role may write these tables; the demo, ``starter.py seed-demo`` / ``token`` and the
benchmarks use this module with a database owner's URL.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from db.errors import translated
from db.queries import execute

DEMO_LIST = "newsletter"


@dataclass(frozen=True)
class Seeded:
    """What ``seed_tenant`` created."""

    tenant_id: UUID
    destination_id: UUID
    list_name: str
    contacts: int


async def insert_token(
    admin_url: str, *, token_sha256: bytes, tenant_id: UUID, principal: str, role: str
) -> None:
    """Record a token by its SHA-256 only, bound to a tenant, a principal and a role."""
    async with translated(), await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await execute(
            conn,
            "insert_api_token",
            {"token_sha256": token_sha256, "tenant_id": tenant_id, "principal": principal, "role": role},
        )


async def seed_tenant(
    admin_url: str,
    *,
    tenant_name: str,
    destination_name: str,
    destination: dict[str, Any],
    contacts: int,
    list_name: str = DEMO_LIST,
) -> Seeded:
    """Insert a tenant, one destination (``destination`` holds its columns) and ``contacts`` synthetic
    contacts in ``list_name``, in one transaction; returns their IDs."""
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    row = {
        "name_and_size_identify": False,
        "hash_evidence": "read_back",
        "ack_suffix": None,
        "max_write_request": 32768,
        **destination,
        "id": destination_id,
        "tenant_id": tenant_id,
        "name": destination_name,
    }
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn, conn.transaction():
        await execute(conn, "insert_tenant", {"id": tenant_id, "name": tenant_name})
        await execute(conn, "insert_destination", row)
        await execute(
            conn,
            "insert_generated_contacts",
            {"tenant_id": tenant_id, "list_name": list_name, "count": contacts},
        )
    return Seeded(tenant_id, destination_id, list_name, contacts)

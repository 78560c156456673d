"""Demo data, written with an administrator's connection: a tenant, a partner destination, contacts.

Only the demo and ``python starter.py seed-demo`` use this; no application role may write these tables.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from api.sql import run

DEMO_LIST = "newsletter"


@dataclass(frozen=True)
class Seeded:
    tenant_id: UUID
    destination_id: UUID
    list_name: str
    contacts: int


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
    async with await psycopg.AsyncConnection.connect(admin_url) as conn:
        async with conn.transaction():
            await run(conn, "insert_tenant", {"id": tenant_id, "name": tenant_name})
            await run(conn, "insert_destination", row)
            await run(
                conn,
                "insert_generated_contacts",
                {"tenant_id": tenant_id, "list_name": list_name, "count": contacts},
            )
    return Seeded(tenant_id, destination_id, list_name, contacts)

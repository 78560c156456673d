"""A partner's SFTP endpoint and the contract agreed with it: one ``destinations`` row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, LiteralString
from uuid import UUID

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

SELECT_DESTINATION: LiteralString = (
    "SELECT id, tenant_id, name, host, port, username, host_key, credential_ref, remote_dir,"
    " name_and_size_identify, hash_evidence, ack_suffix, max_write_request"
    " FROM destinations WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s"
)


class DestinationNotFound(LookupError):
    """No destination with that ID in that tenant."""


class Destination(BaseModel):
    """Where an export lands and what the partner's side can prove about it.

    ``host_key`` is pinned (``"ssh-ed25519 AAAA..."``, optionally preceded by a known_hosts host
    field); ``credential_ref`` is the path of the private key file on the worker host, never the key.
    The contract: ``name_and_size_identify`` (name and size identify a delivered file),
    ``hash_evidence`` (``read_back``: the account may read the file back to hash it; ``ack_file``: the
    partner writes ``{final}{ack_suffix}``, see :mod:`partner.evidence`) and ``max_write_request``
    (the largest SFTP write the server accepts; OpenSSH's limit is 261,120).
    """

    model_config = ConfigDict(frozen=True)

    id: UUID
    tenant_id: UUID
    name: str
    host: str
    port: int
    username: str
    host_key: str
    credential_ref: str
    remote_dir: str
    name_and_size_identify: bool = False
    hash_evidence: Literal["none", "read_back", "ack_file"] = "none"
    ack_suffix: str | None = None
    max_write_request: int = 32768

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Destination:
        """Build a destination from a ``destinations`` row (extra columns such as created_at are ignored)."""
        return cls.model_validate({name: row[name] for name in cls.model_fields if name in row})

    def remote_path(self, name: str) -> str:
        """The absolute path of ``name`` in the destination's remote directory."""
        return f"{self.remote_dir.rstrip('/')}/{name}"


async def load_destination(pool: AsyncConnectionPool, tenant_id: UUID, destination_id: UUID) -> Destination:
    """Read one tenant's destination row; raises :class:`DestinationNotFound` when it is not there."""
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SELECT_DESTINATION, {"tenant_id": tenant_id, "destination_id": destination_id})
        row = await cur.fetchone()
    if row is None:
        raise DestinationNotFound(str(destination_id))
    return Destination.from_row(row)

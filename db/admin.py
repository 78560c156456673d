"""What only an administrator's connection does: seed tenants, destinations and contacts, store and revoke
tokens, manage principals (grant, revoke), retire destinations and change them (each change a recorded version,
as an admin's requests through the API are). Token mint and revoke and role grants are recorded in the ledger
of operator actions with the administrator's name and the role ``owner``, in their own transactions.

No application role may write these tables; the demo, ``starter.py seed-demo`` / ``token`` and the
benchmarks use this module with a database owner's URL. A tenant or destination created here starts
paused unless created enabled (``seed_tenant`` creates both enabled: the caller asked for a working one).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import date
from typing import Any
from uuid import UUID

import psycopg

from db.errors import StoreError, translated
from db.queries import execute, fetch
from db.rows import CountRow, DestinationEdit, DestinationRetirement, PrincipalRow
from domain.audit import ActionRecord, AuditAction, SubjectKind
from domain.file_format import FileFormat

DEMO_LIST = "newsletter"
OWNER = "owner"  # the role a destination's record names for an administrator's connection


@dataclass(frozen=True)
class Seeded:
    """What ``seed_tenant`` created."""

    tenant_id: UUID
    destination_id: UUID
    list_name: str
    contacts: int


ADMINISTRATOR = "administrator"  # who an administrator's change names when the caller gives no name


def _admin_record(
    tenant_id: UUID,
    by: str,
    action: AuditAction,
    subject_kind: SubjectKind,
    subject_id: str,
    *,
    outcome: str,
    before: Any = None,
    after: Any = None,
    request_id: str | None = None,
    reason: str | None = None,
    detail: str | None = None,
) -> ActionRecord:
    """The ledger row of an administrator's action (0031): their name, the role ``owner``."""
    return ActionRecord(
        tenant_id=tenant_id,
        principal=by,
        role=OWNER,
        action=action,
        subject_kind=subject_kind,
        subject_id=subject_id,
        request_id=request_id,
        reason=reason,
        outcome=outcome,
        detail=detail,
        before=before,
        after=after,
    )


async def insert_token(
    admin_url: str,
    *,
    token_sha256: bytes,
    tenant_id: UUID,
    principal: str,
    role: str,
    minted_by: str = ADMINISTRATOR,
    request_id: str | None = None,
) -> None:
    """Record a token by its SHA-256 only, bound to a tenant, a principal and a role, with its row of the ledger
    of operator actions (who minted it, for whom, with which role; never the token) in the same transaction.

    A name that is not yet a principal of the tenant becomes one with ``role``; a revoked principal, or
    one that holds another role, gets no token (``PrincipalRefused``; the refusal is recorded too).
    """
    after = {"principal": principal, "role": role}
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn:
        async with conn.transaction():
            inserted = await execute(
                conn,
                "insert_api_token",
                {"token_sha256": token_sha256, "tenant_id": tenant_id, "principal": principal, "role": role},
            )
            record = _admin_record(
                tenant_id,
                minted_by,
                AuditAction.TOKEN_MINT,
                SubjectKind.TOKEN,
                principal,
                outcome="created" if inserted == 1 else "refused",
                after=after,
                request_id=request_id,
                detail=None if inserted == 1 else "the principal is revoked or holds another role",
            )
            await execute(conn, "record_operator_action", record.params())
    if inserted != 1:
        raise PrincipalRefused(f"{principal} is revoked or holds another role than {role} in this tenant")


async def revoke_tokens(
    admin_url: str, *, tenant_id: UUID, principal: str, revoked_by: str, request_id: str | None = None
) -> int:
    """Revoke every token of a principal (its console sessions end with them), recorded in the ledger in the
    same transaction; the principal stays. The number of tokens revoked."""
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn:
        async with conn.transaction():
            [row] = await fetch(
                conn, "revoke_api_tokens", {"tenant_id": tenant_id, "principal": principal}, CountRow
            )
            record = _admin_record(
                tenant_id,
                revoked_by,
                AuditAction.TOKEN_REVOKE,
                SubjectKind.TOKEN,
                principal,
                outcome="done" if row.n else "not_found",
                after={"principal": principal, "tokens_revoked": row.n},
                request_id=request_id,
            )
            await execute(conn, "record_operator_action", record.params())
    return row.n


class PrincipalRefused(StoreError):
    """A token was not minted: its principal is revoked, or holds another role."""


async def _admin(admin_url: str, name: str, params: dict[str, Any]) -> int:
    async with translated(), await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        return await execute(conn, name, params)


async def upsert_principal(
    admin_url: str,
    *,
    tenant_id: UUID,
    name: str,
    role: str,
    export_lists: list[str] | None = None,
    granted_by: str = ADMINISTRATOR,
    request_id: str | None = None,
) -> None:
    """Make ``name`` a principal of the tenant with ``role`` (and, if given, the only lists it may
    export); an existing principal gets them and is reinstated. The grant is recorded in the ledger of operator
    actions, with the role before and after, in the same transaction."""
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn:
        async with conn.transaction():
            before = await fetch(conn, "find_principal", {"tenant_id": tenant_id, "name": name}, PrincipalRow)
            await execute(
                conn,
                "upsert_principal",
                {"tenant_id": tenant_id, "name": name, "role": role, "export_lists": export_lists},
            )
            record = _admin_record(
                tenant_id,
                granted_by,
                AuditAction.PRINCIPAL_GRANT,
                SubjectKind.PRINCIPAL,
                name,
                outcome="done",
                before=_principal_json(before[0]) if before else None,
                after={"role": role, "export_lists": export_lists, "revoked": False},
                request_id=request_id,
            )
            await execute(conn, "record_operator_action", record.params())


async def revoke_principal(
    admin_url: str, *, tenant_id: UUID, name: str, revoked_by: str, request_id: str | None = None
) -> bool:
    """Revoke a principal: its tokens stop working and its queued exports are rejected when next
    evaluated, recorded in the ledger of operator actions in the same transaction. False when it was already
    revoked or does not exist."""
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn:
        async with conn.transaction():
            before = await fetch(conn, "find_principal", {"tenant_id": tenant_id, "name": name}, PrincipalRow)
            revoked = (
                await execute(
                    conn, "revoke_principal", {"tenant_id": tenant_id, "name": name, "revoked_by": revoked_by}
                )
                == 1
            )
            record = _admin_record(
                tenant_id,
                revoked_by,
                AuditAction.PRINCIPAL_REVOKE,
                SubjectKind.PRINCIPAL,
                name,
                outcome="done" if revoked else ("not_found" if not before else "refused"),
                before=_principal_json(before[0]) if before else None,
                after={"revoked": True} if revoked else None,
                request_id=request_id,
                detail=None if revoked or not before else "already revoked",
            )
            await execute(conn, "record_operator_action", record.params())
    return revoked


def _principal_json(row: PrincipalRow) -> dict[str, Any]:
    return {"role": row.role, "revoked": row.revoked_at is not None}


async def retire_destination(
    admin_url: str,
    *,
    tenant_id: UUID,
    destination_id: UUID,
    retired_by: str,
    reason: str = "retired by an administrator",
) -> bool:
    """Retire a destination as its next version, recorded with who and why: what is building for it stops at
    cutoff 2, what is queued is rejected. False when it was already retired or is not the tenant's."""
    params = {
        "tenant_id": tenant_id,
        "destination_id": destination_id,
        "retired_by": retired_by,
        "changed_role": OWNER,
        "reason": reason,
    }
    async with translated(), await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        rows = await fetch(conn, "retire_destination", params, DestinationRetirement)
    return bool(rows) and rows[0].matched


async def edit_destination(
    admin_url: str,
    *,
    tenant_id: UUID,
    destination_id: UUID,
    changes: dict[str, Any],
    changed_by: str = "administrator",
    reason: str = "changed by an administrator",
) -> DestinationEdit | None:
    """Change a destination's columns (``changes``: column to value; ``None`` clears a nullable one) as its
    next version, whatever version it is at, recorded with who and why (an administrator's connection: the
    same statement an admin's ``PATCH /destinations/{id}`` runs). ``None`` when it is not the tenant's."""
    params = {
        "tenant_id": tenant_id,
        "destination_id": destination_id,
        "expected_version": None,
        "changes": json.dumps(changes, default=str),
        "changed_by": changed_by,
        "changed_role": OWNER,
        "reason": reason,
    }
    async with translated(), await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        rows = await fetch(conn, "edit_destination_if_version", params, DestinationEdit)
    return rows[0] if rows else None


async def set_destination_contract(
    admin_url: str, *, tenant_id: UUID, destination_id: UUID, starts_on: date, ends_on: date | None
) -> bool:
    """Set a destination's contract window (UTC days, both ends inclusive; ``None``: open-ended), as its next
    version."""
    edited = await edit_destination(
        admin_url,
        tenant_id=tenant_id,
        destination_id=destination_id,
        changes={"contract_starts_on": starts_on, "contract_ends_on": ends_on},
        reason="contract window set by an administrator",
    )
    return edited is not None and edited.matched


async def seed_switch(
    admin_url: str,
    *,
    tenant_id: UUID,
    destination_id: UUID | None = None,
    enabled: bool = True,
    reason: str = "created enabled",
    changed_by: str = "seeding",
) -> None:
    """Create a tenant's (or, with ``destination_id``, a destination's) switch, with its history entry."""
    async with translated(), await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await _seed_switch(conn, tenant_id, destination_id, enabled, reason, changed_by)


async def _seed_switch(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: UUID,
    destination_id: UUID | None,
    enabled: bool,
    reason: str,
    changed_by: str,
) -> None:
    await execute(
        conn,
        "seed_switch",
        {
            "scope": "tenant" if destination_id is None else "destination",
            "tenant_id": tenant_id,
            "destination_id": destination_id,
            "enabled": enabled,
            "reason": reason,
            "changed_by": changed_by,
        },
    )


async def add_destination(
    admin_url: str,
    *,
    tenant_id: UUID,
    name: str,
    destination: dict[str, Any],
    enabled: bool = True,
    contract_starts_on: date | None = None,
    contract_ends_on: date | None = None,
) -> UUID:
    """Insert one more destination for a tenant (``destination`` holds its columns), created enabled
    unless ``enabled`` is false, with a contract window when one is given; returns its ID."""
    destination_id = uuid.uuid4()
    row = _destination_row(
        {**_DESTINATION_DEFAULTS, **destination, "id": destination_id, "tenant_id": tenant_id, "name": name}
    )
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn, conn.transaction():
        await execute(conn, "insert_destination", row)
        await _record_seeded(conn, tenant_id, destination_id)
        if contract_starts_on is not None or contract_ends_on is not None:
            # its contract window, as its version 2 (the seeding's own recorded change)
            window = {
                "contract_starts_on": contract_starts_on or date.min,
                "contract_ends_on": contract_ends_on,
            }
            await execute(
                conn,
                "edit_destination_if_version",
                {
                    "tenant_id": tenant_id,
                    "destination_id": destination_id,
                    "expected_version": 1,
                    "changes": json.dumps(window, default=str),
                    "changed_by": "seeding",
                    "changed_role": OWNER,
                    "reason": "contract window seeded",
                },
            )
        await _seed_switch(
            conn, tenant_id, destination_id, enabled, "created enabled" if enabled else "created", "seeding"
        )
    return destination_id


async def _record_seeded(conn: psycopg.AsyncConnection[Any], tenant_id: UUID, destination_id: UUID) -> None:
    """The seeded destination's version 1, recorded (its whole row, who and why) in the same transaction."""
    await execute(
        conn,
        "record_destination_seeded",
        {
            "tenant_id": tenant_id,
            "destination_id": destination_id,
            "changed_by": "seeding",
            "reason": "seeded",
        },
    )


_DESTINATION_DEFAULTS: dict[str, Any] = {
    "name_and_size_identify": False,
    "hash_evidence": "read_back",
    "ack_suffix": None,
    "max_write_request": 32768,
    "temporary_files": "keep",
    # What the partner receives (0020): the plain CSV every destination received before.
    "csv_header": True,
    "csv_delimiter": ",",
    "csv_columns": ["email", "first_name", "last_name"],
    "compression": "none",
    "pgp_recipient_keys": [],
    "pgp_signing_key_ref": None,
    # Several pinned keys (0029): none given, the one host_key is the one pinned. No session limit by default.
    "host_keys": None,
    "max_sessions": None,
    # The manifest published beside each file (0037): none by default.
    "manifest": "none",
}


def _destination_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row to insert, its file format checked first (a bad one raises ``ValueError`` and nothing is
    written; the message never repeats a key); tuples become lists, which psycopg sends as arrays."""
    FileFormat(
        header=row["csv_header"],
        delimiter=row["csv_delimiter"],
        columns=tuple(row["csv_columns"]),
        compression=row["compression"],
        recipient_keys=tuple(row["pgp_recipient_keys"]),
        signing_key_ref=row["pgp_signing_key_ref"],
    )
    return {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}


async def seed_tenant(
    admin_url: str,
    *,
    tenant_name: str,
    destination_name: str,
    destination: dict[str, Any],
    contacts: int,
    list_name: str = DEMO_LIST,
    enabled: bool = True,
) -> Seeded:
    """Insert a tenant, one destination (``destination`` holds its columns) and ``contacts`` synthetic
    contacts in ``list_name``, in one transaction; returns their IDs. Both are created enabled (their
    delivery switches on) unless ``enabled`` is false."""
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    row = _destination_row(
        {
            **_DESTINATION_DEFAULTS,
            **destination,
            "id": destination_id,
            "tenant_id": tenant_id,
            "name": destination_name,
        }
    )
    async with translated(), await psycopg.AsyncConnection.connect(admin_url) as conn, conn.transaction():
        await execute(conn, "insert_tenant", {"id": tenant_id, "name": tenant_name})
        await execute(conn, "insert_destination", row)
        await _record_seeded(conn, tenant_id, destination_id)
        for scoped in (None, destination_id):
            await _seed_switch(
                conn, tenant_id, scoped, enabled, "created enabled" if enabled else "created", "seeding"
            )
        await execute(
            conn,
            "insert_generated_contacts",
            {"tenant_id": tenant_id, "list_name": list_name, "count": contacts},
        )
    return Seeded(tenant_id, destination_id, list_name, contacts)

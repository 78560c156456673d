"""Least privilege for the controls' tables (issue 9), enforced by the database: each role reads and writes
only what its part needs. The worker reads principals and switches and may lock (FOR SHARE) switch and
destination rows, but a trigger refuses every update it could make with the lock-only grant; only the API
changes a tenant's and its destinations' switches, and only the platform's role the global one (issue 23.5:
"global is 403" holds in the database too); the history of changes is append-only for everyone, the owner
included; principals and destinations are an administrator's. Every refusal is a real statement against a
real row."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from db.errors import NotPermitted
from db.pool import Role
from domain.controls import SwitchScope

ROLES: list[Role] = [
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
]


@asynccontextmanager
async def acting_as(database, role: Role | None) -> AsyncIterator[psycopg.AsyncConnection]:
    url = database.admin_url if role is None else database.app_url
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        if role is not None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        yield conn


async def refused(database, role: Role | None, statement: Any, params: dict[str, Any]) -> psycopg.Error:
    async with acting_as(database, role) as conn:
        with pytest.raises(psycopg.Error) as caught:
            await conn.execute(statement, params)
    return caught.value


@pytest.fixture(scope="module")
async def scope(factory, api_store) -> dict[str, Any]:
    """A tenant, an enabled destination, one recorded switch change."""
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    await api_store.set_delivery_switch(
        scope=SwitchScope.DESTINATION,
        tenant_id=tenant,
        destination_id=destination,
        enabled=True,
        reason="contract signed",
        changed_by="sam.ops",
    )
    return {"t": tenant, "d": destination}


async def state(factory, scope) -> list[Any]:
    reads = [
        "SELECT * FROM delivery_switches WHERE tenant_id = %(t)s OR scope = 'global' ORDER BY scope",
        "SELECT * FROM delivery_switch_changes WHERE tenant_id = %(t)s OR scope = 'global' ORDER BY id",
        "SELECT * FROM destinations WHERE id = %(d)s",
        "SELECT * FROM principals WHERE tenant_id = %(t)s ORDER BY name",
    ]
    return [await factory.admin(r, scope) for r in reads]


# -- who may change what ------------------------------------------------------------------------------

_CHANGES = {
    "switch": "UPDATE delivery_switches SET enabled = false WHERE tenant_id = %(t)s",
    "switch insert": "INSERT INTO delivery_switches (scope, tenant_id, enabled, reason, changed_by)"
    " VALUES ('tenant', %(t)s, false, 'x', 'x')",
    "global switch": "UPDATE delivery_switches SET enabled = false, reason = 'x', changed_by = 'x',"
    " changed_at = clock_timestamp() WHERE scope = 'global'",
    # The global row exists (0006), so this would conflict for anyone allowed: a refusal comes first.
    "global switch insert": "INSERT INTO delivery_switches (scope, enabled, reason, changed_by)"
    " VALUES ('global', false, 'x', 'x')",
    "global history insert": "INSERT INTO delivery_switch_changes (scope, enabled, reason, changed_by,"
    " changed_at) VALUES ('global', false, 'forged', 'x', clock_timestamp())",
    "switch delete": "DELETE FROM delivery_switches WHERE tenant_id = %(t)s",
    "history update": "UPDATE delivery_switch_changes SET reason = 'tampered' WHERE tenant_id = %(t)s",
    "history delete": "DELETE FROM delivery_switch_changes WHERE tenant_id = %(t)s",
    "history insert": "INSERT INTO delivery_switch_changes (scope, tenant_id, enabled, reason, changed_by,"
    " changed_at) VALUES ('tenant', %(t)s, true, 'forged', 'x', clock_timestamp())",
    "destination retire": "UPDATE destinations SET retired_at = now(), retired_by = 'x' WHERE id = %(d)s",
    "destination contract": "UPDATE destinations SET contract_ends_on = '2020-01-01', contract_starts_on ="
    " '2019-01-01' WHERE id = %(d)s",
    "destination lock-grant column": "UPDATE destinations SET id = id WHERE id = %(d)s",
    "switch lock-grant column": "UPDATE delivery_switches SET scope = scope WHERE tenant_id = %(t)s",
    "principal revoke": "UPDATE principals SET revoked_at = now(), revoked_by = 'x' WHERE tenant_id = %(t)s",
    "principal insert": "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, 'mallory', 'operator')",
    "principal delete": "DELETE FROM principals WHERE tenant_id = %(t)s",
}
# What each role may do among those; everything else is refused to it.
_ALLOWED = {
    "exports_api": {"switch", "switch insert", "history insert"},
    "exports_platform": {"global switch", "global switch insert", "global history insert"},
}


# What a role's grants allow but a trigger refuses: the API changes a destination only as its next version,
# recorded (0021; tests/db/test_destination_versions.py).
_REFUSED_BY_TRIGGER = {"exports_api": {"destination retire", "destination contract"}}


@pytest.mark.parametrize(
    ("role", "change"),
    # The allowed ones are exercised through the API's and the platform's own statements (test_switches and
    # below).
    [
        (r, c)
        for r in ROLES
        for c in sorted(_CHANGES)
        if c not in _ALLOWED.get(r, set()) | _REFUSED_BY_TRIGGER.get(r, set())
    ],
)
async def test_each_role_changes_only_what_its_part_needs(database, factory, scope, role, change):
    before = await state(factory, scope)
    error = await refused(database, role, _CHANGES[change], scope)
    assert isinstance(error, psycopg.errors.InsufficientPrivilege), (role, change, error)
    assert await state(factory, scope) == before


@pytest.mark.parametrize("change", ["destination retire", "destination contract"])
async def test_the_api_changes_a_destination_only_as_its_next_recorded_version(
    database, factory, scope, change
):
    before = await state(factory, scope)
    error = await refused(database, "exports_api", _CHANGES[change], scope)
    assert isinstance(error, psycopg.errors.CheckViolation)
    assert error.diag.constraint_name == "ck_destinations_version_step"
    assert await state(factory, scope) == before


@pytest.mark.parametrize("change", ["history update", "history delete"])
async def test_the_history_of_switch_changes_is_append_only_even_for_the_owner(
    database, factory, scope, change
):
    before = await state(factory, scope)
    error = await refused(database, None, _CHANGES[change], scope)
    assert isinstance(error, psycopg.errors.InsufficientPrivilege)
    assert await state(factory, scope) == before


async def test_a_switch_never_changes_its_scope_even_for_the_owner(database, factory, scope):
    error = await refused(
        database,
        None,
        "UPDATE delivery_switches SET destination_id = NULL, scope = 'tenant' WHERE destination_id = %(d)s",
        scope,
    )
    assert error.diag.constraint_name == "ck_delivery_switches_identity"


# -- who may read and lock what ------------------------------------------------------------------------


async def test_the_worker_may_read_and_lock_the_rows_its_claim_and_cutoff_2_read(database, scope):
    async with acting_as(database, "exports_worker") as conn:
        for statement in (
            "SELECT enabled FROM delivery_switches WHERE tenant_id = %(t)s FOR SHARE",
            "SELECT retired_at FROM destinations WHERE id = %(d)s FOR SHARE",
            "SELECT role, revoked_at, export_lists FROM principals WHERE tenant_id = %(t)s",
        ):
            await conn.execute(statement, scope)


@pytest.mark.parametrize(
    ("role", "statement"),
    [
        ("exports_dispatcher", "SELECT 1 FROM delivery_switches"),
        ("exports_dispatcher", "SELECT 1 FROM principals"),
        ("exports_reconciler", "SELECT 1 FROM delivery_switches"),
        ("exports_reconciler", "SELECT 1 FROM principals"),
        ("exports_recovery", "SELECT 1 FROM delivery_switch_changes"),
        ("exports_worker", "SELECT 1 FROM delivery_switch_changes"),
        ("exports_api", "SELECT email FROM contacts"),  # still: the API never reads contact data
        ("exports_worker", "SELECT token_sha256 FROM api_tokens"),
    ],
)
async def test_roles_outside_a_table_cannot_read_it(database, role, statement):
    error = await refused(database, role, statement, {})
    assert isinstance(error, psycopg.errors.InsufficientPrivilege)


async def test_the_exact_grants_on_the_controls_tables(database):
    async with acting_as(database, None) as conn:
        cur = await conn.execute(
            "SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE table_name IN ('delivery_switches', 'delivery_switch_changes', 'principals')"
            " AND grantee LIKE 'exports_%%' ORDER BY 1, 2, 3"
        )
        table_grants = await cur.fetchall()
        cur = await conn.execute(
            "SELECT grantee, table_name, column_name FROM information_schema.column_privileges"
            " WHERE table_name IN ('delivery_switches', 'destinations', 'principals') AND privilege_type = 'UPDATE'"
            " AND grantee LIKE 'exports_%%' ORDER BY 1, 2, 3"
        )
        update_columns = await cur.fetchall()
    # The API's and the platform's grants on the switches are the same: which scope each may write is the
    # trigger's (0019), a grant cannot say it.
    assert table_grants == [
        ("exports_api", "delivery_switch_changes", "INSERT"),
        ("exports_api", "delivery_switch_changes", "SELECT"),
        ("exports_api", "delivery_switches", "INSERT"),
        ("exports_api", "delivery_switches", "SELECT"),
        ("exports_api", "principals", "SELECT"),
        ("exports_platform", "delivery_switch_changes", "INSERT"),
        ("exports_platform", "delivery_switch_changes", "SELECT"),
        ("exports_platform", "delivery_switches", "INSERT"),
        ("exports_platform", "delivery_switches", "SELECT"),
        ("exports_recovery", "delivery_switches", "SELECT"),  # recovery opens no session to a paused partner
        ("exports_worker", "delivery_switches", "SELECT"),
        ("exports_worker", "principals", "SELECT"),
    ]
    assert update_columns == [
        ("exports_api", "delivery_switches", "changed_at"),
        ("exports_api", "delivery_switches", "changed_by"),
        ("exports_api", "delivery_switches", "enabled"),
        ("exports_api", "delivery_switches", "held_until"),  # kept by the pauses' trigger (0032)
        ("exports_api", "delivery_switches", "reason"),
        # an admin's changes of a destination (0021): each through a statement that records the version
        *[
            ("exports_api", "destinations", column)
            for column in sorted(
                [
                    "ack_suffix",
                    "contract_ends_on",
                    "contract_starts_on",
                    "credential_ref",
                    "hash_evidence",
                    "host",
                    "host_key",
                    "host_keys",  # several pinned keys (0029)
                    "manifest",  # the manifest published last (0037)
                    "max_sessions",  # the partner's session limit (0029)
                    "max_write_request",
                    "name",
                    "name_and_size_identify",
                    "port",
                    "remote_dir",
                    "retired_at",
                    "retired_by",
                    "temporary_files",
                    "username",
                    "version",
                    # the delivery window (0035)
                    "blackout_dates",
                    "intake_hours",
                    "intake_time_zone",
                    # what the partner receives, its format and OpenPGP keys (0020; an admin's since 0038)
                    "compression",
                    "csv_columns",
                    "csv_delimiter",
                    "csv_header",
                    "pgp_recipient_keys",
                    "pgp_signing_key_ref",
                ]
            )
        ],
        ("exports_platform", "delivery_switches", "changed_at"),
        ("exports_platform", "delivery_switches", "changed_by"),
        ("exports_platform", "delivery_switches", "enabled"),
        ("exports_platform", "delivery_switches", "held_until"),
        ("exports_platform", "delivery_switches", "reason"),
        ("exports_worker", "delivery_switches", "scope"),  # for FOR SHARE only; the trigger refuses updates
        ("exports_worker", "destinations", "id"),  # likewise
        ("exports_worker", "principals", "name"),  # likewise: cutoff 2 reads the creator FOR SHARE (23.6)
    ]


# -- the global switch is the platform's (issue 23.5) ------------------------------------------------------


def global_switch(*, enabled: bool, changed_by: str = "pat.platform") -> dict[str, Any]:
    return {
        "scope": SwitchScope.GLOBAL,
        "tenant_id": None,
        "destination_id": None,
        "enabled": enabled,
        "reason": "partner-wide incident",
        "changed_by": changed_by,
    }


async def test_the_api_role_is_refused_the_global_switch_even_when_the_service_check_is_bypassed(
    factory, scope, api_store, kit
):
    # The service answers 403 before it gets here; this is the statement sent anyway, over the API's pool.
    before = await state(factory, scope)
    with pytest.raises(NotPermitted) as refused:
        await api_store.set_delivery_switch(**global_switch(enabled=False, changed_by="mallory"))
    cause = refused.value.__cause__
    assert isinstance(cause, psycopg.errors.InsufficientPrivilege)
    assert cause.diag.constraint_name == "ck_delivery_switches_global_owner"

    # The history entry alone, which set_delivery_switch writes in the same statement, is refused too.
    held = await kit.hold("exports_api")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await held.execute(_CHANGES["global history insert"])
    await held.rollback()
    assert await state(factory, scope) == before


async def test_the_platform_role_switches_the_global_scope_and_no_other(factory, scope, platform_store):
    before = await state(factory, scope)
    paused = await platform_store.set_delivery_switch(**global_switch(enabled=False))
    try:
        assert (paused.scope, paused.enabled, paused.was_enabled) == (SwitchScope.GLOBAL, False, True)
        for other in (
            {"scope": SwitchScope.TENANT, "tenant_id": scope["t"], "destination_id": None},
            {"scope": SwitchScope.DESTINATION, "tenant_id": scope["t"], "destination_id": scope["d"]},
        ):
            with pytest.raises(NotPermitted):
                await platform_store.set_delivery_switch(
                    **other, enabled=False, reason="not mine", changed_by="pat.platform"
                )
    finally:
        resumed = await platform_store.set_delivery_switch(**global_switch(enabled=True))
    assert (resumed.enabled, resumed.was_enabled, resumed.changed_by) == (True, False, "pat.platform")
    switches, history, *rest = await state(factory, scope)
    assert [r for r in switches if r["scope"] != "global"] == [r for r in before[0] if r["scope"] != "global"]
    assert [h["scope"] for h in history[len(before[1]) :]] == ["global", "global"]
    assert rest == before[2:]

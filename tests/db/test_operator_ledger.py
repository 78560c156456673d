"""The ledger of operator actions in the database (issue #26 item 2, migration 0031): append-only by privileges
(and for the owner too, by a trigger), never a secret, the second person never the first, and written in the
transaction of the action it records, so an action that rolled back is not in it."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from db.errors import ConstraintRefused
from domain.audit import ActionRecord, AuditAction, SubjectKind, without_secrets
from domain.controls import SwitchScope
from tests.db.test_permissions import ROLES, acting_as

ALL_ROLES = [*ROLES, "exports_recovery"]
WRITERS = {"exports_api", "exports_reconciler", "exports_platform"}


def record(tenant_id, **overrides) -> ActionRecord:
    fields = {
        "tenant_id": tenant_id,
        "principal": "sam.ops",
        "role": "operator",
        "action": AuditAction.PAUSE,
        "subject_kind": SubjectKind.DELIVERY_SCOPE,
        "subject_id": str(tenant_id),
        "reason": "partner incident",
        "outcome": "done",
    }
    return ActionRecord(**{**fields, **overrides})


async def rows(factory, tenant_id) -> list[dict]:
    return await factory.admin(
        "SELECT * FROM operator_actions WHERE tenant_id = %(t)s ORDER BY id", {"t": tenant_id}
    )


@pytest.mark.parametrize("role", ALL_ROLES)
async def test_nobody_updates_deletes_or_truncates_the_ledger(database, factory, api_store, role):
    tenant = await factory.tenant()
    await api_store.record_operator_action(record(tenant))
    before = await rows(factory, tenant)
    for statement in (
        "UPDATE operator_actions SET reason = 'tampered' WHERE tenant_id = %(t)s",
        "DELETE FROM operator_actions WHERE tenant_id = %(t)s",
        "TRUNCATE operator_actions",
    ):
        async with acting_as(database, role) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement, {"t": tenant})
    assert await rows(factory, tenant) == before


async def test_not_even_the_owner_rewrites_it(factory, api_store):
    tenant = await factory.tenant()
    await api_store.record_operator_action(record(tenant))
    for statement in (
        "UPDATE operator_actions SET principal = 'someone else' WHERE tenant_id = %(t)s",
        "DELETE FROM operator_actions WHERE tenant_id = %(t)s",
        "TRUNCATE operator_actions",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            await factory.admin(statement, {"t": tenant})
        assert refused.value.diag.constraint_name == "ck_operator_actions_append_only"
    assert len(await rows(factory, tenant)) == 1


async def test_the_roles_that_write_it_may_insert_and_read_it_and_nothing_more(factory):
    found = await factory.admin(
        "SELECT r AS role, p AS privilege FROM unnest(%(roles)s::text[]) r,"
        " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p"
        " WHERE has_table_privilege(r, 'operator_actions', p) ORDER BY 1, 2",
        {"roles": ALL_ROLES},
    )
    assert {(r["role"], r["privilege"]) for r in found} == {
        (role, privilege) for role in WRITERS for privilege in ("INSERT", "SELECT")
    }


@pytest.mark.parametrize(
    "document",
    [
        {"credential_ref": "/etc/keys/partner"},
        {"destination": {"pgp_signing_key_ref": "/keys/tenant.asc"}},
        [{"webhook_secret": "whsec_abc"}],
        {"password": "hunter2"},
        {"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----"},
    ],
    ids=["credential", "nested-reference", "webhook-secret", "password", "private-key"],
)
async def test_a_row_holding_a_secret_is_refused_whoever_writes_it(factory, api_store, document):
    tenant = await factory.tenant()
    raw = record(tenant).params()
    raw["after"] = json.dumps(document)
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin(
            "INSERT INTO operator_actions (tenant_id, principal, role, action, subject_kind, subject_id, outcome,"
            " after) VALUES (%(tenant_id)s, %(principal)s, %(role)s, %(action)s, %(subject_kind)s, %(subject_id)s,"
            " %(outcome)s, %(after)s::jsonb)",
            raw,
        )
    assert refused.value.diag.constraint_name == "ck_operator_actions_no_secrets"
    # what the service records instead: the reference as "set", the secret left out
    await api_store.record_operator_action(record(tenant, after=document))
    [kept] = await rows(factory, tenant)
    assert kept["after"] == without_secrets(document)
    assert "/etc/keys" not in json.dumps(kept["after"]) and "hunter2" not in json.dumps(kept["after"])


async def test_the_second_person_of_a_two_person_action_is_never_its_first(factory, api_store):
    tenant = await factory.tenant()
    with pytest.raises(ConstraintRefused) as refused:
        await api_store.record_operator_action(
            record(tenant, approval_id=uuid.uuid4(), requested_by="sam.ops", principal="sam.ops")
        )
    assert refused.value.constraint == "ck_operator_actions_second_person"


async def test_an_action_and_its_row_commit_together_or_not_at_all(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)

    class Abandoned(Exception):
        pass

    # the pause commits with its row
    paused = record(tenant, subject_id=str(destination))
    async with api_store.recording(paused):
        await api_store.set_delivery_switch(
            scope=SwitchScope.DESTINATION,
            tenant_id=tenant,
            destination_id=destination,
            enabled=False,
            reason="partner incident",
            changed_by="sam.ops",
        )
    assert paused.written and len(await rows(factory, tenant)) == 1

    # an action that rolled back leaves neither its change nor its row
    changes = await factory.admin(
        "SELECT count(*) AS n FROM delivery_switch_changes WHERE tenant_id = %(t)s", {"t": tenant}
    )
    with pytest.raises(Abandoned):
        async with api_store.recording(
            record(tenant, action=AuditAction.RESUME, subject_id=str(destination))
        ):
            await api_store.set_delivery_switch(
                scope=SwitchScope.DESTINATION,
                tenant_id=tenant,
                destination_id=destination,
                enabled=True,
                reason="fixed",
                changed_by="sam.ops",
            )
            raise Abandoned
    assert len(await rows(factory, tenant)) == 1
    assert (
        await factory.admin(
            "SELECT count(*) AS n FROM delivery_switch_changes WHERE tenant_id = %(t)s", {"t": tenant}
        )
        == changes
    )
    [active] = await factory.admin(
        "SELECT count(*) AS n FROM delivery_pauses WHERE destination_id = %(d)s AND released_at IS NULL",
        {"d": destination},
    )
    assert active["n"] == 1


async def test_a_statement_that_fails_inside_the_action_undoes_itself_only(factory, api_store):
    # Each statement of a recorded action runs in a savepoint, so a refusal the service turns into an answer
    # (a 409, a 422) is recorded with that outcome in the same transaction.
    tenant = await factory.tenant()
    refused = record(tenant, outcome=None)
    async with api_store.recording(refused):
        with pytest.raises(ConstraintRefused):
            await api_store.set_delivery_switch(
                scope=SwitchScope.DESTINATION,
                tenant_id=tenant,
                destination_id=uuid.uuid4(),  # not the tenant's: the foreign key refuses it
                enabled=False,
                reason="x",
                changed_by="sam.ops",
            )
        refused.outcome = "invalid"
    [kept] = await rows(factory, tenant)
    assert kept["outcome"] == "invalid"


async def test_a_page_reads_the_ledger_by_keyset_through_its_filters(factory, api_store):
    tenant = await factory.tenant()
    for n in range(5):
        await api_store.record_operator_action(
            record(tenant, principal="rita.ops" if n % 2 else "sam.ops", subject_id=f"s{n}")
        )
    first = await api_store.page_operator_actions(tenant, limit=2)
    second = await api_store.page_operator_actions(tenant, limit=2, before_id=first[-1].id)
    assert [r.subject_id for r in first + second] == ["s4", "s3", "s2", "s1"]
    assert [
        r.subject_id for r in await api_store.page_operator_actions(tenant, limit=9, principal="rita.ops")
    ] == [
        "s3",
        "s1",
    ]
    assert [
        r.subject_id for r in await api_store.page_operator_actions(tenant, limit=9, subject_id="s2")
    ] == ["s2"]
    other = await factory.tenant("globex")
    assert await api_store.page_operator_actions(other, limit=9) == []


async def test_the_ledgers_indexes_serve_each_filter(factory):
    # A page is an index range whatever the filter: each index ends in the keyset's id.
    found = await factory.admin(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'operator_actions' ORDER BY 1", {}
    )
    definitions = {r["indexname"]: r["indexdef"] for r in found}
    for name, columns in {
        "ix_operator_actions_tenant": "(tenant_id, id)",
        "ix_operator_actions_principal": "(tenant_id, principal, id)",
        "ix_operator_actions_action": "(tenant_id, action, id)",
        "ix_operator_actions_subject": "(tenant_id, subject_kind, subject_id, id)",
        "ix_operator_actions_subject_id": "(tenant_id, subject_id, id)",  # the subject without its kind (0040)
    }.items():
        assert definitions[name].endswith(columns), (name, definitions[name])

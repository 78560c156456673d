"""Two people for what re-opens deliveries, in the database (issue #26 item 3, migration 0032): an approval is
decided once, by another principal of the tenant whose role may do the action, before it expires; and each
two-person write (a correction, a replacement with an overwrite agreement, an admin's change of where
deliveries go or whom they trust, the release of another's pause) is refused without an approval that its
writer decided and that has not run yet. What the database says agrees with ``service/permissions.py``."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from db.errors import ConstraintRefused
from domain.audit import TWO_PERSON_DESTINATION_FIELDS, TwoPersonAction
from domain.controls import SwitchScope
from domain.models import FailureCode, JobStatus
from service.permissions import TWO_PERSON_ROLES
from tests.db.test_permissions import acting_as


async def ask(factory, tenant, action: str, subject, parameters: dict, *, by: str, role: str) -> uuid.UUID:
    await factory.principal(tenant, by, role)
    [row] = await factory.admin(
        "INSERT INTO approvals (tenant_id, action, subject_kind, subject_id, parameters, reason, requested_by,"
        " requested_role, expires_at) VALUES (%(t)s, %(a)s, 'export', %(s)s, %(p)s::jsonb, 'why', %(b)s, %(r)s,"
        " clock_timestamp() + interval '1 hour') RETURNING id",
        {"t": tenant, "a": action, "s": str(subject), "p": json.dumps(parameters), "b": by, "r": role},
    )
    return row["id"]


async def decide(database, tenant, approval, *, by: str, role: str, decision: str = "approved") -> None:
    async with acting_as(database, "exports_api") as conn:
        await conn.execute(
            "UPDATE approvals SET decision = %(d)s, decided_by = %(b)s, decided_role = %(r)s"
            " WHERE tenant_id = %(t)s AND id = %(id)s",
            {"d": decision, "b": by, "r": role, "t": tenant, "id": approval},
        )


async def expire(factory, approval) -> None:
    """Move an approval's time limit into the past (the database clock decides; set on the row, set-up only)."""
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")  # past the guard, for this set-up alone
        await conn.execute(
            "UPDATE approvals SET requested_at = clock_timestamp() - interval '2 hours',"
            " expires_at = clock_timestamp() - interval '1 hour' WHERE id = %(id)s",
            {"id": approval},
        )


# -- what the database and the service each state ----------------------------------------------------------


async def test_the_databases_roles_per_action_are_the_services(factory):
    for action in TwoPersonAction:
        [row] = await factory.admin("SELECT approval_roles(%(a)s) AS roles", {"a": action.value})
        assert sorted(row["roles"]) == TWO_PERSON_ROLES[action.value], action


async def test_the_databases_two_person_destination_fields_are_the_services(factory):
    [row] = await factory.admin("SELECT two_person_destination_fields() AS fields", {})
    assert set(row["fields"]) == TWO_PERSON_DESTINATION_FIELDS


# -- the approval's own rules -----------------------------------------------------------------------------


async def test_the_requester_may_not_decide_its_own_approval(database, factory):
    tenant = await factory.tenant()
    approval = await ask(
        factory, tenant, "replace_with_overwrite", uuid.uuid4(), {}, by="sam.ops", role="operator"
    )
    for decision in ("approved", "declined"):
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await decide(database, tenant, approval, by="sam.ops", role="operator", decision=decision)
        assert refused.value.diag.constraint_name == "ck_approvals_second_person"
    [row] = await factory.admin("SELECT decision FROM approvals WHERE id = %(id)s", {"id": approval})
    assert row["decision"] is None


async def test_an_approval_past_its_time_limit_cannot_be_decided(database, factory):
    tenant = await factory.tenant()
    approval = await ask(
        factory, tenant, "replace_with_overwrite", uuid.uuid4(), {}, by="sam.ops", role="operator"
    )
    await expire(factory, approval)
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await decide(database, tenant, approval, by="rita.ops", role="operator")
    assert refused.value.diag.constraint_name == "ck_approvals_expired"


@pytest.mark.parametrize(
    ("action", "role"),
    [("correct_outcome", "operator"), ("change_destination", "reconciler"), ("resume_pause", "viewer")],
)
async def test_a_role_that_may_not_do_the_action_may_neither_ask_nor_decide(database, factory, action, role):
    tenant = await factory.tenant()
    allowed = TWO_PERSON_ROLES[action][0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        await ask(factory, tenant, action, uuid.uuid4(), {}, by="someone", role=role)
    assert refused.value.diag.constraint_name == "ck_approvals_role"
    approval = await ask(factory, tenant, action, uuid.uuid4(), {}, by="asker", role=allowed)
    await factory.principal(tenant, "decider", role)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        await decide(database, tenant, approval, by="decider", role=role)
    assert refused.value.diag.constraint_name == "ck_approvals_role"


async def test_a_decision_is_final_and_what_was_asked_never_changes(database, factory):
    tenant = await factory.tenant()
    approval = await ask(
        factory,
        tenant,
        "replace_with_overwrite",
        uuid.uuid4(),
        {"overwrite_agreement_ref": "A"},
        by="sam.ops",
        role="operator",
    )
    await decide(database, tenant, approval, by="rita.ops", role="operator", decision="declined")
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await decide(database, tenant, approval, by="lee.reconciler", role="reconciler")
    assert refused.value.diag.constraint_name == "ck_approvals_decided"
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin(
            'UPDATE approvals SET parameters = \'{"overwrite_agreement_ref": "B"}\' WHERE id = %(id)s',
            {"id": approval},
        )
    assert refused.value.diag.constraint_name == "ck_approvals_identity"
    for role in ("exports_api", "exports_reconciler", None):
        async with acting_as(database, role) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute("DELETE FROM approvals WHERE id = %(id)s", {"id": approval})


# -- the writes that take two people -----------------------------------------------------------------------


async def test_a_correction_needs_another_reconcilers_approval_decided_by_its_recorder(
    database, factory, reconciler_store
):
    job, attempt = await factory.in_status(JobStatus.COMPLETED)
    correction = {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "attempt_id": attempt,
        "recorded_status": JobStatus.COMPLETED,
        "corrected_status": JobStatus.FAILED,
        "failure_reason": None,
        "corrected_by": "lee.reconciler",
        "evidence_ref": "listing",
        "why": "the partner never got it",
    }
    correction["failure_reason"] = FailureCode.NOT_DELIVERED
    # no approval: the statement matches nothing, and a direct insert is refused
    assert await reconciler_store.correct_outcome(**correction) is False
    async with acting_as(database, "exports_reconciler") as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status,"
                " failure_reason, corrected_by, evidence_ref, why) VALUES (%(t)s, %(j)s, %(a)s, 'Completed',"
                " 'Failed', 'NotDelivered', 'lee.reconciler', 'e', 'w')",
                {"t": job.tenant_id, "j": job.id, "a": attempt},
            )
    assert refused.value.diag.constraint_name == "ck_outcome_corrections_approved"

    # approved by someone else than its recorder: still nothing
    approval = await ask(
        factory,
        job.tenant_id,
        "correct_outcome",
        job.id,
        {"attempt_id": str(attempt), "corrected_status": "Failed"},
        by="kim.reconciler",
        role="reconciler",
    )
    await decide(database, job.tenant_id, approval, by="reconciler@acme", role="reconciler")
    assert await reconciler_store.correct_outcome(**correction) is False
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED

    # decided by lee, asked by kim: lee records it
    approval = await ask(
        factory,
        job.tenant_id,
        "correct_outcome",
        job.id,
        {"attempt_id": str(attempt), "corrected_status": "Failed"},
        by="kim.reconciler",
        role="reconciler",
    )
    await decide(database, job.tenant_id, approval, by="lee.reconciler", role="reconciler")
    assert await reconciler_store.correct_outcome(**correction) is True
    assert (await factory.job(job.id)).status == JobStatus.FAILED


async def test_an_approval_runs_once(database, factory, reconciler_store, api_store):
    original, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    approval = await ask(
        factory,
        original.tenant_id,
        "replace_with_overwrite",
        original.id,
        {"overwrite_agreement_ref": "AGR-1"},
        by="sam.ops",
        role="operator",
    )
    await decide(database, original.tenant_id, approval, by="rita.ops", role="operator")
    await api_store.conclude_approval(tenant_id=original.tenant_id, approval_id=approval, outcome="created")
    # spent: the replacement it approved can no longer be made with it
    created = await api_store.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="rita.ops",
        replacement_reason="partner lost it",
        overwrite_agreement_ref="AGR-1",
    )
    assert created is None
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin("UPDATE approvals SET outcome = 'refused' WHERE id = %(id)s", {"id": approval})
    assert refused.value.diag.constraint_name == "ck_approvals_executed"


async def test_a_replacement_with_an_overwrite_agreement_needs_its_creators_approval(
    database, factory, api_store
):
    original, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    replace = {
        "tenant_id": original.tenant_id,
        "original_job_id": original.id,
        "created_by": "rita.ops",
        "replacement_reason": "partner lost it",
        "overwrite_agreement_ref": "AGR-9",
    }
    assert await api_store.create_replacement(**replace) is None
    async with acting_as(database, "exports_api") as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key,"
                " replaces_job_id, created_by, replacement_reason, overwrite_agreement_ref, list_name)"
                " VALUES (gen_random_uuid(), %(t)s, 'Queued', 1, %(d)s, %(k)s, %(o)s, 'rita.ops', 'r', 'AGR-9',"
                " %(l)s)",
                {
                    "t": original.tenant_id,
                    "d": original.destination_id,
                    "k": original.delivery_key,
                    "o": original.id,
                    "l": original.list_name,
                },
            )
    assert refused.value.diag.constraint_name == "ck_export_jobs_overwrite_approved"

    # an approval of another agreement does not do
    approval = await ask(
        factory,
        original.tenant_id,
        "replace_with_overwrite",
        original.id,
        {"overwrite_agreement_ref": "AGR-1"},
        by="sam.ops",
        role="operator",
    )
    await decide(database, original.tenant_id, approval, by="rita.ops", role="operator")
    assert await api_store.create_replacement(**replace) is None
    # this agreement, approved by its creator
    approval = await ask(
        factory,
        original.tenant_id,
        "replace_with_overwrite",
        original.id,
        {"overwrite_agreement_ref": "AGR-9"},
        by="sam.ops",
        role="operator",
    )
    await decide(database, original.tenant_id, approval, by="rita.ops", role="operator")
    assert await api_store.create_replacement(**replace) is not None
    # a replacement without an agreement takes one person
    assert (await factory.job(original.id)).status == JobStatus.OUTCOME_UNKNOWN


@pytest.mark.parametrize(
    "field", sorted(TWO_PERSON_DESTINATION_FIELDS - {"pgp_recipient_keys", "pgp_signing_key_ref"})
)
async def test_an_admins_change_of_where_deliveries_go_needs_another_admins_approval(
    database, factory, api_store, field
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    value = {
        "host": "sftp.elsewhere.example",
        "port": 2022,
        "username": "other",
        "credential_ref": "/etc/keys/other",
        "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKey",
        "host_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKey"],
    }[field]
    edit = {
        "tenant_id": tenant,
        "destination_id": destination,
        "expected_version": 1,
        "changes": {field: value},
        "changed_by": "ada.admin",
        "changed_role": "admin",
        "reason": "partner moved",
    }
    with pytest.raises(ConstraintRefused) as refused:
        await api_store.edit_destination_if_version(**edit)
    assert refused.value.constraint == "ck_destination_versions_approved"

    # approved for another value: refused still
    approval = await ask(
        factory,
        tenant,
        "change_destination",
        destination,
        {"changes": {field: "something else"}},
        by="ann.admin",
        role="admin",
    )
    await factory.principal(tenant, "ada.admin", "admin")
    await decide(database, tenant, approval, by="ada.admin", role="admin")
    with pytest.raises(ConstraintRefused):
        await api_store.edit_destination_if_version(**edit)

    approval = await ask(
        factory,
        tenant,
        "change_destination",
        destination,
        {"changes": {field: value}},
        by="ann.admin",
        role="admin",
    )
    await decide(database, tenant, approval, by="ada.admin", role="admin")
    assert (await api_store.edit_destination_if_version(**edit)).matched


async def test_a_change_of_anything_else_takes_one_admin_and_an_administrators_connection_none(
    factory, api_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    edited = await api_store.edit_destination_if_version(
        tenant_id=tenant,
        destination_id=destination,
        expected_version=1,
        changes={"remote_dir": "/v2", "name": "renamed"},
        changed_by="ada.admin",
        changed_role="admin",
        reason="tidy",
    )
    assert edited.matched
    # the platform's administrators act outside any tenant's roles (db/admin.py, the 'owner' role)
    assert (await factory.change_destination(tenant, destination, host="sftp.moved.example")) == 3


async def test_releasing_anothers_pause_needs_an_approval_decided_by_the_releaser(
    database, factory, api_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    paused = await api_store.set_delivery_switch(
        scope=SwitchScope.DESTINATION,
        tenant_id=tenant,
        destination_id=destination,
        enabled=False,
        reason="partner compromised",
        changed_by="rita.ops",
    )
    [pause] = paused.pause_ids or []
    release = {
        "scope": SwitchScope.DESTINATION,
        "tenant_id": tenant,
        "destination_id": destination,
        "enabled": True,
        "reason": "looks fine",
        "changed_by": "sam.ops",
        "pause_ids": [pause],
    }
    # the statement leaves it, and a direct UPDATE is refused
    resumed = await api_store.set_delivery_switch(**release)
    assert pause not in (resumed.pause_ids or []) and resumed.enabled is False
    async with acting_as(database, "exports_api") as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "UPDATE delivery_pauses SET released_at = clock_timestamp(), released_by = 'sam.ops',"
                " release_reason = 'x' WHERE id = %(p)s",
                {"p": pause},
            )
    assert refused.value.diag.constraint_name == "ck_delivery_pauses_second_person"

    approval = await ask(factory, tenant, "resume_pause", pause, {}, by="lee.reconciler", role="reconciler")
    await decide(database, tenant, approval, by="sam.ops", role="operator")
    resumed = await api_store.set_delivery_switch(**release)
    assert resumed.pause_ids == [pause] and resumed.enabled is True


async def test_a_host_key_trip_is_released_only_with_an_approval_even_by_whoever_tripped_it(
    database, factory, api_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    tripped = await api_store.trip_host_key_pause(
        tenant_id=tenant, destination_id=destination, reason="host key changed", tripped_by="sam.ops"
    )
    [pause] = tripped.pause_ids or []
    own = await api_store.set_delivery_switch(
        scope=SwitchScope.DESTINATION,
        tenant_id=tenant,
        destination_id=destination,
        enabled=True,
        reason="I tripped it",
        changed_by="sam.ops",
    )
    assert own.pause_ids == [] and own.enabled is False  # its own resume releases manual pauses only
    async with acting_as(database, "exports_api") as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "UPDATE delivery_pauses SET released_at = clock_timestamp(), released_by = 'sam.ops',"
                " release_reason = 'x' WHERE id = %(p)s",
                {"p": pause},
            )
    assert refused.value.diag.constraint_name == "ck_delivery_pauses_second_person"

    approval = await ask(factory, tenant, "resume_pause", pause, {}, by="rita.ops", role="operator")
    await decide(database, tenant, approval, by="sam.ops", role="operator")
    released = await api_store.set_delivery_switch(
        scope=SwitchScope.DESTINATION,
        tenant_id=tenant,
        destination_id=destination,
        enabled=True,
        reason="fingerprint confirmed with the partner",
        changed_by="sam.ops",
        pause_ids=[pause],
    )
    assert released.pause_ids == [pause] and released.enabled is True


async def test_an_operators_reconcile_matches_nothing_even_over_the_reconcilers_pool(
    factory, reconciler_store
):
    # The edge is the reconciler role's (0002), and its statement names who reconciles (0032): an operator named
    # there changes nothing, whatever pool a service sent it over; a reconciler of the tenant does.
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    reconcile = {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "attempt_id": attempt,
        "resolution": JobStatus.COMPLETED,
        "evidence_summary": "looked fine to me",
    }
    assert await reconciler_store.reconcile_unknown(reconciled_by="sam.ops", **reconcile) is False
    assert await reconciler_store.reconcile_unknown(reconciled_by="nobody@else", **reconcile) is False
    assert await factory.job(job.id) == job
    await factory.admin(
        "UPDATE principals SET revoked_at = clock_timestamp(), revoked_by = 'x'"
        " WHERE tenant_id = %(t)s AND name = 'lee.reconciler'",
        {"t": job.tenant_id},
    )
    assert await reconciler_store.reconcile_unknown(reconciled_by="lee.reconciler", **reconcile) is False
    assert await reconciler_store.reconcile_unknown(reconciled_by="kim.reconciler", **reconcile) is True
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED

"""The policy check's facts and its refusal, in the database (000 "The Worker"; issue 9.1): one statement
reads the job's version, its destination row, the creator's principal row, whether the list exists and the
switches; a refusal is Queued -> Rejected for that version only, with a code from the CHECK's fixed list
and the message people read; and a token authenticates its principal only while that principal holds it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from db.admin import (
    PrincipalRefused,
    insert_token,
    retire_destination,
    revoke_principal,
    set_destination_contract,
    upsert_principal,
)
from db.queries import q
from domain.controls import PolicyFacts
from domain.models import JobStatus, RejectionCode
from rules.policy import evaluate_policy
from service.auth import caller_for_token, mint_token, token_sha256
from tests.db.test_statements import prepare_and_describe


def test_the_facts_statement_returns_exactly_the_fields_of_its_model(database):
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        assert sorted(prepare_and_describe(conn, q("read_policy_facts"))) == sorted(PolicyFacts.model_fields)


async def test_the_facts_of_an_allowed_export(factory, worker_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant, name="partner-new")
    await factory.contacts(tenant, "newsletter", [("a@example.test", "A", "B")])
    job = await factory.queued(tenant, destination, list_name="newsletter")

    facts = await worker_store.read_policy_facts(job.id)

    assert facts is not None
    assert (facts.status, facts.version, facts.created_by) == (JobStatus.QUEUED, job.version, "admin@acme")
    assert facts.destination_found and facts.destination_name == "partner-new"
    assert facts.destination_retired_at is None and facts.contract_ends_on is None
    assert facts.contract_starts_on is not None and facts.contract_starts_on <= facts.today
    assert facts.principal_found and facts.principal_role == "operator" and facts.principal_revoked_at is None
    assert facts.list_exists and facts.deliveries_open
    assert evaluate_policy(facts).allowed


async def test_the_facts_see_a_retirement_a_contract_a_revocation_and_a_missing_list(
    factory, worker_store, database
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    created = await factory.api.create_original(  # not factory.queued: that fills an empty list
        tenant_id=tenant, destination_id=destination, list_name="nobody-here", created_by="admin@acme"
    )
    job = await factory.job(created.job_id)
    admin = database.admin_url

    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and not facts.list_exists
    assert evaluate_policy(facts).code == RejectionCode.LIST_MISSING

    assert await revoke_principal(admin, tenant_id=tenant, name="admin@acme", revoked_by="lee.admin")
    assert not await revoke_principal(admin, tenant_id=tenant, name="admin@acme", revoked_by="lee.admin")
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.principal_revoked_at is not None
    assert evaluate_policy(facts).code == RejectionCode.CREATOR_REVOKED

    today = facts.today
    ended = await set_destination_contract(
        admin,
        tenant_id=tenant,
        destination_id=destination,
        starts_on=today - timedelta(days=365),
        ends_on=today - timedelta(days=1),
    )
    assert ended
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.contract_ends_on is not None and facts.contract_ends_on < today
    assert evaluate_policy(facts).code == RejectionCode.CONTRACT_ENDED

    assert await retire_destination(
        admin, tenant_id=tenant, destination_id=destination, retired_by="lee.admin"
    )
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.destination_retired_at is not None
    assert evaluate_policy(facts).code == RejectionCode.DESTINATION_RETIRED


async def test_a_creator_who_is_no_principal_reads_as_not_found(factory, api_store, worker_store):
    tenant = await factory.tenant(principals=())
    created = await api_store.create_original(
        tenant_id=tenant,
        destination_id=await factory.destination(tenant),
        list_name="main",
        created_by="ghost",
    )
    facts = await worker_store.read_policy_facts(created.job_id)
    assert facts is not None and not facts.principal_found and facts.principal_role is None
    assert evaluate_policy(facts).code == RejectionCode.CREATOR_UNKNOWN


async def test_the_lists_a_principal_may_export_are_read(factory, worker_store, database):
    tenant = await factory.tenant()
    await upsert_principal(
        database.admin_url, tenant_id=tenant, name="admin@acme", role="operator", export_lists=["vip"]
    )
    job = await factory.queued(tenant, await factory.destination(tenant), list_name="main")
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.principal_lists == ["vip"]
    assert evaluate_policy(facts).code == RejectionCode.CREATOR_NOT_PERMITTED


async def test_the_facts_of_a_missing_job_are_none(worker_store):
    assert await worker_store.read_policy_facts(uuid.uuid4()) is None


# -- the refusal ----------------------------------------------------------------------------------------


async def test_a_rejection_writes_its_code_and_message_for_the_checked_version_only(
    factory, api_store, worker_store
):
    job = await factory.queued()
    edited = await api_store.edit_terms_if_queued(
        tenant_id=job.tenant_id,
        job_id=job.id,
        expected_version=job.version,
        destination_id=job.destination_id,
        list_name="other",
    )
    assert edited == job.version + 1
    message = "Rejected: partner-old's contract ended on 2026-10-31"

    assert not await worker_store.reject_if_queued(job.id, job.version, RejectionCode.CONTRACT_ENDED, message)
    assert await worker_store.reject_if_queued(job.id, edited, RejectionCode.CONTRACT_ENDED, message)

    row = await factory.job(job.id)
    assert (row.status, row.rejection_code, row.rejection_reason) == (
        JobStatus.REJECTED,
        "contract_ended",
        message,
    )
    assert row.attempt_count == 0 and await factory.event_kinds(job.id) == []


@pytest.mark.parametrize(
    "assignment",
    [
        "status = 'Rejected'",  # a Rejected row without a code
        "status = 'Rejected', rejection_code = 'because', rejection_reason = 'Rejected: x'",  # not a code
        "status = 'Rejected', rejection_code = 'list_missing'",  # a code without its message
        "rejection_code = 'list_missing', rejection_reason = 'x'",  # a code on a row that is not Rejected
    ],
)
async def test_the_database_refuses_a_rejection_without_a_fixed_code_and_its_message(
    factory, database, assignment
):
    job = await factory.queued()
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_worker")
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(f"UPDATE export_jobs SET {assignment} WHERE id = %(id)s", {"id": job.id})  # noqa: S608
    assert await factory.status(job.id) == JobStatus.QUEUED


# -- principals and tokens ------------------------------------------------------------------------------


async def test_a_token_stops_working_when_its_principal_is_revoked(factory, api_store, database):
    tenant = await factory.tenant(principals=())
    token = await mint_token(database.admin_url, tenant_id=tenant, principal="kim.ops", role="operator")
    caller = await caller_for_token(api_store, token)
    assert caller is not None and (caller.principal, caller.role) == ("kim.ops", "operator")

    assert await revoke_principal(
        database.admin_url, tenant_id=tenant, name="kim.ops", revoked_by="lee.admin"
    )
    assert await caller_for_token(api_store, token) is None

    with pytest.raises(PrincipalRefused):
        await mint_token(database.admin_url, tenant_id=tenant, principal="kim.ops", role="operator")

    await upsert_principal(database.admin_url, tenant_id=tenant, name="kim.ops", role="operator")
    assert await caller_for_token(api_store, token) is not None  # reinstated


async def test_a_token_is_honored_only_for_the_role_its_principal_holds(factory, api_store, database):
    tenant = await factory.tenant(principals=())
    token = await mint_token(database.admin_url, tenant_id=tenant, principal="kim", role="reconciler")
    with pytest.raises(PrincipalRefused):
        await mint_token(database.admin_url, tenant_id=tenant, principal="kim", role="operator")

    await upsert_principal(database.admin_url, tenant_id=tenant, name="kim", role="operator")
    assert await caller_for_token(api_store, token) is None  # a reconciler's token, an operator now


async def test_a_token_always_names_a_principal_of_its_tenant(factory, database):
    tenant = await factory.tenant(principals=())
    await factory.tenant("globex", principals=("eve",))  # eve is a principal of globex only
    await insert_token(
        database.admin_url,
        token_sha256=token_sha256("t1"),
        tenant_id=tenant,
        principal="new.one",
        role="operator",
    )
    rows = await factory.admin(
        "SELECT role FROM principals WHERE tenant_id = %(t)s AND name = 'new.one'", {"t": tenant}
    )
    assert rows == [{"role": "operator"}]  # minting made the name a principal of that tenant
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        await factory.admin(
            "INSERT INTO api_tokens (token_sha256, tenant_id, principal, role) VALUES (%(h)s, %(t)s, 'eve', 'operator')",
            {"h": token_sha256("t2"), "t": tenant},
        )

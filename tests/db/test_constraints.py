"""The schema's constraints on the real server (000 "The Tables"; test matrix rows "Creation" and
"Replacement creation"): what the creation statements insert, what they refuse, and what the database
refuses even from a superuser's direct INSERT or UPDATE.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from db.errors import ConstraintRefused, IdempotencyConflict, UnknownReference
from domain.models import DeliveryOutcome, ExportJob, FailureCode, JobStatus
from tests.db.race import still_waiting


async def superuser_refuses(factory, statement: Any, params: dict[str, Any]) -> psycopg.Error:
    """Run ``statement`` as the superuser and return the database's refusal (the test fails if it succeeds)."""
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.IntegrityError) as refused:
            await conn.execute(statement, params)
    return refused.value


_DIRECT_INSERT = (
    "INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, replaces_job_id,"
    " created_by, replacement_reason, woken_at, list_name)"
    " VALUES (%(id)s, %(tenant_id)s, 'Queued', 1, %(destination_id)s, %(delivery_key)s, %(replaces_job_id)s,"
    " 'repair-script', %(reason)s, clock_timestamp(), 'main')"
)


def direct_insert(job: ExportJob, **overrides: Any) -> dict[str, Any]:
    """Parameters for a superuser's direct INSERT of a job shaped like ``job``, with a new ID."""
    params = {
        "id": uuid.uuid4(),
        "tenant_id": job.tenant_id,
        "destination_id": job.destination_id,
        "delivery_key": job.delivery_key,
        "replaces_job_id": None,
        "reason": None,
    }
    params.update(overrides)
    return params


async def jobs_with_key(factory, tenant_id: UUID, delivery_key: str) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %(t)s AND delivery_key = %(k)s",
        {"t": tenant_id, "k": delivery_key},
    )
    return rows[0]["n"]


async def replaceable(factory, status: JobStatus, code: FailureCode = FailureCode.NOT_DELIVERED) -> ExportJob:
    """An original in ``status`` (with ``code`` when Failed), reached along the protocol's edges."""
    if code == FailureCode.ATTEMPTS_EXHAUSTED:
        job, attempt = await factory.running()
        await factory.expire_lease(job.id)
        assert await factory.recovery.exhaust_expired_attempt(job.id, attempt, 1, "recovery-1")
        return await factory.job(job.id)
    job, _ = await factory.in_status(status, code=code)
    return job


async def create_replacement(factory, original: ExportJob, tenant_id: UUID | None = None, **kw: Any):
    return await factory.api.create_replacement(
        tenant_id=tenant_id or original.tenant_id,
        original_job_id=original.id,
        created_by="lee.reconciler",
        replacement_reason="partner confirmed nothing was published",
        **kw,
    )


# -- creation ---------------------------------------------------------------------------------------


async def test_creation_writes_job_deliveries_and_outbox_together(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)

    created = await api_store.create_original(
        tenant_id=tenant, destination_id=destination, list_name="main", created_by="admin@acme"
    )

    job = await factory.job(created.job_id)
    assert (job.status, job.version, job.attempt_count, job.replaces_job_id) == (JobStatus.QUEUED, 1, 0, None)
    deliveries = await factory.admin(
        "SELECT original_job_id FROM deliveries WHERE tenant_id = %(t)s AND delivery_key = %(k)s",
        {"t": tenant, "k": job.delivery_key},
    )
    assert deliveries == [{"original_job_id": job.id}]
    assert await factory.outbox_count(job.id) == 1


async def test_failed_creation_leaves_no_job_no_deliveries_row_and_no_wake_up(factory, api_store):
    tenant = await factory.tenant()
    job_id, key = uuid.uuid4(), f"key-{uuid.uuid4()}"

    with pytest.raises(UnknownReference):
        await api_store.create_original(
            tenant_id=tenant,
            destination_id=uuid.uuid4(),  # no such destination: the job insert fails after the deliveries insert
            list_name="main",
            created_by="admin@acme",
            idempotency_key="click-1",
            fingerprint="f1",
            job_id=job_id,
            delivery_key=key,
        )

    counts = await factory.admin(
        "SELECT (SELECT count(*) FROM export_jobs WHERE id = %(j)s) AS jobs,"
        " (SELECT count(*) FROM deliveries WHERE tenant_id = %(t)s) AS deliveries,"
        " (SELECT count(*) FROM outbox WHERE job_id = %(j)s) AS outbox,"
        " (SELECT count(*) FROM idempotency_keys WHERE tenant_id = %(t)s) AS keys",
        {"j": job_id, "t": tenant},
    )
    assert counts == [{"jobs": 0, "deliveries": 0, "outbox": 0, "keys": 0}]


async def test_second_original_with_the_same_key_is_refused(factory, api_store):
    first = await factory.queued()
    second_id = uuid.uuid4()

    with pytest.raises(ConstraintRefused) as refused:
        await api_store.create_original(
            tenant_id=first.tenant_id,
            destination_id=first.destination_id,
            list_name="main",
            created_by="admin@acme",
            job_id=second_id,
            delivery_key=first.delivery_key,
        )

    assert refused.value.constraint in {"pk_deliveries", "uq_export_jobs_original_key"}
    assert await api_store.get_job(second_id) is None
    assert await factory.outbox_count(second_id) == 0


async def test_second_original_with_the_same_key_is_refused_even_when_inserted_directly(factory):
    first = await factory.queued()

    refused = await superuser_refuses(factory, _DIRECT_INSERT, direct_insert(first))

    assert isinstance(refused, psycopg.errors.UniqueViolation)
    assert refused.diag.constraint_name == "uq_export_jobs_original_key"
    assert await jobs_with_key(factory, first.tenant_id, first.delivery_key) == 1


async def test_the_same_key_in_another_tenant_is_another_delivery(factory, api_store):
    first = await factory.queued()
    other_tenant = await factory.tenant("globex")

    created = await api_store.create_original(
        tenant_id=other_tenant,
        destination_id=await factory.destination(other_tenant),
        list_name="main",
        created_by="admin@globex",
        delivery_key=first.delivery_key,
    )

    assert (await factory.job(created.job_id)).delivery_key == first.delivery_key


# -- idempotent creation ------------------------------------------------------------------------------


async def test_idempotency_key_replays_the_same_request_and_refuses_a_different_one(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    create = dict(tenant_id=tenant, destination_id=destination, list_name="main", created_by="admin@acme")

    first = await api_store.create_original(idempotency_key="click-1", fingerprint="f1", **create)
    again = await api_store.create_original(idempotency_key="click-1", fingerprint="f1", **create)
    with pytest.raises(IdempotencyConflict) as conflict:
        await api_store.create_original(idempotency_key="click-1", fingerprint="f2", **create)

    assert (first.replayed, again.replayed, again.job_id) == (False, True, first.job_id)
    assert conflict.value.job_id == first.job_id
    assert [j.id for j in await api_store.list_tenant_jobs(tenant)] == [first.job_id]
    assert await factory.outbox_count(first.job_id) == 1

    # The key is scoped to the tenant: another tenant's identical key is another request.
    other = await factory.tenant("globex")
    theirs = await api_store.create_original(
        tenant_id=other,
        destination_id=await factory.destination(other),
        list_name="main",
        created_by="admin@globex",
        idempotency_key="click-1",
        fingerprint="f1",
    )
    assert (theirs.replayed, theirs.job_id != first.job_id) == (False, True)


def _create_params(tenant: UUID, destination: UUID, key: str, fingerprint: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "job_id": uuid.uuid4(),
        "delivery_key": str(uuid.uuid4()),
        "destination_id": destination,
        "created_by": "admin@acme",
        "list_name": "main",
        "idempotency_key": key,
        "fingerprint": fingerprint,
        "traceparent": None,
    }


@pytest.mark.parametrize("first_commits", [True, False])
async def test_simultaneous_creations_with_one_idempotency_key_create_one_job(factory, kit, first_commits):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    held = await kit.hold("exports_api")
    params = _create_params(tenant, destination, "click-7", "f1")
    assert await held.run("create_original", params) == [{"job_id": params["job_id"]}]

    api = await kit.solo("exports_api")
    second = asyncio.create_task(
        api.store.create_original(
            tenant_id=tenant,
            destination_id=destination,
            list_name="main",
            created_by="admin@acme",
            idempotency_key="click-7",
            fingerprint="f1",
        )
    )
    await kit.wait_until_blocked_by(api.pid, held.pid)  # waits on the uncommitted key, not a unique error
    await still_waiting(second)

    if first_commits:
        await held.commit()
        result = await second
        assert (result.job_id, result.replayed) == (params["job_id"], True)
    else:
        await held.rollback()
        assert not (await second).replayed
    assert len(await api.store.list_tenant_jobs(tenant)) == 1


# -- Failed and its code ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignment", "status", "role"),
    [
        # Status changes are refused to the superuser by the trigger before the CHECK can speak (issue 9:
        # each edge belongs to its roles), so they run as the role that may take the edge.
        ("status = 'Failed'", JobStatus.RUNNING, "exports_worker"),  # Failed without a code
        ("failure_reason = 'BuildFailed'", JobStatus.RUNNING, None),  # a code without Failed
        ("status = 'Completed', failure_reason = 'NotDelivered'", JobStatus.DELIVERING, "exports_worker"),
        (
            "status = 'OutcomeUnknown', failure_reason = 'NotDelivered'",
            JobStatus.DELIVERING,
            "exports_worker",
        ),
    ],
)
async def test_failed_and_a_failure_code_go_together_for_any_role(factory, assignment, status, role):
    job, _ = await factory.in_status(status)
    statement = sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(a=sql.SQL(assignment))
    if role is None:
        refused = await superuser_refuses(factory, statement, {"id": job.id})
    else:
        async with await psycopg.AsyncConnection.connect(factory.db.app_url, autocommit=True) as conn:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            with pytest.raises(psycopg.errors.IntegrityError) as raised:
                await conn.execute(statement, {"id": job.id})
        refused = raised.value
    assert isinstance(refused, psycopg.errors.CheckViolation)
    assert refused.diag.constraint_name == "ck_export_jobs_failure"
    assert await factory.job(job.id) == job


async def test_the_delivery_finish_statement_cannot_write_failed_without_a_code(factory, kit, worker_store):
    job, attempt = await factory.delivering()
    with pytest.raises(ValueError):
        await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.FAILED, None)

    # The statement itself, run directly as the worker: the database refuses it.
    held = await kit.hold("exports_worker")
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await held.run(
            "finish_delivery",
            {"job_id": job.id, "attempt_id": attempt, "outcome": "Failed", "code": None, "summary": None},
        )
    assert refused.value.diag.constraint_name == "ck_export_jobs_failure"
    await held.rollback()
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


# -- replacements -----------------------------------------------------------------------------------


async def test_replacement_carries_the_original_key_destination_and_scope(factory):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    # a replacement with an overwrite agreement takes two people (0032): another asked, its creator approved
    await factory.approve(
        original.tenant_id,
        "replace_with_overwrite",
        original.id,
        {"overwrite_agreement_ref": "partner-agreement-12"},
        approved_by="lee.reconciler",
    )
    created = await create_replacement(factory, original, overwrite_agreement_ref="partner-agreement-12")
    assert created is not None

    replacement = await factory.job(created.job_id)
    assert replacement.replaces_job_id == original.id
    assert (replacement.delivery_key, replacement.destination_id, replacement.list_name) == (
        original.delivery_key,
        original.destination_id,
        original.list_name,
    )
    assert (replacement.created_by, replacement.overwrite_agreement_ref) == (
        "lee.reconciler",
        "partner-agreement-12",
    )
    assert await factory.outbox_count(replacement.id) == 1


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (JobStatus.QUEUED, None),
        (JobStatus.RUNNING, None),
        (JobStatus.DELIVERING, None),
        (JobStatus.COMPLETED, None),
        (JobStatus.CANCELED, None),
        (JobStatus.REJECTED, None),
        (JobStatus.STOPPED, None),
        (JobStatus.FAILED, FailureCode.FINAL_NAME_OCCUPIED),
        (JobStatus.FAILED, FailureCode.ORIGINAL_DELIVERED),
    ],
)
async def test_replacement_creation_inserts_nothing_for_an_original_that_may_not_be_replaced(
    factory, status, code
):
    original, _ = await factory.in_status(status, code=code or FailureCode.BUILD_FAILED)
    assert await create_replacement(factory, original) is None
    assert await jobs_with_key(factory, original.tenant_id, original.delivery_key) == 1


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (JobStatus.OUTCOME_UNKNOWN, FailureCode.NOT_DELIVERED),
        (JobStatus.FAILED, FailureCode.NOT_DELIVERED),
        (JobStatus.FAILED, FailureCode.BUILD_FAILED),
        (JobStatus.FAILED, FailureCode.ATTEMPTS_EXHAUSTED),
    ],
)
async def test_replacement_creation_accepts_an_original_that_finalized_nothing(factory, status, code):
    original = await replaceable(factory, status, code)
    assert await create_replacement(factory, original) is not None


async def test_replacement_creation_inserts_nothing_for_another_tenants_original(factory):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    intruder = await factory.tenant("globex")
    assert await create_replacement(factory, original, tenant_id=intruder) is None
    assert await jobs_with_key(factory, original.tenant_id, original.delivery_key) == 1


async def test_replacement_of_a_replacement_is_refused(factory):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    created = await create_replacement(factory, original)
    assert created is not None
    replacement, _ = await factory.in_status(
        JobStatus.FAILED, code=FailureCode.NOT_DELIVERED, job=await factory.job(created.job_id)
    )

    # The creation statement only replaces originals ...
    assert await create_replacement(factory, replacement) is None
    # ... and the database refuses a direct INSERT that names a replacement as the original.
    refused = await superuser_refuses(
        factory,
        _DIRECT_INSERT,
        direct_insert(original, replaces_job_id=replacement.id, reason="replace the replacement"),
    )
    assert isinstance(refused, psycopg.errors.ForeignKeyViolation)
    assert refused.diag.constraint_name == "fk_export_jobs_replaces"


async def test_replacement_with_another_key_is_refused_by_the_database(factory):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    unrelated = await factory.queued(original.tenant_id, original.destination_id)

    refused = await superuser_refuses(
        factory,
        _DIRECT_INSERT,
        direct_insert(original, delivery_key=unrelated.delivery_key, replaces_job_id=original.id, reason="x"),
    )

    assert isinstance(refused, psycopg.errors.ForeignKeyViolation)
    assert refused.diag.constraint_name == "fk_export_jobs_replaces"


async def test_replacement_in_another_tenant_is_refused_by_the_database(factory):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    # The other tenant even has its own delivery with the same key string; it is still not this original's.
    theirs = await factory.queued(await factory.tenant("globex"))
    await factory.api.create_original(
        tenant_id=theirs.tenant_id,
        destination_id=theirs.destination_id,
        list_name="main",
        created_by="admin@globex",
        delivery_key=original.delivery_key,
    )

    refused = await superuser_refuses(
        factory,
        _DIRECT_INSERT,
        direct_insert(
            original,
            tenant_id=theirs.tenant_id,
            destination_id=theirs.destination_id,
            replaces_job_id=original.id,
            reason="x",
        ),
    )

    assert isinstance(refused, psycopg.errors.ForeignKeyViolation)
    assert refused.diag.constraint_name == "fk_export_jobs_replaces"


async def test_of_two_simultaneous_replacements_one_fails_on_the_one_replacement_index(factory, kit):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    held = await kit.hold("exports_api")
    first_id = uuid.uuid4()
    rows = await held.run(
        "create_replacement",
        {
            "tenant_id": original.tenant_id,
            "original_job_id": original.id,
            "job_id": first_id,
            "created_by": "lee.reconciler",
            "replacement_reason": "first",
            "overwrite_agreement_ref": None,
            "traceparent": None,
        },
    )
    assert rows == [{"job_id": first_id}]

    api = await kit.solo("exports_api")
    second = asyncio.create_task(
        api.store.create_replacement(
            tenant_id=original.tenant_id,
            original_job_id=original.id,
            created_by="kim.reconciler",
            replacement_reason="second",
        )
    )
    await kit.wait_until_blocked_by(api.pid, held.pid)
    await still_waiting(second)
    await held.commit()

    with pytest.raises(ConstraintRefused) as refused:
        await second
    assert refused.value.constraint == "uq_export_jobs_one_replacement"
    assert await jobs_with_key(factory, original.tenant_id, original.delivery_key) == 2


@pytest.mark.parametrize(
    ("status", "code", "slot_freed"),
    [
        (JobStatus.QUEUED, None, False),
        (JobStatus.RUNNING, None, False),
        (JobStatus.DELIVERING, None, False),
        (JobStatus.OUTCOME_UNKNOWN, None, False),
        (JobStatus.COMPLETED, None, False),
        (JobStatus.FAILED, FailureCode.ORIGINAL_DELIVERED, False),
        (JobStatus.FAILED, FailureCode.NOT_DELIVERED, True),
        (JobStatus.FAILED, FailureCode.FINAL_NAME_OCCUPIED, True),
        (JobStatus.FAILED, FailureCode.BUILD_FAILED, True),
        (JobStatus.CANCELED, None, True),
        (JobStatus.REJECTED, None, True),
        (JobStatus.STOPPED, None, True),
    ],
)
async def test_a_replacement_that_delivered_nothing_frees_the_slot_and_any_other_keeps_it(
    factory, status, code, slot_freed
):
    original = await replaceable(factory, JobStatus.OUTCOME_UNKNOWN)
    created = await create_replacement(factory, original)
    assert created is not None
    await factory.in_status(
        status, code=code or FailureCode.BUILD_FAILED, job=await factory.job(created.job_id)
    )

    if slot_freed:
        assert await create_replacement(factory, original) is not None
    else:
        with pytest.raises(ConstraintRefused) as refused:
            await create_replacement(factory, original)
        assert refused.value.constraint == "uq_export_jobs_one_replacement"


async def test_an_exports_events_read_for_another_tenant_are_empty(factory, api_store):
    job, _ = await factory.in_status(JobStatus.COMPLETED)
    intruder = await factory.tenant("globex")

    own = await api_store.tenant_job_events(job.tenant_id, job.id)
    theirs = await api_store.tenant_job_events(intruder, job.id)

    assert [e.kind for e in own] == [e.kind for e in await api_store.job_events(job.id)]
    assert own and theirs == []

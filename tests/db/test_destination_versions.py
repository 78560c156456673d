"""Destinations as versioned contracts in the database (issue #24, items 1 and 2; migration 0021).

Every change of a destination is its next version and commits with its record (who, the role, why, the whole
row before and after), for every writer; the record is append-only by privileges; the row's trigger says which
version last changed what a delivery uses. Cutoff 2 authorizes only the version the build read: a change of
a delivery term since then refuses it (DestinationChanged), in both orders of the race; a change of the name or
the contract window does not. The job and its DeliveryAuthorized event record the version authorized, and
that version's contract stays loadable after any later edit.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from db.admin import edit_destination, retire_destination
from db.errors import DestinationNotFound
from db.pool import Role
from domain.audit import TWO_PERSON_DESTINATION_FIELDS
from domain.models import AuthorizationResult, JobStatus
from tests.db.race import authorize_params, matched, still_waiting
from tests.db.test_permissions import acting_as

ROLES: list[Role] = [
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
]


async def versions(factory, destination_id) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT * FROM destination_versions WHERE destination_id = %(d)s ORDER BY version",
        {"d": destination_id},
    )


async def row(factory, destination_id) -> dict[str, Any]:
    [found] = await factory.admin("SELECT * FROM destinations WHERE id = %(d)s", {"d": destination_id})
    return found


async def edit(factory, api_store, tenant_id, destination_id, expected: int | None, **changes: Any):
    if set(changes) & TWO_PERSON_DESTINATION_FIELDS:
        # where deliveries go, as whom, whom they trust: another admin asked, ada.admin approved (0032)
        await approve_change(factory, tenant_id, destination_id, **changes)
    return await api_store.edit_destination_if_version(
        tenant_id=tenant_id,
        destination_id=destination_id,
        expected_version=expected,
        changes=changes,
        changed_by="ada.admin",
        changed_role="admin",
        reason="partner asked",
    )


async def approve_change(factory, tenant_id, destination_id, **changes: Any) -> None:
    await factory.approve(
        tenant_id, "change_destination", destination_id, {"changes": changes}, approved_by="ada.admin"
    )


async def authorize_for(worker_store, job, attempt, destination_version: int) -> AuthorizationResult:
    params = authorize_params(job, attempt)
    del params["lease_seconds"], params["detail"]  # the store binds its own
    params["destination_version"] = destination_version
    return await worker_store.authorize_delivery_if_running(**params)


# -- every change is the next version, recorded -----------------------------------------------------------


async def test_each_change_steps_the_version_and_records_who_why_and_the_row_before_and_after(
    factory, api_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)

    renamed = await edit(factory, api_store, tenant, destination, 1, name="partner-renamed")
    moved = await edit(factory, api_store, tenant, destination, 2, host="10.0.0.9", port=2022)

    assert (renamed.matched, renamed.version, renamed.changed_fields, renamed.delivery_changed) == (
        True,
        2,
        ["name"],
        False,
    )
    assert (moved.version, moved.changed_fields, moved.delivery_changed) == (3, ["host", "port"], True)
    now = await row(factory, destination)
    assert (now["version"], now["delivery_version"], now["host"], now["port"]) == (3, 3, "10.0.0.9", 2022)
    v2, v3 = await versions(factory, destination)  # the factory's row had no 'created' record
    assert (v2["change"], v2["changed_by"], v2["changed_role"], v2["reason"]) == (
        "edited",
        "ada.admin",
        "admin",
        "partner asked",
    )
    assert v2["before"]["name"] == "partner-old" and v2["after"]["name"] == "partner-renamed"
    assert v3["before"]["host"] == "127.0.0.1" and v3["after"]["host"] == "10.0.0.9"
    assert v3["after"] == json.loads(json.dumps(v3["after"]))  # plain JSON, a row a delivery can load


async def test_an_edit_from_a_version_that_moved_on_matches_nothing_and_records_nothing(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    assert (await edit(factory, api_store, tenant, destination, 1, port=2000)).matched

    stale = await edit(factory, api_store, tenant, destination, 1, port=2001)

    assert (stale.matched, stale.version) == (False, 2)
    assert (await row(factory, destination))["port"] == 2000
    assert len(await versions(factory, destination)) == 1


async def test_a_name_or_contract_change_keeps_the_delivery_version_and_a_delivery_term_moves_it(
    factory, api_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    for changes in (
        {"name": "partner-x"},
        {"contract_ends_on": "2099-01-01"},
    ):
        await edit(factory, api_store, tenant, destination, None, **changes)
    assert (await row(factory, destination))["delivery_version"] == 1
    for field, value in (
        ("host", "h2"),
        ("username", "u2"),
        ("credential_ref", "/keys/rotated"),
        ("remote_dir", "/elsewhere"),
        ("hash_evidence", "read_back"),
    ):
        edited = await edit(factory, api_store, tenant, destination, None, **{field: value})
        assert edited.delivery_changed, field
        assert (await row(factory, destination))["delivery_version"] == edited.version


async def test_a_change_that_does_not_commit_with_its_record_is_refused_even_for_the_owner(factory):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url) as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            async with conn.transaction():
                await conn.execute(
                    "UPDATE destinations SET host = 'elsewhere', version = version + 1 WHERE id = %(d)s",
                    {"d": destination},
                )
    assert refused.value.diag.constraint_name == "ck_destinations_change_recorded"
    assert (await row(factory, destination))["host"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("assignment", "constraint"),
    [
        ("host = 'elsewhere'", "ck_destinations_version_step"),  # no step: a change nobody could tell
        ("version = version + 2", "ck_destinations_version_step"),
        ("version = version - 1", "ck_destinations_version_step"),
        ("created_at = clock_timestamp(), version = version + 1", "ck_destinations_identity"),
        ("tenant_id = gen_random_uuid(), version = version + 1", "ck_destinations_identity"),
    ],
)
async def test_the_version_only_steps_up_and_the_identity_never_changes_even_for_the_owner(
    factory, assignment, constraint
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    before = await row(factory, destination)
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin(
            sql.SQL("UPDATE destinations SET {} WHERE id = %(d)s").format(sql.SQL(assignment)),
            {"d": destination},
        )
    assert refused.value.diag.constraint_name == constraint
    assert await row(factory, destination) == before


async def test_a_retirement_is_final(factory):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    assert await retire_destination(
        factory.db.admin_url, tenant_id=tenant, destination_id=destination, retired_by="lee.admin"
    )
    assert not await retire_destination(
        factory.db.admin_url, tenant_id=tenant, destination_id=destination, retired_by="lee.admin"
    )
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin(
            "UPDATE destinations SET retired_at = NULL, retired_by = NULL, version = version + 1 WHERE id = %(d)s",
            {"d": destination},
        )
    assert refused.value.diag.constraint_name == "ck_destinations_retirement_final"
    edited = await edit_destination(
        factory.db.admin_url, tenant_id=tenant, destination_id=destination, changes={"port": 1}
    )
    assert edited is not None and not edited.matched and edited.retired_at is not None
    [retired] = await versions(factory, destination)
    assert (retired["change"], retired["changed_by"], retired["changed_role"]) == (
        "retired",
        "lee.admin",
        "owner",
    )


@pytest.mark.parametrize(
    "reference",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "/keys/a\nb3BlbnNzaC1rZXktdjE",
        "MIIE PRIVATE KEY",
        "",
    ],
)
async def test_a_credential_is_a_reference_and_the_database_refuses_key_material(factory, reference):
    tenant = await factory.tenant()
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.destination(tenant, credential_ref=reference)
    assert refused.value.diag.constraint_name == "ck_destinations_credential_ref"


# -- the record is append-only, by privileges ---------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
async def test_nobody_updates_or_deletes_a_recorded_version(database, factory, api_store, role):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    await edit(factory, api_store, tenant, destination, 1, port=2200)
    before = await versions(factory, destination)
    for statement in (
        "UPDATE destination_versions SET reason = 'tampered' WHERE destination_id = %(d)s",
        "DELETE FROM destination_versions WHERE destination_id = %(d)s",
        "TRUNCATE destination_versions CASCADE",
    ):
        async with acting_as(database, role) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement, {"d": destination})
    assert await versions(factory, destination) == before


async def test_the_exact_grants_on_the_recorded_versions(factory):
    rows = await factory.admin(
        "SELECT r AS role, p AS privilege FROM unnest(%(roles)s::text[]) r,"
        " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p"
        " WHERE has_table_privilege(r, 'destination_versions', p) ORDER BY 1, 2",
        {"roles": ROLES},
    )
    grants = [(r["role"], r["privilege"]) for r in rows]
    assert grants == [
        ("exports_api", "INSERT"),  # an admin's changes record their version
        ("exports_api", "SELECT"),
        ("exports_recovery", "SELECT"),  # recovery asks the partner the attempt was authorized for
        ("exports_worker", "SELECT"),  # the delivery loads the authorized version's contract
    ]


@pytest.mark.parametrize(
    "role", ["exports_worker", "exports_recovery", "exports_dispatcher", "exports_reconciler"]
)
async def test_only_the_api_creates_or_changes_a_destination(database, factory, role):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    before = await row(factory, destination)
    async with acting_as(database, role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "UPDATE destinations SET port = 1, version = version + 1 WHERE id = %(d)s", {"d": destination}
            )
    async with acting_as(database, role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "INSERT INTO destination_versions (tenant_id, destination_id, version, change, changed_by,"
                " changed_role, reason, after, changed_fields, delivery_changed)"
                " VALUES (%(t)s, %(d)s, 9, 'edited', 'x', 'admin', 'forged', '{}', '{}', false)",
                {"t": tenant, "d": destination},
            )
    assert await row(factory, destination) == before


# -- what cutoff 2 authorizes -------------------------------------------------------------------------------


async def test_cutoff_2_refuses_a_file_built_for_a_version_whose_delivery_terms_changed(
    factory, api_store, worker_store
):
    job, attempt = await factory.running()
    await edit(factory, api_store, job.tenant_id, job.destination_id, 1, host="sftp.new.example")

    assert await authorize_for(worker_store, job, attempt, 1) == AuthorizationResult.DESTINATION_CHANGED

    found = await factory.job(job.id)
    assert (found.status, found.attempt_id, found.destination_version) == (JobStatus.RUNNING, attempt, None)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_cutoff_2_authorizes_across_a_rename_and_records_the_version_it_authorized(
    factory, api_store, worker_store
):
    job, attempt = await factory.running()
    await edit(factory, api_store, job.tenant_id, job.destination_id, 1, name="partner-renamed")

    assert await authorize_for(worker_store, job, attempt, 1) == AuthorizationResult.AUTHORIZED

    found = await factory.job(job.id)
    assert (found.status, found.destination_version) == (JobStatus.DELIVERING, 2)
    [authorized] = [e for e in await factory.worker.job_events(job.id) if e.kind == "DeliveryAuthorized"]
    assert authorized.destination_version == 2


async def test_an_edit_held_open_makes_cutoff_2_wait_then_refuse(factory, kit):
    job, attempt = await factory.running()
    await approve_change(factory, job.tenant_id, job.destination_id, port=2200)
    editing = await kit.hold("exports_api")
    [edited] = await editing.run(
        "edit_destination_if_version",
        {
            "tenant_id": job.tenant_id,
            "destination_id": job.destination_id,
            "expected_version": 1,
            "changes": json.dumps({"port": 2200}),
            "changed_by": "ada.admin",
            "changed_role": "admin",
            "reason": "partner moved",
        },
    )
    assert edited["matched"]

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize_for(worker.store, job, attempt, 1))
    await kit.wait_until_blocked_by(worker.pid, editing.pid)
    await still_waiting(authorizing)

    await editing.commit()
    assert await authorizing == AuthorizationResult.DESTINATION_CHANGED
    assert await factory.status(job.id) == JobStatus.RUNNING


async def test_cutoff_2_held_open_makes_an_edit_wait_and_the_delivery_keeps_its_version(
    factory, kit, api_store
):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    params = {**authorize_params(job, attempt), "destination_version": 1}
    assert matched(await cutoff.run("authorize_delivery_if_running", params))

    editor = await kit.solo("exports_api")
    editing = asyncio.create_task(
        edit(factory, editor.store, job.tenant_id, job.destination_id, 1, port=2200)
    )
    await kit.wait_until_blocked_by(editor.pid, cutoff.pid)
    await still_waiting(editing)

    await cutoff.commit()
    assert (await editing).version == 2
    found = await factory.job(job.id)
    assert (found.status, found.destination_version) == (JobStatus.DELIVERING, 1)
    authorized = await factory.worker.load_destination(
        job.tenant_id, job.destination_id, found.destination_version
    )
    assert (authorized.version, authorized.port) == (1, 22)  # the delivery's contract, not the row's


async def test_the_authorized_destination_version_is_written_by_cutoff_2_alone(factory):
    job, _ = await factory.delivering()
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.admin(
            "UPDATE export_jobs SET destination_version = 7 WHERE id = %(id)s", {"id": job.id}
        )
    assert refused.value.diag.constraint_name == "ck_export_jobs_destination_version"
    assert (await factory.job(job.id)).destination_version == 1


# -- every version stays loadable -----------------------------------------------------------------------------


async def test_each_recorded_version_loads_as_it_was_whatever_the_row_says_now(
    factory, api_store, worker_store
):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)  # inserted by hand: no 'created' record
    await edit(factory, api_store, tenant, destination, 1, port=2001)
    await edit(factory, api_store, tenant, destination, 2, port=2002, remote_dir="/v3")
    await edit(factory, api_store, tenant, destination, 3, name="renamed")

    loaded = [await worker_store.load_destination(tenant, destination, v) for v in (1, 2, 3, 4)]
    assert [(d.version, d.port, d.remote_dir, d.name) for d in loaded] == [
        (1, 22, "/upload", "partner-old"),  # from the record of the change that followed it
        (2, 2001, "/upload", "partner-old"),
        (3, 2002, "/v3", "partner-old"),
        (4, 2002, "/v3", "renamed"),  # the row as it is now
    ]
    assert (await worker_store.load_destination(tenant, destination)).version == 4
    with pytest.raises(DestinationNotFound):
        await worker_store.load_destination(tenant, destination, 5)
    with pytest.raises(DestinationNotFound):
        await worker_store.load_destination(await factory.tenant(), destination, 1)  # another tenant's


async def test_a_seeded_destination_records_its_first_version(factory):
    from db.admin import add_destination

    tenant = await factory.tenant()
    destination = await add_destination(
        factory.db.admin_url,
        tenant_id=tenant,
        name=f"partner-{uuid.uuid4().hex[:6]}",
        destination={
            "host": "127.0.0.1",
            "port": 22,
            "username": "u",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
            "credential_ref": "/keys/k",
            "remote_dir": "/in",
        },
    )
    [created] = await versions(factory, destination)
    assert (created["version"], created["change"], created["changed_by"], created["changed_role"]) == (
        1,
        "created",
        "seeding",
        "owner",
    )

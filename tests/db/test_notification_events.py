"""Outcome notifications in the database (issue 26, item 1; migration 0025): every edge into a terminal status
or OutcomeUnknown writes one event in its own transaction, whichever statement took it; a cancellation that
lost to a delivery gets one event once that delivery has ended; a skipped recurring firing has a function of
its own; and nobody but those writes an event or reads an endpoint's secret back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from db.queries import q
from domain.models import (
    CancellationOutcome,
    DeliveryOutcome,
    FailureCode,
    FinishResult,
    JobStatus,
    ReleaseResult,
)
from domain.notifications import OUTCOME_KINDS, NotificationKind
from tests.support.factories import Factory

CONTACT = ("mara.quill@contact.example", "Mara", "Quillfeather")


async def events_of(factory: Factory, job_id: UUID) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT id, kind, subject_key, payload, created_at FROM notification_events WHERE job_id = %(j)s"
        " ORDER BY created_at, kind",
        {"j": job_id},
    )


@pytest.fixture(scope="module")
async def tenant(factory: Factory) -> tuple[UUID, UUID]:
    tenant_id = await factory.tenant("notified")
    destination_id = await factory.destination(tenant_id, name="partner-notified")
    await factory.contacts(tenant_id, "vip", [CONTACT])
    return tenant_id, destination_id


@pytest.mark.parametrize(
    "status",
    [
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
        JobStatus.CANCELED,
        JobStatus.REJECTED,
        JobStatus.OUTCOME_UNKNOWN,
    ],
)
async def test_each_terminal_outcome_writes_exactly_one_event_with_ids_names_counts_and_hashes(
    factory, tenant, status
):
    job = await factory.queued(*tenant, list_name="vip")
    job, attempt_id = await factory.in_status(status, job=job)

    events = await events_of(factory, job.id)

    assert [e["kind"] for e in events] == [OUTCOME_KINDS[status].value]
    data = events[0]["payload"]
    assert data["export_id"] == str(job.id)
    assert data["status"] == status.value
    assert data["destination_name"] == "partner-notified"
    assert data["list_name"] == "vip"
    assert data["outcome_at"].endswith("Z")
    if status in (JobStatus.COMPLETED, JobStatus.OUTCOME_UNKNOWN):
        assert data["file"] == {
            "name": job.expected_file_name,
            "bytes": job.expected_file_bytes,
            "rows": job.expected_file_rows,
            "sha256": job.expected_file_sha256.hex(),
        }
    if status == JobStatus.OUTCOME_UNKNOWN:
        assert data["reconciliation_needed"] is True
    if status == JobStatus.FAILED:
        assert data["failure_reason"] == FailureCode.BUILD_FAILED.value
    if status == JobStatus.REJECTED:
        assert data["rejection_code"] == "destination_not_found"
        assert data["rejection_reason"].startswith("Rejected:")
    if status == JobStatus.STOPPED:
        assert data["stop_request_id"] == str(job.stop_request_id)
    if status == JobStatus.CANCELED:
        assert data["cancellation_request_id"] == str(job.cancellation_request_id)
    text = str(events[0]["payload"])
    assert not any(value in text for value in CONTACT), "an event carries contact data"
    assert "wrong destination" not in text, "an event carries the free text a person typed"


async def test_the_claim_cutoff_2_fences_and_a_give_back_write_no_event(factory, tenant, worker_store):
    job, attempt_id = await factory.delivering(await factory.queued(*tenant))
    await factory.fence(job.id, attempt_id, rename=True)
    released, attempt2 = await factory.running(await factory.queued(*tenant))
    assert await worker_store.release_attempt_if_running(released.id, attempt2, "worker-3", "draining") == (
        ReleaseResult.RELEASED
    )

    assert await factory.status(released.id) == JobStatus.QUEUED
    assert await events_of(factory, job.id) == []
    assert await events_of(factory, released.id) == []


async def test_the_event_commits_with_its_transition_and_rolls_back_with_it(factory, tenant, database):
    job, attempt_id = await factory.running(await factory.queued(*tenant))
    params = {"job_id": job.id, "attempt_id": attempt_id, "code": "BuildFailed", "cause": "BuildError"}
    async with await psycopg.AsyncConnection.connect(database.app_url) as conn:
        await conn.execute("SET ROLE exports_worker")
        async with conn.transaction(force_rollback=True):
            await conn.execute(q("finish_failed"), params)
            inside = await (
                await conn.execute("SELECT count(*) FROM export_jobs WHERE id = %(j)s", {"j": job.id})
            ).fetchone()
            assert inside == (1,)
        assert await factory.status(job.id) == JobStatus.RUNNING
        assert await events_of(factory, job.id) == []  # rolled back together
        async with conn.transaction():
            await conn.execute(q("finish_failed"), params)

    assert await factory.status(job.id) == JobStatus.FAILED
    assert [e["kind"] for e in await events_of(factory, job.id)] == ["export.failed"]


async def test_an_outcome_unknown_then_reconciled_reports_each_outcome_once(
    factory, tenant, reconciler_store
):
    job, attempt_id = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(*tenant))
    assert await reconciler_store.reconcile_unknown(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt_id,
        resolution=JobStatus.COMPLETED,
        reconciled_by="lee.reconciler",
        evidence_summary="partner confirmed",
    )
    # a correction takes two people (issue 26 item 3): another reconciler asked, lee approved and records it
    await factory.approve(
        job.tenant_id,
        "correct_outcome",
        job.id,
        {"attempt_id": str(attempt_id), "corrected_status": "Failed"},
        approved_by="lee.reconciler",
    )
    assert await reconciler_store.correct_outcome(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt_id,
        recorded_status=JobStatus.COMPLETED,
        corrected_status=JobStatus.FAILED,
        failure_reason=FailureCode.NOT_DELIVERED,
        corrected_by="lee.reconciler",
        evidence_ref="TICKET-9",
        why="the partner found no file",
    )

    kinds = [e["kind"] for e in await events_of(factory, job.id)]

    assert sorted(kinds) == ["export.completed", "export.failed", "export.outcome_unknown"]
    completed = next(e for e in await events_of(factory, job.id) if e["kind"] == "export.completed")
    assert completed["payload"]["previous_status"] == "OutcomeUnknown"


async def test_a_second_report_of_the_same_outcome_is_refused_by_the_key_and_changes_nothing(factory, tenant):
    job, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(*tenant))
    (event,) = await events_of(factory, job.id)

    # what a trigger firing twice would insert: the unique (tenant, kind, subject) keeps one
    with pytest.raises(psycopg.errors.UniqueViolation):
        await factory.admin(
            "INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload)"
            " VALUES (%(t)s, 'export.completed', %(j)s, %(j)s::text, '{}')",
            {"t": job.tenant_id, "j": job.id},
        )

    assert await events_of(factory, job.id) == [event]


# -- lost cancellations ----------------------------------------------------------------------------------


async def test_a_cancel_that_lost_while_delivering_is_reported_when_the_delivery_completes(
    factory, tenant, worker_store
):
    job, attempt_id = await factory.delivering(await factory.queued(*tenant), sha256=b"\xab" * 32)
    request_id = uuid.uuid4()
    lost = await factory.cancel(job, request_id=request_id, requested_by="sam.ops")
    assert lost.outcome == CancellationOutcome.TOO_LATE
    assert [e["kind"] for e in await events_of(factory, job.id)] == []  # the delivery has not ended yet

    assert (
        await worker_store.finish_delivery(job.id, attempt_id, DeliveryOutcome.COMPLETED)
        == FinishResult.WRITTEN
    )

    events = {e["kind"]: e for e in await events_of(factory, job.id)}
    assert set(events) == {"export.completed", "export.cancellation_lost"}
    data = events["export.cancellation_lost"]["payload"]
    assert events["export.cancellation_lost"]["subject_key"] == str(request_id)
    assert data["cancellation_request_id"] == str(request_id)
    assert data["requested_by"] == "sam.ops"
    assert data["outcome"] == "Completed"
    assert data["file"]["sha256"] == "ab" * 32
    assert data["delivery_authorized_at"].endswith("Z")
    assert data["outcome_at"] == events["export.completed"]["payload"]["outcome_at"]
    assert data["message"] == (
        f"Your cancel of export {job.id} lost: delivery had been authorized at {data['delivery_authorized_at']};"
        f" delivered at {data['outcome_at']}, sha256 {'ab' * 32}."
    )


async def test_a_cancel_that_lost_to_a_delivery_that_had_ended_is_reported_at_once_and_once_per_request(
    factory, tenant
):
    job, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(*tenant))
    first, second = uuid.uuid4(), uuid.uuid4()

    assert (await factory.cancel(job, request_id=first)).outcome == CancellationOutcome.TOO_LATE
    assert (await factory.cancel(job, request_id=first)).outcome == CancellationOutcome.TOO_LATE  # a replay
    assert (await factory.cancel(job, request_id=second)).outcome == CancellationOutcome.TOO_LATE

    lost = [e for e in await events_of(factory, job.id) if e["kind"] == "export.cancellation_lost"]
    assert sorted(e["subject_key"] for e in lost) == sorted([str(first), str(second)])
    completed = next(e for e in await events_of(factory, job.id) if e["kind"] == "export.completed")
    assert {e["payload"]["outcome_at"] for e in lost} == {completed["payload"]["outcome_at"]}


async def test_a_cancel_that_lost_to_a_delivery_that_failed_or_became_unknown_says_so(
    factory, tenant, worker_store
):
    failed, failed_attempt = await factory.delivering(await factory.queued(*tenant))
    unknown, unknown_attempt = await factory.delivering(await factory.queued(*tenant))
    for job in (failed, unknown):
        assert (await factory.cancel(job)).outcome == CancellationOutcome.TOO_LATE
    await worker_store.finish_delivery(
        failed.id, failed_attempt, DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED
    )
    await worker_store.finish_delivery(unknown.id, unknown_attempt, DeliveryOutcome.OUTCOME_UNKNOWN)

    def lost(events: list[dict[str, Any]]) -> dict[str, Any]:
        return next(e["payload"] for e in events if e["kind"] == "export.cancellation_lost")

    failed_lost = lost(await events_of(factory, failed.id))
    unknown_lost = lost(await events_of(factory, unknown.id))
    assert failed_lost["outcome"] == "Failed" and failed_lost["failure_reason"] == "NotDelivered"
    assert "it then failed (NotDelivered)" in failed_lost["message"]
    assert unknown_lost["outcome"] == "OutcomeUnknown"
    assert "(reconciliation needed)" in unknown_lost["message"]


async def test_no_lost_cancellation_for_a_cancel_that_won_or_found_it_ended(factory, tenant):
    stopped, _ = await factory.in_status(JobStatus.STOPPED, job=await factory.queued(*tenant))
    assert (await factory.cancel(stopped)).outcome == CancellationOutcome.ALREADY_ENDED

    kinds = [e["kind"] for e in await events_of(factory, stopped.id)]

    assert kinds == ["export.stopped"]


# -- skipped recurring firings ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["exports_worker", "exports_api"])
async def test_a_skipped_recurring_firing_is_one_event_per_firing(database, factory, tenant, role):
    recurring_id, at = uuid.uuid4(), "2026-12-01T06:00:00Z"
    call = (
        "SELECT notify_recurring_firing_skipped(%(t)s, %(r)s, 'nightly vip', %(at)s::timestamptz,"
        " 'previous_still_running') AS id"
    )
    params = {"t": tenant[0], "r": recurring_id, "at": at}
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        cur = conn.cursor(row_factory=dict_row)
        first = await (await cur.execute(call, params)).fetchone()
        again = await (await cur.execute(call, params)).fetchone()

    assert first["id"] is not None and again["id"] is None
    rows = await factory.admin(
        "SELECT id, kind, payload FROM notification_events WHERE subject_key LIKE %(r)s",
        {"r": f"{recurring_id}@%"},
    )
    assert [(r["id"], r["kind"]) for r in rows] == [
        (first["id"], NotificationKind.RECURRING_FIRING_SKIPPED.value)
    ]
    assert rows[0]["payload"] == {
        "recurring_export_id": str(recurring_id),
        "recurring_export_name": "nightly vip",
        "scheduled_for": "2026-12-01T06:00:00.000000Z",
        "reason": "previous_still_running",
    }


async def test_a_skipped_firing_reason_must_be_a_code_not_free_text(database, tenant):
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_worker")
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(
                "SELECT notify_recurring_firing_skipped(%(t)s, gen_random_uuid(), 'x', clock_timestamp(),"
                " 'Call Mara on +1 555 0100')",
                {"t": tenant[0]},
            )


# -- who may write events and read secrets ---------------------------------------------------------------


@pytest.mark.parametrize(
    "role", ["exports_api", "exports_worker", "exports_recovery", "exports_reconciler", "exports_dispatcher"]
)
async def test_no_application_role_writes_an_event_itself(database, tenant, role):
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "INSERT INTO notification_events (tenant_id, kind, subject_key, payload)"
                " VALUES (%(t)s, 'export.completed', 'forged', '{}')",
                {"t": tenant[0]},
            )


async def test_the_api_writes_a_secret_and_can_never_read_it_back(database, factory, tenant):
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_api")
        await conn.execute(
            "INSERT INTO webhook_endpoints (tenant_id, url, secret, events, created_by)"
            " VALUES (%(t)s, 'https://hooks.example/a', %(s)s, ARRAY['export.completed'], 'ada')",
            {"t": tenant[0], "s": "whsec_" + "A" * 43 + "="},
        )
        for statement in ("SELECT secret FROM webhook_endpoints", "SELECT * FROM webhook_endpoints"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement)
    rows = await factory.admin(
        "SELECT grantee FROM information_schema.column_privileges"
        " WHERE table_name = 'webhook_endpoints' AND column_name = 'secret' AND privilege_type = 'SELECT'"
        " AND grantee LIKE 'exports_%%'"
    )
    assert {r["grantee"] for r in rows} == {"exports_dispatcher"}


async def recurring_export(factory: Factory, tenant: tuple[UUID, UUID], *, paused: bool) -> UUID:
    recurring_id = uuid.uuid4()
    await factory.admin(
        "INSERT INTO recurring_exports (tenant_id, id, destination_id, list_name, interval_seconds, time_zone,"
        " paused, paused_reason, created_by, updated_by)"
        " VALUES (%(t)s, %(r)s, %(d)s, 'vip', 3600, 'UTC', %(p)s, %(why)s, 'admin@acme', 'admin@acme')",
        {
            "t": tenant[0],
            "r": recurring_id,
            "d": tenant[1],
            "p": paused,
            "why": "holiday" if paused else None,
        },
    )
    return recurring_id


async def test_a_firing_the_recurring_code_skips_reports_itself_once_and_one_that_creates_an_export_does_not(
    factory, tenant, api_store
):
    paused = await recurring_export(factory, tenant, paused=True)
    running = await recurring_export(factory, tenant, paused=False)
    at = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)

    async def fire(recurring_id: UUID) -> str:
        answer = await api_store.fire_recurring_export(
            tenant_id=tenant[0],
            recurring_export_id=recurring_id,
            nominal_time=at,
            fired_by="test",
            late_after_seconds=10**9,
            catchup_firings=1,
        )
        assert answer is not None
        return answer.outcome.value

    assert [await fire(paused), await fire(paused), await fire(running)] == [
        "skipped",
        "duplicate",
        "created",
    ]

    rows = await factory.admin(
        "SELECT kind, subject_key, payload FROM notification_events WHERE subject_key LIKE %(r)s"
        " OR subject_key LIKE %(c)s",
        {"r": f"{paused}@%", "c": f"{running}@%"},
    )
    assert [(r["kind"], r["subject_key"]) for r in rows] == [
        ("recurring_export.firing_skipped", f"{paused}@2026-12-01T06:00:00.000000Z")
    ]
    assert rows[0]["payload"] == {
        "recurring_export_id": str(paused),
        "recurring_export_name": "vip to partner-notified",
        "scheduled_for": "2026-12-01T06:00:00.000000Z",
        "reason": "recurring_paused",
    }

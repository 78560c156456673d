"""A manifest published last (issue #24.6, migration 0037), on the real server: cutoff 2 records what the
authorized version asks for beside the file, nobody else writes it, and each statement that can write Completed
(finish_delivery, resolve_expired_delivery, settle_unknown_by_evidence) repeats that every manifest is in place
by the attempt's own evidence: published, or found in place with the same bytes. A conflict, another attempt's
evidence or a listing a reconciler asked for is not that evidence. Failed and OutcomeUnknown are not held up."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from domain.manifest import manifest_names
from domain.models import DeliveryOutcome, ExportJob, FailureCode, FinishResult, JobStatus

RUN = "recovery:recovery-test/run-1"


async def delivering_with(factory, manifest: str) -> tuple[ExportJob, UUID]:
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, manifest=manifest)
    job = await factory.queued(tenant_id, destination_id)
    return await factory.delivering(job)


async def manifest_seen(
    factory, job: ExportJob, attempt: UUID, name: str, result: str = "published", by: str = "worker-3"
) -> None:
    evidence: dict[str, Any] = {"observation": "manifest", "name": name, "kind": "sha256", "result": result}
    assert await factory.worker.append_delivery_evidence(job.id, attempt, by, evidence)


async def finish(factory, job: ExportJob, attempt: UUID) -> bool:
    answer = await factory.worker.finish_delivery(
        job.id, attempt, DeliveryOutcome.COMPLETED, summary="read back"
    )
    return answer == FinishResult.WRITTEN


async def resolve(factory, job: ExportJob, attempt: UUID) -> bool:
    await factory.expire_lease(job.id)
    return await factory.recovery.resolve_expired_delivery(
        job.id, attempt, JobStatus.COMPLETED, RUN, "listed"
    )


async def settle(factory, job: ExportJob, attempt: UUID) -> bool:
    unknown = await factory.worker.finish_delivery(
        job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN, summary="manifest not in place"
    )
    assert unknown == FinishResult.WRITTEN
    return await factory.recovery.settle_unknown_by_evidence(
        job.id, attempt, JobStatus.COMPLETED, RUN, "listed"
    )


COMPLETING: dict[str, Callable[[Any, ExportJob, UUID], Awaitable[bool]]] = {
    "finish_delivery": finish,
    "resolve_expired_delivery": resolve,
    "settle_unknown_by_evidence": settle,
}


async def test_cutoff_2_records_the_manifest_the_authorized_version_asks_for(factory) -> None:
    job, _ = await delivering_with(factory, "both")
    assert job.expected_manifest == "both"
    plain, _ = await delivering_with(factory, "none")
    assert plain.expected_manifest == "none"


@pytest.mark.parametrize("statement", sorted(COMPLETING))
async def test_completed_is_refused_until_every_manifest_is_in_place_by_the_attempts_evidence(
    factory, statement
) -> None:
    complete = COMPLETING[statement]
    job, attempt = await delivering_with(factory, "both")
    sidecar, manifest = manifest_names(job.expected_file_name or "", "both")
    await manifest_seen(factory, job, attempt, sidecar)  # one of two
    await manifest_seen(factory, job, attempt, manifest, result="conflict")  # other bytes there: not in place
    await manifest_seen(factory, job, attempt, manifest, by="reconciler-request:3f1c")  # a person's question

    assert not await complete(factory, job, attempt)
    assert (await factory.job(job.id)).status != JobStatus.COMPLETED

    await manifest_seen(factory, job, attempt, manifest, result="in_place", by=RUN)  # recovery found it there
    if statement == "settle_unknown_by_evidence":
        assert await factory.recovery.settle_unknown_by_evidence(
            job.id, attempt, JobStatus.COMPLETED, RUN, "listed"
        )
    elif statement == "resolve_expired_delivery":
        assert await factory.recovery.resolve_expired_delivery(
            job.id, attempt, JobStatus.COMPLETED, RUN, "listed"
        )
    else:
        assert await complete(factory, job, attempt)
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED


async def test_another_attempts_manifest_evidence_does_not_count(factory) -> None:
    job, attempt = await delivering_with(factory, "sha256")
    [sidecar] = manifest_names(job.expected_file_name or "", "sha256")
    await factory.admin(
        "INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)"
        " VALUES (%(j)s, gen_random_uuid(), 'DeliveryEvidence', 'worker-9', %(d)s, clock_timestamp())",
        {"j": job.id, "d": json.dumps({"observation": "manifest", "name": sidecar, "result": "published"})},
    )
    assert not await finish(factory, job, attempt)


@pytest.mark.parametrize("outcome", [DeliveryOutcome.OUTCOME_UNKNOWN, DeliveryOutcome.FAILED])
async def test_a_manifest_never_holds_up_failed_or_outcome_unknown(factory, outcome) -> None:
    job, attempt = await delivering_with(factory, "json")
    code = FailureCode.NOT_DELIVERED if outcome == DeliveryOutcome.FAILED else None
    answer = await factory.worker.finish_delivery(job.id, attempt, outcome, code, summary="s")
    assert answer == FinishResult.WRITTEN


async def test_a_destination_without_a_manifest_completes_as_before(factory) -> None:
    job, attempt = await delivering_with(factory, "none")
    assert await finish(factory, job, attempt)


@pytest.mark.parametrize("role", [None, "exports_worker"])
async def test_the_expected_manifest_is_written_by_cutoff_2_and_never_changes(
    factory, database, role
) -> None:
    job, _ = await delivering_with(factory, "both")
    url = database.admin_url if role is None else database.app_url
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        if role is not None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "UPDATE export_jobs SET expected_manifest = 'none' WHERE id = %(id)s", {"id": job.id}
            )
    assert refused.value.diag.constraint_name == "ck_export_jobs_expected_manifest_writer"
    assert (await factory.job(job.id)).expected_manifest == "both"


async def test_a_destination_manifest_outside_the_choices_is_refused(factory) -> None:
    tenant_id = await factory.tenant()
    with pytest.raises(psycopg.errors.CheckViolation, match="ck_destinations_manifest"):
        await factory.destination(tenant_id, manifest="md5")

"""Every way an attempt ends through ExportWorkflow, each recorded by one conditional write with its code:
a build that fails, a replacement whose original was corrected to Completed before cutoff 2, an occupied
final name, an unreachable partner, a partner that refuses the upload and drops the session, and a
replacement that delivers."""

from __future__ import annotations

import json
import socket
import uuid

from domain.models import AuthorizationResult, EventKind, FailureCode, JobStatus
from partner.local_server import LocalSftpServer
from rules.retries import RetryPolicy
from tests.workflows.harness import Harness
from workflows.models import AttemptOutcome


async def test_a_build_that_fails_ends_failed_with_build_failed_and_sends_nothing(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)
    not_a_directory = harness.host.work_dir.parent / f"blocker-{uuid.uuid4().hex[:6]}"
    not_a_directory.write_text("a file where the work directory should be")
    harness.host.activities.settings.work_dir = not_a_directory / "work"

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.FAILED and result.failure_code == FailureCode.BUILD_FAILED
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.FAILED and row.failure_reason == FailureCode.BUILD_FAILED
    events = await harness.factory.worker.job_events(job.id)
    assert [e.kind for e in events] == ["Claimed", "Failed"]
    assert events[-1].detail is not None and events[-1].detail.startswith("BuildFailed: WorkDirUnusable")
    assert harness.partner_files(job) == []


async def test_a_replacement_whose_original_was_corrected_to_completed_is_refused_at_cutoff_2(
    harness: Harness,
) -> None:
    original = await harness.queue_export(contacts=5)
    original, original_attempt = await harness.factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=original)
    assert original_attempt is not None
    created = await harness.factory.api.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="rita.ops",
        replacement_reason="partner lost the file",
    )
    assert created is not None
    replacement = await harness.factory.job(created.job_id)

    async def original_confirmed_delivered(job_id: uuid.UUID) -> None:
        assert await harness.factory.reconciler.reconcile_unknown(
            tenant_id=original.tenant_id,
            job_id=original.id,
            attempt_id=original_attempt,
            resolution=JobStatus.COMPLETED,
            reconciled_by="lee.reconciler",  # a reconciler of the tenant (0032)
            evidence_summary="partner confirmed receipt",
        )

    harness.host.activities.seams.before_authorize = original_confirmed_delivered
    result = await harness.run(replacement)

    assert result.cutoff_answers == [AuthorizationResult.ORIGINAL_COMPLETED]
    assert result.outcome == AttemptOutcome.FAILED
    assert result.failure_code == FailureCode.ORIGINAL_DELIVERED
    row = await harness.factory.job(replacement.id)
    assert row.status == JobStatus.FAILED and row.failure_reason == FailureCode.ORIGINAL_DELIVERED
    assert harness.partner_files(replacement) == [] and harness.files_on_disk() == []


async def test_a_replacement_with_nothing_at_the_partner_delivers_under_the_original_name(
    harness: Harness,
) -> None:
    original = await harness.queue_export(contacts=5)
    original, _ = await harness.factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=original)
    created = await harness.factory.api.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="rita.ops",
        replacement_reason="the original never arrived",
    )
    assert created is not None
    replacement = await harness.factory.job(created.job_id)

    result = await harness.run(replacement)

    assert result.outcome == AttemptOutcome.COMPLETED
    assert await harness.status(replacement) == JobStatus.COMPLETED
    assert await harness.status(original) == JobStatus.OUTCOME_UNKNOWN  # a replacement never rewrites it
    assert [p.name for p in harness.uploads(replacement)] == [original.final_name]


async def test_an_occupied_final_name_ends_failed_and_is_never_overwritten(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)
    occupied = harness.sftp.local_dir / job.final_name
    occupied.write_bytes(b"someone else's file\n")

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.FAILED
    assert result.failure_code == FailureCode.FINAL_NAME_OCCUPIED
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.FAILED and row.failure_reason == FailureCode.FINAL_NAME_OCCUPIED
    assert occupied.read_bytes() == b"someone else's file\n"
    kinds = await harness.factory.event_kinds(job.id)
    assert kinds[:2] == ["Claimed", "DeliveryAuthorized"] and kinds[-1] == "Finished"
    assert "DeliveryEvidence" in kinds  # the baseline listing that found it
    assert harness.files_on_disk() == []


async def test_an_unreachable_partner_is_not_delivered_and_waits_to_be_tried_again(harness: Harness) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    job = await harness.queue_export(contacts=5, port=closed_port)

    result = await harness.run(job)

    # Nothing was sent (no session opened), and a refused connect is transient (issue #25.4): the job goes back
    # to the queue to be tried again after its backoff, the attempt counted as used.
    assert (
        result.outcome == AttemptOutcome.RETRY_SCHEDULED and result.failure_code == FailureCode.NOT_DELIVERED
    )
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count, row.attempts_released) == (
        JobStatus.QUEUED,
        None,
        1,
        0,
    )
    assert row.available_at is not None
    [retry] = [
        e for e in await harness.factory.worker.job_events(job.id) if e.kind == EventKind.RETRY_SCHEDULED
    ]
    assert retry.detail is not None and retry.detail.startswith("connect_refused: no SFTP session opened")
    assert harness.files_on_disk() == []


async def test_a_partner_whose_quota_is_full_and_drops_the_session_ends_failed_not_delivered(
    harness: Harness, local_sftp_server: LocalSftpServer
) -> None:
    # Issue 23.2: the partner's quota is full, so the upload is refused, and the session drops, so no fresh
    # listing can be taken. The rename was never sent (the row has its upload fence and no rename fence):
    # Failed NotDelivered from the fences, not an OutcomeUnknown waiting for a person forever.
    job = await harness.queue_export(contacts=5)
    local_sftp_server.set_quota(harness.sftp.local_dir, 0, drop_session=True)
    # No space is transient (issue #25.4): with one attempt allowed, the retry is not made and the job ends here.
    before = harness.host.activities.host.retry_policy
    harness.host.activities.host.retry_policy = RetryPolicy(max_attempts=1)
    try:
        result = await harness.run(job)
    finally:
        local_sftp_server.clear_quota(harness.sftp.local_dir)
        harness.host.activities.host.retry_policy = before

    assert result.outcome == AttemptOutcome.FAILED and result.failure_code == FailureCode.NOT_DELIVERED
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert row.upload_fenced_at is not None and row.rename_fenced_at is None
    events = await harness.factory.worker.job_events(job.id)
    kinds = [e.kind for e in events]
    assert "UploadFenced" in kinds and "RenameFenced" not in kinds
    (finished,) = [e for e in events if e.kind == "Finished"]
    assert finished.detail is not None and finished.detail.startswith(
        "Failed NotDelivered: upload refused (status 4) before the rename fence; the fences prove it: "
        "the rename was never sent"
    )
    # classified from the asyncssh quota's FAILURE (its answer spoke of a quota), not retried at the cap
    assert finished.detail.endswith("not retried (no_space): try 1 of 1, the attempt cap")
    seen = [json.loads(e.detail or "{}") for e in events if e.kind == EventKind.DELIVERY_EVIDENCE]
    by_kind = {item["observation"]: item for item in seen}
    assert by_kind["upload"]["result"] == "refused"
    assert by_kind["interrupted"]["phase"] == "fresh_listing"  # the session was gone
    assert by_kind["outcome"]["rename_sent"] is False
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []

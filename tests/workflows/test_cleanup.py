"""The partner's cleanup agreement (``destinations.temporary_files``) through ExportWorkflow: once an
export is recorded Failed, the worker removes its attempt's temporary and set-aside files when the partner
agreed to it, and keeps them otherwise. Faults are real: a TCP proxy in front of the SFTP server cut
mid-upload, and recovery taking over a paused worker."""

from __future__ import annotations

import json
import uuid

import pytest

from domain.evidence import temp_name_for
from domain.models import EventKind, FailureCode, JobStatus
from rules.retries import RetryPolicy
from testbed.sftp import TcpProxy
from tests.workflows.harness import Harness
from tests.workflows.test_leases import taken_over_mid_upload
from workflows.models import AttemptOutcome


async def worker_cleanup(harness: Harness, job_id: uuid.UUID) -> list[tuple[str, str]]:
    """What the worker's own removal found (recovery's is appended under its run's ID)."""
    events = await harness.factory.worker.job_events(job_id)
    found = [
        json.loads(e.detail)
        for e in events
        if e.kind == EventKind.DELIVERY_EVIDENCE and e.observed_by == harness.host.name
    ]
    return [(item["name"], item["result"]) for item in found if item.get("observation") == "cleanup"]


@pytest.mark.parametrize("temporary_files", ["remove", "keep"])
async def test_an_upload_cut_mid_way_is_not_delivered_and_its_partial_file_goes_only_if_agreed(
    harness: Harness, temporary_files: str
) -> None:
    # The link to the partner is cut after the first write: the worker confirms on a new session that the
    # rename was never sent and the final name is unchanged, records Failed NotDelivered itself, and then,
    # under the agreement, removes what it had uploaded under its temporary name.
    proxy = TcpProxy(harness.sftp.host, harness.sftp.port)
    before = harness.host.activities.host.retry_policy
    try:
        job = await harness.queue_export(contacts=3000, port=proxy.port, temporary_files=temporary_files)
        cut: list[int] = []

        async def cut_mid_upload(job_id: uuid.UUID, sent: int) -> None:
            if not cut:
                cut.append(sent)
                proxy.cut()

        harness.host.activities.seams.during_upload = cut_mid_upload
        # A cut session is transient (issue #25.4): with one attempt allowed, the job ends Failed here.
        harness.host.activities.host.retry_policy = RetryPolicy(max_attempts=1)
        result = await harness.run(job)
    finally:
        harness.host.activities.host.retry_policy = before
        proxy.close()

    assert cut and result.outcome == AttemptOutcome.FAILED
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert harness.uploads(job) == []
    temp = temp_name_for(row.attempt_id, job.final_name)
    if temporary_files == "remove":
        assert harness.partner_files(job) == []
        assert (temp, "removed") in await worker_cleanup(harness, job.id)
    else:
        assert [p.name for p in harness.partner_files(job)] == [temp]
        assert await worker_cleanup(harness, job.id) == []
    assert harness.files_on_disk() == []


async def test_a_paused_worker_taken_over_mid_upload_leaves_nothing_at_the_partner_under_the_agreement(
    harness: Harness,
) -> None:
    # Recovery proves NotDelivered (no rename fence) while the paused worker is still uploading, and removes
    # the temporary file; the worker's upload goes on into the removed file, its rename is never sent, and
    # once it sees the row recorded Failed for its attempt it removes whatever it left itself.
    job = await harness.queue_export(contacts=3000, temporary_files="remove")
    takeovers, result = await taken_over_mid_upload(harness, job)

    assert takeovers == ["NotDelivered"]
    assert result.outcome == AttemptOutcome.NOT_OWNER
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert harness.partner_files(job) == [] and harness.uploads(job) == []
    assert await worker_cleanup(harness, job.id)  # the worker looked too, after the row said Failed
    assert harness.files_on_disk() == []

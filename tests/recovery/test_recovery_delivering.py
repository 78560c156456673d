"""Recovery of expired Delivering attempts against real SFTP servers (in-process asyncssh and OpenSSH
sshd) and a real PostgreSQL, run as RecoveryWorkflow on the time-skipping server (000 "Recovery", test
matrix "Recovery interleavings" and "Interrupted uploads"): Completed only on evidence, OutcomeUnknown
otherwise, never Failed from an absent file, never a second upload, and what recovery saw is kept."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.recovery import RecoveryActivities
from domain.models import DeliveryOutcome, ExportJob, FailureCode, FenceResult, FinishResult, JobStatus
from partner.delivery import FileToDeliver, deliver, observe_final_name
from partner.kinds import partner_for
from settings import Settings
from testbed.sftp import SftpTarget
from workflows.models import RecoveryBatchResult, RecoveryInput, Takeover
from workflows.recovery import RecoveryWorkflow

SIZE = 200_000

asyncssh_only = pytest.mark.parametrize("sftp_server", ["asyncssh"])


async def recover(client, settings) -> RecoveryBatchResult:
    return await client.execute_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(batch=50),
        id=f"recovery-{uuid.uuid4()}",
        task_queue=settings.task_queue,
        result_type=RecoveryBatchResult,
    )


async def delivering_to(
    factory,
    target: SftpTarget,
    data: bytes,
    *,
    job: ExportJob | None = None,
    fenced: str = "rename",
    **contract,
) -> tuple[ExportJob, uuid.UUID]:
    """A job past cutoff 2 whose expected file is ``data``, to a destination on ``target``, with its
    fences written up to ``fenced``: "none" (it died before sending a byte), "upload" (it uploaded to its
    temporary name, no further), "rename" (it was free to rename: only the partner can tell)."""
    if job is None:
        tenant = await factory.tenant()
        destination = await factory.destination(tenant, **target.destination_row(**contract))
        job = await factory.queued(tenant_id=tenant, destination_id=destination)
    job, attempt = await factory.delivering(job, size=len(data), sha256=hashlib.sha256(data).digest())
    if fenced != "none":
        await factory.fence(job.id, attempt, rename=fenced == "rename")
    return job, attempt


def unreachable(target: SftpTarget) -> None:
    """The partner's server cannot be asked: its proxy closes every new connection at once. (Editing the
    destination would not do: recovery asks the partner the attempt was authorized for, #24.2.)"""
    target.proxy.refuse_new_connections()


async def recovery_evidence(factory, job_id, observation: str = "recovery_listing") -> list[dict]:
    """What recovery appended: its listings of the final name, or (``recovery_set_aside``) its moves."""
    events = await factory.worker.job_events(job_id)
    found = [
        json.loads(e.detail)
        for e in events
        if e.kind == "DeliveryEvidence" and (e.observed_by or "").startswith("recovery:")
    ]
    return [item for item in found if item["observation"] == observation]


async def resolution(factory, job_id) -> tuple[JobStatus, str]:
    job = await factory.job(job_id)
    event = [e for e in await factory.worker.job_events(job_id) if e.kind == "ResolvedByRecovery"][-1]
    assert event.observed_by.startswith("recovery:")
    return job.status, event.detail


async def test_a_crash_after_cutoff_2_before_the_upload_fence_ends_not_delivered_and_uploads_nothing(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # Issue 10: the upload fence is the proof. An attempt that never wrote it sent nothing (the uploader
    # sends nothing unless it matched), and recovery's statement refuses a late one: Failed NotDelivered,
    # not an OutcomeUnknown for a person to settle.
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data, fenced="none")
    await factory.expire_lease(job.id)  # the worker died after cutoff 2 and sent nothing

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.FAILED
    assert (await factory.job(job.id)).failure_reason == FailureCode.NOT_DELIVERED
    assert detail == "Failed NotDelivered: the attempt never fenced its upload, so it sent nothing"
    assert sftp_target.files() == {}  # recovery never uploads
    assert await factory.worker.fence_upload_if_delivering(job.id, job.attempt_id) == FenceResult.NOT_OWNER


async def test_a_crash_after_the_upload_before_the_rename_fence_ends_not_delivered(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data, fenced="upload")
    sftp_target.put(f".partial-{job.attempt_id}-{job.final_name}", data[: SIZE // 2])  # its temporary file
    await factory.expire_lease(job.id)

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.FAILED
    assert (
        detail == "Failed NotDelivered: the attempt never fenced its rename, so it never wrote the final name"
    )
    assert job.final_name not in sftp_target.files()
    assert await factory.worker.fence_rename_if_delivering(job.id, job.attempt_id) == FenceResult.NOT_OWNER


async def test_a_crash_after_the_rename_before_the_terminal_write_ends_completed_on_destination_evidence(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)  # the upload landed; the worker died before its write
    await factory.expire_lease(job.id)

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.COMPLETED
    assert f"size {SIZE} matches" in detail
    assert sftp_target.files() == {job.final_name: data}  # no second upload, no temporary file
    [seen] = await recovery_evidence(factory, job.id)
    assert (seen["present"], seen["size"]) == (True, SIZE)


@asyncssh_only
async def test_a_file_of_the_expected_size_but_other_bytes_is_not_evidence_under_a_hash_contract(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data, hash_evidence="read_back")
    sftp_target.put(job.final_name, os.urandom(SIZE))
    await factory.expire_lease(job.id)

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.OUTCOME_UNKNOWN
    assert "hash" in detail
    [seen] = await recovery_evidence(factory, job.id)
    assert seen["sha256"] != hashlib.sha256(data).hexdigest()


@asyncssh_only
async def test_a_matching_read_back_hash_is_evidence_under_a_hash_contract(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data, hash_evidence="read_back")
    sftp_target.put(job.final_name, data)
    await factory.expire_lease(job.id)

    await recover(client, settings)

    assert (await resolution(factory, job.id))[0] == JobStatus.COMPLETED


@asyncssh_only
async def test_a_wrong_size_is_not_evidence(client, settings, recovery_worker, factory, sftp_target):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data[: SIZE // 2])  # a partial write under the final name
    await factory.expire_lease(job.id)

    await recover(client, settings)

    assert (await resolution(factory, job.id))[0] == JobStatus.OUTCOME_UNKNOWN


@asyncssh_only
@pytest.mark.slow
async def test_the_attempts_own_receipt_completes_it_when_the_destination_cannot_be_asked(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget, tmp_path: Path
):
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    destination = await worker_store.load_destination(job.tenant_id, job.destination_id)
    local = tmp_path / job.final_name
    local.write_bytes(data)
    evidence: list[dict] = []
    # The real upload, its evidence kept as the worker keeps it; then the worker dies before its write.
    report = await asyncio.to_thread(
        deliver,
        destination,
        FileToDeliver(path=local, final_name=job.final_name, size=SIZE, sha256=hashlib.sha256(data).digest()),
        attempt,
        original=None,
        overwrite_agreed=False,
        on_evidence=evidence.append,
    )
    assert report.outcome == DeliveryOutcome.COMPLETED
    for item in evidence:
        await worker_store.append_delivery_evidence(job.id, attempt, f"attempt:{attempt}", item)
    unreachable(sftp_target)  # the partner's server cannot be reached when recovery runs
    await factory.expire_lease(job.id)

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.COMPLETED
    assert "receipt of this attempt" in detail
    [seen] = await recovery_evidence(factory, job.id)
    assert seen["error"]  # recovery could not look, and says so
    assert sftp_target.files() == {job.final_name: data}


@asyncssh_only
@pytest.mark.slow
async def test_no_receipt_and_no_destination_answer_is_outcome_unknown(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    unreachable(sftp_target)
    await factory.expire_lease(job.id)

    await recover(client, settings)

    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.OUTCOME_UNKNOWN
    assert "destination not observed" in detail


@asyncssh_only
async def test_a_listing_that_fails_once_is_tried_again_before_anything_is_concluded(
    factory, recovery_store, sftp_target: SftpTarget
):
    """A partner that drops recovery's first connection (a real cut at the proxy) but answers the next
    one: the file there is evidence, so Completed, not 'not observed' and OutcomeUnknown."""
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    await factory.expire_lease(job.id)
    tries: list[str] = []

    def cut_the_first_listing(destination, name):
        try:
            return observe_final_name(destination, name)
        except Exception as exc:
            tries.append(type(exc).__name__)
            sftp_target.proxy.stop_cutting()  # the partner is back for the next try
            raise
        finally:
            tries.append("listed")

    sftp_target.proxy.cut_at_next_answer()
    recovery = RecoveryActivities(
        recovery_store,
        Settings(recovery_observe_tries=3),
        observe=cut_the_first_listing,
        partners=partner_for,
    )
    await ActivityEnvironment().run(
        recovery.take_over,
        next(c for c in await factory.recovery.find_expired_leases(limit=500) if c.id == job.id),
        "recovery:retry",
    )

    assert sftp_target.proxy.answer_swallowed.is_set() and tries[0] != "listed"
    status, detail = await resolution(factory, job.id)
    assert status == JobStatus.COMPLETED, detail
    assert [bool(seen.get("error")) for seen in await recovery_evidence(factory, job.id)] == [False]


async def replacement_delivering(factory, target: SftpTarget, data: bytes, **contract):
    """An original left OutcomeUnknown, and its replacement past cutoff 2 with the same final name."""
    tenant = await factory.tenant()
    destination = await factory.destination(tenant, **target.destination_row(**contract))
    original = await factory.queued(tenant_id=tenant, destination_id=destination)
    original, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=original)
    created = await factory.api.create_replacement(
        tenant_id=tenant,
        original_job_id=original.id,
        created_by="reconciler@acme",
        replacement_reason="original outcome unknown",
    )
    replacement = await factory.job(created.job_id)
    replacement, attempt = await delivering_to(factory, target, data, job=replacement)
    return original, replacement, attempt


@asyncssh_only
async def test_a_replacement_that_crashed_before_its_baseline_stays_unknown_despite_the_originals_file(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    original, replacement, _ = await replacement_delivering(factory, sftp_target, data)
    assert replacement.final_name == original.final_name
    sftp_target.put(replacement.final_name, data)  # same name and size: it may be the original's
    await factory.expire_lease(replacement.id)

    await recover(client, settings)

    status, detail = await resolution(factory, replacement.id)
    assert status == JobStatus.OUTCOME_UNKNOWN
    assert "without a recorded baseline" in detail
    assert (await factory.job(original.id)).status == JobStatus.OUTCOME_UNKNOWN


@asyncssh_only
async def test_a_replacement_completes_from_a_listing_changed_from_its_own_absent_baseline(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    _, replacement, attempt = await replacement_delivering(factory, sftp_target, data)
    destination = await worker_store.load_destination(replacement.tenant_id, replacement.destination_id)
    baseline = await asyncio.to_thread(observe_final_name, destination, replacement.final_name)
    assert not baseline.present
    await worker_store.append_delivery_evidence(
        replacement.id,
        attempt,
        f"attempt:{attempt}",
        {"observation": "baseline", "final_name": replacement.final_name, **baseline.as_evidence()},
    )
    sftp_target.put(replacement.final_name, data)  # its upload landed; it died before the read-back
    await factory.expire_lease(replacement.id)

    await recover(client, settings)

    assert (await resolution(factory, replacement.id))[0] == JobStatus.COMPLETED


@asyncssh_only
async def test_a_renewal_during_recoverys_lookup_prevents_the_takeover(
    settings, worker_store, factory, sftp_target: SftpTarget
):
    from activities.recovery import RecoveryActivities

    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    await factory.expire_lease(job.id)
    [candidate] = [c for c in await factory.recovery.find_expired_leases(500) if c.id == job.id]
    loop = asyncio.get_running_loop()

    def observe_while_the_worker_renews(destination, name):
        seen = observe_final_name(destination, name)  # the real listing
        # At this named point the paused worker wakes and renews: ownership ends only with a takeover.
        asyncio.run_coroutine_threadsafe(worker_store.renew_lease(job.id, attempt), loop).result(10)
        return seen

    recovery = RecoveryActivities(
        factory.recovery, settings, observe=observe_while_the_worker_renews, partners=partner_for
    )
    assert await recovery.take_over(candidate, "recovery:test") == Takeover.MATCHED_NOTHING

    still = await factory.job(job.id)
    assert (still.status, still.attempt_id) == (JobStatus.DELIVERING, attempt)
    assert len(await recovery_evidence(factory, job.id)) == 1  # what it saw is kept all the same


@asyncssh_only
async def test_a_late_receipt_from_a_superseded_attempt_is_kept_and_changes_nothing(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    await factory.expire_lease(job.id)
    await recover(client, settings)
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN

    # The paused worker resumes: its upload lands, it appends its receipt, its terminal write matches nothing.
    sftp_target.put(job.final_name, data)
    receipt = {"observation": "read_back", "final_name": job.final_name, "present": True, "size": SIZE}
    assert await worker_store.append_delivery_evidence(job.id, attempt, f"attempt:{attempt}", receipt)
    finish = await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED)

    assert finish == FinishResult.NOT_OWNER
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    kept = [e for e in await worker_store.job_events(job.id) if e.observed_by == f"attempt:{attempt}"]
    assert json.loads(kept[-1].detail)["observation"] == "read_back"


@asyncssh_only
async def test_over_a_replacements_occupied_baseline_only_a_matching_hash_completes(factory, sftp_target):
    """The overwrite case of decide_delivery on real rows: name and size cannot show the change."""
    from domain.evidence import Observation
    from rules.recovery import decide_delivery

    data = os.urandom(SIZE)
    _, replacement, attempt = await replacement_delivering(
        factory, sftp_target, data, hash_evidence="read_back"
    )
    destination = sftp_target.destination(hash_evidence="read_back")
    original_file = Observation(
        present=True, size=SIZE, mtime=1_000, sha256=hashlib.sha256(b"other").digest()
    )
    baseline = {
        "observation": "baseline",
        "final_name": replacement.final_name,
        **original_file.as_evidence(),
    }

    unchanged = decide_delivery(replacement, [baseline], original_file, destination)
    same_size_other_bytes = decide_delivery(
        replacement, [baseline], original_file.model_copy(update={"mtime": 2_000}), destination
    )
    ours = decide_delivery(
        replacement,
        [baseline],
        original_file.model_copy(update={"mtime": 2_000, "sha256": hashlib.sha256(data).digest()}),
        destination,
    )

    assert unchanged.resolution == JobStatus.OUTCOME_UNKNOWN
    assert same_size_other_bytes.resolution == JobStatus.OUTCOME_UNKNOWN
    assert ours.resolution == JobStatus.COMPLETED
    assert attempt == replacement.attempt_id

"""Recovery settles an expired attempt that fenced its rename by setting its temporary file aside (000
"Recovery": Failed needs "the partner confirming that nothing was published and that the attempt's ...
upload slot can no longer publish"), against both real SFTP servers and a real PostgreSQL.

After the rename fence the attempt's upload to its temporary name was complete and only the rename was left
to send. Recovery moves the temporary file to the attempt's set-aside name: rename is atomic, so of that
move and the attempt's rename exactly one moves the file. Once recovery's has, the paused worker's rename
can never publish it, and a final name that still shows the attempt's baseline is Failed NotDelivered
(``fail_set_aside_delivery``) instead of an OutcomeUnknown for a person. Both orders of the race with a
paused worker that wakes are here, each through the worker's real ``deliver``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.recovery import RecoveryActivities
from domain.evidence import set_aside_name_for, temp_name_for
from domain.models import DeliveryOutcome, ExportJob, FailureCode, FinishResult, JobStatus
from partner.client import session
from partner.delivery import DeliveryHooks, observe_final_name, set_aside_for_recovery
from partner.kinds import partner_for
from testbed.sftp import SftpTarget
from tests.partner.helpers import local_file, run_delivery
from tests.recovery.test_recovery_delivering import (
    SIZE,
    delivering_to,
    recover,
    recovery_evidence,
    replacement_delivering,
    resolution,
)
from workflows.models import Takeover


async def record_baseline(worker_store, job, attempt, destination) -> None:
    """The attempt's baseline listing, appended as the worker appends it before uploading."""
    seen = await asyncio.to_thread(observe_final_name, destination, job.final_name)
    await worker_store.append_delivery_evidence(
        job.id,
        attempt,
        f"attempt:{attempt}",
        {"observation": "baseline", "final_name": job.final_name, **seen.as_evidence()},
    )


@dataclass
class Paused:
    """An attempt that fenced its rename and stopped there, its lease expired: the state recovery meets."""

    job: ExportJob
    attempt: uuid.UUID
    data: bytes
    temp: str
    aside: str


async def paused_after_the_rename_fence(
    factory, worker_store, target: SftpTarget, *, baseline: bool = True, file_at: str = "temp", **contract
) -> Paused:
    """Its whole file under the temporary name (``file_at="aside"``: already set aside, ``"none"``: no
    file), its baseline recorded unless ``baseline`` is false, then its lease expired; ``contract`` is
    the destination's."""
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, target, data, **contract)
    if baseline:
        destination = await worker_store.load_destination(job.tenant_id, job.destination_id)
        await record_baseline(worker_store, job, attempt, destination)
    paused = Paused(
        job,
        attempt,
        data,
        temp_name_for(attempt, job.final_name),
        set_aside_name_for(attempt, job.final_name),
    )
    if file_at != "none":
        target.put(paused.temp if file_at == "temp" else paused.aside, data)
    await factory.expire_lease(job.id)
    return paused


async def candidate_for(factory, job_id):
    return next(c for c in await factory.recovery.find_expired_leases(limit=500) if c.id == job_id)


@pytest.mark.parametrize("baseline", [True, False], ids=["baseline", "no-baseline"])
async def test_a_crash_after_the_rename_fence_before_the_rename_is_set_aside_and_not_delivered(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget, baseline
):
    # Its upload was complete, it fenced its rename, and it died before sending the rename.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target, baseline=baseline)

    await recover(client, settings)

    status, detail = await resolution(factory, p.job.id)
    assert status == JobStatus.FAILED, detail
    assert (await factory.job(p.job.id)).failure_reason == FailureCode.NOT_DELIVERED
    final = "still shows the attempt's baseline" if baseline else "is still absent"
    assert detail == (
        f"Failed NotDelivered: recovery moved the attempt's temporary file under {p.aside}, so its rename can "
        f"never publish it, and the final name {final}"
    )
    assert sftp_target.files() == {p.aside: p.data}  # the bytes kept under a temporary name; nothing uploaded
    [moved] = await recovery_evidence(factory, p.job.id, "recovery_set_aside")
    assert (moved["result"], moved["moved"], moved["final_after"]["present"]) == ("ok", True, False)

    # The paused worker wakes and sends its rename: the server refuses it, there is nothing to publish.
    destination = await worker_store.load_destination(p.job.tenant_id, p.job.destination_id)

    def late_rename() -> None:
        with session(destination) as opened:
            opened.sftp.rename(destination.remote_path(p.temp), destination.remote_path(p.job.final_name))

    with pytest.raises(OSError) as refused:
        await asyncio.to_thread(late_rename)
    assert getattr(refused.value, "status", None) == 2  # SSH_FX_NO_SUCH_FILE
    assert sftp_target.files() == {p.aside: p.data}
    late = await worker_store.finish_delivery(p.job.id, p.attempt, DeliveryOutcome.COMPLETED)
    assert late == FinishResult.NOT_OWNER


async def test_a_file_the_worker_set_aside_before_it_died_is_found_and_not_delivered(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    # The worker settled a lost rename answer by setting its file aside, then died before its terminal write
    # (the case the last note left open): recovery finds the file under the set-aside name.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target, file_at="aside")

    await recover(client, settings)

    status, detail = await resolution(factory, p.job.id)
    assert status == JobStatus.FAILED, detail
    assert f"recovery found the attempt's temporary file under {p.aside}" in detail
    [found] = await recovery_evidence(factory, p.job.id, "recovery_set_aside")
    assert (found["result"], found["moved"]) == ("already_moved", True)
    assert sftp_target.files() == {p.aside: p.data}


async def test_over_an_occupied_baseline_the_set_aside_leaves_the_occupant_and_is_not_delivered(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    # A replacement over the original's file (an agreed overwrite) whose posix_rename was never sent before
    # it died. Setting its file aside leaves the original's file as the baseline showed it.
    data = os.urandom(SIZE)
    occupant = os.urandom(SIZE)
    _, replacement, attempt = await replacement_delivering(factory, sftp_target, data)
    sftp_target.put(replacement.final_name, occupant)
    destination = await worker_store.load_destination(replacement.tenant_id, replacement.destination_id)
    await record_baseline(worker_store, replacement, attempt, destination)
    sftp_target.put(temp_name_for(attempt, replacement.final_name), data)
    await factory.expire_lease(replacement.id)

    await recover(client, settings)

    status, detail = await resolution(factory, replacement.id)
    assert status == JobStatus.FAILED, detail
    assert detail.endswith("and the final name still shows the attempt's baseline")
    aside = set_aside_name_for(attempt, replacement.final_name)
    assert sftp_target.files() == {replacement.final_name: occupant, aside: data}


async def take_over(factory, recovery_store, settings, job: ExportJob, **seams) -> Takeover:
    """Recovery's takeover of this one job, with ``observe`` or ``set_aside`` seams."""
    recovery = RecoveryActivities(recovery_store, settings, **seams, partners=partner_for)
    return await ActivityEnvironment().run(
        recovery.take_over, await candidate_for(factory, job.id), "recovery:t"
    )


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_final_name_that_changed_when_the_file_was_set_aside_stays_unknown(
    factory, recovery_store, settings, worker_store, sftp_target: SftpTarget
):
    # Somebody wrote the final name between recovery's listing and its move (at the move's seam): the file is
    # set aside all the same, but what is under the final name is not what the baseline showed.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)

    def someone_writes_the_final_name_first(destination, attempt_id, final_name):
        sftp_target.put(final_name, os.urandom(SIZE // 2))
        return set_aside_for_recovery(destination, attempt_id, final_name)

    takeover = await take_over(
        factory, recovery_store, settings, p.job, set_aside=someone_writes_the_final_name_first
    )

    assert takeover == Takeover.OUTCOME_UNKNOWN
    status, detail = await resolution(factory, p.job.id)
    assert status == JobStatus.OUTCOME_UNKNOWN
    assert detail.endswith("but the final name changed since the baseline")
    assert p.aside in sftp_target.files()


async def test_a_worker_that_wakes_after_the_set_aside_finds_its_rename_refused_and_agrees(
    settings, recovery_store, factory, worker_store, sftp_target: SftpTarget, tmp_path: Path
):
    """One order of the race: the real ``deliver`` writes its rename fence (its ``authorize_rename``
    seam), then stalls past its lease; recovery sets its file aside and records Failed NotDelivered; the
    worker wakes and sends its rename, which the server refuses. The worker classifies the same outcome,
    its terminal write matches nothing, and the final name is never written."""
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data, fenced="upload")
    destination = await worker_store.load_destination(job.tenant_id, job.destination_id)
    loop = asyncio.get_running_loop()
    takeovers: list[Takeover] = []

    def fence_then_stall_past_the_lease() -> bool:
        async def while_stalled() -> None:
            assert await worker_store.fence_rename_if_delivering(job.id, attempt)  # as the worker does
            await factory.expire_lease(job.id)
            takeovers.append(await take_over(factory, recovery_store, settings, job))

        asyncio.run_coroutine_threadsafe(while_stalled(), loop).result(60)
        return True  # the fence matched before the stall: the worker goes on to send its rename

    run = await run_delivery(
        destination,
        local_file(tmp_path, data, job.final_name),
        attempt_id=attempt,
        hooks=DeliveryHooks(authorize_rename=fence_then_stall_past_the_lease),
    )
    report = run.report

    assert takeovers == [Takeover.NOT_DELIVERED]
    assert (report.outcome, report.failure_code) == (DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED)
    assert (run.one("rename")["result"], run.one("rename")["status"]) == ("refused", 2)
    finish = await worker_store.finish_delivery(job.id, attempt, report.outcome, report.failure_code)
    assert finish == FinishResult.NOT_OWNER
    assert (await factory.status(job.id)) == JobStatus.FAILED
    assert sftp_target.files() == {set_aside_name_for(attempt, job.final_name): data}


async def test_a_worker_that_wakes_and_renames_before_the_set_aside_is_completed_on_evidence(
    settings, recovery_store, factory, worker_store, sftp_target: SftpTarget
):
    """The other order: recovery lists the final name (absent), then the paused worker wakes and its rename
    lands before recovery's move (at the move's seam). The move finds neither name holding the file, and
    the final name now shows the attempt's file: Completed on that evidence, never a second upload."""
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)

    def the_worker_renames_first(destination, attempt_id, final_name):
        with session(destination) as opened:  # the worker's own rename request, on its session
            opened.sftp.rename(destination.remote_path(p.temp), destination.remote_path(final_name))
        return set_aside_for_recovery(destination, attempt_id, final_name)

    takeover = await take_over(factory, recovery_store, settings, p.job, set_aside=the_worker_renames_first)

    assert takeover == Takeover.COMPLETED
    status, detail = await resolution(factory, p.job.id)
    assert status == JobStatus.COMPLETED, detail
    [moved] = await recovery_evidence(factory, p.job.id, "recovery_set_aside")
    assert (moved["result"], moved["moved"], moved["final_after"]["size"]) == ("gone", False, SIZE)
    assert sftp_target.files() == {p.job.final_name: p.data}


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_renewal_before_the_move_leaves_the_workers_file_where_it_is(
    factory, recovery_store, settings, worker_store, sftp_target: SftpTarget
):
    # The paused worker wakes and renews while recovery lists: the row moved on, so recovery does not touch
    # the temporary file of an attempt that owns its lease again, and takes nothing over.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)
    loop = asyncio.get_running_loop()

    def observe_while_the_worker_renews(destination, name):
        seen = observe_final_name(destination, name)
        asyncio.run_coroutine_threadsafe(worker_store.renew_lease(p.job.id, p.attempt), loop).result(10)
        return seen

    takeover = await take_over(
        factory, recovery_store, settings, p.job, observe=observe_while_the_worker_renews
    )

    assert takeover == Takeover.MATCHED_NOTHING
    assert (await factory.job(p.job.id)).status == JobStatus.DELIVERING
    assert sftp_target.files() == {p.temp: p.data}
    assert await recovery_evidence(factory, p.job.id, "recovery_set_aside") == []


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_move_that_cannot_be_made_stays_unknown(
    factory, recovery_store, settings, worker_store, sftp_target: SftpTarget
):
    # The partner answers recovery's listing, then the link is cut as the move's session opens (a real cut
    # at the proxy): nothing proves the rename can no longer publish, so OutcomeUnknown, and the file stays
    # where it was.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)

    def cut_before_the_move(destination, attempt_id, final_name):
        sftp_target.proxy.cut_before_next_request()
        return set_aside_for_recovery(destination, attempt_id, final_name)

    takeover = await take_over(factory, recovery_store, settings, p.job, set_aside=cut_before_the_move)

    assert takeover == Takeover.OUTCOME_UNKNOWN
    status, detail = await resolution(factory, p.job.id)
    assert status == JobStatus.OUTCOME_UNKNOWN
    assert "the temporary file was not set aside" in detail
    assert sftp_target.proxy.request_dropped.is_set()
    assert sftp_target.files() == {p.temp: p.data}


# -- the partner's cleanup agreement (temporary_files = 'remove') --------------------------------------


async def cleanup_evidence(factory, job_id) -> list[tuple[str, str]]:
    found = await recovery_evidence(factory, job_id, "cleanup")
    return [(item["name"].rsplit(".", 1)[-1], item["result"]) for item in found]


async def test_under_a_cleanup_agreement_the_set_aside_file_is_removed_once_failed_is_recorded(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target, temporary_files="remove")

    await recover(client, settings)

    assert (await resolution(factory, p.job.id))[0] == JobStatus.FAILED
    assert sftp_target.files() == {}  # no contact data left at the partner, and nothing published
    assert await cleanup_evidence(factory, p.job.id) == [("csv", "absent"), ("set-aside", "removed")]


async def test_under_a_cleanup_agreement_an_unfenced_attempts_partial_file_is_removed(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data, fenced="upload", temporary_files="remove")
    sftp_target.put(temp_name_for(attempt, job.final_name), data[: SIZE // 2])  # cut mid-upload, then died
    await factory.expire_lease(job.id)

    await recover(client, settings)

    assert (await resolution(factory, job.id))[0] == JobStatus.FAILED
    assert sftp_target.files() == {}
    assert await cleanup_evidence(factory, job.id) == [("csv", "removed"), ("set-aside", "absent")]


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_an_outcome_unknown_keeps_its_files_whatever_the_agreement(
    factory, recovery_store, settings, worker_store, sftp_target: SftpTarget
):
    # A move that cannot be made leaves OutcomeUnknown: the temporary file is evidence for the reconciler.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target, temporary_files="remove")

    def cut_before_the_move(destination, attempt_id, final_name):
        sftp_target.proxy.cut_before_next_request()
        return set_aside_for_recovery(destination, attempt_id, final_name)

    takeover = await take_over(factory, recovery_store, settings, p.job, set_aside=cut_before_the_move)

    assert takeover == Takeover.OUTCOME_UNKNOWN
    assert sftp_target.files() == {p.temp: p.data}
    assert await cleanup_evidence(factory, p.job.id) == []


async def test_without_a_cleanup_agreement_the_files_stay_with_the_partner(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(
        factory, sftp_target, data, fenced="upload"
    )  # temporary_files = 'keep'
    partial = data[: SIZE // 2]
    sftp_target.put(temp_name_for(attempt, job.final_name), partial)
    await factory.expire_lease(job.id)

    await recover(client, settings)

    assert (await resolution(factory, job.id))[0] == JobStatus.FAILED
    assert sftp_target.files() == {temp_name_for(attempt, job.final_name): partial}
    assert await cleanup_evidence(factory, job.id) == []

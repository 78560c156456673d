"""Recovery re-checks an OutcomeUnknown whose partner did not answer, and settles it on the evidence a later
listing finds (0013; 000 "Recovery": an interrupted delivery "is OutcomeUnknown until evidence resolves it"),
against both real SFTP servers and a real PostgreSQL, through RecoveryWorkflow on the time-skipping server.

The partner's silence is a real fault: its TCP proxy refuses every new connection until the test lets them
through again. The re-check's interval and window run on the database clock, so the tests move the job's
history back in time instead of waiting (DESIGN "Things that are easy to get wrong").
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from uuid import UUID

import pytest
from temporalio.testing import ActivityEnvironment

from activities.recovery import RecoveryActivities
from domain.evidence import temp_name_for
from domain.models import DeliveryOutcome, EventKind, FailureCode, FinishResult, JobStatus, UnknownToRecheck
from partner.kinds import partner_for
from settings import Settings
from testbed import pg
from testbed.sftp import SftpTarget
from tests.recovery.conftest import MAX_ATTEMPTS
from tests.recovery.test_recovery_delivering import SIZE, delivering_to, recover, recovery_evidence
from tests.recovery.test_recovery_set_aside import paused_after_the_rename_fence
from workflows.models import Recheck, RecheckInput

INTERVAL_MINUTES = 10.0


@pytest.fixture(scope="module")
def settings(database: pg.TestDatabase) -> Settings:
    """The module's worker settings, with one listing per try (a silent partner answers nothing faster)."""
    return Settings(
        database_url=database.app_url,
        task_queue=f"exports-{uuid.uuid4().hex[:8]}",
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=60,
        recovery_observe_tries=1,
        recovery_recheck_minutes=INTERVAL_MINUTES,
        recovery_recheck_hours=24,
    )


async def minutes_pass(factory, job_id: UUID, minutes: float) -> None:
    """The job's history recorded ``minutes`` earlier: the database clock is what the interval reads."""
    await factory.admin(
        "UPDATE export_attempt_events SET recorded_at = recorded_at - make_interval(secs => %(s)s)"
        " WHERE job_id = %(id)s",
        {"id": job_id, "s": minutes * 60},
    )


async def settlement(factory, job_id: UUID) -> Any:
    (event,) = [e for e in await factory.worker.job_events(job_id) if e.kind == EventKind.RECONCILED]
    return event


async def unknown_because_the_partner_was_silent(
    client, settings, factory, target: SftpTarget, job_id
) -> None:
    """Recovery takes the expired attempt over while the partner refuses every connection: OutcomeUnknown,
    the listing kept as evidence with its error; then the partner answers again."""
    target.proxy.refuse_new_connections()
    try:
        await recover(client, settings)
    finally:
        target.proxy.refuse_new_connections(False)
    job = await factory.job(job_id)
    assert job.status == JobStatus.OUTCOME_UNKNOWN
    [listing] = await recovery_evidence(factory, job_id)
    assert "error" in listing


async def test_a_delivery_the_partner_could_not_confirm_is_settled_completed_once_it_answers(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # The worker died after its rename landed; when recovery took it over the partner did not answer.
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    await factory.expire_lease(job.id)
    await unknown_because_the_partner_was_silent(client, settings, factory, sftp_target, job.id)

    await recover(client, settings)  # within the interval: not listed again yet
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert len(await recovery_evidence(factory, job.id)) == 1

    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    await recover(client, settings)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.COMPLETED, None)
    event = await settlement(factory, job.id)
    assert event.attempt_id == attempt and event.observed_by.startswith("recovery:")
    assert event.detail.startswith("Completed: listing by recovery")
    _, answered = await recovery_evidence(factory, job.id)
    assert (answered["present"], answered["size"]) == (True, SIZE)
    assert sftp_target.files() == {job.final_name: data}  # settled by looking: nothing uploaded again


async def test_a_rename_fenced_file_is_set_aside_and_settled_not_delivered_once_the_partner_answers(
    client, settings, recovery_worker, factory, worker_store, sftp_target: SftpTarget
):
    # Its whole file under the temporary name, its rename fenced, then silence: recovery could not move the
    # file aside, so a paused worker might still have renamed it. Once the partner answers, the move proves
    # it never will, and the final name still shows the baseline.
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)
    await unknown_because_the_partner_was_silent(client, settings, factory, sftp_target, p.job.id)

    await minutes_pass(factory, p.job.id, INTERVAL_MINUTES + 1)
    await recover(client, settings)

    settled = await factory.job(p.job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    event = await settlement(factory, p.job.id)
    assert event.detail == (
        f"Failed: recovery moved the attempt's temporary file under {p.aside}, so its rename can never "
        "publish it, and the final name still shows the attempt's baseline"
    )
    assert sftp_target.files() == {p.aside: p.data}
    [moved] = await recovery_evidence(factory, p.job.id, "recovery_set_aside")
    assert (moved["result"], moved["moved"]) == ("ok", True)


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_an_outcome_unknown_the_worker_recorded_is_settled_by_recoverys_first_listing(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # The worker recorded OutcomeUnknown itself (its rename's answer was lost and the partner went silent
    # before it could look); the rename had landed. Recovery never listed it: it is listed once the interval
    # has passed since the worker's write.
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    assert await factory.worker.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN) == (
        FinishResult.WRITTEN
    )

    await recover(client, settings)
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN  # the worker looked just now

    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    await recover(client, settings)

    assert await factory.status(job.id) == JobStatus.COMPLETED
    assert (await settlement(factory, job.id)).observed_by.startswith("recovery:")


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_partner_that_answers_without_settling_it_leaves_it_to_a_person(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # Once the partner answers, what it shows under the final name is not the expected file (and no
    # temporary file is left to move): the answer settles nothing, and no later listing is made.
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    await factory.expire_lease(job.id)
    await unknown_because_the_partner_was_silent(client, settings, factory, sftp_target, job.id)
    sftp_target.put(job.final_name, os.urandom(SIZE // 2))

    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    await recover(client, settings)
    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    await recover(client, settings)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    listings = await recovery_evidence(factory, job.id)
    assert ["error" in item for item in listings] == [True, False]  # one more listing, answered
    assert [e for e in await factory.worker.job_events(job.id) if e.kind == EventKind.RECONCILED] == []


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_partner_still_silent_is_listed_again_each_interval(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    await factory.expire_lease(job.id)
    sftp_target.proxy.refuse_new_connections()
    try:
        await recover(client, settings)
        for _ in range(2):
            await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
            await recover(client, settings)
    finally:
        sftp_target.proxy.refuse_new_connections(False)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    listings = await recovery_evidence(factory, job.id)
    assert len(listings) == 3 and all("error" in item for item in listings)


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_re_checks_turned_off_list_nothing(settings, recovery_store, factory, sftp_target: SftpTarget):
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    assert await factory.worker.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN) == (
        FinishResult.WRITTEN
    )
    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    off = RecoveryActivities(
        recovery_store, settings.model_copy(update={"recovery_recheck_hours": 0}), partners=partner_for
    )

    result = await ActivityEnvironment().run(
        off.recheck_unknown_outcomes, RecheckInput(recovery_run_id="recovery:off", limit=100)
    )

    assert result.rechecked == 0
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert await recovery_evidence(factory, job.id) == []


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_run_re_checks_one_wave_of_the_oldest_and_the_next_run_the_rest(
    settings, recovery_store, factory, sftp_target: SftpTarget
):
    # One wave a run, recovery_concurrency wide, each listed once: a partner that hangs costs a run one
    # listing's timeout at most, and what did not fit waits for the next run.
    jobs = []
    for _ in range(3):
        data = os.urandom(SIZE)
        job, attempt = await delivering_to(factory, sftp_target, data)
        sftp_target.put(job.final_name, data)
        finished = await factory.worker.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN)
        assert finished == FinishResult.WRITTEN
        await minutes_pass(factory, job.id, 23 * 60 - len(jobs))  # older than the module's others; in order
        jobs.append(job)
    two_wide = RecoveryActivities(
        recovery_store, settings.model_copy(update={"recovery_concurrency": 2}), partners=partner_for
    )

    async def run() -> None:
        await ActivityEnvironment().run(
            two_wide.recheck_unknown_outcomes, RecheckInput(recovery_run_id="recovery:wave", limit=100)
        )

    await run()
    assert [await factory.status(j.id) for j in jobs] == [
        JobStatus.COMPLETED,
        JobStatus.COMPLETED,
        JobStatus.OUTCOME_UNKNOWN,
    ]
    await run()
    assert await factory.status(jobs[2].id) == JobStatus.COMPLETED
    assert [len(await recovery_evidence(factory, j.id)) for j in jobs] == [1, 1, 1]


# -- settled from the row's own fences (issue 23) -----------------------------------------------------------


async def unknown_after_a_refused_upload(
    factory, target: SftpTarget, data: bytes, **contract
) -> tuple[Any, UUID]:
    """What older code recorded after the partner refused the upload and the fresh listing failed: the
    attempt's upload fence, part of the file under its temporary name, no rename fence, OutcomeUnknown."""
    job, attempt = await delivering_to(factory, target, data, fenced="upload", **contract)
    target.put(temp_name_for(attempt, job.final_name), data[: SIZE // 3])
    finished = await factory.worker.finish_delivery(
        job.id,
        attempt,
        DeliveryOutcome.OUTCOME_UNKNOWN,
        summary="upload refused and the fresh listing failed",
    )
    assert finished == FinishResult.WRITTEN
    return await factory.job(job.id), attempt


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_an_unknown_whose_fences_show_the_rename_was_never_sent_is_settled_not_delivered_at_once(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # No interval, no listing, no set-aside: the row alone proves it. The partner answers nobody meanwhile,
    # and recovery's run settles it all the same.
    data = os.urandom(SIZE)
    job, attempt = await unknown_after_a_refused_upload(factory, sftp_target, data)
    partial = sftp_target.files()

    sftp_target.proxy.refuse_new_connections()
    try:
        result = await recover(client, settings)
    finally:
        sftp_target.proxy.refuse_new_connections(False)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert result.settled_not_delivered >= 1
    event = await settlement(factory, job.id)
    assert event.attempt_id == attempt and event.observed_by.startswith("recovery:")
    assert event.detail == (
        "Failed: the attempt fenced its upload and never its rename, so it never sent the rename request "
        "and never wrote the final name"
    )
    assert await recovery_evidence(factory, job.id) == []  # nothing listed
    assert await recovery_evidence(factory, job.id, "recovery_set_aside") == []  # nothing moved
    assert sftp_target.files() == partial  # nothing touched at the partner


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_an_unknown_settled_from_its_fences_has_its_temporary_file_removed_under_the_agreement(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, attempt = await unknown_after_a_refused_upload(factory, sftp_target, data, temporary_files="remove")
    sftp_target.put(job.final_name, os.urandom(100))  # someone else's file: never touched

    await recover(client, settings)

    assert await factory.status(job.id) == JobStatus.FAILED
    assert set(sftp_target.files()) == {job.final_name}
    removed = await recovery_evidence(factory, job.id, "cleanup")
    assert [(r["name"], r["result"]) for r in removed][0] == (
        temp_name_for(attempt, job.final_name),
        "removed",
    )


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_an_unknown_whose_rename_was_fenced_is_not_settled_from_its_fences(
    client, settings, recovery_worker, factory, sftp_target: SftpTarget
):
    # Past the rename fence the rename may have been sent: only the partner's evidence can settle it, and
    # the worker recorded it just now, so the re-check waits for its interval.
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data, fenced="rename")
    assert await factory.worker.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN) == (
        FinishResult.WRITTEN
    )

    await recover(client, settings)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert [e for e in await factory.worker.job_events(job.id) if e.kind == EventKind.RECONCILED] == []


@pytest.mark.parametrize("sftp_server", ["asyncssh"])
async def test_a_listing_re_check_of_an_unknown_its_fences_settle_settles_it_from_them_and_lists_nothing(
    settings, recovery_store, factory, sftp_target: SftpTarget
):
    # Nominated for a listing all the same (its settlement by the fences failed in an earlier run, say): an
    # original's final name showing the expected size would read as Completed, yet the attempt never renamed.
    data = os.urandom(SIZE)
    job, attempt = await unknown_after_a_refused_upload(factory, sftp_target, data)
    sftp_target.put(job.final_name, os.urandom(SIZE))  # another writer's file, of the expected size
    recovery = RecoveryActivities(recovery_store, settings, partners=partner_for)

    outcome = await recovery.recheck(UnknownToRecheck(job_id=job.id, attempt_id=attempt), "recovery:direct")

    assert outcome == Recheck.NOT_DELIVERED
    assert await factory.status(job.id) == JobStatus.FAILED
    assert await recovery_evidence(factory, job.id) == []

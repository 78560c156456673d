"""Every row of the seed's response table (001 "What the API returns"), with the console's message."""

from __future__ import annotations

import uuid

import psycopg

from domain.models import DeliveryOutcome, FailureCode, FinishResult, JobStatus, ReleaseResult, StopPoint
from service.views import clock
from tests.api.conftest import cancel_body, counted, increase, recorded_requests, snapshot


async def test_cancel_of_a_queued_export_is_200_canceled_while_queued_and_no_attempt_had_started(
    client, factory, acme
):
    job = await factory.queued(acme.id, acme.destination_id)
    request_id = uuid.uuid4()

    r = await client.post(
        f"/exports/{job.id}/cancellations", json=cancel_body(request_id), headers=acme.operator
    )

    assert r.status_code == 200
    body = r.json()
    assert body["outcome"] == "CanceledWhileQueued"
    assert body["request_id"] == str(request_id)
    assert body["any_attempt_started"] is False
    assert body["message"] == "Canceled while queued. No attempt had started, and none will."
    assert await factory.status(job.id) == JobStatus.CANCELED


async def test_cancel_after_recovery_requeued_says_no_further_attempt_will_start(
    client, factory, recovery_store, acme
):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    await factory.expire_lease(job.id)
    assert await recovery_store.requeue_expired_attempt(job.id, attempt, 3, "recovery-test")

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 200
    assert r.json()["any_attempt_started"] is True
    message = r.json()["message"]
    assert message.startswith("Canceled while queued. No further attempt will start. ")
    requeued = [e for e in await recovery_store.job_events(job.id) if e.kind.value == "RequeuedByRecovery"]
    assert message.endswith(
        f"The earlier attempt {str(attempt)[:8]}… ended at {clock(requeued[0].recorded_at)}: "
        "its lease expired and recovery returned the export to the queue."
    )


async def test_cancel_after_a_give_back_names_how_the_earlier_attempt_ended(
    client, factory, worker_store, acme
):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    assert (
        await worker_store.release_attempt_if_running(job.id, attempt, "worker-3", "drain")
        == ReleaseResult.RELEASED
    )

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 200
    assert r.json()["message"].startswith("Canceled while queued. No further attempt will start. ")
    assert f"The earlier attempt {str(attempt)[:8]}… ended at " in r.json()["message"]
    assert r.json()["message"].endswith("its worker gave it back to the queue without using it up.")


async def test_cancel_of_a_job_that_never_started_names_no_earlier_attempt(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.json()["message"] == "Canceled while queued. No attempt had started, and none will."


async def test_a_second_request_is_200_already_canceled_by_the_first_and_changes_nothing(
    client, factory, acme
):
    job = await factory.queued(acme.id, acme.destination_id)
    first = uuid.uuid4()
    await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(first), headers=acme.operator)
    before = await snapshot(factory, job.id)

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 200
    body = r.json()
    assert body["outcome"] == "AlreadyCanceled"
    assert body["canceled_by_request_id"] == str(first)
    assert body["canceled_at"] is not None
    assert body["changed_nothing"] is True
    assert body["message"].startswith(f"Already canceled by {first}.")
    after = await snapshot(factory, job.id)
    assert after["requests"] == before["requests"] + 1  # the request that changed nothing is still kept
    assert {k: v for k, v in after.items() if k != "requests"} == {
        k: v for k, v in before.items() if k != "requests"
    }


async def test_resubmitting_the_same_request_id_returns_the_recorded_outcome(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    body = cancel_body()

    first = await client.post(f"/exports/{job.id}/cancellations", json=body, headers=acme.operator)
    again = await client.post(f"/exports/{job.id}/cancellations", json=body, headers=acme.operator)

    assert first.status_code == again.status_code == 200
    assert again.json()["outcome"] == "CanceledWhileQueued"
    assert again.json()["replayed"] is True
    assert await recorded_requests(factory, job.id) == 1


async def test_cancel_of_a_running_export_is_202_stop_requested_with_a_status_url(client, factory, acme):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    request_id = uuid.uuid4()

    r = await client.post(
        f"/exports/{job.id}/cancellations", json=cancel_body(request_id), headers=acme.operator
    )

    assert r.status_code == 202
    body = r.json()
    assert body["outcome"] == "StopRequested"
    assert body["attempt_id"] == str(attempt)
    assert body["worker"] == "worker-3"
    assert r.headers["location"] == body["status_url"] == f"/exports/{job.id}"
    assert body["message"].startswith("Already started at ")
    assert "Stop requested" in body["message"]
    row = await factory.job(job.id)
    assert row.status == JobStatus.RUNNING and row.stop_request_id == request_id


async def test_a_second_stop_is_202_stop_already_requested_naming_the_first(client, factory, acme):
    job, _ = await factory.running(await factory.queued(acme.id, acme.destination_id))
    first = uuid.uuid4()
    await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(first), headers=acme.operator)

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 202
    assert r.json()["outcome"] == "StopAlreadyRequested"
    assert r.json()["stop_request_id"] == str(first)
    assert r.headers["location"] == f"/exports/{job.id}"


async def test_the_status_url_reports_stopped_once_the_attempt_recorded_it(
    client, factory, worker_store, acme
):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)
    status_url = r.headers["location"]
    assert "Stopped at" not in (await client.get(status_url, headers=acme.operator)).json()["message"]

    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.WRITTEN
    )

    view = (await client.get(status_url, headers=acme.operator)).json()
    assert view["export"]["status"] == "Stopped"
    assert view["message"].startswith("Already started at ")
    assert view["message"].endswith(", before delivery was authorized. Nothing was sent.")
    assert "Stopped at " in view["message"]


async def test_cancel_of_a_stopped_export_is_409_already_ended_with_the_stop_it_honored(
    client, factory, acme
):
    job, _ = await factory.in_status(
        JobStatus.STOPPED, job=await factory.queued(acme.id, acme.destination_id)
    )

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 409
    body = r.json()
    assert body["outcome"] == "AlreadyEnded"
    assert body["ending"] == "Stopped"
    assert body["honored_stop_request_id"] == str(job.stop_request_id)
    assert body["delivered_nothing"] is True
    assert body["message"].startswith("Already ended: stopped at ")


async def test_cancel_of_a_rejected_or_failed_export_is_409_already_ended(client, factory, acme):
    for status in (JobStatus.REJECTED, JobStatus.FAILED):
        job, _ = await factory.in_status(status, job=await factory.queued(acme.id, acme.destination_id))

        r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

        assert r.status_code == 409
        assert r.json()["outcome"] == "AlreadyEnded"
        assert r.json()["ending"] == status.value
        assert r.json()["honored_stop_request_id"] is None
        assert r.json()["delivered_nothing"] is True


async def test_a_replacement_that_found_the_originals_file_says_it_happened_under_the_original(
    client, factory, acme
):
    original, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    made = await client.post(
        f"/exports/{original.id}/replacements", json={"reason": "original unresolved"}, headers=acme.operator
    )
    replacement = await factory.job(uuid.UUID(made.json()["export"]["id"]))
    await factory.in_status(JobStatus.FAILED, code=FailureCode.ORIGINAL_DELIVERED, job=replacement)

    r = await client.post(
        f"/exports/{replacement.id}/cancellations", json=cancel_body(), headers=acme.operator
    )

    assert r.status_code == 409
    assert r.json()["outcome"] == "AlreadyEnded"
    assert r.json()["delivered_under_original_job"] == str(original.id)
    assert str(original.id) in r.json()["message"]


async def test_cancel_after_cutoff_2_is_409_too_late_and_reports_completed_only_once_recorded(
    client, factory, worker_store, acme
):
    job, attempt = await factory.delivering(await factory.queued(acme.id, acme.destination_id))

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 409
    body = r.json()
    assert body["outcome"] == "TooLate"
    assert body["current_status"] == "Delivering"
    assert body["delivery_outcome"] is None
    assert body["delivery_authorized_at"] == job.delivery_authorized_at.isoformat()
    assert body["message"].startswith("Too late: delivery was authorized at about ")
    assert "completed" not in body["message"] and "unknown" not in body["message"]
    assert await factory.status(job.id) == JobStatus.DELIVERING  # not rewritten

    assert (
        await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN
    )
    view = (await client.get(f"/exports/{job.id}", headers=acme.operator)).json()
    assert "Delivery completed at " in view["message"]
    assert (
        ": 48,112 contacts (contacts-" in view["message"]
    )  # the count recorded at cutoff 2, as the seed says it
    assert view["export"]["status"] == "Completed"


async def test_cancel_of_a_completed_or_unknown_export_is_409_too_late_with_the_outcome(
    client, factory, acme
):
    for status, words in (
        (JobStatus.COMPLETED, "Delivery completed at"),
        (JobStatus.OUTCOME_UNKNOWN, "unknown"),
    ):
        job, _ = await factory.in_status(status, job=await factory.queued(acme.id, acme.destination_id))

        r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

        assert r.status_code == 409
        assert r.json()["outcome"] == "TooLate"
        assert r.json()["delivery_outcome"] == status.value
        assert words in r.json()["message"]
        assert await factory.status(job.id) == status


async def test_a_request_id_reused_for_another_export_is_400_and_says_nothing_about_it(client, factory, acme):
    first_job = await factory.queued(acme.id, acme.destination_id)
    other_job = await factory.queued(acme.id, acme.destination_id)
    request_id = uuid.uuid4()
    await client.post(
        f"/exports/{first_job.id}/cancellations", json=cancel_body(request_id), headers=acme.operator
    )

    r = await client.post(
        f"/exports/{other_job.id}/cancellations", json=cancel_body(request_id), headers=acme.operator
    )

    assert r.status_code == 400
    assert r.json()["outcome"] == "RequestIdReused"
    assert str(first_job.id) not in r.text
    assert set(r.json()) == {"outcome", "request_id", "detail"}
    assert await factory.status(other_job.id) == JobStatus.QUEUED
    assert await recorded_requests(factory, other_job.id) == 0


async def test_a_missing_export_is_404_and_records_nothing(client, factory, acme):
    r = await client.post(f"/exports/{uuid.uuid4()}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 404
    assert r.json()["outcome"] == "NotFound"


async def test_a_held_row_lock_is_503_busy_records_nothing_and_the_retry_with_the_same_id_decides(
    client, factory, database, acme
):
    job = await factory.queued(acme.id, acme.destination_id)
    body = cancel_body()
    before = await counted(client)
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})

        busy = await client.post(f"/exports/{job.id}/cancellations", json=body, headers=acme.operator)

        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "2"
        assert busy.json()["outcome"] == "Busy"
        assert busy.json()["recorded"] is False
        assert "same request ID" in busy.json()["message"]
        await holder.rollback()
    assert await recorded_requests(factory, job.id) == 0
    assert await factory.status(job.id) == JobStatus.QUEUED

    retry = await client.post(f"/exports/{job.id}/cancellations", json=body, headers=acme.operator)

    assert retry.status_code == 200
    assert retry.json()["outcome"] == "CanceledWhileQueued"
    # The API's /metrics counted both answers, the Busy one as Busy, and the one change of the job.
    after = await counted(client)
    cancellations = "fenced_exports_cancellations_total"
    assert increase(before, after, cancellations, outcome="Busy", source="api") == 1
    assert increase(before, after, "fenced_exports_busy_answers_total", operation="cancel") == 1
    assert increase(before, after, cancellations, outcome="CanceledWhileQueued", source="api") == 1
    written = {"statement": "cancel_and_record", "result": "written"}
    assert increase(before, after, "fenced_exports_transitions_total", **written) == 1

"""The console's sentences for the less common endings, from rows reached through the protocol."""

from __future__ import annotations

import uuid

from domain.models import FailureCode, FinishResult, JobStatus, ReleaseCause, ReleaseResult, StopPoint
from rules.releases import ReleasePolicy
from tests.api.conftest import cancel_body


async def test_a_job_that_gave_up_says_so_not_build_failed(client, factory, recovery_store, acme):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    await factory.expire_lease(job.id)
    assert await recovery_store.exhaust_expired_attempt(job.id, attempt, 1, "recovery-test")

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.status_code == 409
    assert r.json()["failure_reason"] == FailureCode.ATTEMPTS_EXHAUSTED.value
    assert r.json()["message"] == "Already ended: gave up after 1 attempts. This export delivered nothing."


async def test_a_second_stop_reads_stopped_once_the_attempt_recorded_it(client, factory, worker_store, acme):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    first = uuid.uuid4()
    await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(first), headers=acme.operator)
    second = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)
    assert f"Stop already requested by {first}" in second.json()["message"]

    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.BEFORE_DELIVERY) == FinishResult.WRITTEN
    )

    view = (await client.get(f"/exports/{job.id}", headers=acme.operator)).json()
    assert "Stopped at " in view["message"] and view["message"].endswith("Nothing was sent.")


async def test_an_unknown_outcome_is_reported_as_unknown_never_as_completed(client, factory, acme):
    job, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    message = r.json()["message"]
    assert "The delivery outcome is unknown" in message
    assert "completed" not in message.lower().replace("outcomeunknown", "")


async def test_a_rejected_export_says_the_policy_rejected_it(client, factory, acme):
    job, _ = await factory.in_status(
        JobStatus.REJECTED, job=await factory.queued(acme.id, acme.destination_id)
    )

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)

    assert r.json()["message"].startswith("Already ended: the policy check rejected this export")


async def test_a_job_given_back_too_often_says_it_gave_up_after_its_give_backs_and_why(
    client, factory, worker_store, acme
):
    policy = ReleasePolicy(base_seconds=0.1, cap_seconds=0.1, max_releases=1)
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))
    assert (
        await worker_store.release_attempt_if_running(
            job.id, attempt, "worker-3", "build interrupted: CopyFailed", ReleaseCause.TRANSIENT, policy
        )
        == ReleaseResult.RELEASED
    )

    waiting = (await client.get(f"/exports/{job.id}", headers=acme.operator)).json()
    assert waiting["status_line"].startswith(
        "Queued (v1): given back once after failures; the next try is not before "
    )
    assert [e["label"] for e in waiting["timeline"]][-1] == "Given back"
    assert waiting["timeline"][-1]["detail"].startswith(
        "transient: build interrupted: CopyFailed; the next claim"
    )

    await factory.end_wait(job.id)
    job, attempt = await factory.running(await factory.job(job.id))
    assert (
        await worker_store.release_attempt_if_running(
            job.id, attempt, "worker-3", "cutoff 2 not decided: NotPermitted", ReleaseCause.TRANSIENT, policy
        )
        == ReleaseResult.EXHAUSTED
    )

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator)
    assert r.status_code == 409
    assert r.json()["message"] == (
        "Already ended: gave up after being given back 1 time after failures, the limit; last cause: "
        "transient: cutoff 2 not decided: NotPermitted. This export delivered nothing."
    )
    view = (await client.get(f"/exports/{job.id}", headers=acme.operator)).json()
    assert view["status_line"].startswith("Failed: gave up after being given back 1 time after failures")


async def test_a_delivery_waiting_to_be_tried_again_says_next_try_at_and_each_try_with_its_cause(
    client, factory, worker_store, acme
):
    from domain.models import FailureCause, RetryResult
    from rules.retries import RetryPolicy
    from tests.api.conftest import sign_in

    policy = RetryPolicy(base_seconds=600.0, cap_seconds=600.0, max_attempts=3)
    job, attempt = await factory.delivering(await factory.queued(acme.id, acme.destination_id))
    await factory.fence(job.id, attempt, rename=False)
    answer = await worker_store.retry_delivery_if_delivering(
        job.id,
        attempt,
        FailureCause.CONNECT_REFUSED,
        "no SFTP session opened (Unreachable); nothing was sent",
        policy,
    )
    assert answer == RetryResult.RETRIED
    row = await factory.job(job.id)

    view = (await client.get(f"/exports/{job.id}", headers=acme.operator)).json()
    assert view["status_line"] == (
        "Queued (v1): try 1 of 3 failed (connect_refused), nothing was delivered; next try at "
        f"{row.available_at.strftime('%H:%M:%S.%f')[:-3]} UTC."
    )
    [retry] = [e for e in view["timeline"] if e["label"] == "Retry scheduled"]
    assert retry["detail"].startswith("connect_refused: no SFTP session opened (Unreachable)")
    assert retry["subject"] == f"attempt {attempt}"

    await sign_in(client, acme, as_role="viewer")
    try:
        page = (await client.get(f"/console/exports/{job.id}")).text
    finally:
        client.cookies.clear()
    assert "try 1 of 3 failed (connect_refused), nothing was delivered; next try at" in page
    assert "Retry scheduled" in page

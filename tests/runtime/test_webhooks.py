"""The webhook dispatcher against a real HTTP receiver (issue 26, item 1): each outcome reaches every endpoint
subscribed to it once, signed so that ``standardwebhooks`` verifies it, with no contact data; a failing or
unreachable endpoint is retried with the same event ID and backoff; a delivery still failing at the end of its
window is given up, and a person's redelivery sends it again. Time is moved on the rows, never slept."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

import pytest

from db.pool import open_pool
from db.stores.notifications import NotificationStore
from domain.models import CancellationOutcome, JobStatus
from domain.notifications import NotificationKind
from runtime.webhooks import WebhookDispatcher
from service.auth import Caller
from service.notifications import CreateEndpoint, Notifications
from settings import Settings
from testbed.webhook_receiver import WebhookReceiver
from tests.support.eventually import eventually
from tests.support.factories import Factory

CONTACTS = [
    ("mara.quill@contact.example", "Mara", "Quillfeather"),
    ("otto.vane@contact.example", "Otto", "Vanderquist"),
]
ALL_KINDS = list(NotificationKind)


def webhook_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "webhook_retry_base_seconds": 10.0,
        "webhook_retry_cap_seconds": 3600.0,
        "webhook_timeout_seconds": 3.0,
        "webhook_lease_seconds": 30.0,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
async def notification_store(database) -> AsyncIterator[NotificationStore]:
    pool = await open_pool(database.app_url, "exports_dispatcher", max_size=4)
    yield NotificationStore(pool)
    await pool.close()


@pytest.fixture
def dispatcher(notification_store) -> Iterator[WebhookDispatcher]:
    # jitter 1.0: the longest wait of the backoff, so a test can say exactly when the next attempt is due
    yield WebhookDispatcher(notification_store, webhook_settings(), jitter=lambda: 1.0)


async def admin_caller(factory: Factory, name: str) -> Caller:
    tenant_id = await factory.tenant(name)
    await factory.principal(tenant_id, "ada.admin", role="admin")
    return Caller(tenant_id=tenant_id, principal="ada.admin", role="admin")


async def register(
    api_store, receiver: WebhookReceiver, caller: Caller, events: list[NotificationKind] = ALL_KINDS
) -> tuple[UUID, str]:
    """An endpoint of ``caller``'s tenant at a path of its own on the receiver; (endpoint ID, path)."""
    path = f"/hooks/{uuid.uuid4()}"
    answer = await Notifications(api_store, webhook_settings()).create(
        caller, CreateEndpoint(url=receiver.url(path), events=events)
    )
    assert answer.ok, answer.body
    receiver.expect(path, answer.body["secret"])
    return UUID(answer.body["endpoint"]["id"]), path


async def delivery_rows(factory: Factory, endpoint_id: UUID) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT d.*, e.kind FROM webhook_deliveries d JOIN notification_events e ON e.id = d.event_id"
        " WHERE d.endpoint_id = %(e)s ORDER BY d.created_at",
        {"e": endpoint_id},
    )


async def make_due(factory: Factory, endpoint_id: UUID) -> None:
    """The clock: the endpoint's pending retries are due now (the row moves, not the time)."""
    await factory.admin(
        "UPDATE webhook_deliveries SET next_attempt_at = clock_timestamp() - interval '1 millisecond'"
        " WHERE endpoint_id = %(e)s AND state = 'pending'",
        {"e": endpoint_id},
    )


async def test_each_outcome_reaches_each_subscribed_endpoint_once_verified_and_without_contact_data(
    factory, api_store, receiver, dispatcher
):
    caller = await admin_caller(factory, "hooked")
    destination_id = await factory.destination(caller.tenant_id, name="partner-hooked")
    await factory.contacts(caller.tenant_id, "vip", CONTACTS)
    everything, everything_path = await register(api_store, receiver, caller)
    completed_only, completed_path = await register(api_store, receiver, caller, [NotificationKind.COMPLETED])
    other = await admin_caller(factory, "elsewhere")
    _, other_path = await register(api_store, receiver, other)

    jobs: dict[JobStatus, Any] = {}
    for status in (
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
        JobStatus.CANCELED,
        JobStatus.REJECTED,
        JobStatus.OUTCOME_UNKNOWN,
    ):
        jobs[status], _ = await factory.in_status(
            status, job=await factory.queued(caller.tenant_id, destination_id, list_name="vip")
        )
    assert (await factory.cancel(jobs[JobStatus.COMPLETED])).outcome == CancellationOutcome.TOO_LATE

    done = await dispatcher.dispatch_once()

    got = receiver.received(everything_path)
    assert done.attempts >= 8 and done.delivered >= 8
    assert sorted(r.event["type"] for r in got) == sorted(
        [k.value for k in ALL_KINDS if k != NotificationKind.RECURRING_FIRING_SKIPPED]
    )
    assert len({r.webhook_id for r in got}) == len(got) == 7
    assert all(r.verified for r in got), "a signature did not verify with standardwebhooks"
    assert all(r.webhook_id == r.event["id"] for r in got)
    assert {r.event["data"]["export_id"] for r in got} == {str(j.id) for j in jobs.values()}
    assert all(r.event["tenant_id"] == str(caller.tenant_id) for r in got)
    assert [r.event["type"] for r in receiver.received(completed_path)] == ["export.completed"]
    assert receiver.received(other_path) == []
    for r in receiver.received():
        assert not any(value.encode() in r.body for contact in CONTACTS for value in contact), (
            f"contact data in a webhook body: {r.event['type']}"
        )
    assert [d["state"] for d in await delivery_rows(factory, everything)] == ["delivered"] * 7
    assert [d["state"] for d in await delivery_rows(factory, completed_only)] == ["delivered"]

    again = await dispatcher.dispatch_once()  # nothing new: nothing sent twice

    assert len(receiver.received(everything_path)) == 7
    assert again.events == 0


async def test_an_answer_other_than_2xx_is_retried_with_the_same_event_id_and_body(
    factory, api_store, receiver, dispatcher
):
    caller = await admin_caller(factory, "flaky")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.COMPLETED])
    receiver.answer(path, 500, 503)
    job, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(caller.tenant_id))

    await dispatcher.dispatch_once()
    (row,) = await delivery_rows(factory, endpoint_id)
    assert (row["state"], row["attempts"], row["last_status_code"], row["last_error"]) == (
        "pending",
        1,
        500,
        "HTTP 500",
    )
    for _ in range(2):
        await make_due(factory, endpoint_id)
        await dispatcher.dispatch_once()

    got = receiver.received(path)
    assert [r.answered for r in got] == [500, 503, 204]
    assert len({r.webhook_id for r in got}) == 1 and len({r.body for r in got}) == 1
    assert all(r.verified for r in got)
    (row,) = await delivery_rows(factory, endpoint_id)
    assert (row["state"], row["attempts"], row["last_status_code"]) == ("delivered", 3, 204)
    assert row["delivered_at"] is not None


async def test_the_wait_doubles_per_attempt_on_the_database_clock(
    factory, api_store, receiver, notification_store
):
    caller = await admin_caller(factory, "backoff")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.COMPLETED])
    receiver.answer(path, 500, 500, 500)
    await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(caller.tenant_id))
    half = WebhookDispatcher(notification_store, webhook_settings(), jitter=lambda: 0.0)

    waits = []
    for _ in range(3):
        await half.dispatch_once()
        (row,) = await delivery_rows(factory, endpoint_id)
        waits.append((row["next_attempt_at"] - row["last_attempt_at"]).total_seconds())
        await make_due(factory, endpoint_id)

    # base 10 s doubling, scaled by a jitter of 0.5 (its lowest): 5, 10, 20 s
    assert [round(w, 1) for w in waits] == [5.0, 10.0, 20.0]


async def test_an_endpoint_that_is_down_is_retried_once_it_answers_again(factory, api_store, dispatcher):
    down = WebhookReceiver().start()
    try:
        caller = await admin_caller(factory, "down")
        endpoint_id, path = await register(api_store, down, caller, [NotificationKind.FAILED])
        down.stop()
        job, _ = await factory.in_status(JobStatus.FAILED, job=await factory.queued(caller.tenant_id))

        await dispatcher.dispatch_once()
        (row,) = await delivery_rows(factory, endpoint_id)
        assert (row["state"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
        assert row["last_error"] == "ConnectError"
        assert row["next_attempt_at"] > row["last_attempt_at"]

        down.start()
        await make_due(factory, endpoint_id)
        await dispatcher.dispatch_once()

        (got,) = down.received(path)
        assert got.verified and got.event["data"]["export_id"] == str(job.id)
        assert (await delivery_rows(factory, endpoint_id))[0]["state"] == "delivered"
    finally:
        down.stop()


async def test_a_delivery_still_failing_at_the_end_of_its_window_is_given_up_then_redelivered_by_hand(
    factory, api_store, receiver, dispatcher
):
    caller = await admin_caller(factory, "gaveup")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.STOPPED])
    receiver.answer(path, 500, 500)
    await factory.in_status(JobStatus.STOPPED, job=await factory.queued(caller.tenant_id))
    await dispatcher.dispatch_once()
    # a day later: the window's end moves onto the row, not the clock
    await factory.admin(
        "UPDATE webhook_deliveries SET give_up_at = clock_timestamp(), next_attempt_at = clock_timestamp()"
        " WHERE endpoint_id = %(e)s",
        {"e": endpoint_id},
    )

    await dispatcher.dispatch_once()
    (row,) = await delivery_rows(factory, endpoint_id)
    assert (row["state"], row["attempts"]) == ("failed", 2)
    await make_due(factory, endpoint_id)
    await dispatcher.dispatch_once()
    assert len(receiver.received(path)) == 2  # given up: not sent again by itself

    answer = await Notifications(api_store, webhook_settings()).redeliver(caller, endpoint_id, row["id"])
    assert answer.ok, answer.body
    await dispatcher.dispatch_once()

    got = receiver.received(path)
    assert [r.answered for r in got] == [500, 500, 204]
    assert len({r.webhook_id for r in got}) == 1 and all(r.verified for r in got)
    (row,) = await delivery_rows(factory, endpoint_id)
    assert (row["state"], row["attempts"], row["redeliveries"], row["redelivered_by"]) == (
        "delivered",
        3,
        1,
        "ada.admin",
    )


async def test_a_leased_attempt_is_not_sent_by_a_second_dispatcher_meanwhile(
    factory, api_store, receiver, notification_store
):
    caller = await admin_caller(factory, "leased")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.CANCELED])
    await factory.in_status(JobStatus.CANCELED, job=await factory.queued(caller.tenant_id))
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold(due) -> None:
        if due.endpoint_id == endpoint_id:
            holding.set()
            await release.wait()

    first = WebhookDispatcher(notification_store, webhook_settings(), before_attempt=hold)
    second = WebhookDispatcher(notification_store, webhook_settings())
    running = asyncio.create_task(first.dispatch_once())
    await eventually(holding.is_set, "the first dispatcher holds the attempt")

    await second.dispatch_once()
    assert receiver.received(path) == []
    release.set()
    await running

    assert len(receiver.received(path)) == 1
    assert (await delivery_rows(factory, endpoint_id))[0]["attempts"] == 1


async def test_an_attempt_whose_answer_was_never_recorded_is_sent_again_with_the_same_id(
    factory, api_store, receiver, notification_store, dispatcher
):
    caller = await admin_caller(factory, "atleastonce")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.REJECTED])
    await factory.in_status(JobStatus.REJECTED, job=await factory.queued(caller.tenant_id))
    await dispatcher.fan_out()
    # a dispatcher that leased the attempt and died before sending or recording it
    leased = await notification_store.take_due_webhook_deliveries(500, 30.0)
    assert endpoint_id in {d.endpoint_id for d in leased}
    await dispatcher.dispatch_once()
    assert receiver.received(path) == []  # its lease still holds
    await factory.admin(
        "UPDATE webhook_deliveries SET leased_until = clock_timestamp() - interval '1 second'"
        " WHERE endpoint_id = %(e)s",
        {"e": endpoint_id},
    )

    await dispatcher.dispatch_once()

    (got,) = receiver.received(path)
    assert got.verified and got.webhook_id == str(
        next(d.event_id for d in leased if d.endpoint_id == endpoint_id)
    )


async def test_a_disabled_endpoint_gets_nothing_until_it_is_enabled_again(
    factory, api_store, receiver, dispatcher
):
    caller = await admin_caller(factory, "paused-hook")
    endpoint_id, path = await register(api_store, receiver, caller, [NotificationKind.COMPLETED])
    first, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(caller.tenant_id))
    await dispatcher.fan_out()  # its delivery exists, pending
    await factory.admin("UPDATE webhook_endpoints SET enabled = false WHERE id = %(e)s", {"e": endpoint_id})
    second, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(caller.tenant_id))

    await dispatcher.dispatch_once()
    assert receiver.received(path) == []
    await factory.admin("UPDATE webhook_endpoints SET enabled = true WHERE id = %(e)s", {"e": endpoint_id})
    await dispatcher.dispatch_once()

    # the event made while it was enabled waited for it; the one made while disabled was never its
    assert [r.event["data"]["export_id"] for r in receiver.received(path)] == [str(first.id)]

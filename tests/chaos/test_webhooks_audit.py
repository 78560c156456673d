"""The soak's webhook check catches what it claims to catch (chaos/webhooks.py): on crafted receiver records,
a missing outcome, a second event ID for one outcome, an unverified signature, a changed body, contact data, a
lost cancellation without its event and a delivery left pending are each named; retries of one event ID and
an outcome before a reconciliation are not violations."""

from __future__ import annotations

import json
import uuid
from typing import Any

from chaos.webhooks import audit_webhooks
from testbed.webhook_receiver import Received

MARKER = "zqmarker"


def post(
    kind: str, export_id: str, *, event_id: str | None = None, verified: bool = True, **data: Any
) -> Received:
    event_id = event_id or str(uuid.uuid4())
    body = json.dumps({"id": event_id, "type": kind, "data": {"export_id": export_id, **data}}).encode()
    return Received("/hooks/chaos", event_id, "1", "v1,x", body, verified, 204)


def run(
    jobs: dict[str, dict[str, Any]], received: list[Received], **kw: Any
) -> tuple[set[str], dict[str, Any]]:
    found, counts = audit_webhooks(
        jobs=jobs,
        events=kw.get("events", {}),
        requests=kw.get("requests", []),
        received=received,
        deliveries=kw.get("deliveries", []),
        marker=MARKER,
    )
    return {f.invariant for f in found}, counts


def test_one_event_per_outcome_after_deduplicating_retries_is_clean() -> None:
    done, unknown_then_completed = str(uuid.uuid4()), str(uuid.uuid4())
    first = post("export.completed", done)
    retried = Received(first.path, first.webhook_id, "2", "v1,y", first.body, True, 204)
    jobs = {done: {"status": "Completed"}, unknown_then_completed: {"status": "Completed"}}
    events = {unknown_then_completed: [{"kind": "Reconciled", "detail": "Completed: partner confirmed"}]}

    found, counts = run(
        jobs,
        [
            first,
            retried,
            post("export.outcome_unknown", unknown_then_completed),
            post("export.completed", unknown_then_completed),
        ],
        events=events,
    )

    assert found == set()
    assert counts["retried_posts"] == 1 and counts["events"] == 3


def test_a_missing_outcome_a_second_event_id_and_an_extra_one_are_violations() -> None:
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    jobs = {a: {"status": "Completed"}, b: {"status": "Stopped"}, c: {"status": "Canceled"}}

    found, _ = run(
        jobs,
        [
            post("export.completed", a),
            post("export.completed", a),
            post("export.failed", c),
            post("export.canceled", c),
        ],
    )

    assert found == {"webhook_duplicate_event", "webhook_missing", "webhook_unexpected"}


def test_an_unverified_signature_a_changed_body_and_contact_data_are_violations() -> None:
    job = str(uuid.uuid4())
    good = post("export.completed", job)
    changed = Received(good.path, good.webhook_id, "2", "v1,z", good.body + b" ", True, 204)
    leaky = post("export.stopped", str(uuid.uuid4()), verified=False, list_name=f"{MARKER}.x")

    found, _ = run({job: {"status": "Completed"}}, [good, changed, leaky])

    assert {"webhook_signature", "webhook_body_changed", "webhook_contact_data"} <= found


def test_a_lost_cancellation_needs_exactly_one_event_and_every_delivery_must_end_delivered() -> None:
    job = str(uuid.uuid4())
    told, untold = str(uuid.uuid4()), str(uuid.uuid4())
    requests = [
        {"id": told, "job_id": job, "outcome": "TooLate"},
        {"id": untold, "job_id": job, "outcome": "TooLate"},
        {"id": str(uuid.uuid4()), "job_id": job, "outcome": "AlreadyEnded"},
    ]
    received = [
        post("export.completed", job),
        post("export.cancellation_lost", job, cancellation_request_id=told),
    ]
    pending = [{"id": uuid.uuid4(), "state": "pending", "attempts": 3, "last_error": "HTTP 500"}]

    found, counts = run({job: {"status": "Completed"}}, received, requests=requests, deliveries=pending)

    assert found == {"webhook_lost_cancellation", "webhook_not_delivered"}
    assert counts["lost_cancellation_events"] == 1


def test_a_skipped_recurring_firing_needs_exactly_one_event() -> None:
    from datetime import UTC, datetime

    told, untold = str(uuid.uuid4()), str(uuid.uuid4())
    at = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    firings = [
        {"recurring_export_id": told, "nominal_time": at, "outcome": "skipped"},
        {"recurring_export_id": untold, "nominal_time": at, "outcome": "skipped"},
        {"recurring_export_id": str(uuid.uuid4()), "nominal_time": at, "outcome": "created"},
    ]
    event = {"recurring_export_id": told, "scheduled_for": "2026-12-01T06:00:00.000000Z"}
    body = json.dumps({"id": "e1", "type": "recurring_export.firing_skipped", "data": event}).encode()

    found, counts = audit_webhooks(
        jobs={},
        events={},
        requests=[],
        received=[Received("/hooks/chaos", "e1", "1", "v1,x", body, True, 204)],
        deliveries=[],
        marker=MARKER,
        firings=firings,
    )

    assert [f.invariant for f in found] == ["webhook_skipped_firing"]
    assert untold in found[0].detail and counts["skipped_firing_events"] == 1

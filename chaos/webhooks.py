"""Outcome notifications under the soak (issue 26, item 1): a real HTTP receiver subscribed to every event of
the soak's tenant, which refuses some POSTs and is down for a while, and the auditor's check of what it got.

After de-duplicating by event ID (``webhook-id``): exactly one event per (export, outcome) the export went
through, one per cancellation that lost and one per skipped recurring firing, none missing, none extra; every POST's signature verifies (with
``standardwebhooks``, not our code); the POSTs of one event ID carry the same body; no body holds contact
data (the soak's marker is in every contact value); and no delivery is left pending or given up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from testbed.webhook_receiver import Received

PATH = "/hooks/chaos"
FAIL_EVERY = 5  # the receiver answers 500 to every 5th POST: each such event is retried
OUTCOME_KIND = {
    "Completed": "export.completed",
    "Failed": "export.failed",
    "Stopped": "export.stopped",
    "Canceled": "export.canceled",
    "Rejected": "export.rejected",
    "OutcomeUnknown": "export.outcome_unknown",
}
# The worker settings that make retries land within the settle: first retry after 0.5-1 s, at most 5 s apart.
WORKER_ENV = {
    "EXPORTS_WEBHOOK_POLL_SECONDS": "0.5",
    "EXPORTS_WEBHOOK_RETRY_BASE_SECONDS": "1",
    "EXPORTS_WEBHOOK_RETRY_CAP_SECONDS": "5",
}


@dataclass(frozen=True)
class Finding:
    invariant: str
    job_id: str | None
    detail: str


def expected_outcomes(
    jobs: dict[str, dict[str, Any]], events: dict[str, list[dict[str, Any]]]
) -> set[tuple[str, str]]:
    """(export ID, event type) for every outcome each export went through: its status now when that is an
    outcome, OutcomeUnknown before a reconciliation, and the recorded outcome before a correction."""
    expected: set[tuple[str, str]] = set()
    for job_id, job in jobs.items():
        if job["status"] in OUTCOME_KIND:
            expected.add((job_id, OUTCOME_KIND[job["status"]]))
        for event in events.get(job_id, []):
            if event["kind"] == "Reconciled":
                expected.add((job_id, "export.outcome_unknown"))
            if event["kind"] == "Corrected":
                before = str(event["detail"] or "").split(" to ", 1)[0]
                if before in OUTCOME_KIND:
                    expected.add((job_id, OUTCOME_KIND[before]))
    return expected


def audit_webhooks(
    *,
    jobs: dict[str, dict[str, Any]],
    events: dict[str, list[dict[str, Any]]],
    requests: Iterable[dict[str, Any]],
    received: list[Received],
    deliveries: list[dict[str, Any]],
    marker: str,
    firings: Iterable[dict[str, Any]] = (),
) -> tuple[list[Finding], dict[str, Any]]:
    """The violations and counts of one run's webhooks."""
    found: list[Finding] = []
    by_id: dict[str, list[Received]] = defaultdict(list)
    for post in received:
        if not post.verified:
            found.append(Finding("webhook_signature", None, f"a POST ({post.webhook_id}) did not verify"))
        if marker.encode() in post.body:
            found.append(
                Finding("webhook_contact_data", None, f"event {post.webhook_id} carries contact data")
            )
        if post.webhook_id is None:
            found.append(Finding("webhook_signature", None, "a POST without webhook-id"))
            continue
        by_id[post.webhook_id].append(post)
    events_by_subject: dict[tuple[str, str], set[str]] = defaultdict(set)
    lost_by_request: dict[str, set[str]] = defaultdict(set)
    skips: dict[str, set[str]] = defaultdict(set)
    for webhook_id, posts in by_id.items():
        if len({p.body for p in posts}) > 1:
            found.append(
                Finding("webhook_body_changed", None, f"event {webhook_id} was sent with different bodies")
            )
        event = posts[0].event
        if event.get("id") != webhook_id:
            found.append(
                Finding("webhook_id_mismatch", None, f"webhook-id {webhook_id} but body id {event.get('id')}")
            )
        data = event.get("data", {})
        if event.get("type") == "export.cancellation_lost":
            lost_by_request[str(data.get("cancellation_request_id"))].add(webhook_id)
        elif event.get("type") == "recurring_export.firing_skipped":
            skips[f"{data.get('recurring_export_id')}@{data.get('scheduled_for')}"].add(webhook_id)
        elif str(event.get("type", "")).startswith("export."):
            events_by_subject[(str(data.get("export_id")), str(event["type"]))].add(webhook_id)
    expected = expected_outcomes(jobs, events)
    for (job_id, kind), ids in sorted(events_by_subject.items()):
        if len(ids) > 1:
            found.append(
                Finding("webhook_duplicate_event", job_id, f"{kind}: {len(ids)} event IDs for one outcome")
            )
        if (job_id, kind) not in expected:
            found.append(Finding("webhook_unexpected", job_id, f"{kind} received; the export never had it"))
    for job_id, kind in sorted(expected - set(events_by_subject)):
        found.append(
            Finding("webhook_missing", job_id, f"no {kind} event received (status {jobs[job_id]['status']})")
        )
    lost = [r for r in requests if r["outcome"] == "TooLate"]
    for request in lost:
        ids = lost_by_request.get(str(request["id"]), set())
        if len(ids) != 1:
            found.append(
                Finding(
                    "webhook_lost_cancellation",
                    str(request["job_id"]),
                    f"cancellation {request['id']} lost: {len(ids)} events received, one expected",
                )
            )
    for request_id in set(lost_by_request) - {str(r["id"]) for r in lost}:
        found.append(
            Finding("webhook_unexpected", None, f"a lost-cancellation event for {request_id}, not TooLate")
        )
    skipped = {
        f"{f['recurring_export_id']}@{f['nominal_time'].astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"
        for f in firings
        if f["outcome"] == "skipped"
    }
    for key in sorted(skipped):
        if len(skips.get(key, set())) != 1:
            found.append(
                Finding(
                    "webhook_skipped_firing",
                    None,
                    f"skipped firing {key}: {len(skips.get(key, set()))} events",
                )
            )
    for key in sorted(set(skips) - skipped):
        found.append(Finding("webhook_unexpected", None, f"a skipped-firing event for {key}, never skipped"))
    unfinished = [d for d in deliveries if d["state"] != "delivered"]
    for delivery in unfinished:
        found.append(
            Finding(
                "webhook_not_delivered",
                None,
                f"delivery {delivery['id']} is {delivery['state']} after {delivery['attempts']} attempts"
                f" ({delivery['last_error']})",
            )
        )
    counts = {
        "posts": len(received),
        "events": len(by_id),
        "retried_posts": len(received) - len(by_id),
        "answered_500": sum(1 for p in received if p.answered >= 500),
        "outcome_events_expected": len(expected),
        "lost_cancellation_events": sum(len(v) for v in lost_by_request.values()),
        "skipped_firing_events": sum(len(v) for v in skips.values()),
        "deliveries": len(deliveries),
        "deliveries_unfinished": len(unfinished),
    }
    return found, counts

"""What people read: the console's cancellation messages (001 "When Cancellation Loses") and the
timeline of one export in the shape of the seed's evidence block. Pure functions of recorded rows.

A message reports "completed" or "unknown" only once the attempt has recorded it; until then it says
what the row says (stop requested, delivery authorized), never more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote
from uuid import UUID
from zoneinfo import ZoneInfo

from domain.listing import Count, CountKind
from domain.models import (
    AttemptEvent,
    CancellationOutcome,
    CancellationRequest,
    EventKind,
    ExportJob,
    FailureCode,
    JobStatus,
)

ENDED_WITHOUT_DELIVERY = {JobStatus.CANCELED, JobStatus.REJECTED, JobStatus.STOPPED, JobStatus.FAILED}
TERMINAL_STATUSES = ENDED_WITHOUT_DELIVERY | {JobStatus.COMPLETED, JobStatus.OUTCOME_UNKNOWN}


def clock(at: datetime | None) -> str:
    """A recorded time as people read it in a message: ``14:02:07.412 UTC``."""
    if at is None:
        return "an unrecorded time"
    return at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def stamp(at: datetime) -> str:
    """A recorded time with its date, for the timeline: ``2026-11-14 14:02:07.412``."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def short(value: UUID | str | None) -> str:
    """A short, recognisable form of an ID for the timeline (the full ID is shown on hover)."""
    return "-" if value is None else str(value)[:8] + "…"


def _event(events: Iterable[AttemptEvent], attempt_id: UUID | None, *kinds: EventKind) -> AttemptEvent | None:
    for e in events:
        if e.kind in kinds and (attempt_id is None or e.attempt_id == attempt_id):
            return e
    return None


# How an earlier attempt of a job that is Queued again ended, in the words of its event.
_RETURNED_TO_THE_QUEUE = {
    EventKind.REQUEUED_BY_RECOVERY: "its lease expired and recovery returned the export to the queue",
    EventKind.RELEASED: "its worker gave it back to the queue without using it up",
    EventKind.RETRY_SCHEDULED: "its delivery failed for a transient cause with nothing delivered, and the "
    "export went back to the queue to be tried again",
}


def _earlier_ending(events: list[AttemptEvent], request: CancellationRequest) -> str:
    """`` The earlier attempt 1a2b3c4d… ended at 14:02:07.412 UTC: ...`` for the last attempt returned to the
    queue before ``request`` was recorded, or nothing when the events show none."""
    returned = [
        e for e in events if e.kind in _RETURNED_TO_THE_QUEUE and e.recorded_at <= request.recorded_at
    ]
    if not returned:
        return ""
    last = returned[-1]
    return (
        f" The earlier attempt {short(last.attempt_id)} ended at {clock(last.recorded_at)}: "
        f"{_RETURNED_TO_THE_QUEUE[last.kind]}."
    )


def gave_up(job: ExportJob, events: list[AttemptEvent]) -> str:
    """Why an AttemptsExhausted export gave up, in words: after crashed attempts (recovery's cap), or after
    give-backs for failures (the bound of 23.1), with the last cause its event recorded."""
    ended = _event(reversed(events), job.attempt_id, EventKind.ATTEMPTS_EXHAUSTED)
    if ended is not None and ended.worker_id and ended.detail and ended.detail.startswith("given back"):
        # "given back 6 times after failures (the limit); this time transient: build interrupted: ..."
        count, _, last = ended.detail.partition(" (the limit); this time ")
        return f"gave up after being {count}, the limit; last cause: {last}"
    return f"gave up after {job.attempt_count} attempts"


def _code(job: ExportJob) -> str:
    return f" ({job.failure_reason.value})" if job.failure_reason else ""


def _delivery_so_far(job: ExportJob, events: list[AttemptEvent], destination_name: str) -> str:
    """What the attempt has recorded about its delivery, and nothing it has not."""
    ended = _event(
        reversed(events),
        job.attempt_id,
        EventKind.CORRECTED,
        EventKind.RECONCILED,
        EventKind.FINISHED,
        EventKind.RESOLVED_BY_RECOVERY,
    )
    at = clock(ended.recorded_at if ended else None)
    match job.status:
        case JobStatus.COMPLETED:
            size = (
                f"{job.expected_file_rows:,} contacts"
                if job.expected_file_rows is not None
                else f"{job.expected_file_bytes:,} bytes"
                if job.expected_file_bytes is not None
                else "the file"
            )
            return f"Delivery completed at {at}: {size} ({job.expected_file_name}) to {destination_name}."
        case JobStatus.OUTCOME_UNKNOWN:
            return (
                f"The delivery outcome is unknown: the attempt recorded OutcomeUnknown at {at}. "
                "It stays unresolved until it is reconciled from evidence."
            )
        case JobStatus.FAILED if job.failure_reason == FailureCode.ORIGINAL_DELIVERED:
            return (
                f"The delivery happened under the original job {job.replaces_job_id}; this job sent nothing."
            )
        case JobStatus.FAILED:
            return f"The delivery was recorded as Failed{_code(job)} at {at}."
        case _:
            return "The delivery is under way; its outcome is not recorded yet."


def cancellation_message(
    request: CancellationRequest,
    job: ExportJob,
    events: list[AttemptEvent],
    destination_name: str = "the partner",
) -> str:
    """The one sentence the console shows for a recorded cancellation request, given the job as it is now."""
    outcome = request.outcome
    if outcome == CancellationOutcome.CANCELED_WHILE_QUEUED:
        if request.found_attempt_count == 0:
            return "Canceled while queued. No attempt had started, and none will."
        # 001: after recovery or a give-back returned the job to the queue, the earlier attempt's ending
        # stands beside the outcome; "no attempt had started" is only for a job that never had one.
        return "Canceled while queued. No further attempt will start." + _earlier_ending(events, request)

    if outcome == CancellationOutcome.ALREADY_CANCELED:
        return (
            f"Already canceled by {job.cancellation_request_id}. "
            f"Your request {request.id} changed nothing and is recorded."
        )

    if outcome in (CancellationOutcome.STOP_REQUESTED, CancellationOutcome.STOP_ALREADY_REQUESTED):
        attempt = request.found_attempt_id
        claimed = _event(events, attempt, EventKind.CLAIMED)
        started = f"Already started at {clock(claimed.recorded_at if claimed else None)}."
        if job.attempt_id == attempt and job.status == JobStatus.STOPPED:
            stopped = _event(events, attempt, EventKind.STOPPED, EventKind.STOPPED_BY_RECOVERY)
            return (
                f"{started} Stopped at {clock(stopped.recorded_at if stopped else None)}, "
                "before delivery was authorized. Nothing was sent."
            )
        if job.attempt_id == attempt and job.status == JobStatus.FAILED:
            failed = _event(events, attempt, EventKind.FAILED, EventKind.ATTEMPTS_EXHAUSTED)
            return (
                f"{started} The attempt ended Failed{_code(job)} at "
                f"{clock(failed.recorded_at if failed else None)}, before delivery was authorized. "
                "Nothing was sent."
            )
        if outcome == CancellationOutcome.STOP_ALREADY_REQUESTED:
            return (
                f"{started} Stop already requested by {job.stop_request_id}; "
                "the attempt will stop before delivery is authorized."
            )
        return f"{started} Stop requested; the attempt will stop before delivery is authorized."

    if outcome == CancellationOutcome.TOO_LATE:
        return (
            f"Too late: delivery was authorized at about {clock(request.found_delivery_authorized_at)}, "
            f"before your request. {_delivery_so_far(job, events, destination_name)} "
            f"Your request {request.id} is recorded."
        )

    # AlreadyEnded: Rejected, Stopped or Failed before this request.
    match job.status:
        case JobStatus.STOPPED:
            stopped = _event(
                reversed(events), job.attempt_id, EventKind.STOPPED, EventKind.STOPPED_BY_RECOVERY
            )
            return (
                f"Already ended: stopped at {clock(stopped.recorded_at if stopped else None)} for request "
                f"{job.stop_request_id}, before delivery was authorized. Nothing was sent."
            )
        case JobStatus.REJECTED:
            return "Already ended: the policy check rejected this export before it started. Nothing was sent."
        case JobStatus.FAILED if job.failure_reason == FailureCode.ORIGINAL_DELIVERED:
            return (
                f"Already ended: the delivery happened under the original job {job.replaces_job_id}; "
                "this replacement sent nothing."
            )
        case JobStatus.FAILED if job.failure_reason == FailureCode.ATTEMPTS_EXHAUSTED:
            return f"Already ended: {gave_up(job, events)}. This export delivered nothing."
        case _:
            return f"Already ended: {job.status.value}{_code(job)}. This export delivered nothing."


@dataclass(frozen=True)
class DeliveryWindowState:
    """A destination's delivery window as the database read it at ``checked_at`` (issue #25.2): its intake
    hours and blackout dates in the partner's time zone, and its next opening (``checked_at`` itself when it is
    open; ``None`` when it never opens, which the column checks rule out)."""

    destination_name: str
    time_zone: str
    intake_hours: tuple[str, ...] | None
    blackout_dates: tuple[str, ...]
    checked_at: datetime
    opens_at: datetime | None

    @classmethod
    def from_settings(
        cls, settings: dict[str, Any], checked_at: datetime | None, opens_at: datetime | None
    ) -> DeliveryWindowState | None:
        """From a destination's columns (``get_tenant_destination``); ``None`` when it was not checked."""
        if checked_at is None:
            return None
        hours = settings.get("intake_hours")
        return cls(
            destination_name=str(settings.get("name")),
            time_zone=str(settings.get("intake_time_zone") or "UTC"),
            intake_hours=tuple(hours) if hours else None,
            blackout_dates=tuple(str(d) for d in settings.get("blackout_dates") or ()),
            checked_at=checked_at,
            opens_at=opens_at,
        )

    @property
    def closed(self) -> bool:
        return self.opens_at is None or self.opens_at > self.checked_at

    def why_waiting(self) -> str:
        """Why an export to it waits, and until when, in the partner's time zone: "outside partner-new's
        intake hours (Mon-Fri 08:00-18:00 Europe/Berlin); next opening Mon 08:00"."""
        zone = ZoneInfo(self.time_zone)
        local_today = self.checked_at.astimezone(zone).date().isoformat()
        if local_today in self.blackout_dates:
            why = (
                f"{self.destination_name} takes no deliveries today ({local_today}, a blackout date in"
                f" {self.time_zone})"
            )
        else:
            hours = ", ".join(self.intake_hours or ())
            why = f"outside {self.destination_name}'s intake hours ({hours} {self.time_zone})"
        if self.opens_at is None:
            return f"{why}; no opening is ahead"
        opens = self.opens_at.astimezone(zone)
        if opens - self.checked_at.astimezone(zone) < timedelta(days=6):
            when = opens.strftime("%a %H:%M")
        else:
            when = opens.strftime("%a %Y-%m-%d %H:%M")
        return f"{why}; next opening {when}"


def status_line(
    job: ExportJob,
    events: list[AttemptEvent],
    window: DeliveryWindowState | None = None,
    paused: DestinationPause | None = None,
) -> str:
    """A one-line summary of where the export is now, from the row (and, for a Queued export, its
    destination's delivery window and switch when the caller read them)."""
    match job.status:
        case JobStatus.QUEUED if paused is not None:
            # the claim makes no attempt while its destination is paused (a worker's pause for a changed host
            # key too, issue #24.4); the resume wakes it
            return f"Queued (v{job.version}): {paused.why_waiting()}."
        case JobStatus.QUEUED if window is not None and window.closed:
            # issue #25.2: the claim makes no attempt outside the window; the export waits for its opening
            return f"Queued (v{job.version}): {window.why_waiting()}."
        case JobStatus.QUEUED if job.available_at is not None and (retry := _waiting_to_retry(events)):
            # issue #25.4: a delivery that failed for a transient cause waits for its next try
            return f"Queued (v{job.version}): {retry}; next try at {clock(job.available_at)}."
        case JobStatus.QUEUED if job.available_at is not None and job.transient_releases:
            times = "once" if job.transient_releases == 1 else f"{job.transient_releases} times"
            return (
                f"Queued (v{job.version}): given back {times} after failures; "
                f"the next try is not before {clock(job.available_at)}."
            )
        case JobStatus.QUEUED if job.available_at is not None and not events:
            # the list page reads no events: it cannot say which wait this is (a retry's, a session limit's)
            return f"Queued (v{job.version}): next try at {clock(job.available_at)}."
        case JobStatus.QUEUED if job.available_at is not None:
            # an uncounted give-back that waits: its partner was at its session limit (25.3)
            return (
                f"Queued (v{job.version}): given back while its partner was at its session limit; "
                f"the next try is not before {clock(job.available_at)}."
            )
        case JobStatus.QUEUED:
            return f"Queued (v{job.version}), waiting for a worker."
        case JobStatus.RUNNING:
            claimed = _event(events, job.attempt_id, EventKind.CLAIMED)
            stop = " A stop is requested." if job.stop_request_id else ""
            return (
                f"Running: attempt {short(job.attempt_id)} on {job.claimed_by}, claimed at "
                f"{clock(claimed.recorded_at if claimed else None)}{_waiting_for_slot(job, events)}.{stop}"
            )
        case JobStatus.DELIVERING:
            return f"Delivering: delivery authorized at {clock(job.delivery_authorized_at)}."
        case JobStatus.CANCELED:
            return "Canceled while queued."
        case JobStatus.REJECTED:
            return job.rejection_reason or "Rejected by the policy check."
        case JobStatus.STOPPED:
            return "Stopped before delivery was authorized. Nothing was sent."
        case JobStatus.COMPLETED:
            return f"Completed: {job.expected_file_name} delivered."
        case JobStatus.OUTCOME_UNKNOWN:
            return "OutcomeUnknown: delivery was authorized; nobody can yet say whether it happened."
        case JobStatus.FAILED if job.failure_reason == FailureCode.ATTEMPTS_EXHAUSTED:
            return f"Failed: {gave_up(job, events)}."
        case _:
            return f"{job.status.value}{_code(job)}."


@dataclass(frozen=True)
class DestinationPause:
    """A Queued export's destination whose delivery switch is off, and why (``reason`` None: never resumed
    since it was created)."""

    destination_name: str
    reason: str | None

    def why_waiting(self) -> str:
        """ "deliveries to northwind are paused: host key changed: presented SHA256:...; it waits for a resume"."""
        if self.reason is None:
            return f"deliveries to {self.destination_name} were never resumed since it was created"
        return f"deliveries to {self.destination_name} are paused: {self.reason}; it waits for a resume"


def _waiting_to_retry(events: list[AttemptEvent]) -> str:
    """``try 2 failed (connect_refused)`` when the export went back to the queue last because its delivery
    failed for a transient cause (issue #25.4: its latest return to the queue is a RetryScheduled event), else
    nothing."""
    last = None
    for e in events:
        if e.kind in _RETURNED_TO_THE_QUEUE:
            last = e
    if last is None or last.kind != EventKind.RETRY_SCHEDULED:
        return ""
    detail = last.detail or ""
    cause = detail.split(":", 1)[0]
    tries = re.search(r"try (\d+) of (\d+)", detail)
    which = f"try {tries.group(1)} of {tries.group(2)}" if tries else "the last try"
    return f"{which} failed ({cause}), nothing was delivered"


def _waiting_for_slot(job: ExportJob, events: list[AttemptEvent]) -> str:
    """``; waiting for a delivery slot: 2 of 2 in use`` while the running attempt waits for one of its
    partner's session slots (issue #25.3: its latest slot observation says it waits), else nothing."""
    latest: dict[str, Any] | None = None
    for e in events:
        if e.kind != EventKind.DELIVERY_EVIDENCE or e.attempt_id != job.attempt_id:
            continue
        try:
            data = json.loads(e.detail or "{}")
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("observation") == "session_slot":
            latest = data
    if latest is None or latest.get("result") != "waiting":
        return ""
    return f"; waiting for a delivery slot: {latest.get('in_use')} of {latest.get('limit')} in use"


@dataclass(frozen=True)
class TimelineEntry:
    """One line of the evidence block: what, which record, by whom, when (that host's reading), details."""

    label: str
    subject: str
    subject_full: str
    actor: str
    at: datetime
    detail: str = ""
    more: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "subject": self.subject_full,
            "actor": self.actor,
            "at": self.at.isoformat(),
            "when": stamp(self.at),
            "subject_short": self.subject,
            "detail": self.detail,
            "more": self.more,
        }


_EVENT_LABELS = {
    EventKind.CLAIMED: "Claimed",
    EventKind.DELIVERY_AUTHORIZED: "Authorized",
    EventKind.STOPPED: "Stopped",
    EventKind.FAILED: "Failed",
    EventKind.FINISHED: "Delivered",
    EventKind.REQUEUED_BY_RECOVERY: "Requeued",
    EventKind.RELEASED: "Given back",
    EventKind.RETRY_SCHEDULED: "Retry scheduled",
    EventKind.STOPPED_BY_RECOVERY: "Stopped",
    EventKind.ATTEMPTS_EXHAUSTED: "Gave up",
    EventKind.RESOLVED_BY_RECOVERY: "Resolved",
    EventKind.RECONCILED: "Reconciled",
    EventKind.CORRECTED: "Corrected",
    EventKind.DELIVERY_EVIDENCE: "Evidence",
}


def _event_entry(e: AttemptEvent, job: ExportJob, claimers: dict[UUID, str]) -> TimelineEntry:
    who = e.worker_id or e.observed_by or claimers.get(e.attempt_id)
    actor = f"by {who}" if who else ""
    detail = (e.detail or "").rstrip("; ")
    if e.kind == EventKind.CLAIMED:
        detail = f"checked v{e.version}"
    elif e.kind == EventKind.DELIVERY_AUTHORIZED:
        detail = _authorized_summary(e.detail)
        if job.expected_file_bytes is not None and e.attempt_id == job.attempt_id:
            detail = f"{detail}, {job.expected_file_bytes:,} bytes expected"
    if e.kind == EventKind.DELIVERY_AUTHORIZED and e.destination_version is not None:
        # the destination version cutoff 2 authorized: the delivery uses it whatever the destination says since
        detail = f"{detail}; destination version {e.destination_version}"
    elif e.kind == EventKind.DELIVERY_EVIDENCE:
        detail = _evidence_summary(e.detail)
    return TimelineEntry(
        label=_EVENT_LABELS.get(e.kind, e.kind.value),
        subject=f"attempt {short(e.attempt_id)}",
        subject_full=f"attempt {e.attempt_id}",
        actor=actor,
        at=e.recorded_at,
        detail=detail,
    )


def _authorized_summary(detail: str | None) -> str:
    """Cutoff 2's file evidence (JSON since #24; a bare file name before): the name and its layers."""
    try:
        data = json.loads(detail or "")
    except ValueError:
        return detail or ""
    if not isinstance(data, dict):
        return detail or ""
    parts = [str(data.get("file", ""))]
    shape = data.get("format")
    if isinstance(shape, dict) and shape.get("compression") == "gzip":
        parts.append("gzip")
    recipients = data.get("recipients") or []
    if recipients:
        parts.append(f"encrypted to {len(recipients)} key{'s' if len(recipients) != 1 else ''}")
    if data.get("signer"):
        parts.append("signed")
    return ", ".join(p for p in parts if p)


def _evidence_summary(detail: str | None) -> str:
    try:
        data = json.loads(detail or "{}")
    except ValueError:
        return "observation"
    if not isinstance(data, dict):
        return "observation"
    # IDs, sizes, hashes and codes only: the evidence never carries contact data.
    keys = (
        "observation",
        "result",
        "present",
        "size",
        "outcome",
        "code",
        "presented",
        "in_use",
        "limit",
        "matches",
    )
    return ", ".join(f"{k}={data[k]}" for k in keys if k in data) or "observation"


def timeline(
    job: ExportJob,
    events: list[AttemptEvent],
    requests: list[CancellationRequest],
    *,
    tenant_name: str,
    destination_name: str,
) -> list[TimelineEntry]:
    """The export's story in recorded order: requested, claimed, cancel (with what it found), stopped or
    delivered. Each time is the reading of the host that recorded it, for people; the row settled the order."""
    what = f"{destination_name}, list {job.list_name!r}, v1"
    if job.replaces_job_id:
        what += f", replaces {short(job.replaces_job_id)}: {job.replacement_reason!r}"
    entries = [
        TimelineEntry(
            label="Requested",
            subject=short(job.id),
            subject_full=str(job.id),
            actor=f"by {job.created_by} ({tenant_name})",
            at=job.created_at,
            detail=what,
        )
    ]
    claimers = {e.attempt_id: e.worker_id for e in events if e.kind == EventKind.CLAIMED and e.worker_id}
    entries += [_event_entry(e, job, claimers) for e in events]
    for r in requests:
        found = (
            f"found attempt {short(r.found_attempt_id)} {r.found_status.value}"
            if r.found_attempt_id
            else (f"found {r.found_status.value}, {r.found_attempt_count} earlier attempt(s)")
        )
        entries.append(
            TimelineEntry(
                label="Cancel",
                subject=short(r.id),
                subject_full=str(r.id),
                actor=f"by {r.requested_by}",
                at=r.recorded_at,
                detail=repr(r.reason) if r.reason else "",
                more=[f"outcome {r.outcome.value}; {found}"],
            )
        )
    return sorted(entries, key=lambda entry: entry.at)


def temporal_ui_links(ui_url: str, namespace: str, job: ExportJob) -> dict[str, str]:
    """Links into the Temporal Web UI: every workflow of this export (by search attribute), and the
    current attempt's workflow when one is recorded."""
    base = f"{ui_url.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows"
    query = quote('ExportJobId="' + str(job.id) + '"', safe="")
    links = {"workflows": f"{base}?query={query}"}
    if job.workflow_id:
        links["current_workflow"] = f"{base}/{quote(job.workflow_id, safe='')}"
    return links


def cancel_can_matter(job: ExportJob) -> bool:
    """Whether the console offers Cancel: where a cancel can still change something (Queued is canceled;
    Running without a stop request gets one) or be recorded usefully (Delivering: the operator learns at
    once that delivery was authorized, and the request is on record). Not on an ended export, nor on a
    Running one whose stop is already requested: a cancel there changes nothing the page does not show."""
    match job.status:
        case JobStatus.QUEUED | JobStatus.DELIVERING:
            return True
        case JobStatus.RUNNING:
            return job.stop_request_id is None
        case _:
            return False


# -- the list's counts and bounds (issue 26, item 5) ------------------------------------------------------


def about(n: int) -> str:
    """``n`` to two significant digits, with k, M or B: 9,812,345 is "9.8M", 123,456 is "120k"."""
    if n <= 0:
        return "0"
    rounded = round(n, -max(len(str(n)) - 2, 0))
    for suffix, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if rounded >= size:
            scaled = rounded / size
            shown = f"{scaled:.1f}".removesuffix(".0") if scaled < 10 else f"{scaled:.0f}"
            return shown + suffix
    return str(rounded)


def count_text(count: Count) -> str:
    """A count as the console and the API show it: exact ("1,234"), an estimate labelled so ("about 9.8M"),
    a lower bound ("more than 10,000"), or "not counted"; never a capped number passed off as the count."""
    if count.kind == CountKind.EXACT:
        return f"{count.value or 0:,}"
    if count.kind == CountKind.ESTIMATE:
        return f"about {about(count.value or 0)}"
    if count.kind == CountKind.MORE_THAN:
        return f"more than {count.value or 0:,}"
    return "not counted"


def count_title(count: Count, exact_up_to: int, timeout_ms: int) -> str:
    """Why a count is not exact, for the console's tooltip and the API's ``note`` (empty when it is)."""
    if count.kind == CountKind.ESTIMATE:
        return (
            "An estimate from PostgreSQL's statistics: a status the planner expects more than "
            f"{exact_up_to:,} of is not counted exactly, nor one that would take longer than {timeout_ms:,} ms."
        )
    if count.kind == CountKind.MORE_THAN:
        return f"Counting stopped at {exact_up_to:,}: a status is counted exactly only up to that."
    if count.kind == CountKind.UNKNOWN:
        return f"Neither counted nor estimated within {timeout_ms:,} ms."
    return ""


def too_slow(timeout_ms: int) -> str:
    """What a list past its bound says instead of its rows."""
    return (
        f"This filter took longer than {timeout_ms:,} ms, so no exports are shown: narrow it (a status, a"
        " destination, a list, or more of the export ID)."
    )

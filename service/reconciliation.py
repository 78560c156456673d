"""The reconciler's console's operations (issue 26 item 4), shared by the console and the JSON API.

- **The queue**: a tenant's OutcomeUnknown exports, oldest first by when each became OutcomeUnknown, keyset
  paged, with how many wait (exact up to ``QUEUE_COUNT_CAP``, else the planner's estimate, labelled as one)
  and each one's line of why. Every role of the tenant may read it (it holds IDs, sizes, hashes and codes,
  never contact data); only a reconciler acts on it.
- **The evidence** of one export, read for a person (:mod:`service.evidence`).
- **Today's listing of the final name**: a reconciler's request, recorded here and answered by recovery's next
  run on a worker, which lists the name unless the partner's deliveries are paused. The API process holds
  no partner credentials, and should not: a destination's key is a reference resolved on the worker hosts,
  and the process that faces the browser stays one that cannot open a session to a partner.
- **A correction request** goes through :func:`request_correction`, the one function the console's form posts
  through.

Another tenant's export answers exactly as a missing one does. Nothing here writes ``export_jobs``:
reconciliation and replacement are :class:`service.exports.Exports`' ``reconcile`` and ``replace``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from db.errors import QueryTimedOut
from db.rows import ListingRequestRow, QueueSummaryRow
from db.stores.api import ApiStore
from domain.audit import AuditAction, SubjectKind
from domain.models import ExportJob, JobStatus
from rules.recovery import (
    LISTING_REQUEST_OBSERVER_PREFIX,
    LISTING_REQUEST_WINDOW_SECONDS,
    RECOVERY_OBSERVER_PREFIX,
)
from service.audit import Ledger, answered
from service.auth import Caller
from service.commands import CorrectExport
from service.evidence import EvidenceReading, read_evidence, when
from service.exports import Exports, export_json
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, may
from service.views import too_slow

QUEUE_PAGE_SIZE = 50
# Each read of the queue is bounded as the export list's are (EXPORTS_LIST_QUERY_TIMEOUT_MS's default).
QUEUE_TIMEOUT_MS = 250
QUEUE_COUNT_CAP = 1000  # counted exactly up to this many (at most this many index entries read)
QUEUE_CURSOR_PATTERN = r"^[0-9]{1,17}\.[0-9a-f]{32}$"
_QUEUE_CURSOR = re.compile(QUEUE_CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Failed codes a replacement may follow (service.exports.Exports.replace states the rule; create_replacement
# enforces it): the console offers the replacement form only where it can succeed.
_REPLACEABLE_FAILURES = {"BuildFailed", "AttemptsExhausted", "NotDelivered"}


def queue_cursor(job: ExportJob) -> str:
    """The keyset bound after ``job`` in the queue: when it became OutcomeUnknown (microseconds since the
    epoch) and its ID."""
    assert job.outcome_unknown_at is not None  # ck_export_jobs_outcome_unknown_at
    micros = (job.outcome_unknown_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{job.id.hex}"


def decode_queue_cursor(cursor: str) -> tuple[datetime, UUID] | None:
    """The keyset bound a queue cursor names, or ``None`` if it is not one."""
    if not _QUEUE_CURSOR.match(cursor):
        return None
    micros, _, hex_id = cursor.partition(".")
    try:
        return _EPOCH + timedelta(microseconds=int(micros)), UUID(hex=hex_id)
    except OverflowError:
        return None


@dataclass(frozen=True)
class QueueCount:
    """How many wait: ``exact``, an ``estimate`` (the planner's, past the cap), or ``more_than`` the cap."""

    kind: Literal["exact", "estimate", "more_than"]
    value: int

    @property
    def label(self) -> str:
        """The count as the page says it: ``3``, ``about 12,000 (an estimate)``, ``more than 1,000``."""
        if self.kind == "exact":
            return f"{self.value:,}"
        if self.kind == "estimate":
            return f"about {self.value:,} (an estimate)"
        return f"more than {self.value:,}"

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "label": self.label}


def queue_count(counted: int, estimate: int | None, cap: int) -> QueueCount:
    """The count the queue shows from its capped count (``cap + 1``: more than ``cap``) and, past the cap,
    the planner's estimate: an estimate that says fewer than the count found is wrong, and then only the
    bound is claimed."""
    if counted <= cap:
        return QueueCount("exact", counted)
    if estimate is not None and estimate > cap:
        return QueueCount("estimate", estimate)
    return QueueCount("more_than", cap)


@dataclass(frozen=True)
class QueueEntry:
    """One OutcomeUnknown export of the queue and its line of why."""

    job: ExportJob
    destination_name: str
    summary: QueueSummaryRow | None

    def as_json(self) -> dict[str, Any]:
        s = self.summary
        return {
            "export": export_json(self.job),
            "destination_name": self.destination_name,
            "outcome_unknown_at": self.job.outcome_unknown_at.isoformat()
            if self.job.outcome_unknown_at
            else None,
            "why": s.reason if s else None,
            "recorded_by": s.recorded_by if s else None,
            "recovery_listings": s.recovery_listings if s else 0,
            "last_listed_at": s.last_listed_at.isoformat() if s and s.last_listed_at else None,
            "listing_requested": s.listing_requested if s else False,
            "links": {
                "self": f"/exports/{self.job.id}/evidence",
                "console": f"/console/reconciliation/{self.job.id}",
            },
        }


@dataclass(frozen=True)
class QueuePage:
    """One page of the queue, the cursor of the next (``None`` on the last) and how many wait in all."""

    entries: list[QueueEntry]
    next: str | None
    count: QueueCount
    timed_out: str | None = None  # what the page says instead of its rows when a read ran past its bound

    def as_json(self) -> dict[str, Any]:
        return {
            "exports": [e.as_json() for e in self.entries],
            "next": self.next,
            "count": self.count.as_json(),
        }


async def reconciler_queue_page(
    store: ApiStore,
    tenant_id: UUID,
    *,
    limit: int = QUEUE_PAGE_SIZE,
    after: tuple[datetime, UUID] | None = None,
    count_cap: int = QUEUE_COUNT_CAP,
    timeout_ms: int = QUEUE_TIMEOUT_MS,
) -> QueuePage:
    """One page of ``tenant_id``'s reconciler queue as the console reads it: the page (``limit`` + 1 rows
    read, keyset after ``after``), its count (capped, then estimated) and each entry's line of why; every
    read by index (0033's ``ix_export_jobs_tenant_outcome_unknown``, and ``ix_attempt_events_job``). The
    unit ``python -m bench console`` measures at ten million exports (docs/benchmarks.md). Each read is
    bounded by ``timeout_ms``, as the export list's are: one past it raises ``QueryTimedOut``."""
    jobs = await store.page_outcome_unknown_queue(
        tenant_id, limit=limit + 1, after=after, timeout_ms=timeout_ms
    )
    more = len(jobs) > limit
    jobs = jobs[:limit]
    counted = await store.count_outcome_unknown_queue(tenant_id, cap=count_cap, timeout_ms=timeout_ms)
    estimate = (
        await store.estimate_outcome_unknown_queue(tenant_id, timeout_ms=timeout_ms)
        if counted > count_cap
        else None
    )
    summaries = {
        s.job_id: s
        for s in await store.outcome_unknown_summaries(
            tenant_id,
            [j.id for j in jobs],
            recovery_prefix=f"{RECOVERY_OBSERVER_PREFIX}:",
            observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
            window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
            timeout_ms=timeout_ms,
        )
    }
    names = {d.id: d.name for d in await store.tenant_destinations(tenant_id)} if jobs else {}
    entries = [
        QueueEntry(j, names.get(j.destination_id, str(j.destination_id)), summaries.get(j.id)) for j in jobs
    ]
    return QueuePage(
        entries, queue_cursor(jobs[-1]) if more and jobs else None, queue_count(counted, estimate, count_cap)
    )


@dataclass(frozen=True)
class EvidenceDetail:
    """Everything the evidence page shows for one export, and what its caller may do there."""

    job: ExportJob
    destination_name: str
    reading: EvidenceReading
    may_reconcile: bool
    may_request_listing: bool
    may_replace: bool
    may_request_correction: bool
    deliveries_open: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "export": export_json(self.job),
            "destination_name": self.destination_name,
            **self.reading.as_json(),
            "actions": {
                "reconcile": self.may_reconcile,
                "request_listing": self.may_request_listing,
                "replace": self.may_replace,
                "request_correction": self.may_request_correction,
            },
            "links": {
                "self": f"/exports/{self.job.id}/evidence",
                "export": f"/exports/{self.job.id}",
                "console": f"/console/reconciliation/{self.job.id}",
            },
        }


def replaceable(job: ExportJob) -> bool:
    """Whether a replacement of ``job`` (or of its original) can be created from what the row says."""
    if job.status == JobStatus.OUTCOME_UNKNOWN:
        return True
    return (
        job.status == JobStatus.FAILED
        and job.failure_reason is not None
        and (job.failure_reason.value in _REPLACEABLE_FAILURES)
    )


class Reconciliation:
    """The queue, an export's evidence and the listing requests, over the API's store."""

    def __init__(self, store: ApiStore, *, recovery_every_seconds: float = 30.0) -> None:
        self.store = store
        self.recovery_every_seconds = recovery_every_seconds
        self.ledger = Ledger(store)

    async def page(self, caller: Caller, *, after: str | None = None, limit: int = QUEUE_PAGE_SIZE) -> Answer:
        """``GET /reconciliation-queue``: one page of the caller's tenant's OutcomeUnknown exports, oldest
        first, and how many wait."""
        bound = None
        if after is not None:
            bound = decode_queue_cursor(after)
            if bound is None:
                return refusal(Kind.MALFORMED, "after: not a cursor this API gave out")
        try:
            page = await reconciler_queue_page(self.store, caller.tenant_id, limit=limit, after=bound)
        except QueryTimedOut:
            # Said, never a silent part of the queue (26.5), as the export list answers.
            return Answer(
                Kind.BUSY,
                {
                    "detail": too_slow(QUEUE_TIMEOUT_MS),
                    "code": "query_timeout",
                    "timeout_ms": QUEUE_TIMEOUT_MS,
                },
                retry_after_seconds=1,
            )
        return Answer(Kind.DONE, page.as_json())

    async def detail(self, caller: Caller, job_id: UUID) -> EvidenceDetail | None:
        """One export of the caller's tenant with its evidence read, or ``None`` (missing or another tenant's)."""
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return None
        events = await self.store.tenant_job_events(caller.tenant_id, job.id)
        requests = await self.store.listing_requests_of_job(
            caller.tenant_id, job.id, window_seconds=LISTING_REQUEST_WINDOW_SECONDS
        )
        names = {d.id: d.name for d in await self.store.tenant_destinations(caller.tenant_id)}
        unknown = job.status == JobStatus.OUTCOME_UNKNOWN and job.attempt_id is not None
        reconciler = may(caller.role, Action.RECONCILE)
        return EvidenceDetail(
            job=job,
            destination_name=names.get(job.destination_id, str(job.destination_id)),
            reading=read_evidence(job, events, requests),
            may_reconcile=reconciler and unknown,
            may_request_listing=reconciler and unknown,
            may_replace=may(caller.role, Action.EXPORT) and replaceable(job),
            may_request_correction=reconciler
            and job.status in (JobStatus.COMPLETED, JobStatus.FAILED)
            and job.attempt_id is not None,
            deliveries_open=await self.store.delivery_scope_open(job.tenant_id, job.destination_id),
        )

    async def evidence(self, caller: Caller, job_id: UUID) -> Answer:
        """``GET /exports/{id}/evidence``: the export's evidence, read, and the listings asked for it."""
        found = await self.detail(caller, job_id)
        if found is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        return Answer(Kind.DONE, found.as_json(), version=found.job.version)

    async def request_listing(self, caller: Caller, job_id: UUID) -> Answer:
        """Ask for today's listing of an OutcomeUnknown export's final name: recorded now (202), listed by
        recovery's next run on a worker and kept as the attempt's evidence. Reconcilers only; refused while
        the partner's deliveries are paused (no session is opened to a paused partner) or while an earlier
        request still waits for its answer. In the ledger of operator actions, in the request's transaction."""
        async with self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=AuditAction.LISTING_REQUEST,
            subject_kind=SubjectKind.EXPORT,
            subject_id=job_id,
        ) as record:
            async with self.store.recording(record):
                answer = await self._request_listing(caller, job_id)
                record.outcome, record.detail = answer.kind.value, answer.text or None
                record.after = (
                    {"request_id": answer.body["request_id"]} if "request_id" in answer.body else None
                )
            return answered(record, answer)

    async def _request_listing(self, caller: Caller, job_id: UUID) -> Answer:
        if not may(caller.role, Action.RECONCILE):
            return refusal(
                Kind.FORBIDDEN,
                "asking the partner for today's listing needs the reconciler role",
            )
        recorded = await self.store.record_listing_request(
            tenant_id=caller.tenant_id,
            job_id=job_id,
            requested_by=caller.principal,
            observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
            window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
        )
        if recorded is not None:
            return Answer(
                Kind.ACCEPTED,
                {
                    "request_id": str(recorded.id),
                    "export_id": str(job_id),
                    "requested_at": recorded.requested_at.isoformat(),
                    "message": (
                        f"Listing requested at {when(recorded.requested_at)}: recovery's next run (every "
                        f"{self.recovery_every_seconds:g} s) lists the final name on a worker and adds what it "
                        "sees to the evidence."
                    ),
                    "status_url": f"/exports/{job_id}/evidence",
                },
                location=f"/exports/{job_id}/evidence",
            )
        return await self._why_not_recorded(caller, job_id)

    async def _why_not_recorded(self, caller: Caller, job_id: UUID) -> Answer:
        """Why ``record_listing_request`` recorded nothing, re-read: its conditions, one by one."""
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        if job.status != JobStatus.OUTCOME_UNKNOWN:
            return refusal(
                Kind.REFUSED,
                f"the export is {job.status.value}; today's listing is asked only for an OutcomeUnknown export",
            )
        if not await self.store.delivery_scope_open(job.tenant_id, job.destination_id):
            return refusal(
                Kind.REFUSED,
                "deliveries to this partner are paused: no session is opened to it, not even to list, "
                "until they are resumed",
            )
        requests = await self.store.listing_requests_of_job(
            caller.tenant_id, job_id, window_seconds=LISTING_REQUEST_WINDOW_SECONDS
        )
        reading = read_evidence(job, await self.store.tenant_job_events(caller.tenant_id, job_id), requests)
        waiting = [asked for asked in reading.listings if asked.waiting]
        if waiting:
            first: ListingRequestRow = waiting[0].request
            return refusal(
                Kind.REFUSED,
                f"a listing asked by {first.requested_by} at {when(first.requested_at)} still waits for "
                "recovery's next run",
                request_id=str(first.id),
            )
        return refusal(Kind.REFUSED, "nothing was recorded: the export changed meanwhile; read it again")


async def request_correction(exports: Exports, caller: Caller, job_id: UUID, body: CorrectExport) -> Answer:
    """The console's correction request, through this one function (``Exports.correct``): a correction takes two
    people (issue 26 item 3), so it is asked here and waits for another reconciler's approval (202), which runs it
    as theirs, once per attempt, with who and why."""
    return await exports.correct(caller, job_id, body)

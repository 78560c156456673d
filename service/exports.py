"""The operations people and clients ask for, shared by the HTTP API and the command line.

Each returns an ``Answer`` (:mod:`service.outcomes`): a ``Kind`` that the API maps to the HTTP status the
seed's tables give and the command line to an exit code, a JSON-able body with a ``message`` or
``detail`` for people, and what a transport turns into headers. Every read and write is scoped to the caller's tenant, so another
tenant's export is indistinguishable from a missing one. Nothing here writes ``export_jobs`` except
through the store's conditional statements.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from db.errors import ConstraintRefused, IdempotencyConflict, QueryTimedOut, UnknownReference
from db.pool import START_RETRY_SECONDS, open_pool
from db.stores.api import ApiStore
from db.stores.reconciler import ReconcilerStore
from domain.audit import ActionRecord, Approval, AuditAction, SubjectKind, TwoPersonAction
from domain.listing import Count, CountKind, Counts, ExportFilter, id_range
from domain.models import (
    AttemptEvent,
    CancellationOutcome,
    CancellationRequest,
    EventKind,
    ExportJob,
    FailureCode,
    JobStatus,
)
from observability.metrics import CancellationSource, get_metrics
from rules.counting import one_pass_cap, plan_counts, status_count, total, within_prefix
from rules.fingerprint import create_fingerprint
from service.approvals import DEFAULT_TTL_SECONDS, Approvals, Subject
from service.audit import Ledger, answered
from service.auth import Caller
from service.bulk import BulkCancels
from service.commands import (
    BulkCancel,
    CancelExport,
    CorrectExport,
    CreateExport,
    EditTerms,
    ReconcileExport,
    ReplaceExport,
)
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, may, refused
from service.signals import NoSignaller, StopSignaller, TemporalStopSignaller, signal_stop_best_effort
from service.views import (
    TERMINAL_STATUSES,
    DeliveryWindowState,
    DestinationPause,
    TimelineEntry,
    cancellation_message,
    count_text,
    count_title,
    status_line,
    temporal_ui_links,
    timeline,
    too_slow,
)
from settings import Settings

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2
# A replacement delivers its original's list to its original's partner under the original's key (0015).
REPLACEMENT_TERMS_FIXED = (
    "this export replaces {original} and delivers its list to its destination under its delivery key;"
    " its terms cannot change: cancel it, and create a new export with the terms you want"
)
API_CHECKOUT_SECONDS = 5.0  # a request waits this long for a database connection, then answers 503
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]{1,200}$"  # 1-200 visible ASCII characters
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
ID_PREFIX_PATTERN = r"^[0-9a-fA-F-]{1,36}$"  # an export ID, or its first characters
# RFC 9110 §13.1.1: If-Match = "*" / #entity-tag; entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE. The
# pattern is the one the OpenAPI document publishes (visible ASCII, as header values here are).
IF_MATCH_PATTERN = r'^[ \t]*(\*|(W/)?"[!#-~]*"([ \t]*,[ \t]*(W/)?"[!#-~]*")*)[ \t]*$'
_IF_MATCH = re.compile(IF_MATCH_PATTERN)
_ENTITY_TAG = re.compile(r'(W/)?"([!#-~]*)"')
ANY_VERSION = -1


def if_match_versions(value: str) -> set[int] | None:
    """The versions an If-Match header names under strong comparison, ``{ANY_VERSION}`` for ``*``, or
    ``None`` when it is malformed (an unquoted or unterminated tag).

    A weak tag (``W/"4"``) never matches under strong comparison, so it names no version; nor does a strong
    tag that is not one of ours (ours are ``"<version>"``).
    """
    if not _IF_MATCH.match(value):
        return None
    if value.strip() == "*":
        return {ANY_VERSION}
    return {
        int(opaque)
        for weak, opaque in _ENTITY_TAG.findall(value)
        if not weak and opaque.isdigit() and opaque.isascii() and len(opaque) <= 9
    }


def request_fingerprint(caller: Caller, body: CreateExport) -> str:
    """SHA-256 of the canonical JSON of the validated command and its scope (002 "Canonical fingerprint").

    Key order and whitespace in the client's JSON do not matter; the server-minted job ID is not included.
    A recurring export's firing binds its key to the same fingerprint (``rules.fingerprint``).
    """
    return create_fingerprint(
        tenant_id=caller.tenant_id,
        principal=caller.principal,
        destination_id=body.destination_id,
        list_name=body.list_name,
    )


def export_json(job: ExportJob) -> dict[str, Any]:
    """One export as JSON: every column, the hash in hex."""
    data = job.model_dump(mode="json", exclude={"expected_file_sha256"})
    data["expected_file_sha256"] = job.expected_file_sha256.hex() if job.expected_file_sha256 else None
    return data


def request_json(request: CancellationRequest) -> dict[str, Any]:
    """One recorded cancellation request as JSON."""
    return request.model_dump(mode="json")


@dataclass(frozen=True)
class Page:
    """One page of exports and the cursor of the next page, if there is one; ``timed_out`` when the read ran
    past its bound (then there are no rows, and the page must say so rather than show none)."""

    jobs: list[ExportJob]
    next: str | None
    timed_out: bool = False

    def counted(self, filters: ExportFilter, *, first: bool) -> dict[JobStatus, int]:
        """The exact count per status this page proves: a first page with no next one holds every match, so
        the statuses it covers (the filter's, or all) are counted by it; otherwise nothing."""
        if not first or self.next is not None or self.timed_out:
            return {}
        found = {s: 0 for s in (filters.statuses or tuple(JobStatus))}
        for job in self.jobs:
            found[job.status] = found.get(job.status, 0) + 1
        return found


def count_json(count: Count, exact_up_to: int, timeout_ms: int) -> dict[str, Any]:
    """One count as the API answers it: ``kind`` says how far ``count`` can be trusted, ``text`` is what
    the console shows and ``note`` why it is not exact (empty when it is)."""
    return {
        "count": count.value,
        "kind": count.kind.value,
        "exact": count.exact,
        "text": count_text(count),
        "note": count_title(count, exact_up_to, timeout_ms),
    }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CURSOR_PATTERN = r"^[0-9]{1,16}\.[0-9a-f]{32}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(job: ExportJob) -> str:
    """The keyset bound after ``job``: its creation time in microseconds since the epoch, and its ID."""
    micros = (job.created_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{job.id.hex}"


def decode_cursor(cursor: str) -> tuple[datetime, UUID] | None:
    """The keyset bound a cursor names, or ``None`` if it is not one (every string the pattern allows is)."""
    if not _CURSOR.match(cursor):
        return None
    micros, _, hex_id = cursor.partition(".")
    return _EPOCH + timedelta(microseconds=int(micros)), UUID(hex=hex_id)


@dataclass(frozen=True)
class Detail:
    """Everything the console and ``GET /exports/{id}`` show for one export."""

    job: ExportJob
    events: list[AttemptEvent]
    requests: list[CancellationRequest]
    tenant_name: str
    destination_name: str
    entries: list[TimelineEntry]
    message: str | None
    status_line: str
    links: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "export": export_json(self.job),
            "status_line": self.status_line,
            "message": self.message,
            "timeline": [e.as_json() for e in self.entries],
            "cancellation_requests": [request_json(r) for r in self.requests],
            "links": {"self": f"/exports/{self.job.id}", **self.links},
        }


class Exports:
    """The operations, over an ``exports_api`` store (and an ``exports_reconciler`` one for corrections)."""

    def __init__(
        self,
        api_store: ApiStore,
        reconciler_store: ReconcilerStore | None = None,
        signaller: StopSignaller | None = None,
        *,
        temporal_ui_url: str = "http://localhost:8233",
        namespace: str = "default",
        cancel_lock_timeout: str = "2s",
        list_timeout_ms: int = 250,
        exact_count_limit: int = 10_000,
        approval_ttl_seconds: int = DEFAULT_TTL_SECONDS,
    ) -> None:
        self.store = api_store
        self.reconciler_store = reconciler_store
        self.signaller: StopSignaller = signaller or NoSignaller()
        self.temporal_ui_url = temporal_ui_url
        self.namespace = namespace
        self.cancel_lock_timeout = cancel_lock_timeout
        self.list_timeout_ms = list_timeout_ms
        self.exact_count_limit = exact_count_limit
        self.bulk = BulkCancels(api_store, self.signaller, lock_timeout=cancel_lock_timeout)
        # The ledger of operator actions (0031) and the second person's approvals (0032), over the API's store.
        self.ledger = Ledger(api_store)
        self.approvals = Approvals(api_store, ttl_seconds=approval_ttl_seconds)
        self.approvals.register(
            TwoPersonAction.CORRECT_OUTCOME,
            lambda approver, a: self.correct(
                approver, UUID(a.subject_id), CorrectExport(**a.parameters["body"]), approval=a
            ),
        )
        self.approvals.register(
            TwoPersonAction.REPLACE_WITH_OVERWRITE,
            lambda approver, a: self.replace(
                approver, UUID(a.subject_id), ReplaceExport(**a.parameters["body"]), approval=a
            ),
        )
        # The other two-person actions are the switches' and the destinations' operations, which import this
        # module: they register themselves over the same approvals.
        from service import two_person

        two_person.register(self)

    def _action(
        self,
        caller: Caller,
        action: AuditAction,
        subject_kind: SubjectKind,
        subject_id: object,
        reason: str | None,
    ) -> Any:
        """The ledger row of one operator action by ``caller`` (``Ledger.action``)."""
        return self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=action,
            subject_kind=subject_kind,
            subject_id=subject_id,
            reason=reason,
        )

    # -- reads ----------------------------------------------------------------------------------------

    async def tenant_name(self, tenant_id: UUID) -> str:
        """The tenant's display name."""
        return await self.store.tenant_name(tenant_id) or str(tenant_id)

    async def destination_names(self, tenant_id: UUID) -> dict[UUID, str]:
        """The tenant's destinations by ID, for display."""
        return {d.id: d.name for d in await self.store.tenant_destinations(tenant_id)}

    async def detail(self, caller: Caller, job_id: UUID) -> Detail | None:
        """One export of the caller's tenant with its timeline, or ``None`` (missing or another tenant's)."""
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return None
        events = await self.store.tenant_job_events(caller.tenant_id, job.id)
        requests = await self.store.job_cancellation_requests(caller.tenant_id, job.id)
        destinations = await self.destination_names(caller.tenant_id)
        destination = destinations.get(job.destination_id, str(job.destination_id))
        latest = requests[-1] if requests else None
        tenant_name = await self.tenant_name(caller.tenant_id)
        window = paused = None
        if job.status == JobStatus.QUEUED:
            # why a Queued export waits, when its partner takes no deliveries now (issue #25.2) or its
            # destination is paused (a changed host key, issue #24.4)
            record = await self.store.get_tenant_destination(caller.tenant_id, job.destination_id)
            if record is not None:
                window = DeliveryWindowState.from_settings(
                    record.settings, record.window_checked_at, record.window_opens_at
                )
                if not record.enabled:
                    paused = DestinationPause(destination, record.paused_because)
        return Detail(
            job=job,
            events=events,
            requests=requests,
            tenant_name=tenant_name,
            destination_name=destination,
            entries=timeline(job, events, requests, tenant_name=tenant_name, destination_name=destination),
            message=cancellation_message(latest, job, events, destination) if latest else None,
            status_line=status_line(job, events, window, paused),
            links=temporal_ui_links(self.temporal_ui_url, self.namespace, job),
        )

    async def status(self, caller: Caller, job_id: UUID) -> Answer:
        """``GET /exports/{id}``: the export, its status line, its latest cancellation message, its timeline."""
        detail = await self.detail(caller, job_id)
        if detail is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        return Answer(Kind.DONE, detail.as_json(), version=detail.job.version)

    async def list(
        self,
        caller: Caller,
        limit: int = 100,
        *,
        before: str | None = None,
        filters: ExportFilter = ExportFilter(),
    ) -> Answer:
        """``GET /exports``: one page of the tenant's exports, newest first, under ``filters``.

        ``before`` is the ``next`` cursor of the previous page (keyset pagination: a page never repeats
        or skips a row because rows were added meanwhile). A read past its bound answers Busy (503, Retry-After)
        with ``code`` ``query_timeout``: nothing is shown rather than a silent part of the page.
        """
        bound = None
        if before is not None:
            bound = decode_cursor(before)
            if bound is None:
                return refusal(Kind.MALFORMED, "before: not a cursor this API gave out")
        page = await self.page(caller, limit, before=bound, filters=filters)
        if page.timed_out:
            return self._too_slow()
        return Answer(
            Kind.DONE,
            {"exports": [export_json(j) for j in page.jobs], "next": page.next},
        )

    async def page(
        self,
        caller: Caller,
        limit: int,
        *,
        before: tuple[datetime, UUID] | None = None,
        filters: ExportFilter = ExportFilter(),
    ) -> Page:
        """One page of the tenant's exports and the cursor of the next one (``None`` on the last page); a
        page with ``timed_out`` and no rows when the read ran past ``list_timeout_ms``."""
        if filters.id_prefix:
            filters = ExportFilter(
                filters.statuses, filters.destination_id, filters.list_name, filters.id_prefix.lower()
            )
        try:
            jobs = await self.store.page_tenant_jobs(
                caller.tenant_id,
                limit=limit + 1,
                before=before,
                filters=filters,
                timeout_ms=self.list_timeout_ms,
            )
        except QueryTimedOut:
            log.warning("the export list ran past its bound of %d ms", self.list_timeout_ms)
            return Page([], None, timed_out=True)
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return Page(jobs, encode_cursor(jobs[-1]) if more and jobs else None)

    async def counts(
        self, caller: Caller, filters: ExportFilter, *, known: dict[JobStatus, int] | None = None
    ) -> Counts:
        """How many of the tenant's exports match ``filters``, in total and per status under its other
        conditions: counted exactly where the planner expects at most ``exact_count_limit`` (a count that
        reaches it says "more than"), the planner's estimate beyond, each bounded by ``list_timeout_ms``
        (a count past it falls back to its estimate, and ``timed_out`` says so). ``known`` holds exact
        counts the caller already has (a first page that holds every match)."""
        limit = self.exact_count_limit
        scope = filters.without_statuses()
        exact: dict[JobStatus, int] = dict(known or {})  # counted to the end, whatever the limit
        wanted = [s for s in JobStatus if s not in exact]
        capped: dict[JobStatus, int] = {}  # counted up to limit + 1
        estimates: dict[JobStatus, int] = {}
        timed_out = False
        # One budget for all of it: the estimates, then one pass or the counts one by one, each bounded by
        # what is left, so counting never holds a page longer than one read's bound.
        deadline = time.monotonic() + self.list_timeout_ms / 1000

        def left() -> int:
            return max(1, int((deadline - time.monotonic()) * 1000))

        try:
            if wanted:
                estimates = await self.estimates(caller, scope, wanted, timeout_ms=left())
            plan = plan_counts(estimates, limit)
            if plan.one_pass:
                cap = one_pass_cap(limit)
                found = await self.store.count_tenant_jobs_in_scope(
                    caller.tenant_id, filters=scope, cap=cap, timeout_ms=left()
                )
                if sum(found.values()) <= cap:  # the pass did not stop: every status is counted
                    exact |= {s: found.get(s, 0) for s in wanted}
            if any(s not in exact for s in wanted):
                partial = await self.store.count_tenant_jobs_by_status(
                    caller.tenant_id, plan.one_by_one, filters=scope, cap=limit, timeout_ms=left()
                )
                capped, timed_out = partial.counted, not partial.complete
        except QueryTimedOut:
            timed_out = True
        if timed_out:
            log.warning("counting the export list ran past its bound of %d ms", self.list_timeout_ms)
        by_status = {
            s: Count(CountKind.EXACT, exact[s])
            if s in exact
            else status_count(estimates.get(s), capped.get(s), limit)
            for s in JobStatus
        }
        selected = filters.statuses or tuple(JobStatus)
        return Counts(total(by_status[s] for s in selected), by_status, limit, timed_out)

    async def estimates(
        self, caller: Caller, scope: ExportFilter, statuses: Sequence[JobStatus], *, timeout_ms: int
    ) -> dict[JobStatus, int]:
        """The planner's estimate, per status, of the tenant's exports that match ``scope`` (its statuses
        ignored); an ID prefix by arithmetic on the rest of the filter's estimate (``within_prefix``).
        Raises ``QueryTimedOut`` past ``timeout_ms``."""
        unprefixed = ExportFilter((), scope.destination_id, scope.list_name)
        if scope.id_prefix is not None and id_range(scope.id_prefix) is None:
            unprefixed = scope  # it matches nothing: the store answers zeros
        raw = await self.store.estimate_tenant_jobs(
            caller.tenant_id, [*statuses], filters=unprefixed, timeout_ms=timeout_ms
        )
        return {s: within_prefix(e, scope.id_prefix) for s, e in raw.items()}

    async def count(self, caller: Caller, filters: ExportFilter) -> Answer:
        """``GET /export-counts``: how many exports match, in total and per status (see :meth:`counts`)."""
        counts = await self.counts(caller, filters)
        limit, bound = counts.exact_up_to, self.list_timeout_ms
        return Answer(
            Kind.DONE,
            {
                "matching": count_json(counts.total, limit, bound),
                "by_status": {s.value: count_json(c, limit, bound) for s, c in counts.by_status.items()},
                "exact_up_to": counts.exact_up_to,
                "timed_out": counts.timed_out,
                "timeout_ms": self.list_timeout_ms,
            },
        )

    async def list_names(self, caller: Caller) -> Sequence[str]:
        """The list names the tenant's exports use, for the console's filter (none when that read runs past
        its bound: the filter still takes any name typed)."""
        try:
            return await self.store.tenant_list_names(caller.tenant_id, timeout_ms=self.list_timeout_ms)
        except QueryTimedOut:
            return []

    def _too_slow(self) -> Answer:
        return Answer(
            Kind.BUSY,
            {
                "detail": too_slow(self.list_timeout_ms),
                "code": "query_timeout",
                "timeout_ms": self.list_timeout_ms,
            },
            retry_after_seconds=RETRY_AFTER_SECONDS,
        )

    # -- creation and terms ---------------------------------------------------------------------------

    async def create(self, caller: Caller, body: CreateExport, idempotency_key: str | None) -> Answer:
        """Create an export once per idempotency key: a replay with the same request returns the first job
        (200), the same key with a different request is a 409, and a new key creates a job (201)."""
        forbidden = refused(caller.role, Action.EXPORT)
        if forbidden is not None:
            return forbidden
        if idempotency_key is None:
            return refusal(
                Kind.MALFORMED,
                "the Idempotency-Key header is required: one value per request, reused on retry",
            )
        if not _IDEMPOTENCY_KEY.match(idempotency_key):
            return refusal(Kind.MALFORMED, "Idempotency-Key must be 1-200 visible ASCII characters")
        try:
            created = await self.store.create_original(
                tenant_id=caller.tenant_id,
                destination_id=body.destination_id,
                list_name=body.list_name,
                created_by=caller.principal,
                idempotency_key=idempotency_key,
                fingerprint=request_fingerprint(caller, body),
            )
        except IdempotencyConflict:
            return refusal(
                Kind.REFUSED,
                "this Idempotency-Key was used for a different request",
                code="idempotency_conflict",
            )
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        job = await self.store.get_tenant_job(caller.tenant_id, created.job_id)
        assert job is not None
        return Answer(
            Kind.DONE if created.replayed else Kind.CREATED,
            {"export": export_json(job), "replayed": created.replayed},
            location=f"/exports/{job.id}",
            version=job.version,
            replayed=created.replayed,
        )

    async def edit(self, caller: Caller, job_id: UUID, body: EditTerms, if_match: str | None) -> Answer:
        """Change a queued export's terms for the version the editor read (``If-Match``).

        428 without If-Match, 412 when the version moved on, 409 when the export is no longer queued.
        """
        forbidden = refused(caller.role, Action.EXPORT)
        if forbidden is not None:
            return forbidden
        if if_match is None:
            return refusal(
                Kind.PRECONDITION_REQUIRED,
                'the If-Match header is required: the version you read, e.g. If-Match: "1"',
            )
        versions = if_match_versions(if_match)
        if versions is None:
            return refusal(
                Kind.MALFORMED,
                'If-Match must be entity tags as the ETag header gives them, e.g. If-Match: "1" (quoted)',
            )
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        if ANY_VERSION not in versions and job.version not in versions:
            why = "" if versions else " (a weak entity tag never matches: If-Match uses strong comparison)"
            return refusal(
                Kind.STALE,
                f'the export is at version {job.version}; If-Match names no "{job.version}"{why}',
                version=job.version,
            )
        expected = job.version
        if job.replaces_job_id is not None:
            return refusal(Kind.REFUSED, REPLACEMENT_TERMS_FIXED.format(original=job.replaces_job_id))
        if job.status != JobStatus.QUEUED:
            return refusal(
                Kind.REFUSED, f"the export is {job.status.value}; only a queued export's terms can change"
            )
        try:
            version = await self.store.edit_terms_if_queued(
                tenant_id=caller.tenant_id,
                job_id=job_id,
                expected_version=expected,
                destination_id=body.destination_id or job.destination_id,
                list_name=body.list_name or job.list_name,
            )
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        now = await self.store.get_tenant_job(caller.tenant_id, job_id)
        assert now is not None
        if version is None:
            # The conditional edit matched nothing: someone moved first. Say what they changed.
            if now.version != expected:
                return refusal(
                    Kind.STALE, f"the export is at version {now.version}, not {expected}", version=now.version
                )
            return refusal(
                Kind.REFUSED, f"the export is {now.status.value}; only a queued export's terms can change"
            )
        return Answer(Kind.DONE, {"export": export_json(now)}, version=now.version)

    # -- cancellation ----------------------------------------------------------------------------------

    async def cancel(
        self,
        caller: Caller,
        job_id: UUID,
        body: CancelExport,
        *,
        source: CancellationSource = CancellationSource.API,
    ) -> Answer:
        """Record one cancellation request and answer as the seed's table says (001 "What the API returns").

        Every answer, Busy included, is counted in ``fenced_exports_cancellations_total`` under ``source``
        (the API and console, or ``cli`` for ``starter.py cancel``). Every answer but Busy is in the ledger of
        operator actions; a recorded request's row commits with it, in its one round trip.
        """
        async with self._action(
            caller, AuditAction.CANCEL, SubjectKind.EXPORT, job_id, body.reason
        ) as record:
            return answered(record, await self._cancel(caller, job_id, body, source, record))

    async def _cancel(
        self,
        caller: Caller,
        job_id: UUID,
        body: CancelExport,
        source: CancellationSource,
        record: ActionRecord,
    ) -> Answer:
        forbidden = refused(caller.role, Action.CANCEL)
        if forbidden is not None:
            return forbidden
        result = await self.store.request_cancellation(
            tenant_id=caller.tenant_id,
            job_id=job_id,
            request_id=body.request_id,
            requested_by=caller.principal,
            reason=body.reason,
            lock_timeout=self.cancel_lock_timeout,
            record=record,
        )
        get_metrics().observe_cancellation(result.outcome.value, source=source, tenant_id=caller.tenant_id)
        base: dict[str, Any] = {"outcome": result.outcome.value, "request_id": str(body.request_id)}
        match result.outcome:
            case CancellationOutcome.NOT_FOUND:
                # Not recorded against any job (there is none this tenant can see): an access event only.
                log.info(
                    "cancellation %s by %s of tenant %s: export %s not found",
                    body.request_id,
                    caller.principal,
                    caller.tenant_id,
                    job_id,
                )
                return Answer(Kind.NOT_FOUND, {**base, "detail": "no such export"})
            case CancellationOutcome.BUSY:
                return Answer(
                    Kind.BUSY,
                    {
                        **base,
                        "recorded": False,
                        "message": (
                            "Busy: this submission made no new decision and recorded nothing. Retry with the "
                            "same request ID; if an earlier submission committed, the retry returns its outcome."
                        ),
                    },
                    retry_after_seconds=RETRY_AFTER_SECONDS,
                )
            case CancellationOutcome.REQUEST_ID_REUSED:
                return Answer(
                    Kind.MALFORMED,
                    {**base, "detail": "this request ID belongs to a different request; use a new one"},
                )
        return await self._recorded_answer(caller, result.request, base, replayed=result.replayed)

    async def _recorded_answer(
        self, caller: Caller, request: CancellationRequest | None, base: dict[str, Any], *, replayed: bool
    ) -> Answer:
        assert request is not None  # every recorded outcome carries its request
        detail = await self.detail(caller, request.job_id)
        assert detail is not None  # the request's foreign key names this tenant's job
        job = detail.job
        body = {
            **base,
            "export_id": str(job.id),
            "replayed": replayed,
            "recorded_at": request.recorded_at.isoformat(),
            "found_status": request.found_status.value,
            "found_attempt_id": str(request.found_attempt_id) if request.found_attempt_id else None,
            "message": cancellation_message(request, job, detail.events, detail.destination_name),
        }
        status_url = f"/exports/{job.id}"
        match request.outcome:
            case CancellationOutcome.CANCELED_WHILE_QUEUED:
                body["any_attempt_started"] = request.found_attempt_count > 0
                return Answer(Kind.DONE, body)
            case CancellationOutcome.ALREADY_CANCELED:
                by = next((r for r in detail.requests if r.id == job.cancellation_request_id), None)
                body["canceled_by_request_id"] = str(job.cancellation_request_id)
                body["canceled_at"] = by.recorded_at.isoformat() if by else None
                body["changed_nothing"] = True
                return Answer(Kind.DONE, body)
            case CancellationOutcome.STOP_REQUESTED | CancellationOutcome.STOP_ALREADY_REQUESTED:
                body["attempt_id"] = body["found_attempt_id"]
                body["worker"] = job.claimed_by
                body["stop_request_id"] = str(job.stop_request_id) if job.stop_request_id else None
                body["status_url"] = status_url
                body["current_status"] = job.status.value
                if job.status == JobStatus.RUNNING and job.stop_request_id is not None:
                    await signal_stop_best_effort(self.signaller, job.workflow_id, job.stop_request_id)
                return Answer(Kind.ACCEPTED, body, location=status_url)
            case CancellationOutcome.ALREADY_ENDED:
                body["ending"] = job.status.value
                body["failure_reason"] = job.failure_reason.value if job.failure_reason else None
                body["honored_stop_request_id"] = (
                    str(job.stop_request_id)
                    if job.status == JobStatus.STOPPED and job.stop_request_id
                    else None
                )
                body["delivered_nothing"] = True
                if job.failure_reason == FailureCode.ORIGINAL_DELIVERED:
                    body["delivered_under_original_job"] = str(job.replaces_job_id)
                return Answer(Kind.REFUSED, body)
            case _:  # TooLate
                body["current_status"] = job.status.value
                body["delivery_authorized_at"] = (
                    request.found_delivery_authorized_at.isoformat()
                    if request.found_delivery_authorized_at
                    else None
                )
                body["delivery_outcome"] = job.status.value if job.status in TERMINAL_STATUSES else None
                body["failure_reason"] = job.failure_reason.value if job.failure_reason else None
                body["status_url"] = status_url
                return Answer(Kind.REFUSED, body)

    # -- bulk cancel ------------------------------------------------------------------------------------

    async def bulk_cancel(
        self, caller: Caller, body: BulkCancel, *, source: CancellationSource = CancellationSource.API
    ) -> Answer:
        """Cancel every live export of a destination (or of one of its lists), each through its own
        request, grouped under the client's batch ID; a retry with the same ID decides only the Busy ones.
        Each export's answer is counted in ``fenced_exports_cancellations_total`` under ``source``. The ledger of
        operator actions gets one row per submission, after its exports' own transactions, with the counts of
        their outcomes (each export's request is in cancellation_requests, under the batch ID)."""
        async with self._action(
            caller, AuditAction.BULK_CANCEL, SubjectKind.CANCELLATION_BATCH, body.batch_id, body.reason
        ) as record:
            record.before = {"destination_id": body.destination_id, "list_name": body.list_name}
            forbidden = refused(caller.role, Action.CANCEL)
            if forbidden is not None:
                return answered(record, forbidden)
            answer = await self.bulk.submit(caller, body, source=source)
            record.after = {
                "matched": answer.body.get("matched"),
                "outcomes": answer.body.get("outcomes"),
                "busy": len(answer.body.get("busy", [])),
                "replayed": answer.body.get("replayed"),
            }
            return answered(record, answer)

    async def bulk_cancel_preview(
        self, caller: Caller, destination_id: UUID, list_name: str | None
    ) -> Answer:
        """How many live exports a bulk cancel with this filter would cover now."""
        forbidden = refused(caller.role, Action.CANCEL)
        if forbidden is not None:
            return forbidden
        return await self.bulk.preview(caller, destination_id, list_name)

    async def cancellation_batch(self, caller: Caller, batch_id: UUID) -> Answer:
        """A recorded bulk cancel: its counts and the exports still without a request."""
        return await self.bulk.read(caller, batch_id)

    # -- replacement, reconciliation, correction --------------------------------------------------------

    async def replace(
        self, caller: Caller, job_id: UUID, body: ReplaceExport, *, approval: Approval | None = None
    ) -> Answer:
        """Create a replacement for a named person; a replacement of a replacement resolves to its original.

        One with an overwrite agreement takes two people (0032): asked, it waits for another principal's
        approval (202); approved, it is created as the approver's, in the approval's transaction."""
        async with self._action(
            caller, AuditAction.REPLACE, SubjectKind.EXPORT, job_id, body.reason
        ) as record:
            if approval is not None:
                record.approval_id, record.requested_by = approval.id, approval.requested_by
            return answered(record, await self._replace(caller, job_id, body, record, approval))

    async def _replace(
        self,
        caller: Caller,
        job_id: UUID,
        body: ReplaceExport,
        record: ActionRecord,
        approval: Approval | None,
    ) -> Answer:
        forbidden = refused(caller.role, Action.EXPORT)
        if forbidden is not None:
            return forbidden
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        original_id = job.replaces_job_id or job.id
        record.subject_id = str(original_id)
        if body.overwrite_agreement_ref is None:
            async with self.store.recording(record):
                answer = await self._create_replacement(caller, original_id, body)
                record.outcome, record.detail = answer.kind.value, answer.text or None
                record.after = {"replacement": answer.body.get("export", {}).get("id")}
            return answer
        if approval is None:
            original = await self.store.get_tenant_job(caller.tenant_id, original_id)
            assert original is not None
            if not _replaceable(original):
                return _not_replaceable(original)
            return await self.approvals.request(
                caller,
                TwoPersonAction.REPLACE_WITH_OVERWRITE,
                Subject("export", original_id),
                {
                    "overwrite_agreement_ref": body.overwrite_agreement_ref,
                    "body": body.model_dump(mode="json"),
                },
                body.reason,
                record,
            )
        async with self.approvals.executing(self.store, record, approval, caller):
            answer = await self._create_replacement(caller, original_id, body)
            record.outcome, record.detail = answer.kind.value, answer.text or None
            record.after = {"replacement": answer.body.get("export", {}).get("id")}
        return answer

    async def _create_replacement(self, caller: Caller, original_id: UUID, body: ReplaceExport) -> Answer:
        try:
            created = await self.store.create_replacement(
                tenant_id=caller.tenant_id,
                original_job_id=original_id,
                created_by=caller.principal,
                replacement_reason=body.reason,
                overwrite_agreement_ref=body.overwrite_agreement_ref,
            )
        except ConstraintRefused as exc:
            if exc.constraint == "uq_export_jobs_one_replacement":
                return refusal(
                    Kind.REFUSED, f"a replacement of {original_id} is already live, or has delivered"
                )
            raise
        if created is None:
            original = await self.store.get_tenant_job(caller.tenant_id, original_id)
            assert original is not None
            return _not_replaceable(original)
        new = await self.store.get_tenant_job(caller.tenant_id, created.job_id)
        assert new is not None
        return Answer(
            Kind.CREATED,
            {"export": export_json(new), "replaces_job_id": str(original_id)},
            location=f"/exports/{new.id}",
        )

    async def reconcile(self, caller: Caller, job_id: UUID, body: ReconcileExport) -> Answer:
        """Resolve an OutcomeUnknown attempt to Completed or Failed(NotDelivered) from evidence, once;
        reconcilers only (403 for others, and nothing is recorded but the refusal in the ledger)."""
        async with self._action(
            caller, AuditAction.RECONCILE, SubjectKind.EXPORT, job_id, body.evidence_summary
        ) as record:
            return answered(record, await self._reconcile(caller, job_id, body, record))

    async def _reconcile(
        self, caller: Caller, job_id: UUID, body: ReconcileExport, record: ActionRecord
    ) -> Answer:
        if not may(caller.role, Action.RECONCILE):
            # 000 "Reconciliation": a person with the reconciler's duty records what evidence cannot settle;
            # an operator's "Completed" would let the same contacts reach the partner twice by a replacement.
            return refusal(
                Kind.FORBIDDEN,
                "reconciliation needs the reconciler role: an operator may cancel or replace an export, "
                "not record its outcome",
            )
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        if job.status != JobStatus.OUTCOME_UNKNOWN or job.attempt_id is None:
            return refusal(
                Kind.REFUSED, f"the export is {job.status.value}; only OutcomeUnknown is reconciled"
            )
        attempt_id = body.attempt_id or job.attempt_id
        if self.reconciler_store is None:
            return refusal(Kind.FORBIDDEN, "reconciliation needs the exports_reconciler database role")
        store = self._reconciler_for(caller)
        record.before = {"status": job.status.value, "attempt_id": attempt_id}
        try:
            async with store.recording(record):
                done = await store.reconcile_unknown(
                    tenant_id=caller.tenant_id,
                    job_id=job_id,
                    attempt_id=attempt_id,
                    resolution=JobStatus(body.resolution),
                    reconciled_by=caller.principal,
                    evidence_summary=body.evidence_summary,
                )
                record.outcome = (Kind.DONE if done else Kind.REFUSED).value
                record.after = {"status": body.resolution if done else job.status.value}
        except ConstraintRefused as exc:
            if exc.constraint == "uq_attempt_transition":
                return refusal(Kind.REFUSED, f"attempt {attempt_id} was already reconciled once")
            raise
        if not done:
            return refusal(
                Kind.REFUSED,
                f"nothing matched: the export changed, or attempt {attempt_id} is not its attempt",
            )
        now = await self.store.get_tenant_job(caller.tenant_id, job_id)
        assert now is not None
        return Answer(Kind.DONE, {"export": export_json(now)})

    def _reconciler_for(self, caller: Caller) -> ReconcilerStore:
        """The reconciler's statements over the database role this process uses for ``caller``: the
        ``exports_reconciler`` pool for a reconciler, the caller's own ``exports_api`` pool for anyone else, so
        the database refuses a non-reconciler's reconciliation even if a service check were missing."""
        if may(caller.role, Action.RECONCILE) and self.reconciler_store is not None:
            return self.reconciler_store
        return ReconcilerStore(self.store.pool)

    async def correct(
        self, caller: Caller, job_id: UUID, body: CorrectExport, *, approval: Approval | None = None
    ) -> Answer:
        """Correct a recorded Completed/Failed once, with who and why; reconcilers only (403 for others).

        It takes two people (0032): asked, it waits for another reconciler's approval (202); approved, the
        approver records it, in the approval's transaction."""
        async with self._action(caller, AuditAction.CORRECT, SubjectKind.EXPORT, job_id, body.why) as record:
            if approval is not None:
                record.approval_id, record.requested_by = approval.id, approval.requested_by
            return answered(record, await self._correct(caller, job_id, body, record, approval))

    async def _correct(
        self,
        caller: Caller,
        job_id: UUID,
        body: CorrectExport,
        record: ActionRecord,
        approval: Approval | None,
    ) -> Answer:
        if not may(caller.role, Action.RECONCILE) or self.reconciler_store is None:
            return refusal(Kind.FORBIDDEN, "corrections need the reconciler role")
        job = await self.store.get_tenant_job(caller.tenant_id, job_id)
        if job is None:
            return refusal(Kind.NOT_FOUND, "no such export")
        attempt_id = body.attempt_id or job.attempt_id
        if attempt_id is None:
            return refusal(Kind.REFUSED, f"the export is {job.status.value} and has no attempt to correct")
        if job.status.value != body.recorded_status or job.attempt_id != attempt_id:
            return _nothing_to_correct(job, body, attempt_id)
        events = await self.store.tenant_job_events(caller.tenant_id, job.id)
        if any(e.kind == EventKind.CORRECTED and e.attempt_id == attempt_id for e in events):
            # once per attempt (its outcome_corrections row): not worth a second person's time
            return refusal(Kind.REFUSED, f"attempt {attempt_id}'s outcome was already corrected once")
        record.before = {
            "status": job.status.value,
            "failure_reason": job.failure_reason,
            "attempt_id": attempt_id,
        }
        if approval is None:
            return await self.approvals.request(
                caller,
                TwoPersonAction.CORRECT_OUTCOME,
                Subject("export", job_id),
                {
                    "attempt_id": str(attempt_id),
                    "corrected_status": body.corrected_status,
                    "body": body.model_copy(update={"attempt_id": attempt_id}).model_dump(mode="json"),
                },
                body.why,
                record,
            )
        store = self.reconciler_store
        try:
            async with self.approvals.executing(store, record, approval, caller):
                done = await store.correct_outcome(
                    tenant_id=caller.tenant_id,
                    job_id=job_id,
                    attempt_id=attempt_id,
                    recorded_status=JobStatus(body.recorded_status),
                    corrected_status=JobStatus(body.corrected_status),
                    failure_reason=body.failure_reason,
                    corrected_by=caller.principal,
                    evidence_ref=body.evidence_ref,
                    why=body.why,
                )
                record.outcome = (Kind.DONE if done else Kind.REFUSED).value
                record.after = {
                    "status": body.corrected_status if done else job.status.value,
                    "failure_reason": body.failure_reason if done else job.failure_reason,
                }
        except ConstraintRefused as exc:
            if exc.constraint in ("pk_outcome_corrections", "uq_attempt_transition"):
                return refusal(Kind.REFUSED, f"attempt {attempt_id}'s outcome was already corrected once")
            raise
        if not done:
            now = await self.store.get_tenant_job(caller.tenant_id, job_id)
            assert now is not None
            return _nothing_to_correct(now, body, attempt_id)
        now = await self.store.get_tenant_job(caller.tenant_id, job_id)
        assert now is not None
        return Answer(
            Kind.DONE,
            {
                "export": export_json(now),
                "approval_id": str(approval.id),
                "message": f"Corrected to {now.status.value}: asked by {approval.requested_by}, approved by "
                f"{caller.principal}.",
            },
        )


def _replaceable(original: ExportJob) -> bool:
    """Whether an original may be replaced (create_replacement's condition, checked before asking for a second
    person; the statement checks it again)."""
    return original.replaces_job_id is None and (
        original.status == JobStatus.OUTCOME_UNKNOWN
        or (
            original.status == JobStatus.FAILED
            and original.failure_reason
            in (FailureCode.BUILD_FAILED, FailureCode.ATTEMPTS_EXHAUSTED, FailureCode.NOT_DELIVERED)
        )
    )


def _not_replaceable(original: ExportJob) -> Answer:
    code = f" ({original.failure_reason.value})" if original.failure_reason else ""
    return refusal(
        Kind.REFUSED,
        f"the original {original.id} is {original.status.value}{code}; only an OutcomeUnknown original, "
        "or one that Failed with BuildFailed, AttemptsExhausted or NotDelivered, may be replaced",
    )


def _nothing_to_correct(job: ExportJob, body: CorrectExport, attempt_id: UUID) -> Answer:
    return refusal(
        Kind.REFUSED,
        f"nothing matched: the export is {job.status.value}, not a recorded {body.recorded_status} "
        f"of attempt {attempt_id}",
    )


@contextlib.asynccontextmanager
async def open_exports(
    settings: Settings,
    *,
    reconciler: bool = True,
    signaller: StopSignaller | None = None,
    connect_retry_seconds: float = START_RETRY_SECONDS,
    approval_ttl_seconds: int | None = None,
) -> AsyncIterator[Exports]:
    """The operations over pools opened from ``settings.database_url`` (``exports_api``, and
    ``exports_reconciler`` for corrections), closed on exit. The signaller defaults to one that connects
    to ``settings.temporal_address`` on first use (and again on the next signal after a failure).

    The first connection to PostgreSQL is retried with backoff for ``connect_retry_seconds`` (a process
    started while the server restarts); a checkout waits at most ``API_CHECKOUT_SECONDS``, so a request
    that cannot reach the database answers 503 soon rather than late."""
    if not settings.database_url:
        raise ValueError("EXPORTS_DATABASE_URL is not set")
    async with contextlib.AsyncExitStack() as stack:
        api_pool = await open_pool(
            settings.database_url,
            "exports_api",
            max_size=settings.api_pool_size,
            checkout_timeout=API_CHECKOUT_SECONDS,
            retry_for=connect_retry_seconds,
        )
        stack.push_async_callback(api_pool.close)
        reconciler_store = None
        if reconciler:
            reconciler_pool = await open_pool(
                settings.database_url, "exports_reconciler", max_size=2, checkout_timeout=API_CHECKOUT_SECONDS
            )
            stack.push_async_callback(reconciler_pool.close)
            reconciler_store = ReconcilerStore(reconciler_pool)
        yield Exports(
            ApiStore(api_pool),
            reconciler_store,
            signaller or TemporalStopSignaller(settings),
            temporal_ui_url=settings.temporal_ui_url,
            namespace=settings.temporal_namespace,
            cancel_lock_timeout=lock_timeout(settings),
            list_timeout_ms=settings.list_query_timeout_ms,
            exact_count_limit=settings.list_exact_count_limit,
            approval_ttl_seconds=approval_ttl_seconds or settings.approval_ttl_seconds,
        )


def lock_timeout(settings: Settings) -> str:
    """The cancellation transaction's lock_timeout, as PostgreSQL reads it."""
    return f"{int(settings.cancel_lock_timeout_seconds * 1000)}ms"

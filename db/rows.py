"""Typed rows of the store's own answers (the job, its events and requests are in :mod:`domain.models`)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from domain.models import CancellationOutcome, ExportJob, JobStatus, Row


class ClaimAnswer(ExportJob):
    """The claim's answer: whether it matched, with the whole row as it wrote it or, when it matched nothing,
    as the locking read found it, and whether every delivery switch of its scope was enabled (read FOR SHARE by
    the claim itself)."""

    matched: bool
    deliveries_open: bool
    available: bool  # not waiting after a give-back (its available_at passed, or it has none)
    # inside the destination's delivery window now (0035); when not, the claim deferred the job to this opening
    window_open: bool = True
    window_opens_at: datetime | None = None

    def job(self) -> ExportJob:
        """The row alone (its values are validated already)."""
        return _row_of(self)


class CutoffAnswer(Row):
    """Cutoff 2's answer: whether it matched, and state and ownership as the locking read found them."""

    matched: bool
    status: JobStatus
    attempt_id: UUID | None
    stop_request_id: UUID | None
    lease_current: bool
    original_status: JobStatus | None
    destination_usable: bool  # not retired and within its contract today, read FOR SHARE by cutoff 2
    deliveries_open: bool  # every delivery switch of the job's scope enabled, read FOR SHARE by cutoff 2
    policy_allows: (
        bool  # the creator may still export the list (principal read FOR SHARE), and it has contacts
    )
    destination_unchanged: bool = True  # nothing a delivery uses changed since the version the build read
    window_open: bool = True  # inside the destination's delivery window, read on the locked row (0035)


class FenceAnswer(Row):
    """The upload fence's answer: whether it matched, and the row as the locking read found it otherwise."""

    matched: bool
    status: JobStatus
    attempt_id: UUID | None
    fenced: bool
    lease_current: bool
    window_open: bool = True  # the rename fence only: inside the destination's delivery window (0035)


class UploadFenceAnswer(ExportJob):
    """The upload fence's answer: whether it matched, with the whole row, as it wrote it or, when it matched
    nothing, as the locking read found it."""

    matched: bool
    fenced: bool
    lease_current: bool
    window_open: bool = True  # the rename fence's; the upload fence never reads the window

    def job(self) -> ExportJob:
        """The row alone (its values are validated already)."""
        return _row_of(self)


def _row_of(answer: ExportJob) -> ExportJob:
    """An answer's ``export_jobs`` row alone, without the answer's own columns."""
    return ExportJob.model_construct(**{name: getattr(answer, name) for name in ExportJob.model_fields})


class JobIdRow(Row):
    job_id: UUID


class RetryRow(Row):
    """A transient NotDelivered's terminal write (issue #25.4): back to Queued until ``available_at``
    ('Retried'), or Failed NotDelivered ('Failed', with the request that stopped the retry, if one did).
    ``used``: the attempts the job had used, the failed one included."""

    ending: str
    available_at: datetime | None
    request_id: UUID | None
    used: int


class ReleaseRow(Row):
    """A give-back's answer: the job went back to the queue (waiting until ``available_at``, if counted),
    or it was past the bound of give-backs for failures and ended Failed (AttemptsExhausted)."""

    job_id: UUID
    ending: str  # 'Released' or 'Exhausted'
    available_at: datetime | None


class OpenRow(Row):
    """A gate's verdict: every delivery switch of the scope enabled."""

    open: bool


class IdRow(Row):
    id: UUID


class ActionIdRow(Row):
    """The ledger row just appended (operator_actions' identity)."""

    id: int


class CountRow(Row):
    n: int


class EventIdRow(Row):
    id: int


class StoppedRow(EventIdRow):
    """A Stopped write's event, with the seconds since the stop request was recorded (database clock)."""

    stop_latency_seconds: float | None


class VersionRow(Row):
    job_id: UUID
    version: int


class IdempotencyRow(Row):
    job_id: UUID
    fingerprint: str


class RenewalRow(Row):
    status: JobStatus
    stop_requested: bool


class AttemptIdRow(Row):
    attempt_id: UUID


class MessageIdRow(Row):
    message_id: UUID


class TokenRow(Row):
    """What a token's hash is bound to."""

    tenant_id: UUID
    principal: str
    role: str


class NameRow(Row):
    name: str


class RoleRow(Row):
    role: str


class DestinationName(Row):
    """A destination for display: never its credential reference."""

    id: UUID
    name: str
    host: str
    port: int
    remote_dir: str
    version: int = 1
    retired_at: datetime | None = None


class CreatedDestination(Row):
    """``create_destination``'s answer: the destination created now, or the one an earlier request with the
    same Idempotency-Key created (``replayed``), with that request's fingerprint."""

    destination_id: UUID
    replayed: bool
    fingerprint: str | None


class DestinationEdit(Row):
    """``edit_destination_if_version``'s answer: whether it matched, the version the row is at, the fields that
    changed and whether a delivery term was among them; unmatched, whether the destination is retired."""

    matched: bool
    version: int
    changed_fields: list[str]
    delivery_changed: bool
    retired_at: datetime | None


class DestinationRetirement(Row):
    """``retire_destination``'s answer: whether this call retired it, the version, and the retirement."""

    matched: bool
    version: int
    retired_at: datetime | None
    retired_by: str | None


class DestinationRecord(Row):
    """One destination as it is now: every column as JSON (``settings``, for display after references are
    masked), and its switch (``None``: never enabled, so paused)."""

    id: UUID
    version: int
    settings: dict[str, Any]
    enabled: bool | None
    paused_because: str | None = None  # the reason of its switch's pause, while paused (None: never enabled)
    # when its delivery window opens next, as of window_checked_at (the same instant when it is open; 0035)
    window_checked_at: datetime | None = None
    window_opens_at: datetime | None = None
    sessions_in_use: int = 0  # of its session slots, held now (0029)


class DestinationVersion(Row):
    """One recorded version of a destination and the change that made it."""

    version: int
    change: str
    changed_by: str
    changed_role: str
    reason: str
    changed_at: datetime
    before: dict[str, Any] | None
    after: dict[str, Any]
    changed_fields: list[str]
    delivery_changed: bool


class LedgerAnswer(ExportJob):
    """The cancellation ledger's answer: the job as its locking read found it, the request recorded now
    or by an earlier submission of the same ID (as JSON, validated into ``CancellationRequest``), and
    whether it was earlier."""

    request: dict[str, Any] | None
    replayed: bool


class CancellationBatch(Row):
    """One ``cancellation_batches`` row: who asked, when, for which filter, why, how many it covers, and the
    preview whose set it confirmed (``None``: the exports live when it was recorded)."""

    tenant_id: UUID
    id: UUID
    requested_by: str
    reason: str
    destination_id: UUID
    list_name: str | None
    matched: int
    recorded_at: datetime
    preview_id: UUID | None


class PreviewedExport(Row):
    """One live export a bulk cancel's preview counted, and the token its set was kept under (``None`` with
    no row at all when nothing matched)."""

    preview_id: UUID | None
    expires_at: datetime | None
    job_id: UUID
    status: JobStatus


class StopToSignal(Row):
    """A bulk cancel's StopRequested request whose running attempt has not been signalled yet."""

    request_id: UUID
    job_id: UUID
    workflow_id: str


class OutcomeCount(Row):
    outcome: CancellationOutcome
    n: int


class ExpiryRow(Row):
    expires_at: datetime


class SwitchStateRow(Row):
    """What ``lock_delivery_switch`` read under the lock (no row: the scope was never switched)."""

    enabled: bool


class FiringFactsRow(Row):
    """``lock_recurring_export_for_firing``'s answer: a firing's facts, read under its recurring export's lock."""

    id: UUID
    tenant_id: UUID
    version: int
    destination_id: UUID
    list_name: str
    created_by: str
    paused: bool
    paused_reason: str | None
    deleted_at: datetime | None
    starts_at: datetime | None
    ends_at: datetime | None
    destination_found: bool
    destination_name: str | None
    destination_retired_at: datetime | None
    contract_starts_on: date | None
    contract_ends_on: date | None
    principal_found: bool
    principal_role: str | None
    principal_revoked_at: datetime | None
    principal_lists: list[str] | None
    deliveries_open: bool
    paused_scope: str | None
    paused_scope_reason: str | None
    recorded_outcome: str | None
    live_job_id: UUID | None
    live_job_status: str | None
    late: bool
    late_runs: int
    today: date


class StatusCountRow(Row):
    status: JobStatus
    n: int


class PrincipalRow(Row):
    name: str
    role: str
    revoked_at: datetime | None


class CappedCountRow(Row):
    """One status's count, capped (``count_tenant_jobs_of_status``: ``cap + 1`` means more than ``cap``)."""

    status: JobStatus
    counted: int


# -- the reconciler's console (issue 26 item 4) --------------------------------------------------------


class CountedRow(Row):
    """A capped count (``count_outcome_unknown_queue``: ``cap + 1`` means more than ``cap``)."""

    counted: int


class QueryPlanRow(Row):
    """What ``EXPLAIN (FORMAT JSON)`` answers: one row, its one column the plan as JSON."""

    plan: list[dict[str, Any]] = Field(alias="QUERY PLAN")

    @property
    def estimated_rows(self) -> int:
        """The planner's estimate of the rows the top node returns."""
        return round(float(self.plan[0]["Plan"]["Plan Rows"]))


class QueueSummaryRow(Row):
    """One queued OutcomeUnknown's line of why (``outcome_unknown_summaries``)."""

    job_id: UUID
    reason: str | None  # the Finished / ResolvedByRecovery detail that recorded OutcomeUnknown
    recorded_by: str | None
    recorded_at: datetime | None
    recovery_listings: int
    last_listed_at: datetime | None
    listing_requested: bool


class ListingRequestRow(Row):
    """A reconciler's request for today's listing of an export's final name (``listing_requests``)."""

    id: UUID
    job_id: UUID
    attempt_id: UUID
    requested_by: str
    requested_at: datetime
    answerable: bool = True  # still within the window in which recovery answers it


class ListingToAnswer(Row):
    """A listing request recovery answers (``find_listing_requests``)."""

    request_id: UUID
    job_id: UUID
    attempt_id: UUID


class SlotAnswer(Row):
    """``take_session_slot``'s answer: whether the destination exists, its session limit (``None``: none), the
    slot taken (``None``: none free, or the attempt no longer holds its job), whether it was taken over from the
    ``adopt`` holder, whether the holder was eligible (an attempt: still Running with a current lease), and,
    when none was taken, how many slots were held when it looked."""

    destination_found: bool
    max_sessions: int | None
    slot: int | None
    adopted: bool  # the slot was the ``adopt`` holder's (none was free)
    eligible: bool
    in_use: int


class SlotRow(Row):
    """One session slot's number."""

    slot: int


class PartnerPause(Row):
    """``pause_destination_for_partner``'s answer: whether the destination's switch was enabled, whether this
    call paused it (an operator's earlier pause keeps its reason), and whether the destination changed since
    the version the worker checked (then nothing is paused)."""

    was_enabled: bool | None
    paused: bool
    destination_changed: bool  # its delivery terms changed since the version checked: not paused

"""Typed values of the row protocol: the seeds' enumerations, spelled as the seeds spell them, and rows."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict


class JobStatus(StrEnum):
    QUEUED = "Queued"
    RUNNING = "Running"
    DELIVERING = "Delivering"
    CANCELED = "Canceled"
    REJECTED = "Rejected"
    STOPPED = "Stopped"
    FAILED = "Failed"
    COMPLETED = "Completed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"


class FailureCode(StrEnum):
    BUILD_FAILED = "BuildFailed"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    NOT_DELIVERED = "NotDelivered"
    FINAL_NAME_OCCUPIED = "FinalNameOccupied"
    ORIGINAL_DELIVERED = "OriginalDelivered"


class RejectionCode(StrEnum):
    """Why the policy check rejected a version: the codes the ``rejection_code`` column's CHECK allows."""

    LIST_INVALID = "list_invalid"  # blank, oversized or with control characters
    DESTINATION_NOT_FOUND = "destination_not_found"  # not one of the job's tenant's destinations
    DESTINATION_RETIRED = "destination_retired"
    CONTRACT_NOT_STARTED = "contract_not_started"
    CONTRACT_ENDED = "contract_ended"
    CREATOR_UNKNOWN = "creator_unknown"  # the creator is not a principal of the tenant
    CREATOR_REVOKED = "creator_revoked"
    CREATOR_NOT_PERMITTED = "creator_not_permitted"  # the role may not export, or not this list
    LIST_MISSING = "list_missing"  # the tenant has no contacts in that list


class EventKind(StrEnum):
    CLAIMED = "Claimed"
    DELIVERY_AUTHORIZED = "DeliveryAuthorized"
    STOPPED = "Stopped"
    FAILED = "Failed"
    FINISHED = "Finished"
    REQUEUED_BY_RECOVERY = "RequeuedByRecovery"
    STOPPED_BY_RECOVERY = "StoppedByRecovery"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    RESOLVED_BY_RECOVERY = "ResolvedByRecovery"
    RECONCILED = "Reconciled"
    CORRECTED = "Corrected"
    DELIVERY_EVIDENCE = "DeliveryEvidence"
    RELEASED = "Released"
    UPLOAD_FENCED = "UploadFenced"
    RENAME_FENCED = "RenameFenced"
    RETRY_SCHEDULED = (
        "RetryScheduled"  # a transient NotDelivered went back to Queued to be tried again (#25.4)
    )


class CancellationOutcome(StrEnum):
    CANCELED_WHILE_QUEUED = "CanceledWhileQueued"
    STOP_REQUESTED = "StopRequested"
    STOP_ALREADY_REQUESTED = "StopAlreadyRequested"
    ALREADY_CANCELED = "AlreadyCanceled"
    ALREADY_ENDED = "AlreadyEnded"
    TOO_LATE = "TooLate"
    # Answers that record nothing:
    REQUEST_ID_REUSED = "RequestIdReused"
    NOT_FOUND = "NotFound"
    BUSY = "Busy"


class Statement(StrEnum):
    """The statements on the edges of the state diagram (db/queries.sql, named after their transitions):
    the store's transition methods, and the ``statement`` label of the transition metrics; with the
    attempt's own edges of issue 10 (giving an attempt back, the upload and rename fences, recovery's
    NotDelivered for a delivery that never published)."""

    CLAIM_IF_QUEUED = "claim_if_queued"
    AUTHORIZE_DELIVERY_IF_RUNNING = "authorize_delivery_if_running"
    FINISH_STOPPED = "finish_stopped"
    FINISH_FAILED = "finish_failed"
    FINISH_DELIVERY = "finish_delivery"
    REQUEUE_EXPIRED_ATTEMPT = "requeue_expired_attempt"
    STOP_EXPIRED_ATTEMPT = "stop_expired_attempt"
    EXHAUST_EXPIRED_ATTEMPT = "exhaust_expired_attempt"
    RESOLVE_EXPIRED_DELIVERY = "resolve_expired_delivery"
    RECONCILE_UNKNOWN = "reconcile_unknown"
    CORRECT_OUTCOME = "correct_outcome"
    CANCEL_AND_RECORD = "cancel_and_record"  # written: Queued -> Canceled, or a Running job's stop request
    REJECT_IF_QUEUED = "reject_if_queued"
    RELEASE_ATTEMPT_IF_RUNNING = "release_attempt_if_running"
    ADOPT_CLAIM_IF_RUNNING = "adopt_claim_if_running"
    FENCE_UPLOAD_IF_DELIVERING = "fence_upload_if_delivering"
    FENCE_RENAME_IF_DELIVERING = "fence_rename_if_delivering"
    FAIL_UNPUBLISHED_DELIVERY = "fail_unpublished_delivery"
    FAIL_SET_ASIDE_DELIVERY = "fail_set_aside_delivery"
    SETTLE_UNKNOWN_BY_EVIDENCE = "settle_unknown_by_evidence"
    SETTLE_UNKNOWN_BY_FENCES = "settle_unknown_by_fences"
    RETRY_DELIVERY_IF_DELIVERING = "retry_delivery_if_delivering"


class ClaimResult(StrEnum):
    CLAIMED = "Claimed"
    LOST = "Lost"
    PAUSED = "Paused"  # the claim matched nothing because a switch of the job's scope is paused: still Queued
    NOT_YET = "NotYet"  # the claim matched nothing because the job waits after a give-back (available_at)
    # outside the destination's delivery window: nothing claimed, the job waits for the next opening (#25.2)
    OUTSIDE_WINDOW = "OutsideWindow"
    UNKNOWN = "Unknown"


class AuthorizationResult(StrEnum):
    AUTHORIZED = "Authorized"
    STOP_RECORDED = "StopRecorded"
    LEASE_LAPSED = "LeaseLapsed"
    NOT_OWNER = "NotOwner"
    ORIGINAL_COMPLETED = "OriginalCompleted"
    PAUSED = "Paused"  # a switch of the job's scope is paused: give the attempt back (release)
    DESTINATION_INACTIVE = "DestinationInactive"  # retired or out of contract: release; the policy rejects
    POLICY_DENIED = (
        "PolicyDenied"  # the creator may no longer export, or the list is gone: release; the policy rejects
    )
    # what a delivery of the destination uses changed since the build read it: release, and rebuild (#24.2)
    DESTINATION_CHANGED = "DestinationChanged"
    # the destination's delivery window closed during the build: release, wait for the next opening (#25.2)
    WINDOW_CLOSED = "WindowClosed"
    UNKNOWN = "Unknown"


class FenceResult(StrEnum):
    """The upload fence's answer: the uploader sends nothing unless it is Fenced."""

    FENCED = "Fenced"
    LEASE_LAPSED = "LeaseLapsed"  # still the owner, lease expired: renew once and fence again
    NOT_OWNER = "NotOwner"  # another attempt, another state, or recovery's takeover refused it
    # the rename fence only: the destination's delivery window is closed (or closes within the margin)
    OUTSIDE_WINDOW = "OutsideWindow"
    UNKNOWN = "Unknown"  # the answer and its re-read were both lost: send nothing


class ReleaseCause(StrEnum):
    """Why an attempt gave its job back to the queue before cutoff 2 (the ``Released`` event says so)."""

    DRAIN = "drain"  # its worker is shutting down: nobody's failure, handed on at once
    PAUSED = "paused"  # a delivery switch paused, or the destination retired or out of contract, at cutoff 2
    POLICY = (
        "policy"  # at cutoff 2 the creator may no longer export, or the list is gone: the next claim rejects
    )
    TERMINATED = "terminated"  # a person terminated its workflow in Temporal: nobody's failure, a fresh wake-up runs it
    # an admin changed what a delivery of the destination uses during the build: nobody's failure, the next
    # claim rebuilds for the new version at once (issue #24.2)
    DESTINATION_CHANGED = "destination_changed"
    # the destination's delivery window closed during the build: nobody's failure, the job waits for the next
    # opening (issue #25.2)
    WINDOW_CLOSED = "window_closed"
    WORKFLOW = (
        "workflow"  # its workflow is gone, timed out, or not confirmed (Temporal unreachable, throttled)
    )
    TRANSIENT = "transient"  # the build was interrupted by the database, or cutoff 2 could not read a fact
    # no slot of the partner's session limit came free within the wait (issue #25.3): nobody's failure, not
    # counted, but the next claim waits a moment instead of building again against a partner still at its limit
    SESSION_LIMIT = "session_limit"


class ReleaseResult(StrEnum):
    """What a give-back found: released (the job waits in the queue), exhausted (past the bound of
    give-backs for failures, the job ended Failed instead), not this attempt's row, or unknown."""

    RELEASED = "Released"
    EXHAUSTED = "Exhausted"
    NOT_OWNER = "NotOwner"
    UNKNOWN = "Unknown"


class FinishResult(StrEnum):
    """What a terminal write found: it wrote, it had already written (a lost response), or not its row."""

    WRITTEN = "Written"
    NOT_OWNER = "NotOwner"
    UNKNOWN = "Unknown"


class FailureCause(StrEnum):
    """Why a delivery failed NotDelivered, as its evidence shows (rules/retries.py classifies it; the ``cause``
    label of the retry metric). Transient: connect_refused, session_cut, no_space; the others are permanent."""

    CONNECT_REFUSED = "connect_refused"
    SESSION_CUT = "session_cut"
    NO_SPACE = "no_space"
    AUTH_REFUSED = "auth_refused"
    PERMISSION_DENIED = "permission_denied"
    HOST_KEY_MISMATCH = "host_key_mismatch"
    OTHER = "other"


class RetryResult(StrEnum):
    """What the terminal write of a transient NotDelivered did (issue #25.4): the job went back to Queued to
    be tried again, or it ended Failed NotDelivered because a retry may not be made (a cancellation or stop
    request recorded during the attempt, the attempt cap, a rename fence written), or it was not this
    attempt's row, or neither the write nor its re-read answered."""

    RETRIED = "Retried"
    FAILED = "Failed"
    NOT_OWNER = "NotOwner"
    UNKNOWN = "Unknown"


class DeliveryOutcome(StrEnum):
    """The terminal write of a delivery: Delivering becomes one of these."""

    COMPLETED = "Completed"
    FAILED = "Failed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"


class AttemptOutcome(StrEnum):
    """How one ExportWorkflow ended, from its own writes; the row stays the authority on the job."""

    ALREADY_SETTLED = "Settled"  # the row was not Queued (canceled, claimed, ended, or not found): no-op
    REJECTED = "Rejected"  # the policy denied this version; Queued -> Rejected was written
    NOT_CLAIMED = (
        "NotClaimed"  # the claim matched nothing: another wake-up claimed it, or it was canceled/edited
    )
    STOPPED = "Stopped"  # this attempt wrote Running -> Stopped for a recorded stop request
    FAILED = "Failed"  # this attempt wrote a Failed with a code
    COMPLETED = "Completed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"
    NOT_OWNER = (
        "NotOwner"  # ownership was lost (a takeover or a terminal write by someone else): wrote nothing
    )
    LEFT_TO_RECOVERY = "LeftToRecovery"  # unanswered write, timed-out or failed activity: the lease decides
    RELEASED = "Released"  # this attempt gave the job back to the queue (a drain or a pause) before cutoff 2
    PAUSED = "Paused"  # a switch of the job's scope is paused: nothing claimed, the job stays Queued
    NOT_YET = "NotYet"  # the job waits after a give-back until its available_at: nothing claimed
    OUTSIDE_WINDOW = "OutsideWindow"  # outside its destination's delivery window: waits for the next opening
    # the delivery failed NotDelivered for a transient cause and the job waits Queued to be tried again (#25.4)
    RETRY_SCHEDULED = "RetryScheduled"


class StopPoint(StrEnum):
    WHILE_BUILDING = "while building"
    BEFORE_DELIVERY = "before delivery"


class Row(BaseModel):
    model_config = ConfigDict(frozen=True)


class ExportJob(Row):
    """One ``export_jobs`` row, every column."""

    id: UUID
    tenant_id: UUID
    status: JobStatus
    version: int
    destination_id: UUID
    attempt_id: UUID | None
    attempt_count: int
    claimed_by: str | None
    lease_expires_at: datetime | None
    stop_request_id: UUID | None
    cancellation_request_id: UUID | None
    expected_file_name: str | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None
    expected_file_rows: int | None
    delivery_authorized_at: datetime | None
    woken_at: datetime
    failure_reason: FailureCode | None
    delivery_key: str
    replaces_job_id: UUID | None
    created_by: str
    replacement_reason: str | None
    overwrite_agreement_ref: str | None
    sweep_count: int
    list_name: str
    rejection_reason: str | None
    workflow_id: str | None
    created_at: datetime
    attempts_released: int
    fence_expected: bool
    upload_fenced_at: datetime | None
    rename_fenced_at: datetime | None
    rejection_code: RejectionCode | None
    available_at: datetime | None = None  # not claimable before this (database clock), after a give-back
    transient_releases: int = 0  # give-backs for a failure: each makes the next claim wait longer
    destination_version: int | None = None  # the destination version cutoff 2 authorized (issue #24.2)
    outcome_unknown_at: datetime | None = None  # when it became OutcomeUnknown (database clock; 0033)
    # what the version cutoff 2 authorized asks for beside the file (0037): none, sha256, json or both
    expected_manifest: str | None = None

    @property
    def final_name(self) -> str:
        """The plain-CSV name; once delivery is authorized, ``expected_file_name`` is the name sent."""
        return final_name_for(self.delivery_key)


class Claim(Row):
    """Cutoff 1's answer with the row as the claim wrote it (``None`` unless this call's own statement
    claimed it: a claim found by a re-read, or a retry's, is read again by whoever needs the row)."""

    result: ClaimResult
    job: ExportJob | None = None


class UploadFence(Row):
    """The upload fence's answer with the row it left: as the fence wrote it, or as its locking read found it
    when it matched nothing (``None`` when only the re-read after a lost answer decided)."""

    result: FenceResult
    job: ExportJob | None = None


def final_name_for(delivery_key: str, suffix: str = ".csv") -> str:
    """The partner-facing file name: a function of the delivery key (000 "The Tables") and the suffix of
    the destination's file format (``FileFormat.suffix``: ``.csv``, ``.csv.gz``, ``.csv.gz.pgp``, ...)."""
    return f"contacts-{delivery_key}{suffix}"


class OwnershipState(Row):
    """The lost-response re-read: state and ownership read together in one statement."""

    status: JobStatus
    attempt_id: UUID | None
    stop_request_id: UUID | None
    lease_current: bool
    original_status: JobStatus | None
    upload_fenced: bool = False
    rename_fenced: bool = False


class Renewal(Row):
    """A lease renewal's answer: whether this attempt still owns the row, and whether a stop is recorded."""

    owned: bool
    stop_requested: bool
    status: JobStatus | None = None


class AttemptEvent(Row):
    id: int
    job_id: UUID
    attempt_id: UUID
    kind: EventKind
    version: int | None
    worker_id: str | None
    observed_by: str | None
    detail: str | None
    recorded_at: datetime
    destination_version: int | None = None  # DeliveryAuthorized: the destination version it authorized


class CancellationRequest(Row):
    tenant_id: UUID
    id: UUID
    job_id: UUID
    requested_by: str
    reason: str | None
    outcome: CancellationOutcome
    found_status: JobStatus
    found_attempt_id: UUID | None
    found_attempt_count: int
    found_delivery_authorized_at: datetime | None
    recorded_at: datetime
    batch_id: UUID | None = None  # the bulk cancel this request belongs to, if any


class CancellationResult(Row):
    """What a cancellation submission answers. ``request`` is the recorded request when one exists."""

    request_id: UUID
    outcome: CancellationOutcome
    request: CancellationRequest | None = None
    job: ExportJob | None = None
    replayed: bool = False  # the answer was already recorded by an earlier submission of this request ID


class ExpiredLease(Row):
    """A candidate nominated by recovery's scan; each takeover repeats every condition it relied on."""

    id: UUID
    attempt_id: UUID
    status: JobStatus
    stop_request_id: UUID | None
    attempt_count: int
    attempts_released: int
    replaces_job_id: UUID | None
    unpublished: bool  # fences were expected and the rename fence was never written: final name untouched


class UnknownToRecheck(Row):
    """An OutcomeUnknown attempt nominated by recovery's re-check (``find_unknowns_to_recheck``, or
    ``find_unpublished_unknowns`` for those the row's fences settle); settling it repeats every condition
    the nomination relied on."""

    job_id: UUID
    attempt_id: UUID


class OutboxMessage(Row):
    """One wake-up as a dispatcher took it: the row, and the publishing lease it was taken with."""

    message_id: UUID
    kind: str
    job_id: UUID
    created_at: datetime
    traceparent: str | None = None  # W3C trace context of the request that wrote it, IDs only
    publishing_until: datetime | None = None  # the lease (database clock) until which no one else takes it
    waited_seconds: float = 0.0  # from created_at to the take (database clock)


class Created(Row):
    job_id: UUID
    message_id: UUID | None = None
    replayed: bool = False

"""Inputs and results of the workflows and their activities: IDs, sizes, hashes and codes only.

Temporal history is shown in plain text in its Web UI, so nothing here may carry contact data, file
contents or credentials. Every model is a pydantic model so fields can be added later with defaults, and
every client uses ``pydantic_data_converter``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel

from domain.evidence import ConnectionReport
from domain.models import (
    AttemptOutcome as AttemptOutcome,
)
from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    DeliveryOutcome,
    FailureCode,
    FinishResult,
)

# Custom search attributes (keywords) the workflow sets when the server has them registered.
SEARCH_ATTRIBUTE_JOB_ID = "ExportJobId"
SEARCH_ATTRIBUTE_TENANT_ID = "ExportTenantId"
SEARCH_ATTRIBUTE_OUTCOME = "ExportOutcome"
SEARCH_ATTRIBUTE_NAMES = (SEARCH_ATTRIBUTE_JOB_ID, SEARCH_ATTRIBUTE_TENANT_ID, SEARCH_ATTRIBUTE_OUTCOME)


class Stage(StrEnum):
    """Where an attempt stands, for the ``progress`` query and the Web UI's current details."""

    CLAIMING = "Claiming"
    BUILDING = "Building"
    DELIVERING = "Delivering"
    FINISHED = "Finished"


class ExportInput(BaseModel):
    """One wake-up: the job it names and the outbox message it came from.

    The timeouts have production defaults; tests shorten them. They are codes and numbers only.
    """

    job_id: UUID
    message_id: UUID
    build_heartbeat_seconds: float = 5.0
    deliver_heartbeat_seconds: float = 10.0
    schedule_to_start_seconds: float = 60.0
    build_timeout_seconds: float = 2 * 3600.0
    deliver_timeout_seconds: float = 6 * 3600.0


class ExportResult(BaseModel):
    """What this workflow did. ``cutoff_answers`` lists cutoff 2's answers in order (a retry adds one)."""

    job_id: UUID
    attempt_id: UUID
    outcome: AttemptOutcome
    failure_code: FailureCode | None = None
    cutoff_answers: list[AuthorizationResult] = []
    file_bytes: int | None = None
    file_sha256: str | None = None
    temporal_cancel: CancellationOutcome | None = None
    stop_signals: int = 0


class ExportProgress(BaseModel):
    """The ``progress`` query's answer: where the attempt stands."""

    job_id: UUID | None = None
    attempt_id: UUID | None = None
    stage: Stage = Stage.CLAIMING
    worker_task_queue: str | None = None
    file_bytes: int | None = None
    file_rows: int | None = None
    stop_request_ids: list[str] = []
    stop_checks: int = 0  # stop signals checked against the row so far
    stops_confirmed: int = 0  # of those, the ones the row confirmed (the build was stopped)
    temporal_cancel: CancellationOutcome | None = None
    outcome: AttemptOutcome | None = None


# -- activities ---------------------------------------------------------------------------------------


class ClaimStep(StrEnum):
    CLAIMED = "Claimed"
    ALREADY_SETTLED = "Settled"  # the row was already settled (not Queued, or not found): nothing to do
    REJECTED = "Rejected"
    NOT_CLAIMED = "NotClaimed"
    PAUSED = "Paused"  # a delivery switch of the job's scope is paused: nothing claimed, still Queued
    NOT_YET = "NotYet"  # the job waits after a give-back (available_at): nothing claimed, still Queued
    # outside its destination's delivery window: nothing claimed, still Queued, woken at the next opening
    OUTSIDE_WINDOW = "OutsideWindow"


class ClaimInput(BaseModel):
    job_id: UUID
    attempt_id: UUID
    workflow_id: str


class ClaimOutcome(BaseModel):
    """The claim's answer. ``task_queue`` is the claiming worker's own queue, set only when claimed."""

    step: ClaimStep
    tenant_id: UUID | None = None
    task_queue: str | None = None
    search_attributes: bool = False  # the server has the export search attributes registered


class PrepareInput(BaseModel):
    job_id: UUID
    attempt_id: UUID


class LocalFile(BaseModel):
    """The built file, on the host that built it; it never leaves that host."""

    path: str
    final_name: str
    size: int
    sha256: str  # hex
    rows: int


class PrepareResult(BaseModel):
    """Build and cutoff 2. ``file`` is set only when delivery was authorized."""

    outcome: AttemptOutcome | None = None  # None: authorized, go on to deliver
    failure_code: FailureCode | None = None
    cutoff_answers: list[AuthorizationResult] = []
    file: LocalFile | None = None


class ConfirmStopInput(BaseModel):
    job_id: UUID
    attempt_id: UUID
    request_id: str


class ConfirmStopResult(BaseModel):
    """Whether the row shows this attempt Running with a stop request recorded."""

    confirmed: bool
    stop_request_id: UUID | None = None


class DeliverInput(BaseModel):
    job_id: UUID
    attempt_id: UUID
    file: LocalFile


class DeliverResult(BaseModel):
    """The classified delivery, and whether this attempt's terminal write matched."""

    delivery: DeliveryOutcome | None = None  # None: the upload was never started (ownership lost)
    failure_code: FailureCode | None = None
    finish: FinishResult | None = None
    evidence_appended: int = 0
    evidence_lost: int = 0
    # a transient NotDelivered (issue #25.4): its cause, and whether the job went back to Queued to be tried
    # again (the terminal write then wrote Queued, not Failed)
    failure_cause: str | None = None
    retried: bool = False


class RecordCancelInput(BaseModel):
    job_id: UUID
    request_id: UUID


class RecordCancelResult(BaseModel):
    outcome: CancellationOutcome


# -- recovery -----------------------------------------------------------------------------------------


class RecoveryInput(BaseModel):
    """One recovery run: scan in batches of ``batch`` leases, at most ``max_batches`` batches."""

    batch: int = 100
    max_batches: int = 20
    # A batch on a worker that stopped (paused, partitioned) moves to another after this long without a
    # heartbeat; the activity heartbeats on a timer, so a slow listing does not count as silence.
    heartbeat_seconds: float = 20.0


class RecoveryBatchInput(BaseModel):
    recovery_run_id: str
    limit: int = 100


class Takeover(StrEnum):
    """What recovery did with one candidate."""

    REQUEUED = "Requeued"
    STOPPED = "Stopped"
    EXHAUSTED = "Exhausted"
    COMPLETED = "Completed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"
    NOT_DELIVERED = "NotDelivered"  # no rename fence, or its temporary file set aside: Failed NotDelivered
    MATCHED_NOTHING = "MatchedNothing"  # renewed, finished or taken over since the scan
    WAITING_FOR_RESUME = "WaitingForResume"  # needs its partner, whose deliveries are paused: left as it is
    WAITING_FOR_SLOT = "WaitingForSlot"  # needs its partner, whose session slots are all in use: next run
    ERROR = "Error"  # not decided this run; the next run nominates it again


class Recheck(StrEnum):
    """What recovery's re-check did with one OutcomeUnknown (0013)."""

    COMPLETED = "SettledCompleted"  # the final name shows the attempt's expected file
    NOT_DELIVERED = "SettledNotDelivered"  # its temporary file set aside with the final name as its baseline,
    # or its fences prove its rename was never sent (upload fenced, no rename fence: issue 23)
    STILL_UNKNOWN = "StillUnknown"  # nothing conclusive yet: listed again after the interval
    MATCHED_NOTHING = "MatchedNothing"  # reconciled, replaced or moved on since the nomination
    WAITING_FOR_RESUME = "WaitingForResume"  # its partner's deliveries are paused: not listed
    ERROR = "Error"  # not decided this run


class RecheckInput(BaseModel):
    """One re-check of OutcomeUnknowns, after a recovery run's takeovers: at most ``limit`` of them."""

    recovery_run_id: str
    limit: int = 100


class RecoveryBatchResult(BaseModel):
    """Counts by takeover for one batch (or a whole run), and by what its re-check of OutcomeUnknowns did."""

    scanned: int = 0
    requeued: int = 0
    stopped: int = 0
    exhausted: int = 0
    completed: int = 0
    outcome_unknown: int = 0
    not_delivered: int = 0
    matched_nothing: int = 0
    waiting_for_resume: int = 0  # left alone: their partner's deliveries are paused (no session opened)
    waiting_for_slot: int = 0  # left for the next run: every session slot of their partner was in use
    errors: int = 0
    rechecked: int = 0
    settled_completed: int = 0
    settled_not_delivered: int = 0
    listings_answered: int = 0  # reconcilers' listing requests answered (0033), the paused ones included

    @property
    def taken_over(self) -> int:
        return (
            self.requeued
            + self.stopped
            + self.exhausted
            + self.completed
            + self.outcome_unknown
            + self.not_delivered
        )

    def count(self, takeover: Takeover) -> None:
        field = {
            Takeover.REQUEUED: "requeued",
            Takeover.STOPPED: "stopped",
            Takeover.EXHAUSTED: "exhausted",
            Takeover.COMPLETED: "completed",
            Takeover.OUTCOME_UNKNOWN: "outcome_unknown",
            Takeover.NOT_DELIVERED: "not_delivered",
            Takeover.MATCHED_NOTHING: "matched_nothing",
            Takeover.WAITING_FOR_RESUME: "waiting_for_resume",
            Takeover.WAITING_FOR_SLOT: "waiting_for_slot",
            Takeover.ERROR: "errors",
        }[takeover]
        setattr(self, field, getattr(self, field) + 1)

    def count_recheck(self, recheck: Recheck) -> None:
        self.rechecked += 1
        if recheck == Recheck.COMPLETED:
            self.settled_completed += 1
        elif recheck == Recheck.NOT_DELIVERED:
            self.settled_not_delivered += 1
        elif recheck == Recheck.MATCHED_NOTHING:
            self.matched_nothing += 1
        elif recheck == Recheck.WAITING_FOR_RESUME:
            self.waiting_for_resume += 1
        elif recheck == Recheck.ERROR:
            self.errors += 1

    def add(self, other: RecoveryBatchResult) -> None:
        for name in RecoveryBatchResult.model_fields:
            setattr(self, name, getattr(self, name) + getattr(other, name))


# -- sweeper ------------------------------------------------------------------------------------------


class SweepInput(BaseModel):
    """One sweeper run: at most ``max_batches`` batches; ``None`` takes the worker's settings."""

    batch: int | None = None
    older_than_seconds: float | None = None
    max_batches: int = 20


class SweepBatchInput(BaseModel):
    batch: int | None = None
    older_than_seconds: float | None = None


class SweepBatchResult(BaseModel):
    swept: int
    batch: int


class SweepResult(SweepBatchResult):
    batches: int = 0


class RecurringFireInput(BaseModel):
    """A recurring export's Schedule action: which recurring export fires (IDs only). ``nominal_time`` is
    left out by the Schedule, whose firing's nominal time is its ``TemporalScheduledStartTime``; a test or
    an operator starting the workflow by hand gives it."""

    tenant_id: UUID
    recurring_export_id: UUID
    nominal_time: datetime | None = None


class RecurringFiringInput(BaseModel):
    """The firing activity's input: the recurring export, the nominal fire time, and the action's workflow."""

    tenant_id: UUID
    recurring_export_id: UUID
    nominal_time: datetime
    fired_by: str


class RecurringFireResult(BaseModel):
    """What the firing did: created (``job_id``), skipped (``reason``), duplicate (the nominal time was recorded
    before: its ``job_id`` or ``reason``), or missing (no such recurring export: nothing recorded)."""

    outcome: str
    nominal_time: datetime
    reason: str | None = None
    job_id: UUID | None = None


# -- a destination's connection test (issue #24.3) ---------------------------------------------------------


class ConnectionTestInput(BaseModel):
    """Test the connection of one destination of a tenant, as it is now (IDs only)."""

    tenant_id: UUID
    destination_id: UUID


class ConnectionTestResult(BaseModel):
    """What a connection test found: the destination's version tested and the partner's report, or why it
    was not tested (no such destination; every session slot in use: ``in_use`` of ``max_sessions``). Public
    keys, fingerprints, booleans and codes only."""

    found: bool
    destination_version: int | None = None
    report: ConnectionReport | None = None
    slots_busy: bool = False
    in_use: int | None = None
    max_sessions: int | None = None
    worker_id: str | None = None

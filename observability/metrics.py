"""The project's Prometheus metrics (prometheus-client), with a small typed API for the code that moves jobs.

Names follow Prometheus conventions: ``fenced_exports_`` prefix, ``_total`` on counters, base units
(``_seconds``, ``_bytes``). Every label is bounded: statement names and outcomes are the domain's
enumerations (``domain.models``), results and sources are fixed in this module, and a value outside them raises ``ValueError`` rather than minting a
series. Job, attempt and request IDs never become labels; tenant IDs only when the process was built
with ``tenant_labels=True`` (``EXPORTS_METRICS_TENANT_LABELS``), and then only on the transition,
cancellation and Busy counters.

One ``ExportMetrics`` per process: ``main()`` builds it from the settings and installs it with
``set_metrics``; code that records calls ``get_metrics()``. Tests build their own over a fresh
``CollectorRegistry``.

The Temporal SDK's own worker metrics (task slots, poll latencies, schedule-to-start, ...) come from its
Rust core, not from here: ``observability.temporal.temporal_runtime`` builds the ``Runtime`` that serves
them on their own port.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from uuid import UUID

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    Claim,
    ClaimResult,
    DeliveryOutcome,
    FailureCause,
    FenceResult,
    FinishResult,
    ReleaseCause,
    ReleaseResult,
    RetryResult,
    Statement,
    UploadFence,
)
from domain.recurring import FiringOutcome, SkipReason

PREFIX = "fenced_exports"


class TransitionResult(StrEnum):
    """What a transition statement did, the ``result`` label.

    ``written``: it changed the row (or a lost response is found to have). ``not_owner``: the attempt no
    longer owns the row (a takeover or another terminal write came first). ``refused``: a condition of
    the statement did not hold (not Queued any more, a stop recorded, the lease lapsed, the original
    Completed, a delivery switch paused, the destination inactive, a renewal beat recovery). ``unknown``: neither the write nor the re-read answered; the row
    will say later (an exception is not a "no").
    """

    WRITTEN = "written"
    NOT_OWNER = "not_owner"
    REFUSED = "refused"
    UNKNOWN = "unknown"


# The nine answers to a cancellation request (001), the ``outcome`` label: the domain's enumeration.
CancellationKind = CancellationOutcome


class CancellationSource(StrEnum):
    """Who asked: the HTTP API (and console), the command line, or a Temporal workflow cancel."""

    API = "api"
    CLI = "cli"
    TEMPORAL = "temporal"


class RenewalResult(StrEnum):
    """A lease renewal's answer: renewed (still owned), lost (a takeover or terminal write ended the
    attempt), error (the database did not answer; the keeper tries again next interval)."""

    RENEWED = "renewed"
    LOST = "lost"
    ERROR = "error"


class StopPath(StrEnum):
    """Who wrote Stopped: the attempt's own worker (finish_stopped) or recovery (stop_expired_attempt)."""

    WORKER = "worker"
    RECOVERY = "recovery"


_DELIVERY_OUTCOMES = tuple(outcome.value for outcome in DeliveryOutcome)
# Every answer of the transition methods, by the ``result`` label it is counted under (answers of
# different enumerations that share a value share their label: NotOwner, LeaseLapsed, Paused, Unknown).
_RESULTS: dict[str, TransitionResult] = {
    ClaimResult.CLAIMED: TransitionResult.WRITTEN,
    ClaimResult.LOST: TransitionResult.REFUSED,
    ClaimResult.PAUSED: TransitionResult.REFUSED,
    ClaimResult.NOT_YET: TransitionResult.REFUSED,
    ClaimResult.OUTSIDE_WINDOW: TransitionResult.REFUSED,
    ClaimResult.UNKNOWN: TransitionResult.UNKNOWN,
    AuthorizationResult.AUTHORIZED: TransitionResult.WRITTEN,
    AuthorizationResult.STOP_RECORDED: TransitionResult.REFUSED,
    AuthorizationResult.LEASE_LAPSED: TransitionResult.REFUSED,
    AuthorizationResult.NOT_OWNER: TransitionResult.NOT_OWNER,
    AuthorizationResult.ORIGINAL_COMPLETED: TransitionResult.REFUSED,
    AuthorizationResult.PAUSED: TransitionResult.REFUSED,
    AuthorizationResult.DESTINATION_INACTIVE: TransitionResult.REFUSED,
    AuthorizationResult.POLICY_DENIED: TransitionResult.REFUSED,
    AuthorizationResult.DESTINATION_CHANGED: TransitionResult.REFUSED,
    AuthorizationResult.WINDOW_CLOSED: TransitionResult.REFUSED,
    ReleaseResult.RELEASED: TransitionResult.WRITTEN,
    ReleaseResult.EXHAUSTED: TransitionResult.WRITTEN,
    RetryResult.RETRIED: TransitionResult.WRITTEN,  # Delivering -> Queued, to be tried again (#25.4)
    RetryResult.FAILED: TransitionResult.WRITTEN,  # Delivering -> Failed NotDelivered: no retry allowed
    AuthorizationResult.UNKNOWN: TransitionResult.UNKNOWN,
    FinishResult.WRITTEN: TransitionResult.WRITTEN,
    FinishResult.NOT_OWNER: TransitionResult.NOT_OWNER,
    FinishResult.UNKNOWN: TransitionResult.UNKNOWN,
    FenceResult.FENCED: TransitionResult.WRITTEN,
    FenceResult.LEASE_LAPSED: TransitionResult.REFUSED,
    FenceResult.NOT_OWNER: TransitionResult.NOT_OWNER,
    FenceResult.OUTSIDE_WINDOW: TransitionResult.REFUSED,
    FenceResult.UNKNOWN: TransitionResult.UNKNOWN,
}


def transition_result(answer: Any) -> TransitionResult:
    """Map a store answer to the ``result`` label.

    Accepts ``ClaimResult``, ``AuthorizationResult``, ``FinishResult``, ``FenceResult`` (or their string
    values), a bool (a conditional write that matched or not: recovery's takeovers, reject, cancel,
    request-stop, reconcile, correct), a ``Claim`` or an ``UploadFence`` (its result) and ``None`` (no answer). Anything else is a programming error.
    """
    if answer is None:
        return TransitionResult.UNKNOWN
    if isinstance(answer, (Claim, UploadFence)):
        answer = answer.result
    if isinstance(answer, bool):
        return TransitionResult.WRITTEN if answer else TransitionResult.REFUSED
    value = str(answer)
    result = _RESULTS.get(value)
    if result is None:
        raise ValueError(f"no transition result for {value!r}")
    return result


# Any statement of db/queries.sql may be timed; its name is a code identifier, never input.
_STATEMENT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LONG = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)
_ROWS = (100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8)
_BYTES = (1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11)
_THROUGHPUT = (1e5, 1e6, 5e6, 1e7, 5e7, 1e8, 2e8, 5e8, 1e9)
_STOP = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_LAG = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


@dataclass
class Stopwatch:
    """Elapsed wall time of a ``timer()`` block, in seconds (``perf_counter``)."""

    started: float
    seconds: float = 0.0


class ExportMetrics:
    """Every metric this project records, registered in ``registry`` (the process default unless given).

    Each method says where it is called; none of them does I/O or raises for a value it was given
    except a label outside its enumeration.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, tenant_labels: bool = False) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.tenant_labels = tenant_labels
        tenant = ("tenant",) if tenant_labels else ()
        r = self.registry
        self.transitions = Counter(
            f"{PREFIX}_transitions_total",
            "Transition statements of the state diagram by statement and result.",
            ("statement", "result", *tenant),
            registry=r,
        )
        self.cancellations = Counter(
            f"{PREFIX}_cancellations_total",
            "Answers to cancellation requests by outcome (the nine kinds) and who asked.",
            ("outcome", "source", *tenant),
            registry=r,
        )
        self.busy = Counter(
            f"{PREFIX}_busy_answers_total",
            "Requests answered Busy: the job row's lock was held longer than the lock timeout; nothing recorded.",
            ("operation", *tenant),
            registry=r,
        )
        self._statement_children: dict[str, Any] = {}
        self._transition_children: dict[tuple[Any, ...], Any] = {}
        self.statement_duration = Histogram(
            f"{PREFIX}_statement_duration_seconds",
            "Latency of one protocol statement (one round trip), by statement name.",
            ("statement",),
            buckets=_FAST,
            registry=r,
        )
        self.build_duration = Histogram(
            f"{PREFIX}_build_duration_seconds",
            "Duration of a build that produced its file.",
            buckets=_LONG,
            registry=r,
        )
        self.build_rows = Histogram(
            f"{PREFIX}_build_file_rows", "Contacts in a built file.", buckets=_ROWS, registry=r
        )
        self.build_bytes = Histogram(
            f"{PREFIX}_build_file_bytes", "Size of a built file.", buckets=_BYTES, registry=r
        )
        self.upload_duration = Histogram(
            f"{PREFIX}_upload_duration_seconds",
            "Duration of an upload to a partner, from session open to the classified outcome.",
            ("outcome",),
            buckets=_LONG,
            registry=r,
        )
        self.upload_throughput = Histogram(
            f"{PREFIX}_upload_throughput_bytes_per_second",
            "Bytes sent per second of a completed upload.",
            buckets=_THROUGHPUT,
            registry=r,
        )
        self.stop_latency = Histogram(
            f"{PREFIX}_stop_latency_seconds",
            "From a stop request recorded to the job written Stopped, by who wrote it.",
            ("path",),
            buckets=_STOP,
            registry=r,
        )
        self.renewal_duration = Histogram(
            f"{PREFIX}_lease_renewal_duration_seconds",
            "Latency of one lease renewal round trip.",
            buckets=_FAST,
            registry=r,
        )
        self.renewals = Counter(
            f"{PREFIX}_lease_renewals_total",
            "Lease renewals by result (renewed, lost, error).",
            ("result",),
            registry=r,
        )
        self.leases_held = Gauge(
            f"{PREFIX}_leases_held",
            "Attempts whose lease this process is renewing now.",
            registry=r,
        )
        self.outbox_lag = Histogram(
            f"{PREFIX}_outbox_publish_lag_seconds",
            "From an outbox row's creation to its workflow started (database clock at both ends).",
            buckets=_LAG,
            registry=r,
        )
        self.releases = Counter(
            f"{PREFIX}_releases_total",
            "Give-backs of a job to the queue before cutoff 2, by cause and ending (released, or exhausted: "
            "past the bound of give-backs for failures the job ended Failed).",
            ("cause", "ending"),
            registry=r,
        )
        self.delivery_retries = Counter(
            f"{PREFIX}_delivery_retries_total",
            "Deliveries that failed NotDelivered for a transient cause and went back to the queue to be tried "
            "again after a backoff (issue 25 item 4), by cause (connect_refused, session_cut, no_space).",
            ("cause",),
            registry=r,
        )
        self.recurring_firings = Counter(
            f"{PREFIX}_recurring_firings_total",
            "Firings of recurring exports by outcome (created, skipped, duplicate: a nominal time already "
            "recorded) and reason (a skip's: overlap, deliveries_paused, contract_ended, ...; '' otherwise).",
            ("outcome", "reason"),
            registry=r,
        )
        self.config = Gauge(
            f"{PREFIX}_config_seconds",
            "This process's intervals and timeouts, for alert thresholds that follow the configuration.",
            ("setting",),
            registry=r,
        )
        if not tenant_labels:
            # Every bounded series exists from the start at 0, so rate() and absence alerts see them.
            for statement in Statement:
                for result in TransitionResult:
                    self.transitions.labels(statement.value, result.value)
            for kind in CancellationKind:
                for source in CancellationSource:
                    self.cancellations.labels(kind.value, source.value)
            self.busy.labels("cancel")
        for renewal in RenewalResult:
            self.renewals.labels(renewal.value)
        for fired in (FiringOutcome.CREATED, FiringOutcome.DUPLICATE):
            self.recurring_firings.labels(fired.value, "")
        for reason in SkipReason:
            self.recurring_firings.labels(FiringOutcome.SKIPPED.value, reason.value)
        for cause in ReleaseCause:
            for ending in (ReleaseResult.RELEASED, ReleaseResult.EXHAUSTED):
                self.releases.labels(cause.value, ending.value)
        for outcome in _DELIVERY_OUTCOMES:
            self.upload_duration.labels(outcome)
        for statement in Statement:
            self.statement_duration.labels(statement.value)
        for path in StopPath:
            self.stop_latency.labels(path.value)

    def unregister(self) -> None:
        """Remove every metric of this object from its registry (a process replacing its metrics)."""
        for value in list(vars(self).values()):
            if isinstance(value, Counter | Gauge | Histogram):
                self.registry.unregister(value)

    # -- helpers ----------------------------------------------------------------------------------------

    def _tenant(self, tenant_id: UUID | str | None) -> tuple[str, ...]:
        if not self.tenant_labels:
            return ()
        return (str(tenant_id) if tenant_id is not None else "",)

    @staticmethod
    @contextlib.contextmanager
    def timer() -> Iterator[Stopwatch]:
        """Measure a block: ``with metrics.timer() as t: ...`` then ``t.seconds``."""
        watch = Stopwatch(started=time.perf_counter())
        try:
            yield watch
        finally:
            watch.seconds = time.perf_counter() - watch.started

    # -- the row protocol -------------------------------------------------------------------------------

    def observe_transition(
        self,
        statement: Statement | str,
        result: TransitionResult | str,
        *,
        tenant_id: UUID | str | None = None,
    ) -> None:
        """Count one transition statement's answer.

        Called by a store (``db/stores/``) once per call of a transition method (claim_if_queued, cutoff 2, the
        terminal writes, recovery's takeovers, reconcile, correct, reject, and inside the cancellation
        transaction's cancel_and_record when it changed the job), after the lost-response re-read has
        decided; ``transition_result()`` maps the store's answer.
        """
        tenant = self._tenant(tenant_id)
        key = (statement, result, *tenant)
        child = self._transition_children.get(key)
        if child is None:  # checked and looked up once per statement and result (and tenant, if labelled)
            labels = (Statement(statement).value, TransitionResult(result).value, *tenant)
            child = self._transition_children[key] = self.transitions.labels(*labels)
        child.inc()

    def observe_statement_duration(self, statement: str, seconds: float) -> None:
        """Record one statement round trip; called by the stores' ``StoreBase`` for every named statement."""
        child = self._statement_children.get(statement)
        if child is None:  # checked and looked up once per name: this runs around every statement
            if not _STATEMENT_NAME.match(statement):
                raise ValueError(f"{statement!r} is not a statement name")
            child = self._statement_children[statement] = self.statement_duration.labels(statement)
        child.observe(seconds)

    @contextlib.contextmanager
    def time_statement(self, statement: str) -> Iterator[None]:
        """``with metrics.time_statement("claim_if_queued"): ...``: the block's duration, even if it raises."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe_statement_duration(statement, time.perf_counter() - started)

    # -- cancellation -----------------------------------------------------------------------------------

    def observe_cancellation(
        self,
        outcome: CancellationKind | str,
        *,
        source: CancellationSource | str = CancellationSource.API,
        tenant_id: UUID | str | None = None,
    ) -> None:
        """Count one answer to a cancellation request (all nine kinds, replays included).

        Called where the answer leaves the system: the API route (``source="api"``), ``starter.py
        cancel`` (``"cli"``) and the ``record_temporal_cancel`` activity (``"temporal"``). A Busy answer
        also counts in ``fenced_exports_busy_answers_total{operation="cancel"}``.
        """
        kind = CancellationKind(outcome)
        tenant = self._tenant(tenant_id)
        self.cancellations.labels(kind.value, CancellationSource(source).value, *tenant).inc()
        if kind == CancellationKind.BUSY:
            self.busy.labels("cancel", *tenant).inc()

    # -- the build and the upload -----------------------------------------------------------------------

    def count_firing(self, outcome: FiringOutcome | str, reason: SkipReason | str | None = None) -> None:
        """One firing of a recurring export: what it did, and a skip's reason (both bounded enumerations)."""
        self.recurring_firings.labels(
            FiringOutcome(outcome).value, SkipReason(reason).value if reason else ""
        ).inc()

    def count_release(self, cause: ReleaseCause | str, ending: ReleaseResult | str) -> None:
        """A give-back that was written (called by the worker's store): its cause and whether it ended the
        job (exhausted) or put it back in the queue (released)."""
        self.releases.labels(ReleaseCause(cause).value, ReleaseResult(ending).value).inc()

    def count_delivery_retry(self, cause: str) -> None:
        """A transient NotDelivered that went back to the queue to be tried again (called by the worker's
        store once the statement wrote it): its cause, one of rules.retries' transient causes."""
        self.delivery_retries.labels(FailureCause(cause).value).inc()

    def observe_build(self, seconds: float, rows: int, size_bytes: int) -> None:
        """A build that produced its file; called by the build activity after the file is closed and
        hashed, before cutoff 2."""
        self.build_duration.observe(seconds)
        self.build_rows.observe(rows)
        self.build_bytes.observe(size_bytes)

    def observe_upload(self, seconds: float, size_bytes: int, outcome: str) -> None:
        """One delivery, classified; called by the deliver activity when ``partner.deliver`` returns.

        ``outcome`` is the delivery outcome (Completed / Failed / OutcomeUnknown); the throughput is
        recorded for Completed uploads only, where every byte was sent.
        """
        if outcome not in _DELIVERY_OUTCOMES:
            raise ValueError(f"{outcome!r} is not a delivery outcome")
        self.upload_duration.labels(outcome).observe(seconds)
        if outcome == DeliveryOutcome.COMPLETED and seconds > 0:
            self.upload_throughput.observe(size_bytes / seconds)

    # -- stops, leases, the outbox ----------------------------------------------------------------------

    def observe_stop_latency(self, seconds: float, *, path: StopPath | str = StopPath.WORKER) -> None:
        """From the stop request's ``recorded_at`` to the Stopped write, both on the database clock.

        Called after ``finish_stopped`` (path ``worker``) or ``stop_expired_attempt`` (``recovery``)
        wrote; the statement can return the difference (see the report for the RETURNING column).
        """
        self.stop_latency.labels(StopPath(path).value).observe(max(0.0, seconds))

    def observe_lease_renewal(self, seconds: float, result: RenewalResult | str) -> None:
        """One renewal round trip; called by ``LeaseKeeper._renew_once`` after each ``renew_lease``."""
        self.renewals.labels(RenewalResult(result).value).inc()
        self.renewal_duration.observe(seconds)

    @contextlib.contextmanager
    def holding_lease(self) -> Iterator[None]:
        """Around the life of one ``LeaseKeeper`` (from its start to its finish): the leases this process
        is responsible for renewing. The "worker without renewals" alert compares it with renewals."""
        self.leases_held.inc()
        try:
            yield
        finally:
            self.leases_held.dec()

    def observe_outbox_lag(self, seconds: float) -> None:
        """One wake-up published; called by the dispatcher after the workflow start was accepted (or
        found already started), with ``mark_published``'s ``clock_timestamp() - created_at``."""
        self.outbox_lag.observe(max(0.0, seconds))

    def describe_settings(self, **seconds: float) -> None:
        """Publish intervals the alerts compare with, e.g. ``recovery_every_seconds=30``; called once at
        start by worker.py with the settings' values."""
        for name, value in seconds.items():
            if not _STATEMENT_NAME.match(name):
                raise ValueError(f"{name!r} is not a setting name")
            self.config.labels(name).set(value)


_current: ExportMetrics | None = None


def get_metrics() -> ExportMetrics:
    """The process's metrics; built on the default registry without tenant labels on first use."""
    global _current
    if _current is None:
        _current = ExportMetrics()
    return _current


def set_metrics(metrics: ExportMetrics) -> ExportMetrics:
    """Install ``metrics`` as the process's (in ``main()``, before anything records); returns it."""
    global _current
    _current = metrics
    return metrics


def process_metrics(*, tenant_labels: bool = False) -> ExportMetrics:
    """The process's metrics on the default registry, with or without tenant labels: the installed ones
    when they already match, else new ones replacing them (``configure_process`` calls it)."""
    current = _current
    if current is not None and current.registry is REGISTRY:
        if current.tenant_labels == tenant_labels:
            return current
        current.unregister()
    return set_metrics(ExportMetrics(tenant_labels=tenant_labels))

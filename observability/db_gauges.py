"""Gauges read from PostgreSQL at scrape time: a prometheus-client collector running one bounded query.

What it reports (all on the database clock, ages 0 when nothing waits):

- ``fenced_exports_jobs{status}``: jobs Queued, Running, Delivering and OutcomeUnknown (awaiting
  reconciliation). Terminal statuses are not counted here: their rows are the whole history, and an
  exact count of a million rows costs ~75 ms on this machine; ``fenced_exports_transitions_total``
  counts how jobs end.
- ``fenced_exports_queued_job_oldest_age_seconds`` (by ``created_at``) and
  ``fenced_exports_queued_wake_up_oldest_age_seconds`` (by ``woken_at``: what the sweeper acts on);
  ``fenced_exports_queued_job_sweep_count_max``: the highest ``sweep_count`` among Queued jobs.
- ``fenced_exports_outbox_unpublished_messages`` and ``fenced_exports_outbox_unpublished_oldest_age_seconds``.
- ``fenced_exports_expired_leases{status}`` (Running / Delivering rows whose lease has expired) and
  ``fenced_exports_expired_lease_oldest_age_seconds{status}``: how long ago the oldest one expired.
- ``fenced_exports_outcome_unknown_oldest_age_seconds``: since the oldest OutcomeUnknown was recorded.
- ``fenced_exports_deliveries_waiting_for_resume``: expired Delivering jobs recovery leaves alone while
  their partner is paused (23.5); ``fenced_exports_expired_leases{status="Delivering"}`` leaves them out.
- ``fenced_exports_jobs_released_repeatedly``: jobs in flight given back for failures at least
  ``db.gauges.RELEASED_OFTEN`` times (issue 23.1; the alert on a job released again and again).
- ``fenced_exports_db_gauges_up`` (1 when the last query answered) and
  ``fenced_exports_db_gauges_query_duration_seconds``.

Cost: the query (``read_database_gauges`` in ``db/support.sql``, run by ``db.gauges.GaugesReader``) reads
only partial indexes whose size is the work in flight (migration 0004), each count stops at ``count_cap`` rows, and the OutcomeUnknown wait looks at ``unknown_probe`` jobs at most;
the result is cached for ``cache_seconds`` so any number of scrapes make one query per interval; a
``statement_timeout`` bounds the rest. It connects as the worker's login and acts as ``exports_worker``
(it may read export_jobs and export_attempt_events, and of the outbox only ``created_at``,
``published_at`` (granted in 0004) and ``available_at`` (0016)).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from db.errors import StoreError
from db.gauges import GaugesReader, GaugeValues
from domain.models import JobStatus

log = logging.getLogger(__name__)

LIVE_STATUSES: tuple[str, ...] = tuple(
    s.value for s in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DELIVERING, JobStatus.OUTCOME_UNKNOWN)
)
LEASED_STATUSES: tuple[str, ...] = (JobStatus.RUNNING.value, JobStatus.DELIVERING.value)

__all__ = ["LIVE_STATUSES", "DatabaseGauges", "GaugeValues"]


class DatabaseGauges(Collector):
    """Register with ``registry.register(DatabaseGauges(url))`` in the worker (one per process).

    ``url`` is the worker's database URL (a login that may ``SET ROLE exports_worker``). Nothing
    connects until the first scrape; a database that does not answer gives ``fenced_exports_db_gauges_up
    0`` and no values (never stale ones), and is asked again after ``cache_seconds``. Safe to call from
    the metrics server's threads.
    """

    def __init__(
        self,
        url: str,
        *,
        role: str = "exports_worker",
        cache_seconds: float = 5.0,
        count_cap: int = 100_000,
        unknown_probe: int = 100,
        statement_timeout_ms: int = 2_000,
        connect_timeout_seconds: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.cache_seconds = cache_seconds
        self.reader = GaugesReader(
            url,
            role=role,
            count_cap=count_cap,
            unknown_probe=unknown_probe,
            statement_timeout_ms=statement_timeout_ms,
            connect_timeout_seconds=connect_timeout_seconds,
        )
        self.clock = clock
        self.queries = 0  # how many times the database was asked (tests check the cache with it)
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._values: GaugeValues | None = None
        self._duration = 0.0

    # -- reading --------------------------------------------------------------------------------------

    def read(self) -> GaugeValues | None:
        """The values, from the cache when younger than ``cache_seconds``; ``None`` when the database
        did not answer."""
        with self._lock:
            if self.clock() - self._read_at < self.cache_seconds:
                return self._values
            started = time.perf_counter()
            try:
                self.queries += 1
                self._values = self.reader.read()
            except StoreError as exc:
                log.warning("database gauges: no answer (%s)", type(exc).__name__)
                self._values = None
            self._duration = time.perf_counter() - started
            self._read_at = self.clock()
            return self._values

    def __enter__(self) -> DatabaseGauges:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (at shutdown; a later scrape would open a new one)."""
        self.reader.close()

    # -- the collector protocol -------------------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        """The families without values, so registering does not query the database."""
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.read(), scraped=True))

    def _families(self, v: GaugeValues | None, scraped: bool = False) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "fenced_exports_db_gauges_up", "1 when the database answered the gauges query, else 0."
        )
        if scraped:
            up.add_metric([], 1.0 if v is not None else 0.0)
        yield up
        duration = GaugeMetricFamily(
            "fenced_exports_db_gauges_query_duration_seconds", "How long the last gauges query took."
        )
        if scraped:
            duration.add_metric([], self._duration)
        yield duration

        jobs = GaugeMetricFamily(
            "fenced_exports_jobs",
            "Jobs in a non-terminal status (OutcomeUnknown: awaiting reconciliation).",
            labels=["status"],
        )
        expired = GaugeMetricFamily(
            "fenced_exports_expired_leases",
            "Running or Delivering jobs whose lease has expired (recovery has not taken them over yet).",
            labels=["status"],
        )
        expired_age = GaugeMetricFamily(
            "fenced_exports_expired_lease_oldest_age_seconds",
            "How long ago the oldest expired lease expired, by status.",
            labels=["status"],
        )
        scalars = {
            "queued_oldest_age": GaugeMetricFamily(
                "fenced_exports_queued_job_oldest_age_seconds", "Age of the oldest Queued job (created_at)."
            ),
            "queued_oldest_wake_up_age": GaugeMetricFamily(
                "fenced_exports_queued_wake_up_oldest_age_seconds",
                "Age of the oldest last wake-up among Queued jobs (woken_at; the sweeper re-wakes old ones).",
            ),
            "queued_max_sweep_count": GaugeMetricFamily(
                "fenced_exports_queued_job_sweep_count_max",
                "The highest sweep_count among Queued jobs (times the sweeper re-woke one job).",
            ),
            "outbox_unpublished": GaugeMetricFamily(
                "fenced_exports_outbox_unpublished_messages", "Outbox rows not yet published."
            ),
            "outbox_oldest_age": GaugeMetricFamily(
                "fenced_exports_outbox_unpublished_oldest_age_seconds",
                "Age of the oldest unpublished outbox row.",
            ),
            "outcome_unknown_oldest_age": GaugeMetricFamily(
                "fenced_exports_outcome_unknown_oldest_age_seconds",
                "How long the oldest OutcomeUnknown job has waited for reconciliation.",
            ),
            "delivering_waiting_for_resume": GaugeMetricFamily(
                "fenced_exports_deliveries_waiting_for_resume",
                "Delivering jobs with an expired lease that only their partner can settle, left by recovery "
                "while that partner's deliveries are paused (not counted as expired leases).",
            ),
            "released_repeatedly": GaugeMetricFamily(
                "fenced_exports_jobs_released_repeatedly",
                "Queued or Running jobs given back to the queue for failures 3 times or more "
                "(each give-back waits longer; past the bound the job ends Failed).",
            ),
        }
        if v is not None:
            for status, count in zip(
                LIVE_STATUSES, (v.queued, v.running, v.delivering, v.outcome_unknown), strict=True
            ):
                jobs.add_metric([status], float(count))
            running, delivering = LEASED_STATUSES
            expired.add_metric([running], float(v.running_expired))
            expired.add_metric([delivering], float(v.delivering_expired))
            expired_age.add_metric([running], v.running_expired_oldest_age)
            expired_age.add_metric([delivering], v.delivering_expired_oldest_age)
            for attr, family in scalars.items():
                family.add_metric([], float(getattr(v, attr)))
        yield jobs
        yield expired
        yield expired_age
        yield from scalars.values()

"""The database gauges, scraped through prometheus-client from a real database, equal what the rows say.

Jobs are put in their states by the protocol's own statements (tests/support/factories.py); only ages
are set on the rows as the superuser, since the database clock decides them. The expected values are
read with plain aggregate queries that share nothing with observability/gauges.sql.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from db.embedded import free_port
from domain.models import JobStatus
from observability.db_gauges import DatabaseGauges
from testbed.pg import with_database


def scrape(collector: DatabaseGauges) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The collector's exposition as a real scrape would read it: {(name, labels): value}."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def g(values, name: str, **labels: str) -> float:
    return values[(name, tuple(sorted(labels.items())))]


async def expected(factory) -> dict[str, float]:
    """The same numbers, the obvious way (whole-table aggregates as the superuser)."""
    rows = await factory.admin(
        """
        SELECT
          count(*) FILTER (WHERE status = 'Queued') AS queued,
          count(*) FILTER (WHERE status = 'Running') AS running,
          count(*) FILTER (WHERE status = 'Delivering') AS delivering,
          count(*) FILTER (WHERE status = 'OutcomeUnknown') AS outcome_unknown,
          count(*) FILTER (WHERE status = 'Running' AND lease_expires_at < now()) AS running_expired,
          count(*) FILTER (WHERE status = 'Delivering' AND lease_expires_at < now()) AS delivering_expired,
          coalesce(extract(epoch FROM now() - min(lease_expires_at) FILTER (
              WHERE status = 'Running' AND lease_expires_at < now())), 0)::float8 AS running_expired_age,
          coalesce(extract(epoch FROM now() - min(lease_expires_at) FILTER (
              WHERE status = 'Delivering' AND lease_expires_at < now())), 0)::float8 AS delivering_expired_age,
          coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'Queued')), 0)::float8
              AS queued_age,
          coalesce(extract(epoch FROM now() - min(woken_at) FILTER (WHERE status = 'Queued')), 0)::float8
              AS queued_wake_age,
          coalesce(max(sweep_count) FILTER (WHERE status = 'Queued'), 0) AS max_sweeps,
          (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unpublished,
          (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
             FROM outbox WHERE published_at IS NULL) AS outbox_age,
          (SELECT coalesce(extract(epoch FROM now() - min(e.recorded_at)), 0)::float8
             FROM export_jobs j JOIN export_attempt_events e ON e.job_id = j.id AND e.attempt_id = j.attempt_id
             WHERE j.status = 'OutcomeUnknown' AND e.kind IN ('Finished', 'ResolvedByRecovery')) AS unknown_age
        FROM export_jobs
        """
    )
    return rows[0]


async def test_gauges_equal_the_rows(database, factory, worker_store):
    # Queued: one created an hour ago, one the sweeper has re-woken twice.
    old_queued = await factory.queued()
    await factory.admin(
        "UPDATE export_jobs SET created_at = clock_timestamp() - interval '1 hour' WHERE id = %(id)s",
        {"id": old_queued.id},
    )
    swept = await factory.queued()
    for _ in range(2):
        await factory.age_wake_up(swept.id, minutes=60)
        assert swept.id in await worker_store.sweep_stale_queued(older_than_seconds=1800)
    # Running and Delivering, some with expired leases.
    await factory.running()
    expired_running, _ = await factory.running()
    await factory.expire_lease(expired_running.id, seconds_ago=300)
    expired_delivering, _ = await factory.delivering()
    await factory.expire_lease(expired_delivering.id, seconds_ago=120)
    # OutcomeUnknown, recorded two hours ago; and one of every terminal status.
    unknown, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    await factory.admin(
        "UPDATE export_attempt_events SET recorded_at = clock_timestamp() - interval '2 hours'"
        " WHERE job_id = %(id)s AND attempt_id = %(a)s AND kind = 'Finished'",
        {"id": unknown.id, "a": attempt},
    )
    for status in (
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.CANCELED,
        JobStatus.STOPPED,
        JobStatus.REJECTED,
    ):
        await factory.in_status(status)
    # Every wake-up published except the old Queued job's, which waits ten minutes.
    await factory.admin(
        "UPDATE outbox SET published_at = clock_timestamp() WHERE job_id <> %(id)s", {"id": old_queued.id}
    )
    await factory.admin(
        "UPDATE outbox SET created_at = clock_timestamp() - interval '10 minutes' WHERE job_id = %(id)s",
        {"id": old_queued.id},
    )

    # The collector acts as exports_worker through the application login, as in production.
    with DatabaseGauges(database.app_url, cache_seconds=0) as collector:
        values = scrape(collector)
    want = await expected(factory)

    assert g(values, "fenced_exports_db_gauges_up") == 1
    assert g(values, "fenced_exports_jobs", status="Queued") == want["queued"] == 2
    assert g(values, "fenced_exports_jobs", status="Running") == want["running"] == 2
    assert g(values, "fenced_exports_jobs", status="Delivering") == want["delivering"]
    assert g(values, "fenced_exports_jobs", status="OutcomeUnknown") == want["outcome_unknown"] == 1
    assert g(values, "fenced_exports_expired_leases", status="Running") == want["running_expired"] == 1
    assert g(values, "fenced_exports_expired_leases", status="Delivering") == want["delivering_expired"] == 1
    assert g(values, "fenced_exports_queued_job_sweep_count_max") == want["max_sweeps"] == 2
    assert g(values, "fenced_exports_outbox_unpublished_messages") == want["unpublished"] == 1
    ages = {
        ("fenced_exports_expired_lease_oldest_age_seconds", "Running"): want["running_expired_age"],
        ("fenced_exports_expired_lease_oldest_age_seconds", "Delivering"): want["delivering_expired_age"],
        ("fenced_exports_queued_job_oldest_age_seconds", None): want["queued_age"],
        ("fenced_exports_queued_wake_up_oldest_age_seconds", None): want["queued_wake_age"],
        ("fenced_exports_outbox_unpublished_oldest_age_seconds", None): want["outbox_age"],
        ("fenced_exports_outcome_unknown_oldest_age_seconds", None): want["unknown_age"],
    }
    for (name, status), age in ages.items():
        got = g(values, name, status=status) if status else g(values, name)
        assert got == pytest.approx(age, abs=3), name
    assert g(values, "fenced_exports_outcome_unknown_oldest_age_seconds") == pytest.approx(7200, abs=10)
    assert g(values, "fenced_exports_queued_job_oldest_age_seconds") == pytest.approx(3600, abs=10)
    assert g(values, "fenced_exports_outbox_unpublished_oldest_age_seconds") == pytest.approx(600, abs=10)
    assert g(values, "fenced_exports_expired_lease_oldest_age_seconds", status="Running") == pytest.approx(
        300, abs=10
    )


async def test_one_query_per_cache_interval_whatever_the_scrapes(database, factory):
    now = [1000.0]
    with DatabaseGauges(database.app_url, cache_seconds=5, clock=lambda: now[0]) as collector:
        before = g(scrape(collector), "fenced_exports_jobs", status="Queued")
        await factory.queued()
        for _ in range(3):
            assert g(scrape(collector), "fenced_exports_jobs", status="Queued") == before  # cached
        assert collector.queries == 1
        now[0] += 5
        assert g(scrape(collector), "fenced_exports_jobs", status="Queued") == before + 1
        assert collector.queries == 2


def test_a_database_that_does_not_answer_gives_up_0_and_no_values():
    collector = DatabaseGauges(f"postgresql://exports_app@127.0.0.1:{free_port()}/nowhere", cache_seconds=0)
    values = scrape(collector)
    assert g(values, "fenced_exports_db_gauges_up") == 0
    assert not [key for key in values if key[0] == "fenced_exports_jobs"]


def test_a_role_without_the_grants_gets_no_values(database):
    # exports_api may not read the outbox: the query is refused, nothing stale or partial is shown.
    with DatabaseGauges(database.app_url, role="exports_api", cache_seconds=0) as collector:
        values = scrape(collector)
    assert g(values, "fenced_exports_db_gauges_up") == 0
    assert not [key for key in values if key[0].startswith("fenced_exports_outbox")]


def test_registering_the_collector_does_not_query(database):
    collector = DatabaseGauges(with_database(database.admin_url, "no_such_database"), cache_seconds=0)
    CollectorRegistry().register(collector)
    assert collector.queries == 0

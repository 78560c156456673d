"""The scrape of a worker's ``/metrics`` with a million jobs in ``export_jobs`` (``python -m bench.obs scrape``;
see the package's docstring): the load, the plan of the gauges query, and the timed scrapes."""

from __future__ import annotations

import os
import statistics
import time

import httpx
import psycopg
from prometheus_client import CollectorRegistry
from psycopg import sql

from db.gauges import RELEASED_OFTEN
from db.queries import q
from observability.db_gauges import DatabaseGauges
from observability.health import MetricsServer
from observability.metrics import ExportMetrics
from testbed.pg import clone_database, make_template, postgres_server

ROWS = 1_000_000
SCRAPE_ROUNDS = 3
SCRAPE_TARGET_MS = 50.0
TENANT = "00000000-0000-0000-0000-0000000000b1"
DESTINATION = "00000000-0000-0000-0000-0000000000d1"

# A production-like history of ``rows`` jobs (see the module docstring); test_gauges_plan.py loads a few
# thousand of the same mix.
LOAD = [
    "SET session_replication_role = replica",
    "INSERT INTO tenants (id, name) VALUES (%(tenant)s, 'bench')",
    "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref, remote_dir)"
    " VALUES (%(destination)s, %(tenant)s, 'p', '127.0.0.1', 22, 'u', 'ssh-ed25519 AAAA', '/k', '/up')",
    "INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)"
    " SELECT %(tenant)s, 'k' || g, md5('job' || g)::uuid FROM generate_series(1, %(rows)s) g",
    """
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count, claimed_by,
        lease_expires_at, woken_at, failure_reason, delivery_key, created_by, list_name, sweep_count, created_at,
        delivery_authorized_at, rejection_code, rejection_reason, outcome_unknown_at)
    SELECT md5('job' || g)::uuid, %(tenant)s, s.status, 1, %(destination)s,
        CASE WHEN s.status NOT IN ('Queued', 'Canceled', 'Rejected') THEN md5('att' || g)::uuid END,
        CASE WHEN s.status NOT IN ('Queued', 'Canceled', 'Rejected') THEN 1 ELSE 0 END,
        CASE WHEN s.status NOT IN ('Queued', 'Canceled', 'Rejected') THEN 'w' END,
        CASE WHEN s.status IN ('Running', 'Delivering')
             THEN now() + CASE WHEN mod(g / 1000, 10) = 0 THEN interval '-5 min' ELSE interval '1 hour' END END,
        now() - (mod(g, 100)) * interval '1 min',
        CASE WHEN s.status = 'Failed' THEN 'NotDelivered' END, 'k' || g, 'bench', 'main', mod(g, 4),
        now() - (%(rows)s - g) * interval '1 s',
        CASE WHEN s.status IN ('Delivering', 'Completed', 'OutcomeUnknown', 'Failed')
             THEN now() - (%(rows)s - g) * interval '1 s' END,
        CASE WHEN s.status = 'Rejected' THEN 'contract_ended' END,
        CASE WHEN s.status = 'Rejected' THEN 'the partner contract ended' END,
        -- when it became OutcomeUnknown (0033 requires it): its Finished event's time, below
        CASE WHEN s.status = 'OutcomeUnknown' THEN now() - (%(rows)s - g) * interval '1 s' + interval '1 min' END
    FROM generate_series(1, %(rows)s) g
    CROSS JOIN LATERAL (SELECT CASE
        WHEN mod(g, 1000) < 5 THEN 'Queued' WHEN mod(g, 1000) < 7 THEN 'Running' WHEN mod(g, 1000) < 8 THEN 'Delivering'
        WHEN mod(g, 10000) = 9 THEN 'OutcomeUnknown' WHEN mod(g, 1000) < 20 THEN 'Failed'
        WHEN mod(g, 1000) < 25 THEN 'Canceled' WHEN mod(g, 1000) < 28 THEN 'Stopped' WHEN mod(g, 1000) < 30 THEN 'Rejected'
        ELSE 'Completed' END AS status) s
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, version, worker_id, recorded_at)
    SELECT id, attempt_id, 'Claimed', 1, 'w', created_at FROM export_jobs WHERE attempt_id IS NOT NULL
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id, 'Finished', 'w', 'OutcomeUnknown', delivery_authorized_at + interval '1 min'
    FROM export_jobs WHERE status = 'OutcomeUnknown'
    """,
    "INSERT INTO outbox (message_id, kind, job_id, created_at, published_at)"
    " SELECT md5('msg' || g)::uuid, 'ExportReady', md5('job' || g)::uuid, now() - (%(rows)s - g) * interval '1 s',"
    "  CASE WHEN mod(g, 1000) <> 0 THEN now() - (%(rows)s - g) * interval '1 s' END"
    " FROM generate_series(1, %(rows)s) g",
    "SET session_replication_role = origin",
]


def load(admin_url: str, rows: int = ROWS) -> float:
    """Load ``rows`` jobs of the mix above (as the superuser), then VACUUM ANALYZE; returns the seconds."""
    started = time.perf_counter()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for statement in LOAD:
            conn.execute(statement, {"rows": rows, "tenant": TENANT, "destination": DESTINATION})
        for table in ("export_jobs", "outbox", "deliveries", "export_attempt_events"):
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
        assert conn.execute("SELECT count(*) FROM export_jobs").fetchone() == (rows,)
    return time.perf_counter() - started


def explain(app_url: str, *, analyze: bool = True) -> str:
    """The plan of the gauges query (``read_database_gauges``) as ``exports_worker``, with its parameters."""
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "
    with psycopg.connect(app_url, autocommit=True) as conn:
        conn.execute("SET ROLE exports_worker")
        rows = conn.execute(
            prefix + q("read_database_gauges"),  # noqa: S608 - a named statement of db/support.sql
            {"cap": 100_000, "unknown_probe": 100, "released_often": RELEASED_OFTEN},
        ).fetchall()
    return "\n".join(r[0] for r in rows)


async def scrape() -> dict[str, float]:
    """Load a million jobs, then time uncached scrapes of /metrics over HTTP; print the plan."""
    with postgres_server() as server_url:
        database = clone_database(server_url, make_template(server_url))
        seconds = load(database.admin_url)
        print(f"loaded {ROWS:,} jobs, {ROWS:,} outbox rows in {seconds:.1f} s")

        registry = CollectorRegistry()
        ExportMetrics(registry)
        gauges = DatabaseGauges(database.app_url, cache_seconds=0)  # every scrape queries
        registry.register(gauges)
        server = MetricsServer(None, port=0, registry=registry)
        url = await server.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                (await http.get("/metrics")).raise_for_status()  # connect, plan cache
                rounds = []
                for _ in range(SCRAPE_ROUNDS):
                    times = []
                    for _ in range(21):
                        started = time.perf_counter()
                        response = await http.get("/metrics")
                        times.append((time.perf_counter() - started) * 1000)
                        response.raise_for_status()
                    rounds.append(times)
                body = response.text
        finally:
            await server.stop()
            gauges.close()
        explained = explain(database.app_url)

    for expected in (
        'fenced_exports_jobs{status="Queued"} 5000.0',
        'fenced_exports_jobs{status="OutcomeUnknown"} 100.0',
        'fenced_exports_expired_leases{status="Running"} 200.0',
        "fenced_exports_outbox_unpublished_messages 1000.0",
    ):
        if expected not in body:
            raise SystemExit(f"the scrape does not say {expected!r}")
    print(explained)
    for times in rounds:
        print(
            f"/metrics over HTTP, {len(times)} uncached scrapes: median {statistics.median(times):.1f} ms, "
            f"p90 {sorted(times)[int(len(times) * 0.9)]:.1f} ms, max {max(times):.1f} ms"
        )
    best = min(statistics.median(times) for times in rounds)
    print(
        f"query alone {gauges._duration * 1000:.1f} ms (last); best round's median {best:.1f} ms "
        f"(target < {SCRAPE_TARGET_MS:g} ms); sequential scans: {'Seq Scan' in explained}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return {"scrape_median_ms": best, "seq_scan": float("Seq Scan" in explained)}

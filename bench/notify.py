"""What outcome notifications cost per write (issue 26): the terminal write with the event trigger on against
the same write with it disabled, side by side in one run, and the dispatcher's statements per event.

Hot path: alternating rounds of ``--jobs`` exports, each taken through its worker's statements (claim, cutoff
2, both fences, ``finish_delivery``) over one pool, on one embedded server; every other round the trigger
``tr_export_jobs_notify_outcome`` is disabled (as the owner). Reported: the median milliseconds per export and
per ``finish_delivery`` alone, on and off, and the per-round ratio's median with its 95 % bootstrap interval.

Off the hot path: the fan-out of a round's events to one endpoint each (one statement per 50), the lease of
their deliveries and the recording of their answers (one statement per 50 each), in microseconds per event.

    python -m bench.notify [--jobs 300] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import psycopg

from bench.obs.measures import median_interval
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.notifications import NotificationStore
from db.stores.protocol import WorkerStore
from domain.models import (
    AuthorizationResult,
    ClaimResult,
    DeliveryOutcome,
    FenceResult,
    FinishResult,
    final_name_for,
)
from domain.notifications import AttemptRecord
from rules.webhooks import new_secret
from testbed.pg import clone_database, make_template, postgres_server

ENABLE = "ALTER TABLE export_jobs ENABLE TRIGGER tr_export_jobs_notify_outcome"
DISABLE = "ALTER TABLE export_jobs DISABLE TRIGGER tr_export_jobs_notify_outcome"


def admin(url: str, statement: Any, params: dict[str, Any] | None = None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement, params or {})


async def main(jobs: int, rounds: int) -> dict[str, float]:
    """Run both measurements; print and return the figures."""
    with postgres_server() as server_url:
        database = clone_database(server_url, make_template(server_url))
        tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
        admin(database.admin_url, "INSERT INTO tenants (id, name) VALUES (%(t)s, 'bench')", {"t": tenant_id})
        admin(
            database.admin_url,
            "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
            " remote_dir) VALUES (%(d)s, %(t)s, 'bench', '127.0.0.1', 22, 'p', 'k', '/k', '/')",
            {"t": tenant_id, "d": destination_id},
        )
        seed = {"t": tenant_id, "d": destination_id, "s": new_secret()}
        for statement in (
            "INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
            " VALUES ('tenant', %(t)s, NULL, true, 'b', 'b'), ('destination', %(t)s, %(d)s, true, 'b', 'b')",
            "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, 'bench', 'operator')",
            "INSERT INTO contacts (tenant_id, list_name, email) VALUES (%(t)s, 'main', 'x@bench.example')",
            "INSERT INTO webhook_endpoints (tenant_id, url, secret, events, created_by)"
            " VALUES (%(t)s, 'https://hooks.example/bench', %(s)s, ARRAY['export.completed'], 'bench')",
        ):
            admin(database.admin_url, statement, seed)
        worker_pool = await open_pool(database.app_url, "exports_worker", max_size=2)
        api_pool = await open_pool(database.app_url, "exports_api", max_size=2)
        dispatcher_pool = await open_pool(database.app_url, "exports_dispatcher", max_size=2)
        worker, api, notes = WorkerStore(worker_pool), ApiStore(api_pool), NotificationStore(dispatcher_pool)
        per_export: dict[str, list[float]] = {"on": [], "off": []}
        per_finish: dict[str, list[float]] = {"on": [], "off": []}
        fan_out: list[float] = []
        lease: list[float] = []
        record: list[float] = []
        try:
            for r in range(-2, rounds * 2):  # a warm-up pair, then pairs of on/off whose order alternates
                pair, second = divmod(r, 2)
                on = (second == 0) == (pair % 2 == 0)
                admin(database.admin_url, ENABLE if on else DISABLE)
                created = [
                    await api.create_original(
                        tenant_id=tenant_id,
                        destination_id=destination_id,
                        list_name="main",
                        created_by="bench",
                    )
                    for _ in range(jobs)
                ]
                exports, finishes = 0.0, 0.0
                for c in created:
                    job = await worker.get_job(c.job_id)
                    assert job is not None
                    attempt = uuid.uuid4()
                    began = time.perf_counter()
                    assert (
                        await worker.claim_if_queued(job.id, job.version, attempt, "bench")
                        == ClaimResult.CLAIMED
                    )
                    assert (
                        await worker.authorize_delivery_if_running(
                            tenant_id=tenant_id,
                            job_id=job.id,
                            attempt_id=attempt,
                            replaces_job_id=None,
                            final_name=final_name_for(job.delivery_key),
                            length=100,
                            sha256=b"\x01" * 32,
                            rows=1,
                        )
                        == AuthorizationResult.AUTHORIZED
                    )
                    assert await worker.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED
                    assert await worker.fence_rename_if_delivering(job.id, attempt) == FenceResult.FENCED
                    finishing = time.perf_counter()
                    assert (
                        await worker.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED)
                        == FinishResult.WRITTEN
                    )
                    done = time.perf_counter()
                    exports += done - began
                    finishes += done - finishing
                if r < 0:
                    continue
                key = "on" if on else "off"
                per_export[key].append(exports / jobs * 1000)
                per_finish[key].append(finishes / jobs * 1000)
                if on:
                    began = time.perf_counter()
                    while (await notes.fan_out_notification_events(50, 86400.0)).events:
                        pass
                    fan_out.append((time.perf_counter() - began) / jobs * 1e6)
                    leased_total, recorded_total = 0.0, 0.0
                    while True:
                        began = time.perf_counter()
                        due = await notes.take_due_webhook_deliveries(50, 60.0)
                        leased_total += time.perf_counter() - began
                        if not due:
                            break
                        answers = [
                            AttemptRecord(
                                delivery_id=d.id,
                                leased_until=d.leased_until,
                                status_code=204,
                                error=None,
                                jitter=0.5,
                            )
                            for d in due
                        ]
                        began = time.perf_counter()
                        await notes.record_webhook_attempts(answers, base_seconds=10.0, cap_seconds=3600.0)
                        recorded_total += time.perf_counter() - began
                    lease.append(leased_total / jobs * 1e6)
                    record.append(recorded_total / jobs * 1e6)
        finally:
            admin(database.admin_url, ENABLE)
            for pool in (worker_pool, api_pool, dispatcher_pool):
                await pool.close()
    pairs = [on / off for on, off in zip(per_finish["on"], per_finish["off"], strict=True)]
    export_pairs = [on / off for on, off in zip(per_export["on"], per_export["off"], strict=True)]
    low, high = median_interval(pairs)
    elow, ehigh = median_interval(export_pairs)
    result = {
        "export_on_ms": statistics.median(per_export["on"]),
        "export_off_ms": statistics.median(per_export["off"]),
        "finish_on_ms": statistics.median(per_finish["on"]),
        "finish_off_ms": statistics.median(per_finish["off"]),
        "finish_ratio": statistics.median(pairs),
        "export_ratio": statistics.median(export_pairs),
        "fan_out_us": statistics.median(fan_out),
        "lease_us": statistics.median(lease),
        "record_us": statistics.median(record),
    }
    print(f"{jobs} exports per round, {rounds} rounds with the trigger on and {rounds} off, alternating")
    print(
        f"claim + cutoff 2 + fences + finish_delivery: on {result['export_on_ms']:.3f} ms, off"
        f" {result['export_off_ms']:.3f} ms per export; per-round ratio median {result['export_ratio']:.3f}x,"
        f" 95 % interval {elow:.3f}-{ehigh:.3f}x"
    )
    print(
        f"finish_delivery alone: on {result['finish_on_ms']:.3f} ms, off {result['finish_off_ms']:.3f} ms;"
        f" per-round ratio median {result['finish_ratio']:.3f}x, 95 % interval {low:.3f}-{high:.3f}x"
    )
    print(
        f"off the hot path, per event (one endpoint each, batches of 50): fan-out {result['fan_out_us']:.0f} us,"
        f" lease {result['lease_us']:.0f} us, recording the answer {result['record_us']:.0f} us"
    )
    return result


def run_with_defaults() -> None:
    """``python -m bench notify``: the default configuration."""
    asyncio.run(main(jobs=300, rounds=10))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    asyncio.run(main(options.jobs, options.rounds))

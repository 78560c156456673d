"""What the pauses cost on an export's hot path (issue #26, migration 0032), side by side in one run.

The ledger of operator actions is written on control-plane actions only, so an export's way to its outcome
writes nothing new. What it does read anew is the pause check: the claim and cutoff 2 (``lock_delivery_scope``)
and the policy read (``delivery_scope_open``) probe the pauses of the job's three scopes. This benchmark runs
the hot path's statements for ``--jobs`` exports per round, through the worker's store (the policy read, the
claim, cutoff 2, the terminal write), with the gate functions as migration 0032 leaves them against the same
functions as migration 0014 wrote them (switch rows only), swapped on the same database between rounds, in
alternating order; it reports milliseconds per export and the per-round ratio's median with its 95 %
bootstrap interval (as ``bench obs`` and ``bench e2e`` do).

    python -m bench.gate [--jobs 300] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
import uuid
from pathlib import Path

import psycopg

from bench.obs.measures import median_interval
from db.admin import seed_tenant
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.models import AuthorizationResult, ClaimResult, DeliveryOutcome, FinishResult, final_name_for
from testbed.pg import clone_database, make_template, postgres_server

MIGRATIONS = Path(__file__).resolve().parents[1] / "db" / "migrations"


def gate_functions(migration: str) -> str:
    """The two gate functions as ``migration`` defines them, as CREATE OR REPLACE statements."""
    text = (MIGRATIONS / migration).read_text(encoding="utf-8")
    found = re.findall(
        r"CREATE (?:OR REPLACE )?FUNCTION (?:delivery_scope_open|lock_delivery_scope)\(.*?\n\$\$;",
        text,
        flags=re.DOTALL,
    )
    assert len(found) == 2, f"{migration}: expected the two gate functions"
    return "\n".join(
        re.sub(r"^CREATE (OR REPLACE )?FUNCTION", "CREATE OR REPLACE FUNCTION", f) for f in found
    )


VARIANTS = {
    "pauses (0032)": gate_functions("0032_two_person_rule.sql"),
    "switches only (0014)": gate_functions("0014_switch_gate.sql"),
}


async def one_round(
    admin_url: str, api: ApiStore, worker: WorkerStore, tenant, destination, jobs: int
) -> float:
    """Milliseconds per export for the hot path's statements, the jobs created beforehand (outside the wall)."""
    created = [
        await api.create_original(
            tenant_id=tenant, destination_id=destination, list_name="newsletter", created_by="bench"
        )
        for _ in range(jobs)
    ]
    rows = []
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        for c in created:
            cur = await conn.execute(
                "SELECT id, version, delivery_key FROM export_jobs WHERE id = %(id)s", {"id": c.job_id}
            )
            rows.append(await cur.fetchone())
    started = time.perf_counter()
    for job_id, version, delivery_key in rows:
        attempt = uuid.uuid4()
        facts = await worker.read_policy_facts(job_id)
        assert facts is not None and facts.deliveries_open
        assert await worker.claim_if_queued(job_id, version, attempt, "bench-worker") == ClaimResult.CLAIMED
        authorized = await worker.authorize_delivery_if_running(
            tenant_id=tenant,
            job_id=job_id,
            attempt_id=attempt,
            replaces_job_id=None,
            final_name=final_name_for(delivery_key),
            length=1234,
            sha256=b"\x01" * 32,
            rows=10,
        )
        assert authorized == AuthorizationResult.AUTHORIZED, authorized
        assert (
            await worker.finish_delivery(job_id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN
        )
    return (time.perf_counter() - started) * 1000 / jobs


async def main(jobs: int, rounds: int) -> dict[str, float]:
    with postgres_server() as server:
        database = clone_database(server, make_template(server))
        seeded = await seed_tenant(
            database.admin_url,
            tenant_name="bench",
            destination_name="partner",
            destination={
                "host": "127.0.0.1",
                "port": 22,
                "username": "u",
                "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
                "credential_ref": "/nonexistent/key",
                "remote_dir": "/",
            },
            contacts=10,
        )
        async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, 'bench', 'operator')",
                {"t": seeded.tenant_id},
            )
        api_pool = await open_pool(database.app_url, "exports_api", max_size=2)
        worker_pool = await open_pool(database.app_url, "exports_worker", max_size=2)
        api, worker = ApiStore(api_pool), WorkerStore(worker_pool)
        timings: dict[str, list[float]] = {name: [] for name in VARIANTS}
        ratios = []
        try:
            await one_round(
                database.admin_url, api, worker, seeded.tenant_id, seeded.destination_id, 50
            )  # warm-up
            for n in range(rounds):
                order = list(VARIANTS) if n % 2 == 0 else list(reversed(VARIANTS))
                taken = {}
                for name in order:
                    async with await psycopg.AsyncConnection.connect(
                        database.admin_url, autocommit=True
                    ) as conn:
                        await conn.execute(VARIANTS[name])
                    # a fresh pool per variant: no plan cached for the other function's body
                    await worker_pool.close()
                    worker_pool = await open_pool(database.app_url, "exports_worker", max_size=2)
                    worker = WorkerStore(worker_pool)
                    taken[name] = await one_round(
                        database.admin_url, api, worker, seeded.tenant_id, seeded.destination_id, jobs
                    )
                    timings[name].append(taken[name])
                ratios.append(taken["pauses (0032)"] / taken["switches only (0014)"])
                print(f"round {n + 1}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in taken.items()), flush=True)
        finally:
            async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
                await conn.execute(VARIANTS["pauses (0032)"])
            await api_pool.close()
            await worker_pool.close()
    low, high = median_interval(ratios)
    for name, values in timings.items():
        print(
            f"{name:<22}: median {statistics.median(values):.3f} ms per export (policy read, claim, cutoff 2, terminal write)"
        )
    print(
        f"ratio pauses/switches only: median {statistics.median(ratios):.3f}x, 95 % interval {low:.3f}-{high:.3f}x"
    )
    return {"ratio": statistics.median(ratios), "low": low, "high": high}


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    asyncio.run(main(args.jobs, args.rounds))
    return 0


def run_with_defaults() -> None:
    asyncio.run(main(300, 10))


if __name__ == "__main__":
    raise SystemExit(cli())

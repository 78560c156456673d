"""``python -m bench index_cost``: what migration 0027's indexes cost every write to ``export_jobs``.

Each index of ``export_jobs`` takes a new entry on every status change (none of them is a HOT update:
``status`` is indexed), so 0027's three list indexes, less the one it drops, are paid by every export's
create, claim, cutoff 2 and terminal write. Two databases on one server, cloned from one migrated template:
one as migrated, one put back as it was before 0027 (its three indexes and its statistics dropped,
``ix_export_jobs_tenant_created`` built again). Both get the same history (``bench/console_load.py``, 1,000,000
exports by default, so the indexes have a size) and then the same exports, created and driven through the
real stores (``create_original``, ``claim_if_queued``, ``authorize_delivery_if_running``, ``finish_delivery``),
in batches alternating between the sides. Printed: each statement's median ms per side and the ratio.

    python -m bench index_cost
    python -m bench.index_cost [--history 1000000] [--exports 2000] [--batch 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import LiteralString

import psycopg

from bench.console_load import ConsoleScope, load_console_history, seed_console_tenants
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.models import AuthorizationResult, ClaimResult, DeliveryOutcome, FinishResult, final_name_for
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server

BEFORE_0027: list[LiteralString] = [
    "DROP INDEX ix_export_jobs_tenant_status_created",
    "DROP INDEX ix_export_jobs_tenant_destination_status",
    "DROP INDEX ix_export_jobs_tenant_list_status",
    "DROP STATISTICS st_export_jobs_tenant_scope",
    "CREATE INDEX ix_export_jobs_tenant_created ON export_jobs (tenant_id, created_at DESC)",
]
STEPS = ("create_original", "claim_if_queued", "authorize_delivery_if_running", "finish_delivery")
CREATOR = "bench"
LIST = "list-01"


@dataclass
class Side:
    label: str
    database: TestDatabase
    scope: ConsoleScope | None = None
    api: ApiStore | None = None
    worker: WorkerStore | None = None
    times: dict[str, list[float]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Side]:
        api_pool = await open_pool(self.database.app_url, "exports_api", min_size=1, max_size=1)
        worker_pool = await open_pool(self.database.app_url, "exports_worker", min_size=1, max_size=1)
        try:
            self.api, self.worker = ApiStore(api_pool), WorkerStore(worker_pool, lease_seconds=60)
            yield self
        finally:
            await api_pool.close()
            await worker_pool.close()

    def record(self, step: str, started: float) -> None:
        self.times.setdefault(step, []).append((time.perf_counter() - started) * 1000)

    async def one_export(self) -> None:
        """Create, claim, authorize and complete one export, timing each statement."""
        assert self.api is not None and self.worker is not None and self.scope is not None
        started = time.perf_counter()
        created = await self.api.create_original(
            tenant_id=self.scope.tenant_id,
            destination_id=self.scope.destination_ids[0],
            list_name=LIST,
            created_by=CREATOR,
        )
        self.record("create_original", started)
        attempt = uuid.uuid4()
        started = time.perf_counter()
        claimed = await self.worker.claim_if_queued(created.job_id, 1, attempt, "bench-worker.1")
        self.record("claim_if_queued", started)
        job = await self.worker.get_job(created.job_id)
        assert job is not None and claimed == ClaimResult.CLAIMED, claimed
        started = time.perf_counter()
        authorized = await self.worker.authorize_delivery_if_running(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            replaces_job_id=None,
            final_name=final_name_for(job.delivery_key),
            length=40_123,
            sha256=b"\x01" * 32,
            rows=400,
        )
        self.record("authorize_delivery_if_running", started)
        assert authorized == AuthorizationResult.AUTHORIZED, authorized
        started = time.perf_counter()
        finished = await self.worker.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED)
        self.record("finish_delivery", started)
        assert finished == FinishResult.WRITTEN, finished


async def prepare(side: Side, history: int, undo: bool) -> None:
    scopes = await seed_console_tenants(side.database.admin_url, tenants=4, destinations=8)
    side.scope = scopes[0]
    async with await psycopg.AsyncConnection.connect(side.database.admin_url, autocommit=True) as conn:
        if undo:
            for statement in BEFORE_0027:
                await conn.execute(statement)
        # cutoff 2 re-checks the creator and the list: the creator is a principal, the list has a contact
        await conn.execute(
            "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, %(n)s, 'operator')",
            {"t": side.scope.tenant_id, "n": CREATOR},
        )
        await conn.execute(
            "INSERT INTO contacts (tenant_id, list_name, email) VALUES (%(t)s, %(l)s, 'bench@example.test')",
            {"t": side.scope.tenant_id, "l": LIST},
        )
    await asyncio.to_thread(
        load_console_history,
        side.database.admin_url,
        scopes,
        total=history,
        live=history // 200,
        chunk=500_000,
    )


async def index_cost(history: int, exports: int, batch: int) -> dict[str, float]:
    with postgres_server() as server_url:
        template = make_template(server_url)
        after = Side("with 0027", clone_database(server_url, template))
        before = Side("before 0027", clone_database(server_url, template))
        for side, undo in ((after, False), (before, True)):
            await prepare(side, history, undo)
        print(f"each side: a history of {history:,} exports, then {exports:,} exports driven to Completed")
        async with after.opened(), before.opened():
            for side in (after, before):  # warm-up, not timed
                for _ in range(batch):
                    await side.one_export()
                side.times.clear()
            for i in range(exports // batch):
                for side in (after, before) if i % 2 == 0 else (before, after):
                    for _ in range(batch):
                        await side.one_export()
    print(f"\n{'statement':<32} {'before 0027 ms':>15} {'with 0027 ms':>13} {'ratio':>7}")
    ratios = {}
    for step in (*STEPS, "per export"):
        if step == "per export":
            b = sum(statistics.median(before.times[s]) for s in STEPS)
            a = sum(statistics.median(after.times[s]) for s in STEPS)
        else:
            b, a = statistics.median(before.times[step]), statistics.median(after.times[step])
        ratios[step] = a / b
        print(f"{step:<32} {b:>15.3f} {a:>13.3f} {a / b:>6.2f}x")
    return ratios


def run_with_defaults() -> None:
    """``python -m bench index_cost``: a history of a million exports, 2,000 more driven on each side."""
    asyncio.run(index_cost(history=1_000_000, exports=2_000, batch=50))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--exports", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=50)
    options = parser.parse_args()
    asyncio.run(index_cost(options.history, options.exports, options.batch))

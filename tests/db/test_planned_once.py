"""The worker's connections plan each protocol statement once (``db.pool.PLANNED_ONCE``).

The row protocol is a few dozen statements run over and over, each by the rows' keys. Once psycopg prepares
a statement on a worker connection (after its fifth run there), every run uses one generic plan: none is
planned again for its parameters. Other roles keep PostgreSQL's default (the console's lists ask for custom
plans for their optional filters)."""

from __future__ import annotations

import uuid

from db.pool import open_pool
from db.queries import q
from db.stores.protocol import WorkerStore
from domain.models import ClaimResult
from tests.db.test_list_check_plan import positional


async def _plans(conn, statement: str) -> tuple[int, int] | None:
    """How many runs of ``statement`` on this connection used its generic plan and how many were planned for
    their parameters (custom plans), or None if it is not prepared there."""
    cur = await conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = %s",
        (positional(q(statement))[0],),
    )
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1])


async def test_a_worker_connection_plans_each_statement_once(factory, database):
    pool = await open_pool(database.app_url, "exports_worker", min_size=1, max_size=1, name="planned-once")
    try:
        store = WorkerStore(pool, lease_seconds=60)
        jobs = [await factory.queued() for _ in range(8)]
        for job in jobs:
            facts = await store.read_policy_facts(job.id)
            assert facts is not None
            assert (
                await store.claim_if_queued(job.id, job.version, uuid.uuid4(), "w-1") == ClaimResult.CLAIMED
            )

        async with pool.connection() as conn:
            for statement in ("read_policy_facts", "claim_if_queued"):
                # prepared by psycopg after its first runs, and from then on every run used the generic plan
                planned = await _plans(conn, statement)
                assert planned is not None, statement
                generic, custom = planned
                assert generic >= 2 and custom == 0, (statement, planned)
    finally:
        await pool.close()


async def test_other_roles_keep_the_defaults(database):
    pool = await open_pool(database.app_url, "exports_api", min_size=1, max_size=1, name="not-planned-once")
    try:
        async with pool.connection() as conn:
            cur = await conn.execute("SHOW plan_cache_mode")
            assert await cur.fetchone() == ("auto",)
    finally:
        await pool.close()

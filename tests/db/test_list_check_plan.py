"""The policy's "the list still has contacts" reads one index entry, however many contacts the table holds.

Both policy checks ask it: the claim's ``read_policy_facts`` and cutoff 2 (``authorize_delivery_if_running``).
Written as ``EXISTS (SELECT 1 FROM contacts ...)``, the planner may read contacts sequentially and stop at the
list's first row, counting on matches spread through the table. A list's contacts are inserted together, so
they sit together, often at the end: the sequential read then reads almost every contact of every tenant,
twice per export (seen in ``bench e2e``: 5 ms a check at 49,000 contacts, growing with the table). Each
statement is planned here as the worker runs it, as ``exports_worker``, with the parameters bound (a custom
plan) and as the generic plan a pool connection's prepared statement settles on, over many tenants' lists of
the same name, inserted before the list under test, with fresh statistics.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.scale import plan_nodes
from db.queries import q
from tests.db.race import authorize_params

OTHER_TENANTS = 40
CONTACTS_EACH = 500


@pytest.fixture
async def crowded(factory):
    """A tenant whose list "newsletter" comes after 20,000 contacts of other tenants' lists of that name."""
    others = [await factory.tenant() for _ in range(OTHER_TENANTS)]
    await factory.admin(
        "INSERT INTO contacts (tenant_id, list_name, email)"
        " SELECT t, 'newsletter', 'c' || g || '@crowd.test' FROM unnest(%(t)s::uuid[]) t,"
        " generate_series(1, %(n)s) g",
        {"t": others, "n": CONTACTS_EACH},
    )
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    await factory.contacts(tenant, "newsletter", [(f"n{i}@acme.test", "N", str(i)) for i in range(200)])
    await factory.admin("ANALYZE contacts")
    return tenant, destination


def positional(text: str) -> tuple[str, list[str]]:
    """The statement with ``%(name)s`` as ``$1``, ``$2``... in order of first use, and the names in that order."""
    names: list[str] = []

    def number(found: re.Match[str]) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text), names


def _plans(admin_url: str, statement: str, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The statement's custom and generic plans as ``exports_worker`` runs them, each in a transaction rolled
    back (a write's too), with what each node read."""
    text, names = positional(q(statement))
    plans: dict[str, dict[str, Any]] = {}
    with psycopg.connect(admin_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL ROLE exports_worker")
            conn.execute(sql.SQL("PREPARE checked AS {}").format(sql.SQL(text)))  # type: ignore[arg-type]
            arguments = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
            for mode in ("force_custom_plan", "force_generic_plan"):
                with conn.transaction(force_rollback=True):
                    conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.Literal(mode)))
                    row = conn.execute(
                        sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE checked ({})").format(arguments)
                    ).fetchone()
                assert row is not None
                plans[mode] = row[0][0]["Plan"]
    return plans


def _contacts_scans(plan: dict[str, Any]) -> list[tuple[str, float]]:
    """Each scan of contacts: its kind, and the rows it read (returned or discarded) over all its loops."""
    return [
        (n["Node Type"], (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"])
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "contacts"
    ]


def _reads_one_entry(mode: str, plan: dict[str, Any]) -> None:
    scans = _contacts_scans(plan)
    assert scans, (mode, "the list is not read at all")
    assert [kind for kind, _ in scans if kind == "Seq Scan"] == [], (mode, scans)
    # the list's first contact, not the list (200 here) nor the table (20,200)
    assert sum(rows for _, rows in scans) == 1, (mode, scans)


async def test_the_claims_policy_facts_read_the_list_by_its_index(factory, database, crowded):
    tenant, destination = crowded
    job = await factory.queued(tenant, destination, list_name="newsletter")

    for mode, plan in _plans(database.admin_url, "read_policy_facts", {"job_id": job.id}).items():
        _reads_one_entry(mode, plan)


async def test_cutoff_2_reads_the_list_by_its_index(factory, database, crowded):
    tenant, destination = crowded
    job, attempt = await factory.running(await factory.queued(tenant, destination, list_name="newsletter"))
    params = authorize_params(job, attempt) | {"destination_version": None}

    for mode, plan in _plans(database.admin_url, "authorize_delivery_if_running", params).items():
        _reads_one_entry(mode, plan)


async def test_the_list_check_still_sees_a_list_emptied_and_another_tenants_list(
    factory, worker_store, crowded
):
    tenant, destination = crowded
    job = await factory.queued(tenant, destination, list_name="newsletter")
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.list_exists

    await factory.admin(
        "DELETE FROM contacts WHERE tenant_id = %(t)s AND list_name = 'newsletter'", {"t": tenant}
    )
    facts = await worker_store.read_policy_facts(job.id)
    # other tenants' lists of that name do not count
    assert facts is not None and not facts.list_exists
    assert uuid.UUID(str(facts.tenant_id)) == tenant

"""The export list's statements read what they show, at a scale that loads in seconds (issue 26, item 5):
150,000 exports of a console's history (``bench/console_load.py``: 4 tenants, one with 85 % of them, 8
destinations each, 51 lists, every status), every filter of ``python -m bench console`` planned as the
store binds it, as ``exports_api``, with the custom plans ``bound_this_read`` asks for.

What makes a page's time independent of the table's size is that it reads about as many rows as it shows:
no plan reads export_jobs sequentially; a page filtered on one thing reads it through that filter's index in
the list's order, and touches at most a couple of pages' worth of rows; the list names read one index entry
per name; and the planner's estimate of a small tenant's destination, which a large count shows as "about",
is near the truth. The latencies at ten million exports are the benchmark's (docs/benchmarks.md); a plan
does not flake on a shared machine, a wall-clock threshold would.

The audit page's statement (``page_operator_actions``, issue 26 item 2) likewise, over the ledger the benchmark
loads beside that history (22,500 operator actions here, 1,500,000 at ten million): no plan reads
operator_actions sequentially, and a page reads a page's worth of an index, not the tenant's ledger (all but
the console's subject without its kind, which no index of 0031 answers before PostgreSQL 18: see below).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from bench.console import CASES, AuditCase, Side, audit_cases, load_audit, mid_history
from bench.console_load import load_console_history, seed_console_tenants
from bench.scale import plan_nodes
from db.queries import q
from db.stores.listing import count_params, estimate_params, page_statement, scope_params
from domain.listing import ExportFilter
from domain.models import JobStatus
from rules.counting import plan_counts
from service.auth import Caller
from service.exports import Exports
from settings import Settings

EXPORTS = 150_000
PAGE = 51  # the console's 50 and one more, as the service asks
LIMIT = 10_000
pytestmark = pytest.mark.slow

# The index each single filter must be read through, in the list's order.
EXPECTED = {
    "no filter": "ix_export_jobs_tenant_created_id",
    "no filter, a page mid-history": "ix_export_jobs_tenant_created_id",
    **{f"status {s.value}": "ix_export_jobs_tenant_status_created" for s in JobStatus},
    "status Completed, a page mid-history": "ix_export_jobs_tenant_status_created",
    "busiest destination (50 %)": "ix_export_jobs_tenant_destination_status",
    "a middling destination (6 %)": "ix_export_jobs_tenant_destination_status",
    "rarest destination (1 %)": "ix_export_jobs_tenant_destination_status",
    "list-01 (27 %)": "ix_export_jobs_tenant_list_status",
    "list-25 (1 %)": "ix_export_jobs_tenant_list_status",
    "list-50 (0.7 %)": "ix_export_jobs_tenant_list_status",
    "a list no export uses": "ix_export_jobs_tenant_list_status",
}


@pytest.fixture(scope="module")
async def history(database):
    scopes = await seed_console_tenants(database.admin_url, tenants=4, destinations=8)
    await asyncio.to_thread(
        load_console_history, database.admin_url, scopes, total=EXPORTS, live=EXPORTS // 200, chunk=EXPORTS
    )
    return Side("loaded", database, scopes, EXPORTS, Settings())


async def _as_api(database, text: Any, params: dict[str, Any]) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier("exports_api")))
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")  # as bound_this_read
            cur = await conn.execute(text, params)
            row = await cur.fetchone()
    assert row is not None
    return cast(dict[str, Any], row[0][0]["Plan"])


async def plan(database, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    """The statement's plan as it runs, with what each node read."""
    return await _as_api(database, "EXPLAIN (ANALYZE, FORMAT JSON) " + q(statement), params)


async def estimate(database, params: dict[str, Any]) -> float:
    """``estimate_tenant_jobs`` as the store runs it (the statement is an EXPLAIN itself)."""
    return float((await _as_api(database, q("estimate_tenant_jobs"), params))["Plan Rows"])


def scans(found: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n for n in plan_nodes(found) if "Scan" in n["Node Type"] and n.get("Relation Name") == "export_jobs"
    ]


def indexes(found: dict[str, Any]) -> set[str]:
    return {
        n["Index Name"]
        for n in plan_nodes(found)
        if n.get("Index Name", "").startswith(("ix_", "uq_", "export_"))
    }


def rows_touched(found: dict[str, Any]) -> float:
    """Rows the scans of export_jobs returned or discarded, over all their loops."""
    return sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in scans(found)
    )


@pytest.mark.parametrize("case", [c.label for c in CASES])
async def test_every_page_of_the_list_reads_export_jobs_through_an_index(history, case):
    found = next(c for c in CASES if c.label == case)
    f = found.build(history)
    statement = page_statement(
        history.tenant.tenant_id, limit=PAGE, before=mid_history(history) if found.deep else None, filters=f
    )
    assert statement is not None
    explained = await plan(history.database, *statement)

    assert [n["Node Type"] for n in scans(explained) if n["Node Type"] == "Seq Scan"] == []
    assert indexes(explained), "export_jobs read through no index"
    if case in EXPECTED:
        assert EXPECTED[case] in indexes(explained)
        # It reads what it shows: one page per status it merges (every status for a destination or a list),
        # and not the filter's whole history.
        merged = len(f.statuses) or (len(JobStatus) if f.destination_id or f.list_name else 1)
        assert rows_touched(explained) <= 2 * PAGE * merged


@pytest.mark.parametrize("case", [c.label for c in CASES if not c.deep])
async def test_every_count_of_the_list_reads_export_jobs_through_an_index(history, api_store, case):
    f = next(c for c in CASES if c.label == case).build(history)
    tenant = history.tenant.tenant_id
    scope = f.without_statuses()
    ops = Exports(api_store)
    caller = Caller(tenant, "vic.view", "viewer")
    plan_of_counts = plan_counts(
        await ops.estimates(caller, scope, list(JobStatus), timeout_ms=10_000), LIMIT
    )
    scoped = scope_params(scope)
    if scoped is None:
        return  # an ID no export can start with: nothing is read
    if plan_of_counts.one_pass:
        params = {"tenant_id": tenant, "cap": LIMIT, **scoped}
        explained = [await plan(history.database, "count_tenant_jobs_in_scope", params)]
    else:
        explained = []
        for status in plan_of_counts.one_by_one:
            one = count_params(tenant, status, filters=scope, cap=LIMIT)
            assert one is not None
            explained.append(await plan(history.database, "count_tenant_jobs_of_status", one))

    for found in explained:
        assert [n["Node Type"] for n in scans(found) if n["Node Type"] == "Seq Scan"] == []
        assert indexes(found)
        if scope == ExportFilter():
            # The tenant's own counts by status stop at the cap, however many exports the tenant has: the
            # status is an index condition (its list index, or a partial index of live ones).
            assert rows_touched(found) <= 2 * (LIMIT + 1)


async def test_the_list_names_read_one_index_entry_per_name(history):
    explained = await plan(history.database, "tenant_list_names", {"tenant_id": history.tenant.tenant_id})

    assert indexes(explained) == {"ix_export_jobs_tenant_list_status"}
    assert rows_touched(explained) <= 60  # 51 names, and the probe that finds no more


async def test_the_estimate_of_a_small_tenants_destination_is_near_the_truth(history):
    # A destination belongs to one tenant: without the dependency statistics of 0027 the planner multiplies
    # the tenant's share (5 %) into it and is off twentyfold.
    small = history.scopes[1]
    f = ExportFilter(destination_id=small.destination_ids[0])
    params = estimate_params(small.tenant_id, JobStatus.COMPLETED, filters=f)
    assert params is not None
    estimated = await estimate(history.database, params)
    truth = await history.admin(
        "SELECT count(*) FROM export_jobs WHERE tenant_id = %(t)s AND destination_id = %(d)s AND status = 'Completed'",
        {"t": small.tenant_id, "d": small.destination_ids[0]},
    )

    assert truth[0][0] / 2 <= estimated <= truth[0][0] * 2, (estimated, truth)


# -- the ledger of operator actions (issue 26 item 2): the audit page's statement -----------------------------

LEDGER = (
    EXPORTS * 3 // 20
)  # as ``python -m bench console`` loads it: 22,500 rows here, 1,500,000 at ten million
AUDIT_PAGE = 101  # GET /audit's 100 and one more, as the service asks


@pytest.fixture(scope="module")
async def ledger(history):
    # The ledger as the benchmark loads it (one operator action in every 6.7 exports, 85 % in the measured
    # tenant), then the ledger's middle and the export the cases filter by, as the benchmark finds them.
    await load_audit(history)
    return history


def audit_params(side: Side, case: AuditCase) -> dict[str, Any]:
    return {
        "tenant_id": side.tenant.tenant_id,
        "limit": AUDIT_PAGE,
        "before_id": side.audit_middle if case.deep else None,
        "principal": None,
        "action": None,
        "subject_kind": None,
        "subject_id": None,
        "since": None,
        "until": None,
        **case.filters,
    }


def ledger_scans(found: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n
        for n in plan_nodes(found)
        if "Scan" in n["Node Type"] and n.get("Relation Name") == "operator_actions"
    ]


def ledger_rows_touched(found: dict[str, Any]) -> float:
    """Rows the scans of operator_actions returned or discarded, over all their loops."""
    return sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
        for n in ledger_scans(found)
    )


async def _count(side: Side, filters: dict[str, str]) -> int:
    """How many of the measured tenant's ledger rows match ``filters`` (as the superuser)."""
    rows = await side.admin(
        "SELECT count(*) FROM operator_actions WHERE tenant_id = %(tenant_id)s"
        " AND (%(principal)s::text IS NULL OR principal = %(principal)s::text)"
        " AND (%(action)s::text IS NULL OR action = %(action)s::text)"
        " AND (%(subject_kind)s::text IS NULL OR subject_kind = %(subject_kind)s::text)"
        " AND (%(subject_id)s::text IS NULL OR subject_id = %(subject_id)s::text)",
        {
            "tenant_id": side.tenant.tenant_id,
            "principal": None,
            "action": None,
            "subject_kind": None,
            "subject_id": None,
            **filters,
        },
    )
    return int(rows[0][0])


# The subject without its kind (the console's Subject box) reads ix_operator_actions_subject_id (0040): without
# it PostgreSQL 16 (and 15) read the whole ledger sequentially, 430 ms at 1,500,000 rows (docs/benchmarks.md).
ALL_CASES = [c.label for c in audit_cases()]


@pytest.mark.parametrize("case", ALL_CASES)
async def test_every_page_of_the_ledger_reads_operator_actions_through_an_index(ledger, case):
    found = next(c for c in audit_cases() if c.label == case)
    explained = await plan(ledger.database, "page_operator_actions", audit_params(ledger, found))

    assert [n["Node Type"] for n in ledger_scans(explained) if n["Node Type"] == "Seq Scan"] == []
    assert {n.get("Index Name") for n in plan_nodes(explained)} & {
        "pk_operator_actions",
        "ix_operator_actions_tenant",
        "ix_operator_actions_principal",
        "ix_operator_actions_action",
        "ix_operator_actions_subject",
        "ix_operator_actions_subject_id",
    }, "operator_actions read through no index"


@pytest.mark.parametrize("case", ALL_CASES)
async def test_a_page_of_the_ledger_reads_what_it_shows_not_the_ledgers_length(ledger, case):
    # Newest first through an index in id order, either the filter's own (a page's worth of entries, or every
    # entry of the rarer filter when a second one discards them) or the newest rows until the page is full
    # (about a page over the share of the ledger that matches). Never the tenant's ledger for one page.
    found = next(c for c in audit_cases() if c.label == case)
    explained = await plan(ledger.database, "page_operator_actions", audit_params(ledger, found))
    every = await _count(ledger, found.filters)
    rarer = min([await _count(ledger, {})] + [await _count(ledger, {k: v}) for k, v in found.filters.items()])
    bound = (
        rarer + AUDIT_PAGE if every < AUDIT_PAGE else max(2 * AUDIT_PAGE * LEDGER / every, rarer + AUDIT_PAGE)
    )

    assert ledger_rows_touched(explained) <= bound

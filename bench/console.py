"""``python -m bench console``: the console at ten million exports against an empty database (issue 26, item 5).

Two databases on one PostgreSQL server: one loaded with a console's history (``bench/console_load.py``:
10,000,000 exports over 4 tenants, the first holding 85 % of them, 8 destinations each, 51 lists, every
status, each attempt's events), one freshly migrated with the same tenants and no exports. Each side serves the
real app (``api.app.create_app`` over an ``exports_api`` pool, the list's bound and exact-count limit of
production's defaults), driven in-process through httpx as a signed-in reconciler, one request at a time, the
sides alternating request by request so both share the machine's load of the moment.

What a page is, is a :class:`PageBench`: the requests a person's use of it makes (each timed as a whole HTTP
request, template and all), the statements whose plans it prints, and a ``load`` step for the rows it needs
beyond the history. :data:`PAGES` holds two: the export list (:data:`EXPORT_LIST`: the console page with its
counts, ``GET /exports`` and ``GET /export-counts`` over 33 filters: none, a page deep in the history, each
status, sets of statuses, busy and rare destinations, common, rare and absent lists, ID prefixes of 1 to 36
characters, and their combinations) and the reconciler's queue (:data:`RECONCILER_QUEUE`, issue 26 item 4: its
console page and ``GET /reconciliation-queue``, the first page and one from the middle) and the ledger of
operator actions (:data:`AUDIT_LOG`, item 2: the console's Operator actions and ``GET /audit`` over 12 filters
by principal, action and subject, first pages and one from the middle, over 1,500,000 rows at ten million its
load step appends: ``bench/console_load.py`` ``load_operator_actions``). The run, the alternation, the figures
and the plan checks are shared.

Printed: per page and request kind, p50 and p95 on each side, the loaded side's p95 against the 300 ms target,
and how many requests ran past their bound; per case on the loaded side, its latencies, what the page showed
(beside the true count, for the list), and the indexes its statements read (no plan may read export_jobs or
operator_actions sequentially; for the audit page also the rows its scans read and the buffers it touched); the
full plans of a few; and how long building a copy of each of 0027's indexes concurrently takes. Nothing prints
contact data.

    python -m bench console                   # 10,000,000 exports against none
    python -m bench.console [--exports N] [--tenants 4] [--destinations 8] [--rounds 10] [--shared-buffers 1GB]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString, cast
from urllib.parse import urlencode
from uuid import UUID

import httpx
import psycopg
from psycopg import sql

from api.app import create_app
from api.console import PAGE_SIZE
from bench.console_load import (
    RARE_LIST,
    RARE_PRINCIPAL,
    ConsoleScope,
    load_console_history,
    load_operator_actions,
    seed_console_tenants,
)
from bench.scale import percentile, plan_nodes, top_nodes
from db.pool import open_pool
from db.queries import q
from db.stores.api import ApiStore
from db.stores.listing import count_params, page_statement, scope_params
from db.stores.reconciliation import QUEUE_START_AT, QUEUE_START_ID
from domain.listing import ExportFilter
from domain.models import JobStatus
from rules.counting import plan_counts
from rules.recovery import (
    LISTING_REQUEST_OBSERVER_PREFIX,
    LISTING_REQUEST_WINDOW_SECONDS,
    RECOVERY_OBSERVER_PREFIX,
)
from service.audit import PAGE_LIMIT as AUDIT_PAGE_LIMIT
from service.auth import Caller, mint_token
from service.exports import Exports
from service.reconciliation import QUEUE_COUNT_CAP, QUEUE_PAGE_SIZE
from settings import Settings
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server

TARGET_P95_MS = 300.0
BASE_URL = "http://bench.test"
UUID_MAX = UUID(int=(1 << 128) - 1)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# -- a side: one database, its app, its clients, its timings ---------------------------------------------


@dataclass
class Side:
    """One database under measurement, served by the real app."""

    label: str
    database: TestDatabase
    scopes: list[ConsoleScope]
    exports: int
    settings: Settings
    api: httpx.AsyncClient | None = None  # bearer token (a reconciler's: the queue is theirs; reads only)
    console: httpx.AsyncClient | None = None  # a signed-in console session
    ops: Exports = field(init=False)  # the operations the app serves, for the plans' decisions
    queue_middle: tuple[datetime, UUID] = (datetime.min.replace(tzinfo=UTC), UUID(int=0))
    audit_middle: int | None = None  # the ledger's keyset bound halfway through the measured tenant's rows

    @property
    def caller(self) -> Caller:
        return Caller(self.tenant.tenant_id, "bench.reconciler", "reconciler")

    times: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)  # (page, kind, case) -> ms
    shown: dict[tuple[str, str, str], str] = field(default_factory=dict)  # what the last answer said
    too_slow: dict[tuple[str, str, str], int] = field(default_factory=dict)

    @property
    def tenant(self) -> ConsoleScope:
        """The tenant measured: the largest."""
        return self.scopes[0]

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Side]:
        pool = await open_pool(self.database.app_url, "exports_api", min_size=2, max_size=4)
        try:
            self.ops = Exports(
                ApiStore(pool),
                None,
                list_timeout_ms=self.settings.list_query_timeout_ms,
                exact_count_limit=self.settings.list_exact_count_limit,
            )
            app = create_app(self.settings, exports=self.ops)
            token = await mint_token(
                self.database.admin_url,
                tenant_id=self.tenant.tenant_id,
                principal="bench.reconciler",
                role="reconciler",
            )
            async with (
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as api,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as console,
            ):
                api.headers["Authorization"] = f"Bearer {token}"
                await sign_in(console, token)
                self.api, self.console = api, console
                yield self
        finally:
            await pool.close()

    async def admin(
        self, query: LiteralString, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.database.admin_url, autocommit=True) as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []


async def sign_in(client: httpx.AsyncClient, token: str) -> None:
    """Open a console session as a browser on this site would (the form's anti-forgery token, our Origin)."""
    form = await client.get("/console/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    if found is None:
        raise SystemExit("the console's sign-in form has no anti-forgery token")
    answer = await client.post(
        "/console/login", data={"token": token, "csrf": found.group(1)}, headers={"Origin": BASE_URL}
    )
    if answer.status_code != 303:
        raise SystemExit(f"console sign-in answered {answer.status_code}")


# -- what a page is --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One timed request: which kind (the console page, the JSON list, the counts), for which case, and
    what its answer says (for the printout: the count shown, or that it ran past its bound)."""

    kind: str
    case: str
    client: str  # "console" or "api"
    url: str
    read: Callable[[httpx.Response], tuple[str, bool]]  # -> (what it showed, ran past its bound)


@dataclass(frozen=True)
class PlanCase:
    """A statement the page runs, as its store binds it, whose plan the loaded side prints and checks."""

    case: str
    what: str  # "page" or "count"
    statement: str
    params: dict[str, Any]


@dataclass(frozen=True)
class PageBench:
    """One console page under measurement. ``requests`` and ``plans`` are built per side (IDs differ);
    ``load`` adds the rows the page reads beyond the export history (none for the export list)."""

    name: str
    requests: Callable[[Side], list[Request]]
    plans: Callable[[Side], Awaitable[list[PlanCase]]]
    load: Callable[[Side], Awaitable[None]] | None = None


# -- the export list ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A filter a person applies to the list, built on a side (its destinations are its own)."""

    label: str
    build: Callable[[Side], ExportFilter]
    deep: bool = False  # a keyset page in the middle of the history, not the newest


def _statuses(*statuses: JobStatus) -> Callable[[Side], ExportFilter]:
    return lambda side: ExportFilter(statuses=statuses)


def _destination(
    k: int, *statuses: JobStatus, list_name: str | None = None
) -> Callable[[Side], ExportFilter]:
    return lambda side: ExportFilter(statuses, side.tenant.destination_ids[k - 1], list_name)


def _list(name: str, *statuses: JobStatus) -> Callable[[Side], ExportFilter]:
    return lambda side: ExportFilter(statuses, None, name)


def _prefix(length: int) -> Callable[[Side], ExportFilter]:
    return lambda side: ExportFilter(id_prefix=ID_PREFIX_SOURCE[0][:length])


# An existing export's ID on the loaded side (set before the run), whose prefixes both sides search.
ID_PREFIX_SOURCE: list[str] = ["01234567-89ab-cdef-0123-456789abcdef"]

S = JobStatus
CASES: tuple[Case, ...] = (
    Case("no filter", lambda side: ExportFilter()),
    Case("no filter, a page mid-history", lambda side: ExportFilter(), deep=True),
    *(Case(f"status {s.value}", _statuses(s)) for s in JobStatus),
    Case("status Completed, a page mid-history", _statuses(S.COMPLETED), deep=True),
    Case("statuses Queued+Running+Delivering", _statuses(S.QUEUED, S.RUNNING, S.DELIVERING)),
    Case("statuses Failed+OutcomeUnknown", _statuses(S.FAILED, S.OUTCOME_UNKNOWN)),
    Case("statuses Canceled+Stopped+Rejected", _statuses(S.CANCELED, S.STOPPED, S.REJECTED)),
    Case("busiest destination (50 %)", _destination(1)),
    Case("a middling destination (6 %)", _destination(4)),
    Case("rarest destination (1 %)", _destination(8)),
    Case("list-01 (27 %)", _list("list-01")),
    Case("list-25 (1 %)", _list("list-25")),
    Case("list-50 (0.7 %)", _list("list-50")),
    Case(f"list {RARE_LIST} (1 in 200,003)", _list(RARE_LIST)),
    Case("a list no export uses", _list("no-such-list")),
    *(Case(f"ID prefix of {n}", _prefix(n)) for n in (1, 2, 4, 8, 36)),
    Case("rarest destination, Failed", _destination(8, S.FAILED)),
    Case("busiest destination, Queued", _destination(1, S.QUEUED)),
    Case("list-50, Completed", _list("list-50", S.COMPLETED)),
    Case("list-01, OutcomeUnknown", _list("list-01", S.OUTCOME_UNKNOWN)),
    Case("busiest destination, list-50", _destination(1, list_name="list-50")),
    Case("rarest destination, list-50, Rejected", _destination(8, S.REJECTED, list_name="list-50")),
)


def _console_query(f: ExportFilter, before: str | None) -> list[tuple[str, str]]:
    query = [("status", s.value) for s in f.statuses]
    if f.destination_id:
        query.append(("destination", str(f.destination_id)))
    if f.list_name:
        query.append(("list", f.list_name))
    if f.id_prefix:
        query.append(("q", f.id_prefix))
    return query + ([("before", before)] if before else [])


def _api_query(f: ExportFilter) -> list[tuple[str, str]]:
    query = [("status", s.value) for s in f.statuses]
    if f.destination_id:
        query.append(("destination_id", str(f.destination_id)))
    if f.list_name:
        query.append(("list_name", f.list_name))
    if f.id_prefix:
        query.append(("q", f.id_prefix))
    return query


def mid_history(side: Side) -> tuple[datetime, UUID]:
    """A keyset bound halfway through the loaded history (on the empty side: past every row there is)."""
    return datetime.now(UTC) - timedelta(seconds=side.exports // 2), UUID_MAX


def _cursor(bound: tuple[datetime, UUID]) -> str:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return f"{(bound[0] - epoch) // timedelta(microseconds=1)}.{bound[1].hex}"


def _read_console(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"the console answered {response.status_code}")
    total = re.search(r'id="match-total"[^>]*>([^<]*)<', response.text)
    return (total.group(1) if total else "?"), 'id="list-too-slow"' in response.text


def _read_list(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code == 503 and response.json().get("code") == "query_timeout":
        return "past its bound", True
    if response.status_code != 200:
        raise SystemExit(f"GET /exports answered {response.status_code}: {response.text[:200]}")
    return f"{len(response.json()['exports'])} rows", False


def _read_counts(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"GET /export-counts answered {response.status_code}: {response.text[:200]}")
    body = response.json()
    return body["matching"]["text"], bool(body["timed_out"])


def list_requests(side: Side) -> list[Request]:
    """Per case: the console page (rows, counts, chips), the JSON page and the JSON counts."""
    requests = []
    for case in CASES:
        f = case.build(side)
        before = _cursor(mid_history(side)) if case.deep else None
        console = "/console?" + urlencode(_console_query(f, before))
        api = "/exports?" + urlencode(
            [*_api_query(f), ("limit", str(PAGE_SIZE))] + ([("before", before)] if before else [])
        )
        requests.append(Request("console page", case.label, "console", console, _read_console))
        requests.append(Request("GET /exports", case.label, "api", api, _read_list))
        if not case.deep:  # the counts do not depend on the page
            counts = "/export-counts?" + urlencode(_api_query(f))
            requests.append(Request("GET /export-counts", case.label, "api", counts, _read_counts))
    return requests


async def list_plans(side: Side) -> list[PlanCase]:
    """Per case, the page's statement and the count's (for the statuses the planner expects few of), as the
    store binds them."""
    plans = []
    tenant = side.tenant.tenant_id
    for case in CASES:
        f = case.build(side)
        statement = page_statement(
            tenant, limit=PAGE_SIZE + 1, before=mid_history(side) if case.deep else None, filters=f
        )
        if statement is not None:
            plans.append(PlanCase(case.label, "page", *statement))
        if case.deep:
            continue
        scope, limit = f.without_statuses(), side.settings.list_exact_count_limit
        plan = plan_counts(
            await side.ops.estimates(side.caller, scope, list(JobStatus), timeout_ms=5_000), limit
        )
        scoped = scope_params(scope)
        if scoped is not None and plan.one_pass:  # as Exports.counts decides
            params = {"tenant_id": tenant, "cap": limit, **scoped}
            plans.append(PlanCase(case.label, "count", "count_tenant_jobs_in_scope", params))
            continue
        for status in plan.one_by_one:
            params = count_params(tenant, status, filters=scope, cap=limit)
            if params is not None:
                plans.append(
                    PlanCase(case.label, f"count {status.value}", "count_tenant_jobs_of_status", params)
                )
    return plans


EXPORT_LIST = PageBench("export list", list_requests, list_plans)


# -- the reconciler's queue (issue 26 item 4: service.reconciliation.reconciler_queue_page) ----------------


async def queue_middle(side: Side) -> tuple[datetime, UUID]:
    """A keyset bound halfway through the measured tenant's queue (on the empty side: before any row)."""
    rows = await side.admin(
        "SELECT outcome_unknown_at, id FROM export_jobs WHERE tenant_id = %(t)s AND status = 'OutcomeUnknown'"
        " ORDER BY outcome_unknown_at, id"
        " OFFSET (SELECT count(*) / 2 FROM export_jobs WHERE tenant_id = %(t)s AND status = 'OutcomeUnknown')"
        " LIMIT 1",
        {"t": side.tenant.tenant_id},
    )
    return (rows[0][0], rows[0][1]) if rows else (datetime.now(UTC) - timedelta(days=1), UUID(int=0))


def _read_queue_console(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"the reconciler's console answered {response.status_code}")
    found = re.search(r'id="queue-count"[^>]*><strong>([^<]*)<', response.text)
    return (found.group(1) if found else "?"), False


def _read_queue_api(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"GET /reconciliation-queue answered {response.status_code}: {response.text[:200]}")
    body = response.json()
    return f"{body['count']['label']} ({len(body['exports'])} rows)", False


def queue_requests(side: Side) -> list[Request]:
    """The queue's first page and a keyset page from its middle, on the console and over the API."""
    middle = _cursor(side.queue_middle)
    return [
        Request("console page", "first page", "console", "/console/reconciliation", _read_queue_console),
        Request(
            "console page",
            "a page mid-queue",
            "console",
            f"/console/reconciliation?after={middle}",
            _read_queue_console,
        ),
        Request("GET /reconciliation-queue", "first page", "api", "/reconciliation-queue", _read_queue_api),
        Request(
            "GET /reconciliation-queue",
            "a page mid-queue",
            "api",
            f"/reconciliation-queue?after={middle}",
            _read_queue_api,
        ),
    ]


async def queue_plans(side: Side) -> list[PlanCase]:
    """The statements of ``reconciler_queue_page`` as its store binds them (the estimate reads statistics only)."""
    tenant = side.tenant.tenant_id
    plans = []
    for case, (after_at, after_id) in (
        ("first page", (QUEUE_START_AT, QUEUE_START_ID)),
        ("a page mid-queue", side.queue_middle),
    ):
        params = {
            "tenant_id": tenant,
            "after_at": after_at,
            "after_id": after_id,
            "limit": QUEUE_PAGE_SIZE + 1,
        }
        plans.append(PlanCase(case, "page", "page_outcome_unknown_queue", params))
    plans.append(
        PlanCase(
            "first page",
            "count",
            "count_outcome_unknown_queue",
            {"tenant_id": tenant, "cap": QUEUE_COUNT_CAP},
        )
    )
    ids = await side.admin(
        "SELECT id FROM export_jobs WHERE tenant_id = %(t)s AND status = 'OutcomeUnknown'"
        " ORDER BY outcome_unknown_at, id LIMIT %(n)s",
        {"t": tenant, "n": QUEUE_PAGE_SIZE},
    )
    summaries = {
        "tenant_id": tenant,
        "job_ids": [r[0] for r in ids],
        "recovery_prefix": f"{RECOVERY_OBSERVER_PREFIX}:",
        "observer_prefix": f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        "window_seconds": LISTING_REQUEST_WINDOW_SECONDS,
    }
    plans.append(PlanCase("first page", "summaries", "outcome_unknown_summaries", summaries))
    return plans


async def load_queue(side: Side) -> None:
    """Nothing to load (the history has the queue's exports and their events); where its middle is."""
    side.queue_middle = await queue_middle(side)


RECONCILER_QUEUE = PageBench("reconciler queue", queue_requests, queue_plans, load_queue)


# -- the ledger of operator actions (issue 26 item 2: service.audit.Audit.page) -----------------------------


@dataclass(frozen=True)
class AuditCase:
    """A filter an admin applies to the ledger. ``console`` is the console page's query (None: the page cannot
    say it), ``api`` GET /audit's; ``filters`` are the statement's as the store binds them."""

    label: str
    console: dict[str, str] | None
    api: dict[str, str]
    filters: dict[str, str]
    deep: bool = False  # a keyset page from the middle of the ledger, not the newest


# What the loaded side's ledger holds that the cases name (set by its load step; the empty side asks the same).
AUDIT_SUBJECT: list[str] = ["00000000-0000-0000-0000-000000000000"]  # an export with actions in the ledger


def audit_cases() -> tuple[AuditCase, ...]:
    export = AUDIT_SUBJECT[0]
    busiest, rare = "operator-01", RARE_PRINCIPAL
    return (
        AuditCase("no filter", {}, {}, {}),
        AuditCase("no filter, a page mid-ledger", {}, {}, {}, deep=True),
        AuditCase(
            "principal operator-01 (28 %)",
            {"principal": busiest},
            {"principal": busiest},
            {"principal": busiest},
        ),
        AuditCase(
            "principal operator-01, a page mid-ledger",
            {"principal": busiest},
            {"principal": busiest},
            {"principal": busiest},
            deep=True,
        ),
        AuditCase(
            f"principal {rare} (1 in 100,003)", {"principal": rare}, {"principal": rare}, {"principal": rare}
        ),
        AuditCase("action cancel (62 %)", {"action": "cancel"}, {"action": "cancel"}, {"action": "cancel"}),
        AuditCase("action pause (6 %)", {"action": "pause"}, {"action": "pause"}, {"action": "pause"}),
        AuditCase(
            "action principal.grant (0.5 %)",
            {"action": "principal.grant"},
            {"action": "principal.grant"},
            {"action": "principal.grant"},
        ),
        AuditCase(
            "principal operator-01, action pause",
            {"principal": busiest, "action": "pause"},
            {"principal": busiest, "action": "pause"},
            {"principal": busiest, "action": "pause"},
        ),
        AuditCase(
            "principal operator-01, action reconcile (none)",
            {"principal": busiest, "action": "reconcile"},
            {"principal": busiest, "action": "reconcile"},
            {"principal": busiest, "action": "reconcile"},
        ),
        AuditCase(
            "one export (kind and ID)",
            None,
            {"subject_kind": "export", "subject_id": export},
            {"subject_kind": "export", "subject_id": export},
        ),
        AuditCase(
            "one export (ID only, as the console asks)",
            {"subject": export},
            {"subject_id": export},
            {"subject_id": export},
        ),
    )


async def audit_middle(side: Side) -> int | None:
    """A keyset bound halfway through the measured tenant's ledger (None on a side without one)."""
    rows = await side.admin(
        "SELECT id FROM operator_actions WHERE tenant_id = %(t)s ORDER BY id"
        " OFFSET (SELECT count(*) / 2 FROM operator_actions WHERE tenant_id = %(t)s) LIMIT 1",
        {"t": side.tenant.tenant_id},
    )
    return int(rows[0][0]) if rows else None


_AUDIT_ROW = 'class="audit-row'


def _read_audit_console(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"the console's Operator actions answered {response.status_code}")
    return f"{response.text.count(_AUDIT_ROW)} rows", False


def _read_audit_api(response: httpx.Response) -> tuple[str, bool]:
    if response.status_code != 200:
        raise SystemExit(f"GET /audit answered {response.status_code}: {response.text[:200]}")
    return f"{len(response.json()['actions'])} rows", False


def audit_requests(side: Side) -> list[Request]:
    """Per case: the console page (50 rows) and GET /audit (its default 100), the first page or one mid-ledger."""
    # The empty side has no middle: a bound past every row there is asks the same statement.
    middle = {"before": str(side.audit_middle or 1 << 40)}
    requests = []
    for case in audit_cases():
        extra = middle if case.deep else {}
        if case.console is not None:
            url = "/console/audit?" + urlencode({**case.console, **extra})
            requests.append(Request("console page", case.label, "console", url, _read_audit_console))
        url = "/audit?" + urlencode({**case.api, **extra})
        requests.append(Request("GET /audit", case.label, "api", url, _read_audit_api))
    return requests


async def audit_plans(side: Side) -> list[PlanCase]:
    """``page_operator_actions`` as ``AuditReads`` binds it, for each case (GET /audit's limit and one more)."""
    plans = []
    for case in audit_cases():
        params: dict[str, Any] = {
            "tenant_id": side.tenant.tenant_id,
            "limit": AUDIT_PAGE_LIMIT + 1,
            "before_id": side.audit_middle if case.deep else None,
            "principal": None,
            "action": None,
            "subject_kind": None,
            "subject_id": None,
            "since": None,
            "until": None,
            **case.filters,
        }
        plans.append(PlanCase(case.label, "page", "page_operator_actions", params))
    return plans


async def load_audit(side: Side) -> None:
    """The loaded side's ledger: one operator action in every ``LEDGER_EVERY`` exports (1,500,000 at ten
    million), in the measured tenant 85 % of them; then the export whose actions the cases filter by, and the
    ledger's middle. The empty side has none."""
    if side.exports:
        rows = max(side.exports * 3 // 20, 1)
        say(f"loading {rows:,} operator actions")
        seconds = await asyncio.to_thread(
            load_operator_actions,
            side.database.admin_url,
            side.scopes,
            total=rows,
            total_jobs=side.exports,
            progress=say,
        )
        size = await side.admin(
            "SELECT pg_size_pretty(pg_relation_size('operator_actions')),"
            " pg_size_pretty(pg_indexes_size('operator_actions'))"
        )
        say(f"ledger loaded in {seconds:.0f} s; operator_actions {size[0][0]} and its indexes {size[0][1]}")
        # An export someone acted on more than once (a cancel that lost, then a reconcile, say), mid-history.
        some = await side.admin(
            "SELECT subject_id FROM operator_actions WHERE tenant_id = %(t)s AND subject_kind = 'export'"
            " AND id > (SELECT max(id) / 2 FROM operator_actions)"
            " GROUP BY subject_id HAVING count(*) > 1 ORDER BY min(id) LIMIT 1",
            {"t": side.tenant.tenant_id},
        )
        if some:
            AUDIT_SUBJECT[0] = str(some[0][0])
    side.audit_middle = await audit_middle(side)


AUDIT_LOG = PageBench("audit log", audit_requests, audit_plans, load_audit)

# The pages measured, in order.
PAGES: tuple[PageBench, ...] = (EXPORT_LIST, RECONCILER_QUEUE, AUDIT_LOG)


# -- the run ----------------------------------------------------------------------------------------------


async def measure(sides: Sequence[Side], page: PageBench, rounds: int, seed: int = 26) -> None:
    """``rounds`` passes over the page's requests in a shuffled order (the same on both sides), each request
    made on both sides in turn, the first side flipping every request."""
    per_side = {side.label: page.requests(side) for side in sides}
    count = len(per_side[sides[0].label])
    shuffle = random.Random(seed)
    flip = 0
    for r in range(rounds):
        order = list(range(count))
        shuffle.shuffle(order)
        for i in order:
            flip += 1
            for side in sides if flip % 2 else list(reversed(sides)):
                request = per_side[side.label][i]
                client = side.console if request.client == "console" else side.api
                assert client is not None
                started = time.perf_counter()
                response = await client.get(request.url)
                elapsed = (time.perf_counter() - started) * 1000
                shown, slow = request.read(response)
                key = (page.name, request.kind, request.case)
                side.times.setdefault(key, []).append(elapsed)
                side.shown[key] = shown
                side.too_slow[key] = side.too_slow.get(key, 0) + int(slow)
        say(f"{page.name}: round {r + 1} of {rounds} done")


async def true_count(side: Side, f: ExportFilter) -> int | None:
    """The exact count of a filter, unbounded, as the superuser (for the printout only)."""
    scope = scope_params(f)
    if scope is None:
        return 0
    rows = await side.admin(
        "SELECT count(*) FROM export_jobs WHERE tenant_id = %(tenant_id)s"
        " AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))"
        " AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)"
        " AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)"
        " AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid)",
        {"tenant_id": side.tenant.tenant_id, "statuses": [s.value for s in f.statuses] or None, **scope},
    )
    return int(rows[0][0])


@dataclass(frozen=True)
class PlanReport:
    case: str
    what: str
    indexes: list[str]
    seq_scans: list[str]
    execution_ms: float
    text: list[str]
    rows_read: float = 0.0  # rows the scans of SCANNED returned or discarded by a filter, over all loops
    buffers: int = 0  # shared buffers the whole plan touched (hit or read)


# The large tables no page may read sequentially: the exports, and the ledger of operator actions.
SCANNED = ("export_jobs", "operator_actions")


async def explain(side: Side, plan: PlanCase) -> PlanReport:
    """EXPLAIN (ANALYZE, BUFFERS) as the API's role with custom plans, as ``bound_this_read`` sets them."""
    async with await psycopg.AsyncConnection.connect(side.database.app_url, autocommit=True) as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier("exports_api")))
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            text = cast(LiteralString, q(plan.statement))
            cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, plan.params)
            found = (await cur.fetchone() or [[{}]])[0][0]
            cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, plan.params)
            lines = [r[0] for r in await cur.fetchall()]
    nodes = list(plan_nodes(found["Plan"]))
    return PlanReport(
        plan.case,
        plan.what,
        sorted(
            {
                n["Index Name"]
                for n in nodes
                if n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
            }
        ),
        [n["Node Type"] for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in SCANNED],
        float(found.get("Execution Time", float("nan"))),
        lines,
        sum(
            (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
            for n in nodes
            if "Scan" in n["Node Type"] and n.get("Relation Name") in SCANNED
        ),
        int(found["Plan"].get("Shared Hit Blocks", 0)) + int(found["Plan"].get("Shared Read Blocks", 0)),
    )


LIST_INDEXES = (
    "ix_export_jobs_tenant_status_created",
    "ix_export_jobs_tenant_destination_status",
    "ix_export_jobs_tenant_list_status",
)


async def index_builds(side: Side) -> dict[str, float]:
    """Seconds to build a copy of each of 0027's indexes with CREATE INDEX CONCURRENTLY (then dropped)."""
    seconds = {}
    async with await psycopg.AsyncConnection.connect(side.database.admin_url, autocommit=True) as conn:
        for name in LIST_INDEXES:
            cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %(n)s", {"n": name})
            found = await cur.fetchone()
            if found is None:
                continue
            # The catalog's own definition, renamed: "CREATE INDEX <name> ON ..." -> "... CONCURRENTLY <copy> ON".
            copy = f"bench_copy_of_{name}"
            definition = str(found[0]).replace(
                f"CREATE INDEX {name} ON", f"CREATE INDEX CONCURRENTLY {copy} ON", 1
            )
            started = time.perf_counter()
            await conn.execute(cast(LiteralString, definition))
            seconds[name] = time.perf_counter() - started
            await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(copy)))
    return seconds


def _ms(values: Sequence[float], p: float) -> str:
    return f"{percentile(values, p):.1f}" if values else "-"


def report(sides: Sequence[Side], plans: dict[str, list[PlanReport]], truths: dict[str, int | None]) -> bool:
    """Print the figures; True when every loaded p95 is within the target and no plan reads sequentially."""
    empty, loaded = sides
    ok = True
    print(
        f"\n{loaded.exports:,} exports on the loaded side ({len(loaded.scopes)} tenants; the one measured holds "
        f"about {int(loaded.exports * 0.85):,}), none on the empty side; cpus {os.cpu_count()}, load "
        f"{os.getloadavg()[0]:.1f}; bound {loaded.settings.list_query_timeout_ms} ms per read, exact counts up "
        f"to {loaded.settings.list_exact_count_limit:,}"
    )
    for page in PAGES:
        kinds = sorted({k for (p, k, _c) in loaded.times if p == page.name})
        print(f"\n== {page.name}: per request kind, every case and round (ms)")
        print(
            f"{'request':<22} {'n':>5} {'empty p50':>10} {'empty p95':>10} {'loaded p50':>11} {'loaded p95':>11}  target 300 ms  past bound"
        )
        for kind in kinds:
            e = [t for (p, k, _c), ts in empty.times.items() if p == page.name and k == kind for t in ts]
            lo = [t for (p, k, _c), ts in loaded.times.items() if p == page.name and k == kind for t in ts]
            slow = sum(n for (p, k, _c), n in loaded.too_slow.items() if p == page.name and k == kind)
            verdict = "ok" if percentile(lo, 95) <= TARGET_P95_MS else "OVER"
            ok &= verdict == "ok"
            print(
                f"{kind:<22} {len(lo):>5} {_ms(e, 50):>10} {_ms(e, 95):>10} {_ms(lo, 50):>11} {_ms(lo, 95):>11}  {verdict:<13}  {slow}"
            )
        ordered = [k for k in dict.fromkeys(r.kind for r in page.requests(loaded))]
        print(f"\n-- {page.name}, loaded side, per case: p50/p95 ms of {' / '.join(ordered)}")
        print(
            f"{'case':<42} "
            + " ".join(f"{k[:13]:>13}" for k in ordered)
            + f"  {'shown':<22} {'true count':>11}  page read by / count read by"
        )
        by_case: dict[str, list[PlanReport]] = {}
        for found in plans.get(page.name, []):
            by_case.setdefault(found.case, []).append(found)
        for case in dict.fromkeys(r.case for r in page.requests(loaded)):
            cells = []
            for kind in ordered:
                ts = loaded.times.get((page.name, kind, case), [])
                cells.append(f"{_ms(ts, 50)}/{_ms(ts, 95)}" if ts else "-")
            shown = loaded.shown.get((page.name, ordered[0], case), "")
            found = by_case.get(case, [])
            page_read = {i for r in found if r.what == "page" for i in r.indexes}
            count_read = {i for r in found if r.what != "page" for i in r.indexes}
            read = f"{', '.join(sorted(page_read)) or '-'} / {', '.join(sorted(count_read)) or '-'}"
            if page is AUDIT_LOG:
                read += "".join(f" ({r.rows_read:,.0f} rows, {r.buffers:,} buffers)" for r in found)
            if any(r.seq_scans for r in found):
                read += " SEQUENTIAL"
            truth = truths.get(case) if page is EXPORT_LIST else None
            print(
                f"{case:<42} "
                + " ".join(f"{c:>13}" for c in cells)
                + f"  {shown:<22} {'' if truth is None else f'{truth:,}':>11}  {read}"
            )
        sequential = [f"{r.case} ({r.what})" for r in plans.get(page.name, []) if r.seq_scans]
        ok &= not sequential
        print(
            f"\nplans that read {' or '.join(SCANNED)} sequentially on the loaded side: {', '.join(sequential) or 'none'}"
        )
        print("\nEXPLAIN (ANALYZE, BUFFERS) on the loaded side, a few cases:")
        for found in plans.get(page.name, []):
            if found.case in SHOWN_PLANS:
                print(f"-- {found.case} ({found.what}): {found.execution_ms:.2f} ms")
                for line in top_nodes(found.text):
                    print(f"   {line}")
    return ok


SHOWN_PLANS = (
    "first page",
    "principal operator-01, action pause",
    "one export (ID only, as the console asks)",
    "one export (kind and ID)",
    "status OutcomeUnknown",
    "statuses Failed+OutcomeUnknown",
    f"list {RARE_LIST} (1 in 200,003)",
    "ID prefix of 4",
    "rarest destination, list-50, Rejected",
    "no filter, a page mid-history",
)


async def console_bench(
    exports: int, tenants: int, destinations: int, rounds: int, shared_buffers: str, chunk: int
) -> bool:
    """Load the history, serve both sides, measure every page, print the figures."""
    settings = Settings()
    with postgres_server(settings=(f"shared_buffers={shared_buffers}",)) as server_url:
        template = make_template(server_url)
        empty = Side("empty", clone_database(server_url, template), [], 0, settings)
        loaded = Side("loaded", clone_database(server_url, template), [], exports, settings)
        for side in (empty, loaded):
            side.scopes = await seed_console_tenants(side.database.admin_url, tenants, destinations)
        say(f"loading {exports:,} exports")
        seconds = await asyncio.to_thread(
            load_console_history,
            loaded.database.admin_url,
            loaded.scopes,
            total=exports,
            live=max(exports // 200, 1),
            chunk=chunk,
            progress=say,
        )
        size = await loaded.admin(
            "SELECT pg_size_pretty(pg_relation_size('export_jobs')),"
            " pg_size_pretty(pg_indexes_size('export_jobs')), current_setting('shared_buffers')"
        )
        say(
            f"loaded in {seconds:.0f} s; export_jobs {size[0][0]} and its indexes {size[0][1]}; shared_buffers {size[0][2]}"
        )
        some = await loaded.admin(
            "SELECT id FROM export_jobs WHERE tenant_id = %(t)s"
            " AND created_at < now() - make_interval(secs => %(half)s)"
            " ORDER BY created_at DESC, id DESC LIMIT 1",
            {"t": loaded.tenant.tenant_id, "half": exports // 2},
        )
        if some:
            ID_PREFIX_SOURCE[0] = str(some[0][0])
        async with empty.serving(), loaded.serving():
            for page in PAGES:
                for side in (empty, loaded):
                    if page.load is not None:
                        await page.load(side)
            # One untimed pass first, as a console in use would have warmed its caches and pools.
            for page in PAGES:
                await measure((empty, loaded), page, 1, seed=0)
                for side in (empty, loaded):
                    side.times.clear()
                    side.too_slow.clear()
            for page in PAGES:
                await measure((empty, loaded), page, rounds)
            say("plans and true counts")
            plans = {
                page.name: [await explain(loaded, p) for p in await page.plans(loaded)] for page in PAGES
            }
            truths = {
                case.label: await true_count(loaded, case.build(loaded)) for case in CASES if not case.deep
            }
            builds = await index_builds(loaded)
    ok = report((empty, loaded), plans, truths)
    print(
        "\nCREATE INDEX CONCURRENTLY of a copy of each of 0027's indexes on the loaded side (what building them"
        " on a live table before the migration takes; docs/operations.md):"
    )
    for name, seconds in builds.items():
        print(f"   {name}: {seconds:.1f} s")
    return ok


def run_with_defaults() -> None:
    """``python -m bench console``: 10,000,000 exports against none."""
    asyncio.run(
        console_bench(
            exports=10_000_000, tenants=4, destinations=8, rounds=10, shared_buffers="1GB", chunk=500_000
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--exports", type=int, default=10_000_000)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--destinations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10, help="passes over every request, each side")
    parser.add_argument("--shared-buffers", default="1GB", help="the embedded server's shared_buffers")
    parser.add_argument("--chunk", type=int, default=500_000, help="exports loaded per statement")
    options = parser.parse_args()
    ok = asyncio.run(
        console_bench(
            options.exports,
            options.tenants,
            options.destinations,
            options.rounds,
            options.shared_buffers,
            options.chunk,
        )
    )
    raise SystemExit(0 if ok else 1)

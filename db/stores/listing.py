"""The export list's reads (role ``exports_api``; issue 26, item 5): a page of a tenant's exports under
optional filters, how many match per status (counted exactly up to a cap, or the planner's estimate), and
the list names of the console's filter. Each runs under :meth:`StoreBase._bounded`: past its bound it raises
:class:`db.errors.QueryTimedOut` instead of hanging, and its plan is custom to the filters given, so each
filter reads through its own index (0027).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from db.errors import QueryTimedOut
from db.queries import execute, fetch, send
from db.rows import CappedCountRow, NameRow, QueryPlanRow
from db.stores.base import StoreBase
from db.stores.reads import NO_BOUND_ID, NO_BOUND_TIME
from domain.listing import ExportFilter, id_range
from domain.models import ExportJob, JobStatus


def scope_params(filters: ExportFilter) -> dict[str, Any] | None:
    """The filters' parameters besides the statuses, as the statements bind them; ``None`` when the ID prefix
    can match no ID (then there is nothing to read)."""
    id_from = id_to = None
    if filters.id_prefix is not None:
        found = id_range(filters.id_prefix)
        if found is None:
            return None
        id_from, id_to = found
    return {
        "destination_id": filters.destination_id,
        "list_name": filters.list_name,
        "id_from": id_from,
        "id_to": id_to,
    }


def page_statement(
    tenant_id: UUID,
    *,
    limit: int,
    before: tuple[datetime, UUID] | None = None,
    filters: ExportFilter = ExportFilter(),
) -> tuple[str, dict[str, Any]] | None:
    """The statement a page runs and its parameters (``None``: nothing can match): ``page_tenant_jobs``, or
    ``page_tenant_jobs_by_status`` when statuses are asked for or a destination or a list is (every status,
    then). The benchmark and the plan tests explain exactly this."""
    scope = scope_params(filters)
    if scope is None:
        return None
    created_at, last_id = before or (NO_BOUND_TIME, NO_BOUND_ID)
    params = {"tenant_id": tenant_id, "before_created_at": created_at, "before_id": last_id, "limit": limit}
    params |= scope
    # A destination's and a list's index hold each status apart (0027): their pages merge a scan per status.
    statuses = filters.statuses or (tuple(JobStatus) if filters.destination_id or filters.list_name else ())
    if statuses:
        return "page_tenant_jobs_by_status", params | {"statuses": [s.value for s in statuses]}
    return "page_tenant_jobs", params


def count_params(
    tenant_id: UUID, status: JobStatus, *, filters: ExportFilter, cap: int
) -> dict[str, Any] | None:
    """``count_tenant_jobs_of_status``'s parameters (``None``: nothing can match); the filter's own statuses
    are ignored."""
    scope = scope_params(filters)
    if scope is None:
        return None
    return {"tenant_id": tenant_id, "status": status.value, "cap": cap, **scope}


@dataclass(frozen=True)
class StatusCounts:
    """The capped counts a budget allowed, in the order asked; ``complete`` when every status asked was
    counted (else the budget ran out, or a count ran past it, and the rest were not)."""

    counted: dict[JobStatus, int]
    complete: bool


def estimate_params(tenant_id: UUID, status: JobStatus, *, filters: ExportFilter) -> dict[str, Any] | None:
    """``estimate_tenant_jobs``'s parameters for one status (``None``: nothing can match)."""
    scope = scope_params(filters)
    if scope is None:
        return None
    return {"tenant_id": tenant_id, "status": status.value, **scope}


class ListingStatements(StoreBase):
    """The list, its counts and its list names, each bounded by the caller's ``timeout_ms``."""

    async def page_tenant_jobs(
        self,
        tenant_id: UUID,
        *,
        limit: int,
        timeout_ms: int,
        before: tuple[datetime, UUID] | None = None,
        filters: ExportFilter = ExportFilter(),
    ) -> list[ExportJob]:
        """One page of a tenant's exports, newest first, strictly after the keyset bound ``before`` (the last
        row of the previous page), under ``filters``. Raises ``QueryTimedOut`` past ``timeout_ms``."""
        statement = page_statement(tenant_id, limit=limit, before=before, filters=filters)
        if statement is None:
            return []
        name, params = statement
        if name == "page_tenant_jobs_by_status":
            return await self._bounded_rows("page_tenant_jobs_by_status", params, ExportJob, timeout_ms)
        return await self._bounded_rows("page_tenant_jobs", params, ExportJob, timeout_ms)

    async def estimate_tenant_jobs(
        self, tenant_id: UUID, statuses: list[JobStatus], *, filters: ExportFilter, timeout_ms: int
    ) -> dict[JobStatus, int]:
        """The planner's estimate, per status, of the tenant's exports that match ``filters`` (whose own
        statuses are ignored): reads only the statistics. Raises ``QueryTimedOut`` past ``timeout_ms``."""
        if scope_params(filters) is None:
            return dict.fromkeys(statuses, 0)
        async with self._bounded(timeout_ms) as conn:
            async with conn.pipeline():  # one round trip for them all
                sent = [
                    await send(
                        conn,
                        "estimate_tenant_jobs",
                        estimate_params(tenant_id, s, filters=filters) or {},
                        QueryPlanRow,
                    )
                    for s in statuses
                ]
            plans = [(await cur.fetchall())[0] for cur in sent]
        return {status: plan.estimated_rows for status, plan in zip(statuses, plans, strict=True)}

    async def count_tenant_jobs_by_status(
        self,
        tenant_id: UUID,
        statuses: list[JobStatus],
        *,
        filters: ExportFilter,
        cap: int,
        timeout_ms: int,
    ) -> StatusCounts:
        """How many of the tenant's exports of each of ``statuses`` match ``filters`` (whose own statuses are
        ignored), each counted up to ``cap + 1`` (``cap + 1`` means more than ``cap``), one after another in
        the order given, all within one budget of ``timeout_ms``: each count is bounded by what is left of it,
        and the statuses it does not reach are left out (``complete`` is then false)."""
        counted: dict[JobStatus, int] = {}
        if not statuses or scope_params(filters) is None:
            return StatusCounts(dict.fromkeys(statuses, 0), complete=True)
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            async with self._bounded(timeout_ms) as conn:
                for status in statuses:
                    left = int((deadline - time.monotonic()) * 1000)
                    if left < 1:
                        return StatusCounts(counted, complete=False)
                    await execute(conn, "bound_this_read", {"timeout": f"{left}ms"})
                    params = count_params(tenant_id, status, filters=filters, cap=cap) or {}
                    (row,) = await fetch(conn, "count_tenant_jobs_of_status", params, CappedCountRow)
                    counted[status] = row.counted
        except QueryTimedOut:
            return StatusCounts(counted, complete=False)
        return StatusCounts(counted, complete=True)

    async def count_tenant_jobs_in_scope(
        self, tenant_id: UUID, *, filters: ExportFilter, cap: int, timeout_ms: int
    ) -> dict[JobStatus, int]:
        """How many of the tenant's exports match ``filters`` (whose own statuses are ignored), per status, in
        one pass over at most ``cap + 1`` of them: counts adding up to ``cap + 1`` mean the pass stopped (no
        status's count is known then). Raises ``QueryTimedOut`` past ``timeout_ms``."""
        scope = scope_params(filters)
        if scope is None:
            return {}
        params = {"tenant_id": tenant_id, "cap": cap, **scope}
        rows = await self._bounded_rows("count_tenant_jobs_in_scope", params, CappedCountRow, timeout_ms)
        return {r.status: r.counted for r in rows}

    async def tenant_list_names(self, tenant_id: UUID, *, timeout_ms: int) -> list[str]:
        """The list names a tenant's exports use (at most 200), for the console's filter. Raises
        ``QueryTimedOut`` past ``timeout_ms``."""
        rows = await self._bounded_rows("tenant_list_names", {"tenant_id": tenant_id}, NameRow, timeout_ms)
        return [r.name for r in rows]

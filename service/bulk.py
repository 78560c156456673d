"""Bulk cancel: one operator action that cancels every live export of a destination (optionally of one
list), each export through its own cancellation request in the same ledger transaction as a single cancel.

The batch (who, when, the filter, why) and the exports it covers are recorded first, in one statement, so
the batch's scope is fixed. Each covered export then gets a request whose ID is derived from the batch ID
and the export ID (``uuid5``), so re-submitting the same batch ID replays what was recorded, records
nothing twice, and decides only the exports that were Busy (or never reached).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from uuid import UUID

from db.errors import UnknownReference
from db.rows import CancellationBatch
from db.stores.api import ApiStore
from domain.models import CancellationOutcome, CancellationResult, JobStatus
from observability.metrics import CancellationSource, get_metrics
from service.auth import Caller
from service.commands import BulkCancel
from service.outcomes import Answer, Kind, refusal
from service.signals import StopSignaller, signal_stop_best_effort

RETRY_AFTER_SECONDS = 2
LANES = 4  # connections a batch uses at once; each export's row lock is held for one round trip
SIGNALS_AT_ONCE = 8

# Outcomes in the order people read them, with the words the summary uses.
_WORDS: dict[CancellationOutcome, str] = {
    CancellationOutcome.CANCELED_WHILE_QUEUED: "canceled while queued",
    CancellationOutcome.STOP_REQUESTED: "stop requested",
    CancellationOutcome.STOP_ALREADY_REQUESTED: "stop already requested",
    CancellationOutcome.ALREADY_CANCELED: "already canceled",
    CancellationOutcome.ALREADY_ENDED: "already ended",
    CancellationOutcome.TOO_LATE: "too late (delivery already authorized)",
    CancellationOutcome.REQUEST_ID_REUSED: "request ID reused (not recorded)",
    CancellationOutcome.NOT_FOUND: "not found (not recorded)",
    CancellationOutcome.BUSY: "busy (not recorded)",
}


def request_id_for(batch_id: UUID, job_id: UUID) -> UUID:
    """The request ID of one export's request in a batch: the same for every submission of the batch."""
    return uuid.uuid5(batch_id, str(job_id))


def summary(matched: int, counts: dict[CancellationOutcome, int]) -> str:
    """One sentence for people: how many matched and what each came to."""
    parts = [f"{counts[o]:,} {words}" for o, words in _WORDS.items() if counts.get(o)]
    noun = "export" if matched == 1 else "exports"
    text = f"{matched:,} live {noun} matched" + (f": {', '.join(parts)}." if parts else ".")
    if counts.get(CancellationOutcome.BUSY):
        text += (
            " The busy ones recorded nothing: retry with the same batch ID to decide them;"
            " nothing is recorded twice."
        )
    return text


def _batch_json(batch: CancellationBatch) -> dict[str, Any]:
    return {
        "batch_id": str(batch.id),
        "requested_by": batch.requested_by,
        "reason": batch.reason,
        "recorded_at": batch.recorded_at.isoformat(),
        "filter": {"destination_id": str(batch.destination_id), "list_name": batch.list_name},
        "matched": batch.matched,
    }


class BulkCancels:
    """Bulk cancel over an ``exports_api`` store, signalling each attempt it asked to stop."""

    def __init__(self, store: ApiStore, signaller: StopSignaller, *, lock_timeout: str, lanes: int = LANES):
        self.store = store
        self.signaller = signaller
        self.lock_timeout = lock_timeout
        self.lanes = lanes

    async def preview(self, caller: Caller, destination_id: UUID, list_name: str | None) -> Answer:
        """How many live exports a bulk cancel with this filter would cover now, by status."""
        counts = await self.store.count_live_exports(caller.tenant_id, destination_id, list_name)
        by_status = {
            s.value: counts.get(s, 0) for s in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DELIVERING)
        }
        return Answer(
            Kind.DONE,
            {
                "filter": {"destination_id": str(destination_id), "list_name": list_name},
                "matching": sum(by_status.values()),
                "by_status": by_status,
            },
        )

    async def submit(
        self, caller: Caller, body: BulkCancel, *, source: CancellationSource = CancellationSource.API
    ) -> Answer:
        """Record the batch (or find it), decide every covered export that has no request yet, and
        answer with the counts of every outcome recorded for the batch and the Busy ones."""
        try:
            batch, created = await self.store.record_cancellation_batch(
                tenant_id=caller.tenant_id,
                batch_id=body.batch_id,
                requested_by=caller.principal,
                reason=body.reason,
                destination_id=body.destination_id,
                list_name=body.list_name,
            )
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        if not created and (batch.requested_by, batch.destination_id, batch.list_name) != (
            caller.principal,
            body.destination_id,
            body.list_name,
        ):
            # A client error, like a reused request ID; says nothing about the other batch.
            return refusal(
                Kind.MALFORMED,
                "this batch ID belongs to a different bulk cancel; use a new one",
                batch_id=str(body.batch_id),
            )
        pending = await self.store.batch_jobs_without_request(caller.tenant_id, batch.id)
        results = await self.store.request_cancellations(
            tenant_id=caller.tenant_id,
            batch_id=batch.id,
            requests=[(job_id, request_id_for(batch.id, job_id)) for job_id in pending],
            requested_by=batch.requested_by,
            reason=batch.reason,
            lock_timeout=self.lock_timeout,
            concurrency=self.lanes,
        )
        for result in results:
            get_metrics().observe_cancellation(
                result.outcome.value, source=source, tenant_id=caller.tenant_id
            )
        await self._signal_stops(results)
        return await self._answer(caller, batch, results, replayed=not created)

    async def read(self, caller: Caller, batch_id: UUID) -> Answer:
        """A batch as recorded: its counts, and the exports it covers that have no request yet."""
        batch = await self.store.find_cancellation_batch(caller.tenant_id, batch_id)
        if batch is None:
            return refusal(Kind.NOT_FOUND, "no such cancellation batch")
        return await self._answer(caller, batch, None, replayed=True)

    async def _answer(
        self,
        caller: Caller,
        batch: CancellationBatch,
        results: list[CancellationResult] | None,
        *,
        replayed: bool,
    ) -> Answer:
        counts = dict(await self.store.batch_outcomes(caller.tenant_id, batch.id))
        undecided = await self.store.batch_jobs_without_request(caller.tenant_id, batch.id)
        decided_now = {r.request_id: r for r in results or []}
        for job_id in undecided:
            result = decided_now.get(request_id_for(batch.id, job_id))
            outcome = result.outcome if result is not None else CancellationOutcome.BUSY
            counts[outcome] = counts.get(outcome, 0) + 1
        busy = [
            {"export_id": str(job_id), "request_id": str(request_id_for(batch.id, job_id))}
            for job_id in undecided
        ]
        body = {
            **_batch_json(batch),
            "replayed": replayed,
            "outcomes": {o.value: n for o, n in counts.items() if n},
            "busy": busy,
            "complete": not busy,
            "message": summary(batch.matched, counts),
        }
        location = f"/cancellation-batches/{batch.id}"
        if busy:
            return Answer(Kind.PARTIAL, body, location=location, retry_after_seconds=RETRY_AFTER_SECONDS)
        return Answer(Kind.DONE if replayed else Kind.CREATED, body, location=location)

    async def _signal_stops(self, results: list[CancellationResult]) -> None:
        """Tell each attempt this batch asked to stop (for speed only: cutoff 2 enforces the stop)."""
        gate = asyncio.Semaphore(SIGNALS_AT_ONCE)

        async def signal(result: CancellationResult) -> None:
            assert result.job is not None
            async with gate:
                await signal_stop_best_effort(self.signaller, result.job.workflow_id, result.request_id)

        await asyncio.gather(
            *(
                signal(r)
                for r in results
                if r.outcome == CancellationOutcome.STOP_REQUESTED and not r.replayed and r.job is not None
            )
        )

"""Bulk cancel: one operator action that cancels the live exports of a destination (optionally of one
list), each export through its own cancellation request in the same ledger transaction as a single cancel.

The preview counts the live exports and keeps that exact set under a token bound to the tenant and the
caller; a batch submitted with the token covers exactly that set, so what the operator confirmed is what
is cancelled (an export that became live since is not touched, and the answer names it). The batch (who,
when, the filter, why) and the exports it covers are recorded first, in one statement, so the batch's scope
is fixed. Each covered export then gets a request whose ID is derived from the batch ID and the export ID
(``uuid5``), so re-submitting the same batch ID replays what was recorded, records nothing twice, and
decides only the exports that were Busy (or never reached). Every submission signals the batch's stop
requests that no submission has signalled yet, read from the ledger, so a stop request whose answer a lost
connection swallowed is signalled by the replay.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from db.errors import TransientStoreError, UnknownReference
from db.rows import CancellationBatch, StopToSignal
from db.stores.api import ApiStore
from domain.models import CancellationOutcome, CancellationResult, JobStatus
from observability.metrics import CancellationSource, get_metrics
from service.auth import Caller
from service.commands import BulkCancel
from service.outcomes import Answer, Kind, refusal
from service.signals import NoSignaller, StopSignaller, signal_stop_best_effort

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2
LANES = 4  # connections a batch uses at once; each export's row lock is held for one round trip
SIGNALS_AT_ONCE = 8
PREVIEW_TTL_SECONDS = 15 * 60  # how long a preview's set may be confirmed
NAMED_IN_SENTENCE = 10  # export IDs a sentence names before "and N more" (the JSON lists them all)
LIVE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DELIVERING)

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


def untouched(batch: CancellationBatch, not_covered: list[UUID]) -> str:
    """One sentence naming the live exports of the batch's filter that it does not cover, or nothing."""
    if not not_covered:
        return ""
    n = len(not_covered)
    named = ", ".join(str(j)[:8] for j in not_covered[:NAMED_IN_SENTENCE])
    more = f" and {n - NAMED_IN_SENTENCE:,} more" if n > NAMED_IN_SENTENCE else ""
    noun, verb = ("export", "was") if n == 1 else ("exports", "were")
    if batch.preview_id is not None:
        return f" {n:,} live {noun} not in the previewed set {verb} not touched: {named}{more}."
    return f" {n:,} {noun} that became live after the batch was recorded {verb} not touched: {named}{more}."


def _batch_json(batch: CancellationBatch) -> dict[str, Any]:
    return {
        "batch_id": str(batch.id),
        "requested_by": batch.requested_by,
        "reason": batch.reason,
        "recorded_at": batch.recorded_at.isoformat(),
        "filter": {"destination_id": str(batch.destination_id), "list_name": batch.list_name},
        "preview_token": str(batch.preview_id) if batch.preview_id else None,
        "matched": batch.matched,
    }


@dataclass(frozen=True)
class _Standing:
    """A batch as the ledger records it now: each outcome's count (its undecided exports as Busy, or as
    what this submission was told for the ones it could not record), the undecided ones, and the live
    exports of its filter it does not cover."""

    counts: dict[CancellationOutcome, int]
    undecided: list[UUID]
    not_covered: list[UUID]


class BulkCancels:
    """Bulk cancel over an ``exports_api`` store, signalling each attempt it asked to stop."""

    def __init__(self, store: ApiStore, signaller: StopSignaller, *, lock_timeout: str, lanes: int = LANES):
        self.store = store
        self.signaller = signaller
        self.lock_timeout = lock_timeout
        self.lanes = lanes

    async def preview(self, caller: Caller, destination_id: UUID, list_name: str | None) -> Answer:
        """The live exports a bulk cancel with this filter would cover now, by status and by ID, and a
        token for exactly that set: a batch submitted with it cancels those and nothing else."""
        rows = await self.store.record_cancellation_preview(
            tenant_id=caller.tenant_id,
            previewed_by=caller.principal,
            destination_id=destination_id,
            list_name=list_name,
            ttl_seconds=PREVIEW_TTL_SECONDS,
        )
        by_status = {s.value: 0 for s in LIVE}
        for row in rows:
            by_status[row.status.value] += 1
        kept = rows[0] if rows else None
        return Answer(
            Kind.DONE,
            {
                "filter": {"destination_id": str(destination_id), "list_name": list_name},
                "matching": len(rows),
                "by_status": by_status,
                "export_ids": [str(r.job_id) for r in rows],
                "preview_token": str(kept.preview_id) if kept and kept.preview_id else None,
                "expires_at": kept.expires_at.isoformat() if kept and kept.expires_at else None,
            },
        )

    async def submit(
        self, caller: Caller, body: BulkCancel, *, source: CancellationSource = CancellationSource.API
    ) -> Answer:
        """Record the batch (or find it), decide every covered export that has no request yet, signal the
        stop requests not signalled yet, and answer with the counts of every outcome recorded for the batch,
        the Busy ones, and the live exports it does not cover."""
        try:
            recorded = await self.store.record_cancellation_batch(
                tenant_id=caller.tenant_id,
                batch_id=body.batch_id,
                requested_by=caller.principal,
                reason=body.reason,
                destination_id=body.destination_id,
                list_name=body.list_name,
                preview_id=body.preview_token,
            )
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        if recorded is None:
            # Another tenant's token, another caller's, another filter's, or an expired one: all look alike.
            return refusal(
                Kind.INVALID,
                "preview_token: no preview of this destination and list by you in this tenant, or it expired;"
                " preview again and confirm what it counts",
            )
        batch, created = recorded
        if not created and (batch.requested_by, batch.destination_id, batch.list_name, batch.preview_id) != (
            caller.principal,
            body.destination_id,
            body.list_name,
            body.preview_token,
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
        await self._signal_stops(caller.tenant_id, batch.id)
        standing = await self._standing(caller, batch, results)
        # Each export's answer, as the ledger recorded it (a replayed one again, as a single cancel's replay
        # is), never a Busy for a request whose answer a lost connection swallowed.
        for outcome, n in standing.counts.items():
            for _ in range(n):
                get_metrics().observe_cancellation(outcome.value, source=source, tenant_id=caller.tenant_id)
        return self._answer(batch, standing, replayed=not created)

    async def read(self, caller: Caller, batch_id: UUID) -> Answer:
        """A batch as recorded: its counts, the exports it covers that have no request yet, and the live
        exports of its filter it does not cover."""
        batch = await self.store.find_cancellation_batch(caller.tenant_id, batch_id)
        if batch is None:
            return refusal(Kind.NOT_FOUND, "no such cancellation batch")
        return self._answer(batch, await self._standing(caller, batch, None), replayed=True)

    async def _standing(
        self, caller: Caller, batch: CancellationBatch, results: list[CancellationResult] | None
    ) -> _Standing:
        counts = dict(await self.store.batch_outcomes(caller.tenant_id, batch.id))
        undecided = await self.store.batch_jobs_without_request(caller.tenant_id, batch.id)
        decided_now = {r.request_id: r for r in results or []}
        for job_id in undecided:
            result = decided_now.get(request_id_for(batch.id, job_id))
            outcome = result.outcome if result is not None else CancellationOutcome.BUSY
            counts[outcome] = counts.get(outcome, 0) + 1
        not_covered = await self.store.batch_live_exports_not_covered(caller.tenant_id, batch.id)
        return _Standing({o: n for o, n in counts.items() if n}, undecided, not_covered)

    def _answer(self, batch: CancellationBatch, standing: _Standing, *, replayed: bool) -> Answer:
        busy = [
            {"export_id": str(job_id), "request_id": str(request_id_for(batch.id, job_id))}
            for job_id in standing.undecided
        ]
        body = {
            **_batch_json(batch),
            "replayed": replayed,
            "outcomes": {o.value: n for o, n in standing.counts.items()},
            "busy": busy,
            "complete": not busy,
            "not_in_preview": [str(j) for j in standing.not_covered],
            "message": summary(batch.matched, standing.counts) + untouched(batch, standing.not_covered),
        }
        location = f"/cancellation-batches/{batch.id}"
        if busy:
            return Answer(Kind.PARTIAL, body, location=location, retry_after_seconds=RETRY_AFTER_SECONDS)
        return Answer(Kind.DONE if replayed else Kind.CREATED, body, location=location)

    async def _signal_stops(self, tenant_id: UUID, batch_id: UUID) -> None:
        """Tell each attempt this batch asked to stop and no submission has told yet (for speed only:
        cutoff 2 enforces the stop), and record the signals Temporal took so no replay repeats them."""
        stops = await self.store.batch_stops_to_signal(tenant_id, batch_id)
        gate = asyncio.Semaphore(SIGNALS_AT_ONCE)

        async def signal(stop: StopToSignal) -> bool:
            async with gate:
                return await signal_stop_best_effort(self.signaller, stop.workflow_id, stop.request_id)

        delivered = await asyncio.gather(*(signal(s) for s in stops))
        if isinstance(self.signaller, NoSignaller):
            return  # nothing was sent: a later submission through Temporal still signals them
        try:
            await self.store.record_stop_signals(
                tenant_id, [s for s, ok in zip(stops, delivered, strict=True) if ok]
            )
        except TransientStoreError as exc:
            # The signals went; without their record a later submission of the batch sends them again,
            # which the workflow confirms against the row like any signal.
            log.warning(
                "batch %s: the stop signals sent were not recorded (%s)", batch_id, type(exc).__name__
            )

"""Recovery's activities: take over expired leases, one conditional statement per case (000 "Recovery").

The scan only nominates. Each takeover repeats every condition the scan relied on, so a renewal that
commits after the scan makes it match nothing, and the job is left to its worker:

- Running, no stop request, under the attempt cap: back to Queued with a new outbox row.
- Running with a recorded stop request: Stopped.
- Running at the attempt cap: Failed with AttemptsExhausted.
- Delivering whose rename fence was never written: Failed NotDelivered (the final name was never
  written by it: it sent nothing, or only a temporary file).
- Delivering otherwise: resolved from evidence, never stopped or retried. Completed only when the
  destination or a receipt the attempt appended matches the expected file recorded at cutoff 2. An
  absent file is never a reason for Failed on its own: a paused worker can still rename. So before an
  OutcomeUnknown recovery moves the attempt's temporary file to its set-aside name: once it is there, that
  rename can never publish it, and a final name that still shows the attempt's baseline is Failed
  NotDelivered (``fail_set_aside_delivery``). Otherwise OutcomeUnknown. What recovery observed and what its
  move found are appended as DeliveryEvidence under the recovery run's ID.
- After either Failed NotDelivered, under the partner's cleanup agreement (``temporary_files``), the
  attempt's temporary and set-aside files are removed, and what that found is appended too.

Every session recovery opens with a partner is opened under one of the partner's session slots (issue #25.3),
so recovery never takes the partner past its limit either: the slot the expired attempt held is taken over
for its takeover (and given back if the attempt renewed meanwhile), any other is taken like a connection
test's, for a bounded time. With no free slot the job waits for the next run (``WaitingForSlot``).

After its takeovers a run settles the OutcomeUnknowns whose own fences prove the attempt never sent its
rename (issue 23: upload fenced, no rename fence) as Failed NotDelivered with ``settle_unknown_by_fences``,
asking no partner. Then it answers the reconcilers' requests for today's listing of a final name (0033: the
API records them and holds no partner credentials): one listing each, unless the partner's deliveries are
paused, appended as the attempt's DeliveryEvidence observed by ``reconciler-request:<request id>``, with how
recovery's rules read it; it settles nothing, a person does. Then it re-checks OutcomeUnknowns whose partner did not answer (0013: recovery never
listed it, or its last listing or move got no answer), at most every ``recovery_recheck_minutes`` each, for
``recovery_recheck_hours`` after they were recorded: the same listing, set-aside and rules as a Delivering
takeover, and when they now settle it, ``settle_unknown_by_evidence`` records that as the attempt's one
reconciliation. A partner that answered without settling it leaves it to a person.

Runs as ``exports_recovery``. Payloads and evidence carry IDs, sizes, hashes and codes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from temporalio import activity

from activities.heartbeat import keep_heartbeating
from db.errors import StoreError
from db.rows import ListingToAnswer
from db.stores.recovery import RecoveryStore
from db.stores.slots import RECOVERY
from domain.destination import Destination
from domain.evidence import Observation, SetAside
from domain.manifest import IN_PLACE_RESULTS, manifests_for_job, manifests_in_place
from domain.models import ExpiredLease, ExportJob, JobStatus, UnknownToRecheck
from observability import logs
from partner.protocol import PartnerFor
from rules.ownership import held_by
from rules.recovery import (
    LISTING_REQUEST_OBSERVER_PREFIX,
    LISTING_REQUEST_WINDOW_SECONDS,
    RECOVERY_OBSERVER_PREFIX,
    Verdict,
    attempt_evidence,
    decide_after_set_aside,
    decide_delivery,
    fences_prove_never_renamed,
    listing_request_observer,
    may_set_aside,
    observation_evidence,
    requested_listing_evidence,
    set_aside_evidence,
)
from settings import Settings
from workflows.models import Recheck, RecheckInput, RecoveryBatchInput, RecoveryBatchResult, Takeover

log = logging.getLogger(__name__)

OBSERVE_TIMEOUT_SECONDS = 60.0  # a listing (and read-back) that takes longer is "not observed"
OBSERVE_RETRY_SECONDS = 2.0  # the pause before the next listing, times the tries so far


# -- the activities --------------------------------------------------------------------------------

_Decided = TypeVar("_Decided", Takeover, Recheck, bool)


async def _alone(
    what: str, job_id: UUID, attempt_id: UUID, deciding: Coroutine[Any, Any, _Decided], error: _Decided
) -> _Decided:
    """``deciding``'s answer, or ``error`` when it raised: one job's error is its alone, logged with its type
    only (a message can carry a row's values), and the job is left for a later run. ``CancelledError`` is no
    ``Exception``: it ends the batch."""
    with logs.bind(job_id=job_id, attempt_id=attempt_id):
        try:
            return await deciding
        except (StoreError, OSError, TimeoutError) as exc:
            log.warning(
                "%s of job %s attempt %s not decided (%s)", what, job_id, attempt_id, type(exc).__name__
            )
            return error
        except Exception as exc:  # noqa: BLE001 - a defect or an unreadable row must not cost the batch
            log.error(
                "%s of job %s attempt %s failed unexpectedly (%s); left for the next run",
                what,
                job_id,
                attempt_id,
                type(exc).__name__,
            )
            return error


Observe = Callable[[Destination, str], Observation]
SetAsideAt = Callable[[Destination, UUID, str], tuple[SetAside, Observation]]


@dataclass
class SlotHold:
    """Recovery's hold of one of a partner's session slots: ``ok`` when its sessions may be opened (a slot is
    held, or the partner has no limit); ``return_to`` (an attempt and its job) gives an adopted slot back to
    the attempt it came from when recovery leaves that attempt alone after all."""

    ok: bool
    return_to: tuple[UUID, UUID] | None = None


class RecoveryActivities:
    """Recovery's activities over a worker store. ``partners`` picks each destination's partner
    (``partner.kinds.partner_for``, injected). ``observe`` lists the final name on the destination
    (default the partner's ``observe_final_name``) and ``set_aside`` moves an attempt's temporary file
    aside (default the partner's ``set_aside_for_recovery``): test seams, never replacements for the
    server."""

    def __init__(
        self,
        store: RecoveryStore,
        settings: Settings,
        *,
        partners: PartnerFor,
        observe: Observe | None = None,
        set_aside: SetAsideAt | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.partners = partners
        self._observe: Observe = observe or (lambda d, name: partners(d).observe_final_name(d, name))
        self._set_aside_at: SetAsideAt = set_aside or (
            lambda d, attempt_id, name: partners(d).set_aside_for_recovery(d, attempt_id, name)
        )
        # Test seam: while true, the batch sends no heartbeat (a stalled, e.g. SIGSTOPped, worker).
        self.heartbeats_paused: Callable[[], bool] = lambda: False

    def activities(self) -> list[Callable[..., Any]]:
        """The activities to register on the shared task queue."""
        return [self.recover_expired_leases, self.recheck_unknown_outcomes]

    @activity.defn(name="recover_expired_leases")
    async def recover_expired_leases(self, inp: RecoveryBatchInput) -> RecoveryBatchResult:
        """Scan one batch of expired leases and apply the conditional takeover for each candidate.

        Candidates are independent (each takeover is one conditional statement on its own row), so all
        are decided at once, at most ``recovery_concurrency`` of those that list their partner: a
        Delivering one waits on its partner's listing without holding up the Running ones behind it. The activity heartbeats on a timer, not per
        candidate, so a short heartbeat timeout moves a batch stuck on a paused worker to another one.
        """
        result = RecoveryBatchResult()
        candidates = await self.store.find_expired_leases(limit=inp.limit)
        result.scanned = len(candidates)
        listings = asyncio.Semaphore(max(1, self.settings.recovery_concurrency))

        async def decide(candidate: ExpiredLease) -> None:
            # Only a candidate that asks its partner takes a slot: the others are one statement each (the
            # pool bounds those), so a Running one never waits behind listings that hang.
            asks_partner = candidate.status == JobStatus.DELIVERING and not candidate.unpublished
            async with listings if asks_partner else contextlib.nullcontext():
                takeover = await self.take_over(candidate, inp.recovery_run_id)
            log.info("recovery %s: job %s %s", inp.recovery_run_id, candidate.id, takeover.value)
            result.count(takeover)

        beat = asyncio.create_task(
            keep_heartbeating(
                lambda: {"scanned": result.scanned, "taken_over": result.taken_over}, self.heartbeats_paused
            )
        )
        try:
            await asyncio.gather(*(decide(candidate) for candidate in candidates))
        finally:
            beat.cancel()
        return result

    async def take_over(self, candidate: ExpiredLease, recovery_run_id: str) -> Takeover:
        """Apply the one takeover statement this candidate's case calls for.

        Any error while deciding it is this job's alone (issue 10.6): logged with its type only (a message
        can carry a row's values), counted as ``Takeover.ERROR``, and the job left for the next run, while
        the batch's other candidates are still taken over. Every takeover is one conditional statement, so
        an error before it wrote nothing, and one after it cannot undo it. Cancellation is not an error: an
        ``asyncio.CancelledError`` is no ``Exception`` and ends the batch.
        """
        return await _alone(
            "recovery",
            candidate.id,
            candidate.attempt_id,
            self._take_over(candidate, recovery_run_id),
            Takeover.ERROR,
        )

    async def _take_over(self, candidate: ExpiredLease, run_id: str) -> Takeover:
        job_id, attempt_id = candidate.id, candidate.attempt_id
        max_attempts = self.settings.max_attempts
        if candidate.status == JobStatus.RUNNING:
            # Running means cutoff 2 never committed: nothing was delivered by this attempt.
            if candidate.stop_request_id is not None:
                done = await self.store.stop_expired_attempt(job_id, attempt_id, run_id)
                return Takeover.STOPPED if done else Takeover.MATCHED_NOTHING
            # Attempts given back by a drain or a pause do not count towards the cap.
            if candidate.attempt_count - candidate.attempts_released < max_attempts:
                done = await self.store.requeue_expired_attempt(job_id, attempt_id, max_attempts, run_id)
                return Takeover.REQUEUED if done else Takeover.MATCHED_NOTHING
            done = await self.store.exhaust_expired_attempt(job_id, attempt_id, max_attempts, run_id)
            return Takeover.EXHAUSTED if done else Takeover.MATCHED_NOTHING
        if candidate.status == JobStatus.DELIVERING:
            if candidate.unpublished:
                # The attempt never fenced its rename, so it never wrote the final name; the statement also
                # refuses a late fence. If a fence or a renewal committed since the scan, it matches nothing.
                done = await self.store.fail_unpublished_delivery(job_id, attempt_id, run_id)
                if not done:
                    return Takeover.MATCHED_NOTHING
                await self._clean_up(job_id, attempt_id, run_id)
                return Takeover.NOT_DELIVERED
            return await self._resolve_delivery(candidate, run_id)
        return Takeover.MATCHED_NOTHING

    async def _resolve_delivery(self, candidate: ExpiredLease, run_id: str) -> Takeover:
        job = await self.store.get_job(candidate.id)
        if not held_by(job, candidate.attempt_id, JobStatus.DELIVERING):
            return Takeover.MATCHED_NOTHING
        if not await self.store.delivery_scope_open(job.tenant_id, job.destination_id):
            # Only the partner can settle it, and its deliveries are paused (a compromise, an incident):
            # no session is opened to it, not even to list. It waits, Delivering, for the resume (23.5).
            return Takeover.WAITING_FOR_RESUME
        # The expired attempt's slot serves its takeover (25.3): recovery's sessions replace its session.
        async with self._slot(job, adopt=candidate.attempt_id) as hold:
            if not hold.ok:
                return Takeover.WAITING_FOR_SLOT
            takeover = await self._resolve_with_partner(job, candidate, run_id)
            if takeover == Takeover.MATCHED_NOTHING:
                hold.return_to = (candidate.attempt_id, job.id)  # it renewed: its slot is its own again
            return takeover

    async def _resolve_with_partner(self, job: ExportJob, candidate: ExpiredLease, run_id: str) -> Takeover:
        verdict = await self._decide_from_evidence(job, run_id, tries=self.settings.recovery_observe_tries)
        if verdict is None:
            return Takeover.MATCHED_NOTHING
        if verdict.resolution == JobStatus.FAILED:  # only after the set-aside (decide_after_set_aside)
            done = await self.store.fail_set_aside_delivery(
                job.id, candidate.attempt_id, run_id, verdict.summary
            )
            if not done:
                return Takeover.MATCHED_NOTHING
            await self._clean_up(job.id, candidate.attempt_id, run_id, slot_held=True)
            return Takeover.NOT_DELIVERED
        done = await self.store.resolve_expired_delivery(
            job.id, candidate.attempt_id, verdict.resolution, run_id, verdict.summary
        )
        if not done:
            return Takeover.MATCHED_NOTHING
        return Takeover.COMPLETED if verdict.resolution == JobStatus.COMPLETED else Takeover.OUTCOME_UNKNOWN

    @contextlib.asynccontextmanager
    async def _slot(self, job: ExportJob, *, adopt: UUID | None) -> AsyncIterator[SlotHold]:
        """One of ``job``'s partner's session slots for recovery's sessions, held while the block runs (at most
        ``session_hold_seconds``): a free one, else the one ``adopt`` (the expired attempt) holds, taken over.
        A free one first: an attempt whose lease lapsed (its database unreachable a while) may still be alive
        and using its session, and its slot is taken over only when every other one is held (else expired
        attempts holding every slot would wait forever for one). Not ``ok`` when none can be had; ``ok``
        without a slot when the partner has no limit."""
        holder = uuid.uuid4()
        answer = await self.store.take_session_slot(
            job.tenant_id,
            job.destination_id,
            holder,
            purpose=RECOVERY,
            hold_seconds=self.settings.session_hold_seconds,
            adopt=adopt,
        )
        hold = SlotHold(ok=answer.max_sessions is None or answer.slot is not None)
        try:
            yield hold
        finally:
            if answer.slot is not None:
                back = hold.return_to if answer.adopted else None  # only a slot taken over goes back
                with contextlib.suppress(StoreError):  # a slot not released expires by itself
                    await self.store.release_session_slot(
                        holder,
                        return_to=back[0] if back else None,
                        return_job_id=back[1] if back else None,
                    )

    async def _decide_from_evidence(self, job: ExportJob, run_id: str, *, tries: int) -> Verdict | None:
        """What the evidence settles for ``job``'s attempt (Delivering and expired, or OutcomeUnknown): the
        partner's final name listed (up to ``tries`` times, and kept as evidence under ``run_id``), the
        attempt's own receipts, and, in place of an OutcomeUnknown, its temporary file set aside. ``None``
        when the row moved on before the set-aside."""
        assert job.attempt_id is not None
        # The partner the attempt was authorized to deliver to, whatever the destination says since (#24.2).
        destination = await self.store.load_destination(
            job.tenant_id, job.destination_id, job.destination_version
        )
        evidence = attempt_evidence(await self.store.job_events(job.id), job.attempt_id)
        observation, error = await self._observe_final_name(destination, job, tries)
        # What recovery saw is kept whatever it decides, under the recovery run's ID.
        await self.store.append_delivery_evidence(
            job.id,
            job.attempt_id,
            run_id,
            {
                **observation_evidence(observation, job, destination.id, error),
                "destination_version": destination.version,
            },
        )
        verdict = decide_delivery(job, evidence, observation, destination, observe_error=error)
        if may_set_aside(job, verdict, observation):
            return await self._set_aside(job, destination, evidence, verdict, run_id)
        if verdict.resolution == JobStatus.COMPLETED:
            return await self._manifests_in_place(job, destination, evidence, verdict, run_id)
        return verdict

    async def _manifests_in_place(
        self,
        job: ExportJob,
        destination: Destination,
        evidence: list[dict[str, Any]],
        verdict: Verdict,
        run_id: str,
    ) -> Verdict:
        """The data file is proven in place (``verdict`` is Completed): publish the manifests the authorized
        version asks for that the attempt's own evidence does not show in place (issue #24.6), on a new session,
        and never send the data again. Completed only when every one is in place (the terminal statements repeat
        it, 0037); else OutcomeUnknown: a session lost on the way (an ``error`` in the evidence, so the re-check
        asks again), or a name that holds other bytes (never replaced: a person looks)."""
        assert job.attempt_id is not None
        wanted = manifests_for_job(job)
        placed = manifests_in_place(evidence)
        missing = [m for m in wanted if m.name not in placed]
        if not missing:
            return verdict
        publisher = uuid.uuid4()  # recovery's own temporary names: a paused worker may still write its own
        overwrite = job.overwrite_agreement_ref is not None  # the form the data file's rename could use
        try:
            records = await asyncio.wait_for(
                asyncio.to_thread(
                    self.partners(destination).publish_manifests,
                    destination,
                    job.attempt_id,
                    publisher,
                    missing,
                    overwrite=overwrite,
                ),
                timeout=OBSERVE_TIMEOUT_SECONDS,
            )
        except Exception as exc:  # noqa: BLE001 - a publication that did not answer proves nothing
            records = [{"observation": "manifest", "result": "interrupted", "error": type(exc).__name__}]
        for record in records:
            await self.store.append_delivery_evidence(
                job.id, job.attempt_id, run_id, {**record, "destination_version": destination.version}
            )
        results = {str(r.get("name")): str(r.get("result")) for r in records}
        if all(results.get(m.name) in IN_PLACE_RESULTS for m in missing):
            return Verdict(
                resolution=JobStatus.COMPLETED,
                summary=f"{verdict.summary}; manifest published by recovery (the data file was not sent again)",
            )
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"the data file is in place, but its manifest is not ({', '.join(sorted(set(results.values())))})",
        )

    # -- the re-check of OutcomeUnknowns (0013) ------------------------------------------------------

    @activity.defn(name="recheck_unknown_outcomes")
    async def recheck_unknown_outcomes(self, inp: RecheckInput) -> RecoveryBatchResult:
        """Settle the OutcomeUnknowns whose own fences prove NotDelivered (``settle_unknown_by_fences``: at
        most ``inp.limit``, oldest first, no partner asked, whatever the re-check settings); then list the
        partner of OutcomeUnknowns that recovery could not settle for want of an answer, and settle those the
        evidence now settles (``settle_unknown_by_evidence``).

        One wave a run: at most ``recovery_concurrency`` candidates (and ``inp.limit``), nominated by
        ``find_unknowns_to_recheck`` and re-read before anything is listed, listed at once and once each,
        so a partner that hangs adds at most a listing's timeout (and a move's) to the run, and never delays
        the takeovers of the runs after it for longer; the others wait for the next run. The activity
        heartbeats on a timer. A retry re-checks only what was not listed yet: a listing is recovery's
        evidence, and its clock.
        """
        result = RecoveryBatchResult()
        beat = asyncio.create_task(
            keep_heartbeating(lambda: {"rechecked": result.rechecked}, self.heartbeats_paused)
        )
        try:
            await self._settle_by_fences(inp, result)
            await self._answer_listing_requests(inp, result)
            if self.settings.recovery_recheck_hours > 0:
                await self._recheck_wave(inp, result)
        finally:
            beat.cancel()
        return result

    async def _settle_by_fences(self, inp: RecheckInput, result: RecoveryBatchResult) -> None:
        """Failed NotDelivered for each OutcomeUnknown its fences settle (issue 23): the proof is in the row,
        so neither the re-check's window nor its interval applies, and no partner is listed."""
        candidates = await self.store.find_unpublished_unknowns(limit=inp.limit)

        async def settle(candidate: UnknownToRecheck) -> None:
            outcome = await _alone(
                "settlement by fences",
                candidate.job_id,
                candidate.attempt_id,
                self._settle_unpublished(candidate.job_id, candidate.attempt_id, inp.recovery_run_id),
                Recheck.ERROR,
            )
            log.info(
                "recovery %s: job %s settled by its fences: %s",
                inp.recovery_run_id,
                candidate.job_id,
                outcome.value,
            )
            result.count_recheck(outcome)

        await asyncio.gather(*(settle(candidate) for candidate in candidates))

    async def _settle_unpublished(self, job_id: UUID, attempt_id: UUID, run_id: str) -> Recheck:
        """The one statement that settles an OutcomeUnknown from its fences; then, under the partner's
        cleanup agreement, its temporary files go, as after any Failed NotDelivered."""
        if not await self.store.settle_unknown_by_fences(job_id, attempt_id, run_id):
            return Recheck.MATCHED_NOTHING  # a person reconciled it first, or the nomination was stale
        await self._clean_up(job_id, attempt_id, run_id)
        return Recheck.NOT_DELIVERED

    async def _answer_listing_requests(self, inp: RecheckInput, result: RecoveryBatchResult) -> None:
        """Answer the reconcilers' listing requests (0033), oldest first, at most ``recovery_concurrency`` a
        run, listed at once and once each: a partner that hangs adds at most a listing's timeout."""
        requests = await self.store.find_listing_requests(
            observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
            window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
            limit=min(inp.limit, max(1, self.settings.recovery_concurrency)),
        )

        async def answer(request: ListingToAnswer) -> None:
            answered = await self.answer_listing_request(request, inp.recovery_run_id)
            log.info(
                "recovery %s: job %s listing request %s answered: %s",
                inp.recovery_run_id,
                request.job_id,
                request.request_id,
                answered,
            )
            if answered:
                result.listings_answered += 1

        await asyncio.gather(*(answer(request) for request in requests))

    async def answer_listing_request(self, request: ListingToAnswer, run_id: str) -> bool:
        """List one export's final name for a reconciler's request and append what was seen; ``False`` when
        the row moved on (reconciled, or settled meanwhile) or on an error (this request's alone: a later run
        answers it while it is within its window)."""
        return await _alone(
            "listing request",
            request.job_id,
            request.attempt_id,
            self._answer_listing_request(request, run_id),
            False,
        )

    async def _answer_listing_request(self, request: ListingToAnswer, run_id: str) -> bool:
        job = await self.store.get_job(request.job_id)
        if not held_by(job, request.attempt_id, JobStatus.OUTCOME_UNKNOWN):
            return False
        # The partner the attempt was authorized to deliver to, whatever the destination says since (#24.2).
        destination = await self.store.load_destination(
            job.tenant_id, job.destination_id, job.destination_version
        )
        observation: Observation | None = None
        reading: Verdict | None = None
        if not await self.store.delivery_scope_open(job.tenant_id, job.destination_id):
            # No session with a paused partner, not even to list (23.5): the answer says it was not asked.
            error: str | None = "not asked: deliveries to this partner are paused"
        else:
            observation, error = await self._observe_final_name(destination, job, tries=1)
            evidence = attempt_evidence(await self.store.job_events(job.id), request.attempt_id)
            reading = decide_delivery(job, evidence, observation, destination, observe_error=error)
        await self.store.append_delivery_evidence(
            job.id,
            request.attempt_id,
            listing_request_observer(request.request_id),
            requested_listing_evidence(
                observation,
                job,
                destination,
                request_id=request.request_id,
                answered_by=run_id,
                error=error,
                reading=reading,
            ),
        )
        return True

    async def _recheck_wave(self, inp: RecheckInput, result: RecoveryBatchResult) -> None:
        """The listing wave of the re-check (0013), described in ``recheck_unknown_outcomes``."""
        candidates = await self.store.find_unknowns_to_recheck(
            observer_prefix=f"{RECOVERY_OBSERVER_PREFIX}:",
            within_seconds=self.settings.recovery_recheck_hours * 3600,
            every_seconds=self.settings.recovery_recheck_minutes * 60,
            limit=min(inp.limit, max(1, self.settings.recovery_concurrency)),
        )

        async def recheck(candidate: UnknownToRecheck) -> None:
            outcome = await self.recheck(candidate, inp.recovery_run_id)
            log.info(
                "recovery %s: job %s re-checked: %s", inp.recovery_run_id, candidate.job_id, outcome.value
            )
            result.count_recheck(outcome)

        await asyncio.gather(*(recheck(candidate) for candidate in candidates))

    async def recheck(self, candidate: UnknownToRecheck, run_id: str) -> Recheck:
        """Re-check one OutcomeUnknown; an error is this job's alone, as in ``take_over``, and the job is
        nominated again after the interval."""
        return await _alone(
            "re-check",
            candidate.job_id,
            candidate.attempt_id,
            self._recheck(candidate, run_id),
            Recheck.ERROR,
        )

    async def _recheck(self, candidate: UnknownToRecheck, run_id: str) -> Recheck:
        job = await self.store.get_job(candidate.job_id)
        if not held_by(job, candidate.attempt_id, JobStatus.OUTCOME_UNKNOWN):
            return Recheck.MATCHED_NOTHING
        if fences_prove_never_renamed(job):
            # Never a listing: a file under the final name is not this attempt's, whatever it shows.
            return await self._settle_unpublished(job.id, candidate.attempt_id, run_id)
        if not await self.store.delivery_scope_open(job.tenant_id, job.destination_id):
            return Recheck.WAITING_FOR_RESUME  # paused since its nomination: no session with that partner
        async with self._slot(job, adopt=candidate.attempt_id) as hold:
            if not hold.ok:
                return Recheck.STILL_UNKNOWN  # every session slot is in use: asked again after the interval
            return await self._recheck_with_partner(job, candidate, run_id)

    async def _recheck_with_partner(
        self, job: ExportJob, candidate: UnknownToRecheck, run_id: str
    ) -> Recheck:
        # One listing: a partner still silent is asked again after the interval, not now.
        verdict = await self._decide_from_evidence(job, run_id, tries=1)
        if verdict is None:
            return Recheck.MATCHED_NOTHING
        if verdict.resolution == JobStatus.OUTCOME_UNKNOWN:
            return Recheck.STILL_UNKNOWN
        done = await self.store.settle_unknown_by_evidence(
            job.id, candidate.attempt_id, verdict.resolution, run_id, verdict.summary
        )
        if not done:
            return Recheck.MATCHED_NOTHING
        if verdict.resolution == JobStatus.FAILED:
            await self._clean_up(job.id, candidate.attempt_id, run_id, slot_held=True)
            return Recheck.NOT_DELIVERED
        return Recheck.COMPLETED

    async def _set_aside(
        self,
        job: ExportJob,
        destination: Destination,
        evidence: list[dict[str, Any]],
        before: Verdict,
        run_id: str,
    ) -> Verdict | None:
        """Instead of an OutcomeUnknown, move the attempt's temporary file to its set-aside name, so its
        rename can never publish it, and decide on what that found (``rules.recovery.decide_after_set_aside``).
        ``None`` when the row moved on since it was read: a renewal (a paused worker woke) changes the lease,
        and then the worker, not recovery, owns its temporary file."""
        now = await self.store.get_job(job.id)
        if now is None or (now.status, now.attempt_id, now.lease_expires_at) != (
            job.status,
            job.attempt_id,
            job.lease_expires_at,
        ):
            return None
        assert job.attempt_id is not None and job.expected_file_name is not None  # may_set_aside held
        aside: SetAside | None = None
        after: Observation | None = None
        error: str | None = None
        try:
            aside, after = await asyncio.wait_for(
                asyncio.to_thread(self._set_aside_at, destination, job.attempt_id, job.expected_file_name),
                timeout=OBSERVE_TIMEOUT_SECONDS,
            )
        except Exception as exc:  # noqa: BLE001 - a move that did not answer proves nothing either way
            error = type(exc).__name__
            log.info("recovery could not set job %s's temporary file aside (%s)", job.id, error)
        await self.store.append_delivery_evidence(
            job.id, job.attempt_id, run_id, set_aside_evidence(aside, after, job, error)
        )
        return decide_after_set_aside(job, evidence, destination, before, aside, after, error=error)

    async def _clean_up(
        self, job_id: UUID, attempt_id: UUID, run_id: str, *, slot_held: bool = False
    ) -> None:
        """After recovery recorded Failed NotDelivered, and only under the partner's cleanup agreement
        (``temporary_files = 'remove'``): remove the attempt's temporary and set-aside files, and keep what
        that found as evidence (the partner's ``remove_temporary_files`` never raises). The outcome is
        already recorded: nothing here can change it, and a database error here is logged, not counted
        against the takeover. Its session is opened under a session slot (``slot_held``: the caller's)."""
        try:
            job = await self.store.get_job(job_id)
            if job is None:
                return
            destination = await self.store.load_destination(
                job.tenant_id, job.destination_id, job.destination_version
            )
            if destination.temporary_files != "remove":
                return
            if not await self.store.delivery_scope_open(job.tenant_id, job.destination_id):
                # No session with a paused partner, not even to tidy up: the files stay (it is recorded).
                await self.store.append_delivery_evidence(
                    job_id, attempt_id, run_id, {"cleanup": "skipped", "why": "deliveries paused"}
                )
                return
            name = job.expected_file_name or job.final_name
            partner = self.partners(destination)
            async with (
                contextlib.nullcontext(SlotHold(ok=True)) if slot_held else self._slot(job, adopt=attempt_id)
            ) as hold:
                if not hold.ok:
                    await self.store.append_delivery_evidence(
                        job_id, attempt_id, run_id, {"cleanup": "skipped", "why": "no free session slot"}
                    )
                    return
                records = await asyncio.to_thread(
                    partner.remove_temporary_files, destination, attempt_id, name
                )
            for record in records:
                await self.store.append_delivery_evidence(job_id, attempt_id, run_id, record)
        except (StoreError, OSError, TimeoutError) as exc:
            log.info("recovery's cleanup of job %s not recorded (%s)", job_id, type(exc).__name__)

    async def _observe_final_name(
        self, destination: Destination, job: ExportJob, tries: int
    ) -> tuple[Observation | None, str | None]:
        """(what the destination shows under the final name, or None with the error's type name), asking up
        to ``tries`` times."""
        name = job.expected_file_name or job.final_name
        tries = max(1, tries)
        error = "not asked"
        for attempt in range(1, tries + 1):
            try:
                observation = await asyncio.wait_for(
                    asyncio.to_thread(self._observe, destination, name), timeout=OBSERVE_TIMEOUT_SECONDS
                )
            except Exception as exc:  # noqa: BLE001 - failing to observe is "not observed", never evidence
                error = type(exc).__name__
                log.info("recovery could not list job %s's final name (%s, try %d)", job.id, error, attempt)
            else:
                return observation, None
            if attempt < tries:
                # A partner that did not answer may answer a moment later: OutcomeUnknown only if it never does.
                await asyncio.sleep(OBSERVE_RETRY_SECONDS * attempt)
        return None, f"{error} ({tries} tries)" if tries > 1 else error

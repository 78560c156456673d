"""The claim (cutoff 1), on the shared task queue: read the row's facts, decide the policy, claim it.

It returns the claiming worker's own queue; everything after the claim runs there, so the local file
never leaves the host that built it. A confirmed claim opens the attempt's lease keeper, which renews
until the attempt's last write (000 "one stop source and one lease keeper").
"""

from __future__ import annotations

from uuid import UUID

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.host import ExportHost
from domain.models import ClaimResult, ExportJob, JobStatus
from observability import logs
from rules.ownership import held_by
from rules.policy import evaluate_policy
from workflows.models import ClaimInput, ClaimOutcome, ClaimStep


class ClaimActivity:
    """``export.claim`` on one host. ``search_attributes`` says whether the server has the export search
    attributes registered (the worker registers them at start-up); the workflow sets them only then."""

    def __init__(self, host: ExportHost, *, search_attributes: bool) -> None:
        self.host = host
        self.search_attributes = search_attributes

    @activity.defn(name="export.claim")
    async def claim(self, inp: ClaimInput) -> ClaimOutcome:
        """Read the row with the policy's facts, evaluate the policy, and claim it (cutoff 1) with this
        attempt's ID.

        The message is only a hint: a row that is not Queued settles it. While a delivery switch of the
        job's scope is paused nothing is decided: the wake-up is settled and the job stays Queued (the
        resume wakes it). Outside the destination's delivery window the claim matches nothing and makes the
        job wait for the next opening, which wakes it. A denied policy rejects the checked version only, with its reason code and
        message. A claim whose answer and re-read were both lost raises a retryable ``ClaimUnknown``; the
        retry uses the same attempt ID, so it finds its own claim if it committed. A switch or fact that
        cannot be read raises: nothing is claimed. A confirmed claim opens the attempt's lease keeper.
        """
        store = self.host.store
        facts = await store.read_policy_facts(inp.job_id)
        if facts is None:
            return ClaimOutcome(step=ClaimStep.ALREADY_SETTLED)
        logs.bind_rest_of_task(tenant_id=facts.tenant_id)
        if held_by(facts, inp.attempt_id, JobStatus.RUNNING):
            # A retry of this claim after a lost response: the claim committed. Temporal may have retried it
            # on another host than the first: the attempt is this host's now, and the row says so (23.8).
            await store.adopt_claim_if_running(facts.job_id, inp.attempt_id, self.host.worker_id)
            if self.host.seams.after_claim is not None:
                await self.host.seams.after_claim(facts.job_id)
            return self._claimed(facts.job_id, facts.tenant_id, inp.attempt_id)
        if facts.status != JobStatus.QUEUED:
            return self._not_claimed(ClaimStep.ALREADY_SETTLED, facts.tenant_id)
        if not facts.available:
            # Given back after a failure, it waits until its available_at; its own wake-up is due then.
            return self._not_claimed(ClaimStep.NOT_YET, facts.tenant_id)
        if self.host.seams.after_load is not None:
            await self.host.seams.after_load(facts.job_id)

        if not facts.deliveries_open:
            # Paused: no decision is taken on the job, not even a rejection; the resume wakes it.
            return self._not_claimed(ClaimStep.PAUSED, facts.tenant_id)
        decision = evaluate_policy(facts)
        if not decision.allowed:
            # This version only: if the terms changed meanwhile, the edit's own wake-up brings it back.
            assert decision.code is not None
            rejected = await store.reject_if_queued(
                facts.job_id, facts.version, decision.code, decision.message
            )
            return self._not_claimed(
                ClaimStep.REJECTED if rejected else ClaimStep.NOT_CLAIMED, facts.tenant_id
            )

        claim = await store.claim(
            facts.job_id, facts.version, inp.attempt_id, self.host.worker_id, workflow_id=inp.workflow_id
        )
        result = claim.result
        if result == ClaimResult.UNKNOWN:
            raise ApplicationError("the claim's answer and its re-read were both lost", type="ClaimUnknown")
        if result == ClaimResult.PAUSED:
            # Paused between the facts and the claim: the claim, under the switch's lock, matched nothing.
            return self._not_claimed(ClaimStep.PAUSED, facts.tenant_id)
        if result == ClaimResult.NOT_YET:
            return self._not_claimed(ClaimStep.NOT_YET, facts.tenant_id)
        if result == ClaimResult.OUTSIDE_WINDOW:
            # The partner takes no deliveries now: the claim made the job wait for the window's next opening,
            # with its wake-up deferred as long (issue #25.2). No attempt was made.
            return self._not_claimed(ClaimStep.OUTSIDE_WINDOW, facts.tenant_id)
        if result == ClaimResult.LOST:
            return self._not_claimed(ClaimStep.NOT_CLAIMED, facts.tenant_id)
        if self.host.seams.after_claim is not None:
            await self.host.seams.after_claim(facts.job_id)
        return self._claimed(facts.job_id, facts.tenant_id, inp.attempt_id, row=claim.job)

    def _not_claimed(self, step: ClaimStep, tenant_id: UUID) -> ClaimOutcome:
        return ClaimOutcome(step=step, tenant_id=tenant_id, search_attributes=self.search_attributes)

    def _claimed(
        self, job_id: UUID, tenant_id: UUID, attempt_id: UUID, *, row: ExportJob | None = None
    ) -> ClaimOutcome:
        # From the confirmed claim on, one keeper renews this attempt's lease (the claim has just set it).
        attempt, created = self.host.open(job_id, attempt_id)
        if created:
            attempt.keeper.start_timer()
            self.host.attempts.watch_idle(attempt)
        if row is not None:
            attempt.claimed = row  # the build on this host starts from it, without reading it again
        return ClaimOutcome(
            step=ClaimStep.CLAIMED,
            tenant_id=tenant_id,
            task_queue=self.host.own_task_queue,
            search_attributes=self.search_attributes,
        )

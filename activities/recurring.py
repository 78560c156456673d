"""The firing activity of recurring exports: one short transaction over an ``exports_api`` store (the same
create as ``POST /exports``; see ``db/stores/recurring.py``), counted in
``fenced_exports_recurring_firings_total{outcome, reason}``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from db.errors import IdempotencyConflict
from db.stores.recurring import RecurringStatements
from domain.recurring import FiringOutcome
from observability.metrics import get_metrics
from settings import Settings
from workflows.models import RecurringFireResult, RecurringFiringInput

log = logging.getLogger(__name__)

MISSING = "missing"


class RecurringActivities:
    """The firing of a recurring export, over a store whose role is ``exports_api``."""

    def __init__(self, store: RecurringStatements, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    def activities(self) -> list[Callable[..., Any]]:
        """The activities to register on the shared task queue."""
        return [self.fire_recurring_export]

    @activity.defn(name="fire_recurring_export")
    async def fire_recurring_export(self, inp: RecurringFiringInput) -> RecurringFireResult:
        """Create the firing's export, or record why it was skipped; a repeated nominal time is a duplicate."""
        try:
            answer = await self.store.fire_recurring_export(
                tenant_id=inp.tenant_id,
                recurring_export_id=inp.recurring_export_id,
                nominal_time=inp.nominal_time,
                fired_by=inp.fired_by,
                late_after_seconds=self.settings.recurring_late_after_seconds,
                catchup_firings=self.settings.recurring_catchup_firings,
            )
        except IdempotencyConflict as exc:
            # Only a client's own POST /exports can hold this firing's key for other terms: nothing was
            # created or recorded, and a retry would find the same; a person reads the failed run.
            raise ApplicationError(
                f"the firing's idempotency key names export {exc.job_id}, created for other terms",
                type="IdempotencyConflict",
                non_retryable=True,
            ) from exc
        if answer is None:
            log.warning(
                "recurring export %s of tenant %s does not exist; firing %s recorded nothing",
                inp.recurring_export_id,
                inp.tenant_id,
                inp.nominal_time.isoformat(),
            )
            return RecurringFireResult(outcome=MISSING, nominal_time=inp.nominal_time)
        firing = answer.firing
        get_metrics().count_firing(
            answer.outcome, firing.reason if answer.outcome == FiringOutcome.SKIPPED else None
        )
        log.info(
            "recurring export %s fired for %s: %s%s",
            inp.recurring_export_id,
            inp.nominal_time.isoformat(),
            answer.outcome.value,
            f" ({firing.reason.value})" if firing.reason else f" export {firing.job_id}",
        )
        return RecurringFireResult(
            outcome=answer.outcome.value,
            nominal_time=firing.nominal_time,
            reason=firing.reason.value if firing.reason else None,
            job_id=firing.job_id,
        )

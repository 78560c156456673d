"""RecurringFireWorkflow: the action of a recurring export's Temporal Schedule. No I/O here.

One activity decides and records the firing in PostgreSQL (create the export through the same idempotent
create as ``POST /exports``, or record why it was skipped). The nominal fire time is the Schedule's
(``TemporalScheduledStartTime``), so a duplicate or caught-up firing of the same time carries the same key
and the activity finds it recorded. Retrying the activity is safe for the same reason.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.recurring import RecurringActivities
    from workflows.models import RecurringFireInput, RecurringFireResult, RecurringFiringInput

SCHEDULED_START_TIME = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


@workflow.defn(name="RecurringFireWorkflow")
class RecurringFireWorkflow:
    """Fires one recurring export for one nominal time."""

    @workflow.run
    async def run(self, inp: RecurringFireInput) -> RecurringFireResult:
        """Record this firing in PostgreSQL: the export it created, or why it skipped."""
        info = workflow.info()
        nominal = inp.nominal_time or info.typed_search_attributes.get(SCHEDULED_START_TIME)
        if nominal is None:
            raise ApplicationError(
                "no nominal fire time: started outside a Schedule without nominal_time",
                type="NoNominalTime",
                non_retryable=True,
            )
        return await workflow.execute_activity_method(
            RecurringActivities.fire_recurring_export,
            RecurringFiringInput(
                tenant_id=inp.tenant_id,
                recurring_export_id=inp.recurring_export_id,
                nominal_time=nominal,
                fired_by=f"{info.workflow_id}/{info.run_id}",
            ),
            # One short transaction; a retry after a lost answer finds the firing recorded.
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=timedelta(hours=1),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
        )

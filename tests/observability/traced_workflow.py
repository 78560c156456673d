"""A trivial workflow and activity for the observability tests: the activity runs what an export activity
would (a statement span, an SFTP span, a log line), with IDs only in its input."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

with workflow.unsafe.imports_passed_through():
    import logging

    from observability.statements import observe_statement, record_transition
    from observability.tracing import sftp_span


class StepInput(BaseModel):
    job_id: str
    attempt_id: str


@activity.defn
async def traced_step(inp: StepInput) -> int:
    with observe_statement("claim_if_queued", {"job_id": inp.job_id, "attempt_id": inp.attempt_id}):
        pass
    record_transition("claim_if_queued", "Claimed", job_id=inp.job_id, attempt_id=inp.attempt_id)
    with sftp_span("upload", bytes=1234):
        pass
    logging.getLogger("tests.traced").info("step done")
    return 1234


@workflow.defn
class TracedWorkflow:
    @workflow.run
    async def run(self, inp: StepInput) -> int:
        return await workflow.execute_activity(traced_step, inp, start_to_close_timeout=timedelta(seconds=10))


@activity.defn
async def failing_step(benign: bool) -> None:
    category = ApplicationErrorCategory.BENIGN if benign else ApplicationErrorCategory.UNSPECIFIED
    raise ApplicationError("the row of alice@example.com", non_retryable=True, category=category)


@workflow.defn
class FailingWorkflow:
    @workflow.run
    async def run(self, benign: bool) -> None:
        await workflow.execute_activity(failing_step, benign, start_to_close_timeout=timedelta(seconds=10))


@workflow.defn
class ParentWorkflow:
    """Waits for a ``go`` signal, then runs ``TracedWorkflow`` as its child: a handler's span and a child's
    start."""

    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.run
    async def run(self, inp: StepInput) -> int:
        await workflow.wait_condition(lambda: self._go)
        return await workflow.execute_child_workflow(
            TracedWorkflow.run, inp, id=f"{workflow.info().workflow_id}-child"
        )

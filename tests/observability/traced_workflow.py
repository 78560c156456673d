"""A trivial workflow and activity for the observability tests: the activity runs what an export activity
would (a statement span, an SFTP span, a log line), with IDs only in its input."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow

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

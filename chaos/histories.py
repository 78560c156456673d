"""Reading the soak's workflow histories: which export a workflow served, what each activity of an
attempt did and when, what went wrong in a recovery run, and what became of a delivery after cutoff 2."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio.client import Client


def job_of_workflow(workflow_id: str) -> str | None:
    """The job ID in an export workflow's ID (``export-{job_id}-{message_id}``), else None."""
    return workflow_id[7:43] if workflow_id.startswith("export-") and len(workflow_id) >= 43 else None


async def connect(address: str) -> Client | None:
    """A client of the Temporal server at ``address``, waiting up to half a minute for it to answer."""
    for _ in range(30):
        try:
            return await Client.connect(address)
        except Exception:  # noqa: BLE001 - the server may be coming back; try again
            await asyncio.sleep(1)
    return None


async def open_export_jobs(client: Client) -> set[str]:
    """The jobs that have an export workflow open now (a live wake-up)."""
    jobs = set()
    async for execution in client.list_workflows(
        "WorkflowType = 'ExportWorkflow' AND ExecutionStatus = 'Running'"
    ):
        job = job_of_workflow(execution.id)
        if job is not None:
            jobs.add(job)
    return jobs


def recovery_run(execution: Any, history: Any) -> dict[str, Any]:
    """A RecoveryWorkflow run: when, how long, and what went wrong with its activities."""
    start = execution.start_time.timestamp() if execution.start_time else 0.0
    close = execution.close_time.timestamp() if execution.close_time else None
    problems: list[str] = []
    for event in history.events:
        if event.HasField("activity_task_timed_out_event_attributes"):
            attrs = event.activity_task_timed_out_event_attributes
            problems.append(
                f"activity timed out: {attrs.failure.message or attrs.failure.timeout_failure_info}"[:160]
            )
        elif event.HasField("activity_task_failed_event_attributes"):
            problems.append(
                f"activity failed: {event.activity_task_failed_event_attributes.failure.message}"[:160]
            )
        elif event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            if attrs.attempt > 1:
                problems.append(f"activity attempt {attrs.attempt} started by {attrs.identity}"[:160])
    return {
        "workflow_id": f"{execution.id}/{execution.run_id}",
        "status": execution.status.name if execution.status is not None else "?",
        "start": start,
        "duration": round(close - start, 1) if close else None,
        "problems": problems,
    }


def timeline(history: Any) -> list[str]:
    """One workflow run, short: when each activity was scheduled, started (by whom) and how it ended."""
    names: dict[int, str] = {}
    first = history.events[0].event_time.ToDatetime() if history.events else None
    lines = [f"{history.workflow_id} started {first.strftime('%H:%M:%S.%f')[:-3] if first else '?'}"]
    for event in history.events:
        t = event.event_time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            names[event.event_id] = attrs.activity_type.name.removeprefix("export.")
            lines.append(f"{t} {names[event.event_id]} scheduled on {attrs.task_queue.name}")
        elif event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            lines.append(
                f"{t} {names.get(attrs.scheduled_event_id, '?')} started (attempt {attrs.attempt}) by {attrs.identity}"
            )
        elif event.HasField("activity_task_completed_event_attributes"):
            attrs = event.activity_task_completed_event_attributes
            result = ""
            if attrs.result.payloads:
                try:
                    data = json.loads(attrs.result.payloads[0].data)
                    result = " ".join(
                        f"{k}={data[k]}" for k in ("step", "outcome", "finish", "delivery") if data.get(k)
                    )
                except ValueError:
                    result = ""
            lines.append(f"{t} {names.get(attrs.scheduled_event_id, '?')} completed {result}".rstrip())
        elif event.HasField("activity_task_failed_event_attributes"):
            attrs = event.activity_task_failed_event_attributes
            lines.append(
                f"{t} {names.get(attrs.scheduled_event_id, '?')} failed: {attrs.failure.message[:120]}"
            )
        elif event.HasField("activity_task_timed_out_event_attributes"):
            attrs = event.activity_task_timed_out_event_attributes
            kind = attrs.failure.timeout_failure_info.timeout_type
            lines.append(
                f"{t} {names.get(attrs.scheduled_event_id, '?')} timed out (type {kind}): {attrs.failure.message[:80]}"
            )
        elif event.HasField("workflow_execution_cancel_requested_event_attributes"):
            lines.append(f"{t} workflow cancel requested")
        elif event.HasField("workflow_execution_terminated_event_attributes"):
            lines.append(
                f"{t} workflow terminated: {event.workflow_execution_terminated_event_attributes.reason}"
            )
        elif event.HasField("workflow_execution_completed_event_attributes"):
            payloads = event.workflow_execution_completed_event_attributes.result.payloads
            outcome = ""
            if payloads:
                try:
                    outcome = json.loads(payloads[0].data).get("outcome", "")
                except ValueError:
                    outcome = ""
            lines.append(f"{t} workflow completed: {outcome}")
        elif event.HasField("workflow_execution_failed_event_attributes"):
            lines.append(
                f"{t} workflow failed: {event.workflow_execution_failed_event_attributes.failure.message[:120]}"
            )
        elif event.HasField("workflow_execution_timed_out_event_attributes"):
            lines.append(f"{t} workflow timed out")
    return lines


def delivery_fate(lines: list[str] | None) -> str:
    """What happened to an attempt's delivery between cutoff 2 and the partner, from its workflow timeline."""
    if not lines:
        return "its workflow's history was not found"
    text = "\n".join(lines)

    def has(fragment: str) -> bool:
        return fragment in text

    if has(" deliver timed out (type 2)"):
        return "deliver never started: ScheduleToStart timeout on the claiming worker's own queue (that worker stopped polling)"
    if has(" deliver timed out (type 4)"):
        return "deliver started, then its worker stopped heartbeating (killed or paused) before it reached the partner"
    if has(" deliver completed finish=NotOwner"):
        return (
            "deliver started after recovery had taken over (the lease lapsed between cutoff 2 and the upload)"
        )
    if has(" deliver completed finish=Unknown"):
        return "deliver could not confirm its ownership (renewal failed) and sent nothing"
    if has(" deliver started") and not has(" deliver completed"):
        return "deliver started but never ended in this history (workflow gone)"
    if has(" deliver scheduled") and not has(" deliver started"):
        if has("workflow terminated"):
            return "deliver scheduled, then the workflow was terminated before it started"
        return "deliver scheduled but never started"
    if has("workflow terminated"):
        return "the workflow was terminated after cutoff 2, before scheduling the delivery"
    if has(" prepare_delivery timed out (type 4)"):
        return "cutoff 2 committed, then the build activity's heartbeat timed out (worker killed or paused): no delivery scheduled"
    if has(" prepare_delivery timed out (type 2)"):
        return "the build activity never started on the claiming worker's queue, yet cutoff 2 is recorded"
    if has(" prepare_delivery completed") and not has(" deliver scheduled"):
        return "cutoff 2 committed but the workflow never scheduled the delivery"
    return "no delivery in the attempt's workflow history"

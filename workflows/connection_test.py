"""ConnectionTestWorkflow: a destination's connection test, run on a worker (issue #24.3). No I/O here.

The test needs what only a worker host has: the login key the destination's ``credential_ref`` names and a
route to the partner. The API or the command line starts this workflow on the shared task queue and waits
for its answer; one activity on any worker runs the test (``activities.connection_test``) under one of the
partner's session slots. It is never retried: a test is a question, asked again by a person.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.connection_test import ConnectionTestActivity
    from workflows.models import ConnectionTestInput, ConnectionTestResult

TEST_TIMEOUT = timedelta(seconds=90)


def connection_test_workflow_id(destination_id: object, test_id: object) -> str:
    """One workflow per test: the destination's ID and the test's own."""
    return f"connection-test-{destination_id}-{test_id}"


@workflow.defn(name="ConnectionTestWorkflow")
class ConnectionTestWorkflow:
    """Runs one connection test of one destination on a worker and answers its result."""

    @workflow.run
    async def run(self, inp: ConnectionTestInput) -> ConnectionTestResult:
        """The test's result (the activity never raises for what the partner did)."""
        return await workflow.execute_activity_method(
            ConnectionTestActivity.test_connection,
            inp,
            start_to_close_timeout=TEST_TIMEOUT,
            schedule_to_start_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

"""Connection tests, run on a worker (issue #24.3): the API and the command line start
``ConnectionTestWorkflow`` on the shared task queue and wait for its answer. Only a worker host holds the
login key a destination's ``credential_ref`` names and a route to the partner, so the test runs there."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from uuid import UUID

from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from workflows.connection_test import ConnectionTestWorkflow, connection_test_workflow_id
from workflows.models import ConnectionTestInput, ConnectionTestResult

# Longer than the activity's own bound (90 s) plus its schedule-to-start (30 s): the answer, or "no worker".
WAIT_SECONDS = 130.0


class ConnectionTestUnavailable(Exception):
    """No worker answered the test (Temporal unreachable, no worker polling, or the test timed out)."""


class ConnectionTests:
    """Runs connection tests through ``client()`` (connected on first use) on ``task_queue``."""

    def __init__(
        self, client: Callable[[], Awaitable[Client]], task_queue: str, *, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        self._client = client
        self.task_queue = task_queue
        self.wait_seconds = wait_seconds

    async def run(self, tenant_id: UUID, destination_id: UUID) -> ConnectionTestResult:
        """The worker's answer; raises :class:`ConnectionTestUnavailable` when none came."""
        try:
            client = await asyncio.wait_for(self._client(), 10)
            return await asyncio.wait_for(
                client.execute_workflow(
                    ConnectionTestWorkflow.run,
                    ConnectionTestInput(tenant_id=tenant_id, destination_id=destination_id),
                    id=connection_test_workflow_id(destination_id, uuid.uuid4()),
                    task_queue=self.task_queue,
                    execution_timeout=timedelta(seconds=self.wait_seconds),
                    static_summary=f"Connection test of destination {destination_id}",
                ),
                self.wait_seconds + 5,
            )
        except WorkflowFailureError as exc:
            raise ConnectionTestUnavailable(
                f"the connection test did not finish on a worker ({type(exc.cause).__name__}): is a worker running?"
            ) from None
        except (RPCError, TimeoutError, OSError, RuntimeError) as exc:
            raise ConnectionTestUnavailable(
                f"no worker could be asked to run the connection test ({type(exc).__name__})"
            ) from None

"""A destination's connection test on a worker host (issue #24.3), started by ``ConnectionTestWorkflow``.

The worker reads the destination as it is now and asks its partner, under one of the partner's session slots
(issue #25.3: a test is a session too), what the server presents and allows: the host key and whether it is
pinned, our login (offered only to a pinned key), whether the remote directory lists and takes a new file
(a temporary name, removed), ``posix-rename`` and the write limit. Nothing is pinned and nothing is recorded:
the answer goes back to whoever asked.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from temporalio import activity

from activities.host import ExportHost
from db.errors import DestinationNotFound
from db.stores.slots import CONNECTION_TEST
from workflows.models import ConnectionTestInput, ConnectionTestResult

log = logging.getLogger(__name__)


class ConnectionTestActivity:
    """``destination.connection_test`` on the shared queue of any worker host."""

    def __init__(self, host: ExportHost) -> None:
        self.host = host

    @activity.defn(name="destination.connection_test")
    async def test_connection(self, inp: ConnectionTestInput) -> ConnectionTestResult:
        """Test the destination's connection as it is now; a partner that is busy (every session slot held)
        is not asked. Public facts and codes only."""
        try:
            destination = await self.host.store.load_destination(inp.tenant_id, inp.destination_id)
        except DestinationNotFound:
            return ConnectionTestResult(found=False)
        holder = uuid.uuid4()
        slot = await self.host.store.take_session_slot(
            inp.tenant_id,
            inp.destination_id,
            holder,
            purpose=CONNECTION_TEST,
            hold_seconds=self.host.settings.session_hold_seconds,
        )
        if slot.max_sessions is not None and slot.slot is None:
            return ConnectionTestResult(
                found=True,
                destination_version=destination.version,
                slots_busy=True,
                in_use=slot.in_use,
                max_sessions=slot.max_sessions,
                worker_id=self.host.worker_id,
            )
        try:
            report = await asyncio.to_thread(self.host.partners(destination).test_connection, destination)
        finally:
            if slot.slot is not None:
                await self.host.store.release_session_slot(holder)
        log.info(
            "connection test of destination %s: %s",
            inp.destination_id,
            report.error or "every step answered",
        )
        return ConnectionTestResult(
            found=True,
            destination_version=destination.version,
            report=report,
            in_use=slot.in_use,
            max_sessions=slot.max_sessions,
            worker_id=self.host.worker_id,
        )

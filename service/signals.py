"""Telling a running attempt's workflow that a stop was requested.

The signal is for speed only: cutoff 2 refuses delivery once the stop request is recorded, whether or
not the workflow ever hears of it. So a failed signal is logged, never turned into an error.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from temporalio.client import Client

from service.temporal import connect_client
from settings import Settings
from workflows.export import ExportWorkflow

log = logging.getLogger(__name__)

_SIGNAL_TIMEOUT = timedelta(seconds=3)


class StopSignaller(Protocol):
    """Sends ``stop_requested(request_id)`` to one workflow."""

    async def stop_requested(self, workflow_id: str, request_id: UUID) -> None: ...


class NoSignaller:
    """For an API running without Temporal: the recorded stop request alone still prevents delivery."""

    async def stop_requested(self, workflow_id: str, request_id: UUID) -> None:
        log.info(
            "no Temporal client; stop request %s for %s is enforced at cutoff 2", request_id, workflow_id
        )


class TemporalStopSignaller:
    """Signals through a Temporal client; given settings instead, it connects on first use (bounded)."""

    def __init__(self, client_or_settings: Client | Settings) -> None:
        self._client = client_or_settings if isinstance(client_or_settings, Client) else None
        self._settings = client_or_settings if isinstance(client_or_settings, Settings) else None
        self._lock = asyncio.Lock()

    async def connected_client(self) -> Client:
        """The client, connected now if this signaller was given settings (readiness asks it too)."""
        return await self._connected()

    async def _connected(self) -> Client:
        async with self._lock:
            if self._client is None:
                assert self._settings is not None
                self._client = await asyncio.wait_for(
                    connect_client(self._settings), _SIGNAL_TIMEOUT.total_seconds()
                )
            return self._client

    async def stop_requested(self, workflow_id: str, request_id: UUID) -> None:
        client = await self._connected()
        handle = client.get_workflow_handle_for(ExportWorkflow.run, workflow_id)
        await handle.signal(ExportWorkflow.stop_requested, str(request_id), rpc_timeout=_SIGNAL_TIMEOUT)


async def signal_stop_best_effort(
    signaller: StopSignaller, workflow_id: str | None, request_id: UUID
) -> bool:
    """Send the stop signal if the attempt recorded its workflow; log and carry on if it fails.

    Returns whether the signal was delivered to Temporal.
    """
    if not workflow_id:
        log.info("stop request %s: the attempt recorded no workflow; cutoff 2 enforces it", request_id)
        return False
    try:
        await asyncio.wait_for(signaller.stop_requested(workflow_id, request_id), timeout=5)
    except Exception as exc:  # noqa: BLE001 - a lost signal only slows the stop; cutoff 2 guarantees it
        log.warning("stop signal to %s for %s failed (%s)", workflow_id, request_id, type(exc).__name__)
        return False
    return True

"""Heartbeats and work that outlives its activity's cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity

T = TypeVar("T")


async def run_to_end(work: asyncio.Task[T], on_cancel: Callable[[], None]) -> T:
    """Await ``work`` to its end even if the activity is cancelled; ``on_cancel`` runs at each cancel."""
    while True:
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.done():
                return work.result()
            on_cancel()


def _heartbeat_interval() -> float:
    timeout = activity.info().heartbeat_timeout
    if timeout is None:
        return 1.0
    return max(0.05, min(1.0, timeout.total_seconds() / 4))


async def keep_heartbeating(
    details: Callable[[], dict[str, Any]], paused: Callable[[], bool] = lambda: False
) -> None:
    """Heartbeat the current activity with ``details()`` (codes and counts only) until cancelled.

    The SDK throttles what it sends to 0.8 x the heartbeat timeout; this only keeps the latest details
    fresh, at a quarter of the timeout (at most every second). While ``paused()`` (a test seam: a stalled
    worker) nothing is sent.
    """
    interval = _heartbeat_interval()
    while True:
        if not paused():
            activity.heartbeat(details())
        await asyncio.sleep(interval)

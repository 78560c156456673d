"""A worker's start-up calls to Temporal, retried while Temporal is restarting or overloaded.

A worker that starts while the Temporal server restarts (or sheds load) must come up once it answers, as
``connect_with_retry`` does for the connection itself: a start-up call that meets ``UNAVAILABLE`` (the
server's connection refused or lost), ``RESOURCE_EXHAUSTED`` (its buffers full), ``DEADLINE_EXCEEDED``,
``ABORTED``, ``CANCELLED`` (the connection cut under it), or a connection the SDK could not make (``UNKNOWN`` "tcp connect error", "transport error") is
tried again with backoff until ``within`` seconds have passed. Any other answer is the call's
own (the soak saw a worker exit on "tcp connect error" while ensuring the Schedules during a Temporal restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.ABORTED,
        # a connection cut under the call (the SDK's transport cancels it: "operation was canceled"); a
        # cancel of ours is asyncio.CancelledError, never this
        RPCStatusCode.CANCELLED,
    }
)


# The SDK reports a connection it could not make or lost as UNKNOWN with these words ("tcp connect error",
# "transport error"): the transport's answer, not the server's.
_TRANSPORT_WORDS = ("connect error", "transport error")


def transient(exc: RPCError) -> bool:
    """Whether Temporal's answer says "not now" rather than "no"."""
    if exc.status in TRANSIENT:
        return True
    return exc.status == RPCStatusCode.UNKNOWN and any(w in exc.message for w in _TRANSPORT_WORDS)


async def until_temporal_answers(call: Callable[[], Awaitable[T]], what: str, *, within: float) -> T:
    """``call()``, again after each transient RPC error (0.5 s doubling to 5 s) for ``within`` seconds in
    all; then the last error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = 0.5
    while True:
        try:
            return await call()
        except RPCError as exc:
            left = deadline - loop.time()
            if not transient(exc) or left <= 0:
                raise
            log.warning(
                "%s: Temporal did not answer (%s); retrying in %.1f s",
                what,
                exc.status.name,
                min(delay, left),
            )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)

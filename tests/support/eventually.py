"""One bounded wait for a condition, instead of hand-written polls: re-ask until the answer is truthy, and on
timeout fail with what was awaited and the last answer seen. A condition, never a guess at timing."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _timed_out(what: str, within: float, last: object) -> AssertionError:
    return AssertionError(f"{what}: not seen within {within:g} s; last seen: {last!r}")


async def eventually(
    check: Callable[[], Awaitable[T] | T], what: str, *, within: float = 10.0, interval: float = 0.05
) -> T:
    """Call ``check`` (sync or async) until it returns a truthy value and return that value.

    The first call is immediate, then one every ``interval`` seconds until ``within`` seconds have passed
    on the monotonic clock; a last call is made at the deadline. On timeout raises an AssertionError naming
    ``what`` was awaited and the last value ``check`` returned.
    """
    deadline = time.monotonic() + within
    while True:
        answer = check()
        last = await answer if inspect.isawaitable(answer) else answer
        if last:
            return last  # type: ignore[return-value]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(what, within, last)
        await asyncio.sleep(min(interval, remaining))


def eventually_sync(check: Callable[[], T], what: str, *, within: float = 10.0, interval: float = 0.05) -> T:
    """Call ``check`` until it returns a truthy value and return that value, blocking the thread meanwhile.

    The same bound as :func:`eventually`, for code that runs off any event loop; on timeout raises an
    AssertionError naming ``what`` was awaited and the last value ``check`` returned.
    """
    deadline = time.monotonic() + within
    while True:
        last = check()
        if last:
            return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(what, within, last)
        time.sleep(min(interval, remaining))

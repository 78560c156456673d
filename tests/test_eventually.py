"""tests/support/eventually.py: it returns the first truthy answer, and a timeout names what was awaited and
the last value seen."""

from __future__ import annotations

import time

import pytest

from tests.support.eventually import eventually, eventually_sync


async def test_eventually_returns_the_first_truthy_answer_of_a_sync_or_async_check() -> None:
    answers = iter([0, [], ["row"]])
    assert await eventually(lambda: next(answers), "a row", within=5, interval=0.01) == ["row"]

    calls = 0

    async def third_time() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await eventually(third_time, "the third call", within=5, interval=0.01) == 3


async def test_eventually_fails_within_its_bound_naming_what_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"the row: not seen within 0.2 s; last seen: \[\]"):
        await eventually(lambda: [], "the row", within=0.2, interval=0.05)
    assert time.monotonic() - started < 1.0


def test_eventually_sync_fails_within_its_bound_naming_what_and_the_last_value() -> None:
    assert eventually_sync(lambda: "yes", "an answer", within=1) == "yes"
    started = time.monotonic()
    with pytest.raises(AssertionError, match="the file: not seen within 0.2 s; last seen: False"):
        eventually_sync(lambda: False, "the file", within=0.2, interval=0.05)
    assert time.monotonic() - started < 1.0

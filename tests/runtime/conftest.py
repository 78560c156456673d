"""Fixtures for the tests of runtime/ and worker.py (the outbox dispatcher, lease keeper, drain, scavenger and
schedules): the shared PostgreSQL fixtures of tests/conftest.py, and the Temporal servers and worker settings
that tests/recovery/conftest.py defines, taken from there until they become session-wide plugins."""

from __future__ import annotations

from tests.recovery.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    MAX_ATTEMPTS,
    client,
    dev_env,
    recovery_worker,
    settings,
    ts_env,
)

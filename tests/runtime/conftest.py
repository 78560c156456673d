"""Fixtures for the tests of runtime/ and worker.py (the outbox dispatcher, lease keeper, drain, scavenger and
schedules): the session's PostgreSQL and Temporal servers come from the plugins of tests/conftest.py
(tests/fix_db.py, tests/fix_temporal.py); the worker settings and recovery worker from tests/recovery/conftest.py."""

from __future__ import annotations

from tests.recovery.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    MAX_ATTEMPTS,
    client,
    recovery_worker,
    settings,
)

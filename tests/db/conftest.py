"""Fixtures for the database-level tests: the race kit (held transactions, one-connection stores, the
``pg_blocking_pids`` proof) on this module's fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from testbed.pg import TestDatabase
from tests.db.race import RaceKit, race_kit


@pytest.fixture
async def kit(database: TestDatabase) -> AsyncIterator[RaceKit]:
    async with race_kit(database.app_url, database.admin_url) as k:
        yield k

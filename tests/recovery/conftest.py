"""Fixtures for recovery, the sweeper, the outbox dispatcher and worker.py: real PostgreSQL (the shared
fixtures), the session's time-skipping Temporal server and dev server (``ts_env``, ``dev_env`` from
tests/fix_temporal.py). Nothing here is a mock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.recovery import RecoveryActivities
from activities.sweeper import SweeperActivities
from db.stores.protocol import WorkerStore
from db.stores.recovery import RecoveryStore
from partner.kinds import partner_for
from settings import Settings
from testbed.pg import TestDatabase
from workflows.recovery import RecoveryWorkflow
from workflows.sweeper import SweeperWorkflow

MAX_ATTEMPTS = 3


@pytest.fixture(scope="module")
def settings(database: TestDatabase) -> Settings:
    """This module's worker settings: its own database and task queue, the seed's thresholds."""
    return Settings(
        database_url=database.app_url,
        task_queue=f"exports-{uuid.uuid4().hex[:8]}",
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=60,
        sweep_after_seconds=30 * 60,
        sweep_batch=500,
    )


@pytest.fixture(scope="module")
async def recovery_worker(
    ts_env: WorkflowEnvironment, worker_store: WorkerStore, recovery_store: RecoveryStore, settings: Settings
) -> AsyncIterator[RecoveryActivities]:
    """A worker for RecoveryWorkflow and SweeperWorkflow on the module's shared queue (time-skipping server)."""
    recovery = RecoveryActivities(recovery_store, settings, partners=partner_for)
    sweeper = SweeperActivities(worker_store, settings)
    async with Worker(
        ts_env.client,
        task_queue=settings.task_queue,
        workflows=[RecoveryWorkflow, SweeperWorkflow],
        activities=[*recovery.activities(), *sweeper.activities()],
    ):
        yield recovery


@pytest.fixture(scope="module")
def client(ts_env: WorkflowEnvironment) -> Client:
    return ts_env.client

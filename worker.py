"""``python worker.py``: one host's worker. It only wires.

It opens the database pools, connects to Temporal, registers the Web UI's search attributes where the
server allows it, creates the recovery and sweeper Schedules if they are missing, and runs:

- a Temporal worker on the shared task queue: ExportWorkflow, RecoveryWorkflow, SweeperWorkflow, the
  claim, recovery and sweeper activities;
- a Temporal worker on this host's own queue (``{task_queue}-{worker_id}``): the build, cutoff 2 and
  delivery activities of the attempts this host claimed, so the local file never leaves the host;
- the outbox dispatcher.

On SIGTERM or SIGINT it stops taking work, gives running activities ``shutdown_grace_seconds`` to reach
their outcome writes, then cancels what is left; the leases of attempts it abandoned expire and recovery
takes them over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.dispatcher import OutboxDispatcher
from activities.export import ExportActivities
from activities.recovery import RecoveryActivities, RecoveryInput
from activities.sweeper import SweeperActivities, SweepInput
from db.builder import scavenge_export_files
from db.errors import StoreError
from db.pool import open_pool
from db.store import JobStore
from partner.client import passphrase_from, set_key_passphrase
from service.temporal import TemporalConnectError, connect_client
from settings import Settings
from workflows.export import ExportWorkflow
from workflows.models import SEARCH_ATTRIBUTE_NAMES
from workflows.recovery import RecoveryWorkflow
from workflows.sweeper import SweeperWorkflow

log = logging.getLogger("worker")

SEARCH_ATTRIBUTES = SEARCH_ATTRIBUTE_NAMES  # keywords: ExportJobId, ExportTenantId, ExportOutcome
RECOVERY_SCHEDULE_ID = "fenced-exports-recovery"
SWEEPER_SCHEDULE_ID = "fenced-exports-sweeper"


def own_task_queue(settings: Settings, worker_id: str) -> str:
    """This host's own task queue, where the activities after the claim run."""
    return f"{settings.task_queue}-{worker_id}"


def new_worker_id(settings: Settings) -> str:
    """The configured worker ID, else one unique to this process (host name and a random suffix)."""
    return settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def register_search_attributes(client: Client, namespace: str) -> bool:
    """Register the keyword search attributes the Web UI uses; True when they exist afterwards.

    Existing ones are left alone. A server that refuses (no operator permission, no support) is logged
    and tolerated: the workflow sets the attributes only where the server has them.
    """
    wanted = {name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTES}
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        wanted = {k: v for k, v in wanted.items() if k not in existing.custom_attributes}
    except RPCError as exc:
        log.info("cannot list search attributes (%s); trying to add them", exc.status.name)
    if not wanted:
        return True
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.ALREADY_EXISTS:
            return True
        log.warning(
            "search attributes not registered (%s); the Web UI cannot filter by them", exc.status.name
        )
        return False
    return True


def _periodic(
    run: Any, arg: Any, schedule_id: str, every_seconds: float, summary: str, settings: Settings
) -> Schedule:
    """A workflow started every ``every_seconds`` on the shared queue; a run still going when the next is
    due is skipped (overlap SKIP)."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            run,
            arg,
            id=schedule_id,
            task_queue=settings.task_queue,
            execution_timeout=timedelta(hours=1),
            static_summary=summary,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


def recovery_schedule(settings: Settings) -> Schedule:
    """Recovery every ``recovery_every_seconds``."""
    return _periodic(
        RecoveryWorkflow.run,
        RecoveryInput(),
        RECOVERY_SCHEDULE_ID,
        settings.recovery_every_seconds,
        "Recovery: take over expired export leases",
        settings,
    )


def sweeper_schedule(settings: Settings) -> Schedule:
    """The sweeper every ``sweep_every_seconds``; thresholds come from each worker's settings."""
    return _periodic(
        SweeperWorkflow.run,
        SweepInput(),
        SWEEPER_SCHEDULE_ID,
        settings.sweep_every_seconds,
        "Sweeper: re-wake stale queued exports",
        settings,
    )


async def ensure_schedules(client: Client, settings: Settings) -> None:
    """Create the recovery and sweeper Schedules, or bring existing ones to this worker's settings.

    Idempotent: any number of workers may call it at start. An existing schedule keeps its state (paused
    or not, with its note) and gets this worker's action, interval and overlap policy.
    """
    for schedule_id, schedule in (
        (RECOVERY_SCHEDULE_ID, recovery_schedule(settings)),
        (SWEEPER_SCHEDULE_ID, sweeper_schedule(settings)),
    ):
        try:
            await client.create_schedule(schedule_id, schedule)
            log.info("schedule %s created", schedule_id)
        except ScheduleAlreadyRunningError:
            await client.get_schedule_handle(schedule_id).update(_keep_state_update(schedule))
            log.info("schedule %s exists; updated to this worker's settings", schedule_id)


def _keep_state_update(schedule: Schedule) -> Callable[[ScheduleUpdateInput], ScheduleUpdate]:
    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        existing = current.description.schedule
        return ScheduleUpdate(
            schedule=Schedule(
                action=schedule.action, spec=schedule.spec, policy=schedule.policy, state=existing.state
            )
        )

    return update


async def run_worker(
    settings: Settings,
    *,
    stop: asyncio.Event,
    client: Client | None = None,
    ready: asyncio.Event | None = None,
    schedules: bool = True,
    export_hooks: Callable[[ExportActivities], None] | None = None,
) -> None:
    """Run one host's workers and the outbox dispatcher until ``stop`` is set, then shut down gracefully.

    ``client`` defaults to one connected from ``settings``; ``ready`` is set once both workers run and the
    dispatcher listens. With ``schedules`` the recovery and sweeper Schedules are ensured (a server
    without Schedules, such as the time-skipping test server, is logged and tolerated). ``export_hooks``
    receives the ``ExportActivities`` before the workers start (a test seam for its hooks). On ``stop``
    the dispatcher stops first, then both workers stop polling and give running activities
    ``shutdown_grace_seconds`` before cancelling them; recovery takes over whatever was abandoned.
    """
    if settings.database_url is None:
        raise ValueError("EXPORTS_DATABASE_URL is not set")
    worker_id = new_worker_id(settings)
    own_queue = own_task_queue(settings, worker_id)
    client = client or await connect_client(settings)
    search_attributes = await register_search_attributes(client, client.namespace)
    if schedules:
        await _ensure_schedules_tolerant(client, settings)

    async with contextlib.AsyncExitStack() as resources:
        worker_pool = await open_pool(
            settings.database_url, "exports_worker", max_size=10, name=f"worker-{worker_id}"
        )
        resources.push_async_callback(worker_pool.close)
        dispatcher_pool = await open_pool(
            settings.database_url, "exports_dispatcher", max_size=2, name=f"dispatcher-{worker_id}"
        )
        resources.push_async_callback(dispatcher_pool.close)

        # A cancel of a workflow from Temporal is recorded through the API's cancellation transaction,
        # which the worker role may not write: it gets its own small exports_api pool.
        api_pool = await open_pool(
            settings.database_url, "exports_api", max_size=2, name=f"cancel-{worker_id}"
        )
        resources.push_async_callback(api_pool.close)

        store = JobStore(worker_pool, lease_seconds=settings.lease_seconds)
        export = ExportActivities(
            store,
            worker_pool,
            settings,
            worker_id,
            own_queue,
            cancellation_store=JobStore(api_pool),
            search_attributes=search_attributes,
        )
        resources.push_async_callback(export.aclose)
        if export_hooks is not None:
            export_hooks(export)
        recovery = RecoveryActivities(store, worker_pool, settings)
        sweeper = SweeperActivities(store, settings)
        grace = timedelta(seconds=settings.shutdown_grace_seconds)
        shared = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[ExportWorkflow, RecoveryWorkflow, SweeperWorkflow],
            activities=[*export.shared_activities(), *recovery.activities(), *sweeper.activities()],
            graceful_shutdown_timeout=grace,
            identity=f"{worker_id}@shared",
        )
        own = Worker(
            client,
            task_queue=own_queue,
            activities=export.own_activities(),
            graceful_shutdown_timeout=grace,
            identity=f"{worker_id}@own",
        )
        dispatcher = OutboxDispatcher(
            JobStore(dispatcher_pool), client, settings.task_queue, listen_url=settings.database_url
        )
        log.info("worker %s: shared queue %s, own queue %s", worker_id, settings.task_queue, own_queue)
        scavenger = asyncio.create_task(
            scavenge_periodically(store, settings.work_dir, settings.recovery_every_seconds), name="scavenger"
        )
        try:
            await _serve(shared, own, dispatcher, stop=stop, ready=ready)
        finally:
            scavenger.cancel()
        log.info("worker %s stopped", worker_id)


async def scavenge_periodically(store: JobStore, work_dir: Path, every_seconds: float) -> None:
    """Remove the local export files of ended attempts (a killed worker's contact data), now and every
    ``every_seconds``; a failed pass is logged and tried again next time."""
    while True:
        try:
            await scavenge_export_files(work_dir, store.live_attempts)
        except StoreError as exc:
            log.warning("scavenger pass failed (%s); trying again later", type(exc).__name__)
        await asyncio.sleep(every_seconds)


async def _serve(
    shared: Worker,
    own: Worker,
    dispatcher: OutboxDispatcher,
    *,
    stop: asyncio.Event,
    ready: asyncio.Event | None,
) -> None:
    """Run the two workers and the dispatcher until ``stop`` (or one of them ends), then stop in order."""
    dispatcher_stop = asyncio.Event()
    runs = [
        asyncio.create_task(shared.run(), name="shared-worker"),
        asyncio.create_task(own.run(), name="own-worker"),
        asyncio.create_task(dispatcher.run(dispatcher_stop), name="outbox-dispatcher"),
    ]
    stopping = asyncio.create_task(stop.wait())
    listening = asyncio.create_task(dispatcher.ready.wait())
    await asyncio.wait([listening, stopping, *runs], return_when=asyncio.FIRST_COMPLETED)
    if ready is not None and listening.done():
        ready.set()
    await asyncio.wait([stopping, *runs], return_when=asyncio.FIRST_COMPLETED)
    for waiter in (stopping, listening):
        waiter.cancel()

    # Stop taking work: no new wake-ups, no new tasks; running activities get the grace window.
    dispatcher_stop.set()
    log.info("shutting down: no new work, running activities get the grace window")
    await asyncio.gather(shared.shutdown(), own.shutdown(), return_exceptions=True)
    results = await asyncio.gather(*runs, return_exceptions=True)
    failures = [
        (task.get_name(), outcome)
        for task, outcome in zip(runs, results, strict=True)
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError)
    ]
    for name, outcome in failures:
        log.error("%s ended with %s", name, type(outcome).__name__)
    if failures and not stop.is_set():
        raise RuntimeError(f"{failures[0][0]} ended unexpectedly") from failures[0][1]


async def _ensure_schedules_tolerant(client: Client, settings: Settings) -> None:
    try:
        await ensure_schedules(client, settings)
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        log.warning("this Temporal server has no Schedules; recovery and the sweeper will not run from here")


def main() -> None:
    """Build the settings, install the signal handlers and run the worker until SIGTERM or SIGINT."""
    argparse.ArgumentParser(
        description="The Temporal worker: ExportWorkflow and its activities, the outbox dispatcher, and the "
        "recovery and sweeper schedules. Configured by EXPORTS_* environment variables (see settings.py): "
        "EXPORTS_DATABASE_URL and EXPORTS_TEMPORAL_ADDRESS at least. Stops gracefully on SIGTERM/SIGINT."
    ).parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    if not settings.database_url:
        sys.exit("worker.py: EXPORTS_DATABASE_URL is not set (a PostgreSQL URL of a login that may SET ROLE)")
    secret = settings.sftp_key_passphrase
    try:
        set_key_passphrase(
            passphrase_from(secret.get_secret_value() if secret else None, settings.sftp_key_passphrase_file)
        )
    except ValueError as exc:
        sys.exit(f"worker.py: EXPORTS_SFTP_KEY_PASSPHRASE_FILE: {exc}")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop=stop)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except TemporalConnectError as exc:
        print(f"worker.py: {exc}", file=sys.stderr, flush=True)  # one line naming the setting
        # Not sys.exit: a connect abandoned at its timeout leaves SDK threads that panic if they
        # outlive the interpreter's shutdown. Nothing has started yet, so there is nothing to clean up.
        os._exit(1)


if __name__ == "__main__":
    main()

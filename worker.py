"""``python worker.py``: one host's worker. It only wires.

It opens the database pools, connects to Temporal, registers the Web UI's search attributes where the
server allows it, creates the recovery and sweeper Schedules if they are missing (runtime/), brings every
recurring export's Schedule to its PostgreSQL row (service/recurring_schedules.py), and runs:

- a Temporal worker on the shared task queue: ExportWorkflow, RecoveryWorkflow, SweeperWorkflow,
  RecurringFireWorkflow (recurring exports' Schedules), ConnectionTestWorkflow (a destination's connection
  test), the claim, recovery, sweeper, firing and connection-test activities;
- a Temporal worker on this host's own queue (``{task_queue}-{worker_id}``): the build, cutoff 2 and
  delivery activities of the attempts this host claimed, so the local file never leaves the host;
- the outbox dispatcher, the webhook dispatcher (outcome notifications) and the scavenger of local files.

On SIGTERM or SIGINT it stops taking work, gives running activities ``shutdown_grace_seconds`` to reach
their outcome writes, then cancels what is left; the leases of attempts it abandoned expire and recovery
takes them over. The test harness builds its hosts with :func:`open_export_activities` and
:func:`build_workers`, the same wiring as here.
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

from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from activities.export import ExportActivities
from activities.recovery import RecoveryActivities
from activities.recurring import RecurringActivities
from activities.sweeper import SweeperActivities
from db.errors import StoreError
from db.pool import START_RETRY_SECONDS, open_pool, wait_for_postgres
from db.stores.api import ApiStore
from db.stores.base import REREAD_TIMEOUT_SECONDS
from db.stores.notifications import NotificationStore
from db.stores.outbox import DispatcherStore
from db.stores.protocol import WorkerStore
from db.stores.recovery import RecoveryStore
from db.stores.recurring import RecurringStatements
from observability.metrics import get_metrics
from observability.setup import busy_metrics_ports, configure_process, start_worker_endpoints, worker_runtime
from observability.temporal import LogContextInterceptor, workflow_runner
from observability.tracing import shutdown_tracing
from partner.client import passphrase_from, set_key_passphrase
from partner.kinds import partner_for
from runtime.dispatcher import OutboxDispatcher
from runtime.drain import HostWorkers, serve_then_drain
from runtime.scavenger import scavenge_periodically
from runtime.schedules import ensure_schedules
from runtime.search_attributes import register_search_attributes
from runtime.temporal_calls import until_temporal_answers
from runtime.webhooks import WebhookDispatcher
from service.recurring_schedules import ScheduleSync
from service.temporal import ADDRESS as TEMPORAL_ADDRESS
from service.temporal import NAMESPACE as TEMPORAL_NAMESPACE
from service.temporal import TemporalConnectError, connect_client
from settings import Settings
from workflows.connection_test import ConnectionTestWorkflow
from workflows.export import ExportWorkflow
from workflows.recovery import RecoveryWorkflow
from workflows.recurring import RecurringFireWorkflow
from workflows.sweeper import SweeperWorkflow

log = logging.getLogger("worker")
_UNRELEASED: list[HostWorkers] = []  # see run_worker: kept until the process exits


def own_task_queue(task_queue: str, worker_id: str) -> str:
    """A host's own task queue, where the activities after the claim run."""
    return f"{task_queue}-{worker_id}"


def new_worker_id(settings: Settings) -> str:
    """The configured worker ID, else one unique to this process (host name and a random suffix)."""
    return settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def open_export_activities(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    *,
    worker_id: str,
    search_attributes: bool,
    worker_url: str | None = None,
    build_url: str | None = None,
    build_pool_timeout: float = 15.0,
    reread_timeout: float = REREAD_TIMEOUT_SECONDS,
) -> ExportActivities:
    """One host's export activities over pools opened from ``settings`` (closed by ``stack``).

    The ``exports_worker`` pool serves the store and the builder; a small ``exports_api`` pool records a
    workflow cancellation from Temporal through the cancellation transaction, which the worker role may not
    write. ``worker_url`` points the worker pool elsewhere and ``build_url`` the build pool (a TCP proxy,
    or nothing listening, in tests).
    """
    assert settings.database_url is not None
    url = worker_url or settings.database_url
    # The protocol's statements (renewals, cutoff 2, fences, evidence) and the builder's COPY never share
    # connections: a build holds its connection for the whole COPY, and renewals must not wait behind it.
    worker_pool = await open_pool(
        url, "exports_worker", max_size=settings.worker_pool_size, name=f"worker-{worker_id}"
    )
    stack.push_async_callback(worker_pool.close)
    build_pool = await open_pool(
        build_url or url,
        "exports_worker",
        min_size=0,
        max_size=settings.max_concurrent_builds,
        name=f"build-{worker_id}",
        checkout_timeout=build_pool_timeout,
    )
    stack.push_async_callback(build_pool.close)
    api_pool = await open_pool(settings.database_url, "exports_api", max_size=2, name=f"cancel-{worker_id}")
    stack.push_async_callback(api_pool.close)
    export = ExportActivities(
        WorkerStore(
            worker_pool,
            lease_seconds=settings.lease_seconds,
            reread_timeout=reread_timeout,
            window_margin_seconds=settings.window_rename_margin_seconds,
        ),
        build_pool,
        settings,
        worker_id,
        own_task_queue(settings.task_queue, worker_id),
        cancellation_store=ApiStore(api_pool, lease_seconds=settings.lease_seconds),
        search_attributes=search_attributes,
        max_concurrent_deliveries=settings.max_concurrent_deliveries,
        partners=partner_for,
    )
    stack.push_async_callback(export.aclose)
    return export


class PostgresUnreachable(Exception):
    """PostgreSQL was not reached at start-up within the retry window, or refused for good."""


# Errors a retry can fix: nothing answers at the address yet (a server starting or restarting), or its
# namespace is not registered yet. Bad TLS files, certificates or API keys fail at once.
_RETRYABLE_SETTINGS = (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE)


async def connect_with_retry(settings: Settings, *, runtime: Runtime | None = None) -> Client:
    """``connect_client``, retried with backoff (0.5 s doubling to 5 s) while Temporal does not answer, for
    ``temporal_connect_timeout_seconds`` in all (each attempt gets what is left), each failure logged; then
    the last ``TemporalConnectError``, one line naming the setting. A worker started while Temporal
    restarts comes up once it is back; a bad TLS file, certificate or API key fails at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.temporal_connect_timeout_seconds
    delay = 0.5
    while True:
        left = deadline - loop.time()
        attempt = settings.model_copy(update={"temporal_connect_timeout_seconds": max(left, 1.0)})
        try:
            return await connect_client(attempt, runtime=runtime)
        except TemporalConnectError as exc:
            left = deadline - loop.time()
            if exc.setting not in _RETRYABLE_SETTINGS or left <= 0:
                raise
            log.warning("Temporal is not reachable yet (%s); retrying in %.1f s", exc, min(delay, left))
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)


def build_workers(
    client: Client,
    settings: Settings,
    export: ExportActivities,
    *,
    recovery: RecoveryActivities | None = None,
    sweeper: SweeperActivities | None = None,
    recurring: RecurringActivities | None = None,
) -> HostWorkers:
    """The Temporal workers of one host: the shared queue's workflows, the shared queue's activities (the
    claim, and recovery and the sweeper when given), and the host's own queue. Each binds the export's IDs
    to the log lines of its activities (``LogContextInterceptor``); the tracing interceptor, when on,
    comes with the client."""
    workflows: list[type] = [ExportWorkflow, ConnectionTestWorkflow]
    shared_activities = export.shared_activities()
    if recovery is not None:
        workflows.append(RecoveryWorkflow)
        shared_activities += recovery.activities()
    if sweeper is not None:
        workflows.append(SweeperWorkflow)
        shared_activities += sweeper.activities()
    if recurring is not None:
        workflows.append(RecurringFireWorkflow)
        shared_activities += recurring.activities()
    grace = timedelta(seconds=settings.shutdown_grace_seconds)
    return HostWorkers(
        workflows=Worker(
            client,
            task_queue=settings.task_queue,
            workflows=workflows,
            workflow_runner=workflow_runner(),
            graceful_shutdown_timeout=grace,
            identity=f"{export.worker_id}@workflows",
            interceptors=[LogContextInterceptor()],
        ),
        claims=Worker(
            client,
            task_queue=settings.task_queue,
            activities=shared_activities,
            graceful_shutdown_timeout=grace,
            identity=f"{export.worker_id}@shared",
            interceptors=[LogContextInterceptor()],
        ),
        own=Worker(
            client,
            task_queue=export.own_task_queue,
            activities=export.own_activities(),
            graceful_shutdown_timeout=grace,
            identity=f"{export.worker_id}@own",
            interceptors=[LogContextInterceptor()],
        ),
    )


async def run_worker(
    settings: Settings,
    *,
    stop: asyncio.Event,
    client: Client | None = None,
    ready: asyncio.Event | None = None,
    schedules: bool = True,
    export_hooks: Callable[[ExportActivities], None] | None = None,
) -> bool:
    """Run one host's workers, the outbox dispatcher and the scavenger until ``stop`` is set, then shut
    down gracefully. Returns False when a Temporal worker never stopped (its polls were not released:
    the server is partitioned or hung) although nothing was held any more; the process should then exit
    without waiting for it.

    ``client`` defaults to one connected from ``settings``; ``ready`` is set once both workers run and the
    dispatcher listens. The metrics port (``metrics_port``; 0 serves nothing) serves ``/metrics`` with the
    database gauges, ``/healthz`` and ``/readyz`` until the workers have stopped. With ``schedules`` the
    recovery and sweeper Schedules are ensured. ``export_hooks``
    receives the ``ExportActivities`` before the workers start (a test seam for its hooks). On ``stop``
    the dispatcher stops first, then both workers stop polling and give running activities
    ``shutdown_grace_seconds`` before cancelling them; recovery takes over whatever was abandoned.
    """
    if settings.database_url is None:
        raise ValueError("EXPORTS_DATABASE_URL is not set")
    worker_id = new_worker_id(settings)
    client = client or await connect_with_retry(settings)
    try:
        await wait_for_postgres(settings.database_url, START_RETRY_SECONDS, what="the worker")
    except StoreError as exc:
        raise PostgresUnreachable(str(exc)) from exc
    # Temporal answered the connect; a restart or an overload after it is waited out as long as PostgreSQL's
    # (the soak's dev server took over 10 s to come back under load, and a worker exited on it).
    within = max(settings.temporal_connect_timeout_seconds, START_RETRY_SECONDS)
    search_attributes = await until_temporal_answers(
        lambda: register_search_attributes(client, client.namespace), "search attributes", within=within
    )
    if schedules:
        await until_temporal_answers(
            lambda: ensure_schedules(client, settings), "the Schedules", within=within
        )

    async with contextlib.AsyncExitStack() as resources:
        export = await open_export_activities(
            settings, resources, worker_id=worker_id, search_attributes=search_attributes
        )
        if export_hooks is not None:
            export_hooks(export)
        dispatcher_pool = await open_pool(
            settings.database_url, "exports_dispatcher", max_size=3, name=f"dispatcher-{worker_id}"
        )
        resources.push_async_callback(dispatcher_pool.close)
        # Takeovers run as their own role: the trigger lets exports_recovery take only recovery's edges.
        recovery_pool = await open_pool(
            settings.database_url,
            "exports_recovery",
            max_size=min(4, settings.recovery_concurrency),
            name=f"recovery-{worker_id}",
            # how long a slot recovery's takeover leaves held for the attempt it took over (0041)
            parameters={"fenced.session_takeover_hold_seconds": str(settings.session_takeover_hold_seconds)},
        )
        resources.push_async_callback(recovery_pool.close)
        # Recurring exports' firings create exports through the API's create, so they run as exports_api.
        recurring_pool = await open_pool(
            settings.database_url, "exports_api", max_size=4, name=f"recurring-{worker_id}"
        )
        resources.push_async_callback(recurring_pool.close)
        recurring_store = RecurringStatements(recurring_pool)
        if schedules:
            synced = await ScheduleSync(
                client,
                task_queue=settings.task_queue,
                catchup_window_seconds=settings.recurring_catchup_window_seconds,
            ).reconcile(recurring_store)
            log.info("recurring exports' schedules: %s", {k.value: n for k, n in synced.items() if n})
        workers = build_workers(
            client,
            settings,
            export,
            recovery=RecoveryActivities(RecoveryStore(recovery_pool), settings, partners=partner_for),
            sweeper=SweeperActivities(export.store, settings),
            recurring=RecurringActivities(recurring_store, settings),
        )
        dispatcher = OutboxDispatcher(
            DispatcherStore(dispatcher_pool), client, settings, listen_url=settings.database_url
        )
        log.info(
            "worker %s: shared queue %s, own queue %s", worker_id, settings.task_queue, export.own_task_queue
        )
        # /metrics (with the database gauges), /healthz and /readyz; stopped after the workers and the
        # dispatcher, so readiness answers through the drain.
        endpoints = await start_worker_endpoints(settings, get_metrics(), export.store.pool, client)
        resources.push_async_callback(endpoints.stop)
        if endpoints.url is not None:
            log.info("worker %s: /metrics, /healthz and /readyz at %s", worker_id, endpoints.url)
        scavenger = asyncio.create_task(
            scavenge_periodically(export.store, settings.work_dir, settings.recovery_every_seconds),
            name="scavenger",
        )
        # Outcome notifications: POSTs to the tenants' endpoints, over the dispatcher's pool; an attempt cut
        # by the shutdown is sent again once its lease passes (at least once, by event ID).
        webhooks = (
            asyncio.create_task(
                WebhookDispatcher(NotificationStore(dispatcher_pool), settings).run(stop), name="webhooks"
            )
            if settings.webhooks_enabled
            else None
        )
        try:
            clean = await serve_then_drain(
                workers, dispatcher, export.attempts, settings.shutdown_grace_seconds, stop=stop, ready=ready
            )
        finally:
            scavenger.cancel()
            if webhooks is not None:
                webhooks.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await webhooks
        if not clean:
            # Workers whose polls Temporal never released must never be finalized: their core's drop
            # waits for those polls, so a garbage collection before main()'s os._exit would hang there.
            _UNRELEASED.append(workers)
        log.info("worker %s stopped", worker_id)
        return clean


def main() -> None:
    """Build the settings, install the signal handlers and run the worker until SIGTERM or SIGINT."""
    argparse.ArgumentParser(
        description="The Temporal worker: ExportWorkflow and its activities, the outbox dispatcher, and the "
        "recovery and sweeper schedules. Configured by EXPORTS_* environment variables (see settings.py): "
        "EXPORTS_DATABASE_URL and EXPORTS_TEMPORAL_ADDRESS at least. Stops gracefully on SIGTERM/SIGINT."
    ).parse_args()
    settings = Settings()
    configure_process(settings, "worker")  # logging, tracing (OTEL_*) and the process's metrics
    if not settings.database_url:
        sys.exit("worker.py: EXPORTS_DATABASE_URL is not set (a PostgreSQL URL of a login that may SET ROLE)")
    secret = settings.sftp_key_passphrase
    try:
        set_key_passphrase(
            passphrase_from(secret.get_secret_value() if secret else None, settings.sftp_key_passphrase_file)
        )
    except ValueError as exc:
        sys.exit(f"worker.py: EXPORTS_SFTP_KEY_PASSPHRASE_FILE: {exc}")

    for line in busy_metrics_ports(settings):
        print(f"worker.py: {line}", file=sys.stderr, flush=True)
        sys.exit(1)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # One runtime per process: it serves the SDK's own worker metrics on temporal_metrics_port.
        client = await connect_with_retry(settings, runtime=worker_runtime(settings))
        if not await run_worker(settings, stop=stop, client=client):
            # asyncio.run would wait forever for the task Temporal never released; nothing is held.
            shutdown_tracing()
            logging.shutdown()
            os._exit(0)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
        shutdown_tracing()  # flushes the spans still batched
        # Everything is closed; skip the interpreter's finalization. A thread of the SDK's core that calls
        # back into Python while the interpreter finalizes aborts the process ("Fatal Python error:
        # PyGILState_Release", exit -6): about one clean SIGTERM in eight here.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except PostgresUnreachable as exc:
        # Never reached, or refused for good. One line; the URL is not in it.
        print(f"worker.py: EXPORTS_DATABASE_URL: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    except TemporalConnectError as exc:
        print(f"worker.py: {exc}", file=sys.stderr, flush=True)  # one line naming the setting
        # Not sys.exit: a connect abandoned at its timeout leaves SDK threads that panic if they
        # outlive the interpreter's shutdown. Nothing has started yet, so there is nothing to clean up.
        os._exit(1)


if __name__ == "__main__":
    main()

"""The outbox dispatcher: publishes each committed wake-up by starting its ExportWorkflow.

It runs inside ``worker.py`` beside the Temporal workers, not as an activity. It wakes on the ``outbox``
NOTIFY (the insert trigger sends one) and polls as a fallback, so a lost notification only delays a
wake-up. Each pass takes unpublished rows with ``FOR UPDATE SKIP LOCKED`` as ``exports_dispatcher``
(``JobStore.take_and_publish``), so several dispatchers can run at once and each row is published by one.

A row maps to the workflow ID ``export-{job_id}-{message_id}``. Started with ``USE_EXISTING`` and
``REJECT_DUPLICATE``, a row retried after an uncertain publish reaches the same workflow and starts it
once; a new wake-up (a new outbox row) is a new workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from db.errors import StoreError
from db.notify import outbox_wakeups
from db.store import JobStore
from domain.models import OutboxMessage
from settings import Settings
from workflows.export import ExportWorkflow, export_summary, export_workflow_id
from workflows.models import ExportInput

log = logging.getLogger(__name__)


START_TIMEOUT = timedelta(seconds=10)

MessageHook = Callable[[OutboxMessage], Awaitable[None]]


class OutboxDispatcher:
    """Publishes outbox rows to Temporal; ``run`` until ``stop`` is set.

    ``store`` must be a ``JobStore`` over an ``exports_dispatcher`` pool. ``listen_url`` is the login URL
    for the dedicated LISTEN connection (``None`` polls only). The ``before_publish`` and
    ``after_start`` hooks are test seams, awaited inside the batch transaction (rows locked) before and
    after the workflow start; an exception from either leaves that row unpublished for the next pass.
    """

    def __init__(
        self,
        store: JobStore,
        client: Client,
        settings: Settings,
        *,
        listen_url: str | None,
        poll_seconds: float | None = None,
        before_publish: MessageHook | None = None,
        after_start: MessageHook | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.settings = settings
        self.task_queue = settings.task_queue
        self.listen_url = listen_url
        self.poll_seconds = settings.dispatcher_poll_seconds if poll_seconds is None else poll_seconds
        self.batch = settings.dispatcher_batch
        self.before_publish = before_publish
        self.after_start = after_start
        self.published_count = 0
        # Set once LISTEN is in place and the first drain is done: a row inserted after this wakes us.
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._listening = asyncio.Event()

    async def publish(self, msg: OutboxMessage) -> None:
        """Start the wake-up's ExportWorkflow; an already started or finished one counts as published."""
        if self.before_publish is not None:
            await self.before_publish(msg)
        workflow_id = export_workflow_id(msg.job_id, msg.message_id)
        try:
            await self.client.start_workflow(
                ExportWorkflow.run,
                export_input(self.settings, msg),
                id=workflow_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=export_summary(msg.job_id),
                static_details=f"wake-up {msg.message_id} ({msg.kind}), job {msg.job_id}",
                # Bounded: the batch's rows stay locked while this waits, and an unanswered start is retried.
                rpc_timeout=START_TIMEOUT,
            )
        except WorkflowAlreadyStartedError:
            # A retried row whose workflow already ran to its end: it was published before.
            log.info("workflow %s already ran; wake-up %s counts as published", workflow_id, msg.message_id)
        if self.after_start is not None:
            await self.after_start(msg)

    async def dispatch_once(self) -> int:
        """Publish unpublished rows until a pass finds fewer than a batch; returns how many were published."""
        total = 0
        while True:
            published = await self.store.take_and_publish(self.publish, batch=self.batch)
            total += len(published)
            self.published_count += len(published)
            if len(published) < self.batch:
                return total

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until ``stop`` is set: at once, on every NOTIFY, and every ``poll_seconds`` regardless."""
        listener = asyncio.create_task(self._listen(stop), name="outbox-listener")
        try:
            while not stop.is_set():
                # A pass that starts after LISTEN is in place misses nothing committed before it.
                listening = self._listening.is_set() or self.listen_url is None
                await self._drain_logged()
                if listening:
                    self.ready.set()
                await self._wait_for_wake_up(stop)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _drain_logged(self) -> None:
        self._wake.clear()
        try:
            await self.dispatch_once()
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the next wake-up or poll
            log.warning("outbox pass failed (%s); retrying at the next wake-up", type(exc).__name__)

    async def _wait_for_wake_up(self, stop: asyncio.Event) -> None:
        stopping = asyncio.create_task(stop.wait())
        woken = asyncio.create_task(self._wake.wait())
        try:
            await asyncio.wait(
                {stopping, woken}, timeout=self.poll_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (stopping, woken):
                task.cancel()

    async def _listen(self, stop: asyncio.Event) -> None:
        """Hold a dedicated LISTEN connection, reconnecting after failures; polling covers the gaps."""
        if self.listen_url is None:
            return
        while not stop.is_set():
            try:
                async for _ in outbox_wakeups(self.listen_url):
                    # The first is LISTEN in place: rows committed before it sent nothing we heard.
                    self._listening.set()
                    self._wake.set()
            except (StoreError, OSError) as exc:
                log.warning(
                    "outbox LISTEN connection lost (%s); polling until it is back", type(exc).__name__
                )
            finally:
                self._listening.clear()
            # Reconnect after a poll interval, or not at all when stopping.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.poll_seconds)


def export_input(settings: Settings, msg: OutboxMessage) -> ExportInput:
    """The workflow input for one wake-up, with this deployment's activity timeouts."""
    return ExportInput(
        job_id=msg.job_id,
        message_id=msg.message_id,
        build_heartbeat_seconds=settings.build_heartbeat_seconds,
        deliver_heartbeat_seconds=settings.deliver_heartbeat_seconds,
        schedule_to_start_seconds=settings.schedule_to_start_seconds,
        build_timeout_seconds=settings.build_timeout_seconds,
        deliver_timeout_seconds=settings.deliver_timeout_seconds,
    )

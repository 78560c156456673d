"""The outbox dispatcher: publishes each committed wake-up by starting its ExportWorkflow.

It runs inside ``worker.py`` beside the Temporal workers, not as an activity. It wakes on the ``outbox``
NOTIFY (the insert trigger sends one) and polls as a fallback, so a lost notification only delays a
wake-up. Each pass, as ``exports_dispatcher``:

1. takes a batch of unpublished rows with a short publishing lease (``DispatcherStore.take_unpublished``: one
   conditional ``UPDATE ... FOR UPDATE SKIP LOCKED`` that sets ``publishing_until``), and commits: no
   transaction and no row lock is held while Temporal answers;
2. starts their workflows concurrently, at most ``concurrency`` starts in flight in this dispatcher;
3. marks the started ones published (``mark_published``, conditional on not yet published) and gives
   the failed ones back at once (``release_unpublished``) for the next pass.

Several dispatchers can run at once: a row leased by one is skipped by the others until its lease passes.
A dispatcher that dies after taking a batch leaves it to any dispatcher once the lease passes, with the
same message IDs. A row maps to the workflow ID ``export-{job_id}-{message_id}``; started with
``USE_EXISTING`` and ``REJECT_DUPLICATE``, a row published twice (a lost mark, an expired lease) reaches
the same workflow and starts it once; a new wake-up (a new outbox row) is a new workflow.

A start only begins while its row's lease has at least ``start_timeout`` and a margin left, and the start
is bounded by ``start_timeout``, so a slow Temporal makes rows wait for the next pass rather than be
started by two dispatchers at once. Each start runs in the trace of the request that wrote the row
(``outbox.traceparent``), and records the outbox lag (row created, database clock, to workflow started).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from db.errors import StoreError
from db.notify import outbox_wakeups
from db.stores.outbox import DispatcherStore
from domain.models import OutboxMessage
from observability.metrics import get_metrics
from observability.tracing import continue_trace
from settings import Settings
from workflows.export import ExportWorkflow, export_summary, export_workflow_id
from workflows.models import ExportInput

log = logging.getLogger(__name__)


START_TIMEOUT = timedelta(seconds=10)  # one workflow start, retries included
LEASE_MARGIN_SECONDS = 2.0  # a start begins only with start_timeout + this left on its lease

MessageHook = Callable[[OutboxMessage], Awaitable[None]]


@dataclass(frozen=True)
class PassResult:
    """What one pass did: rows taken, rows it marked published, rows whose start failed (given back)."""

    taken: int
    published: int
    failed: int


class OutboxDispatcher:
    """Publishes outbox rows to Temporal; ``run`` until ``stop`` is set.

    ``store`` must be a ``DispatcherStore`` over an ``exports_dispatcher`` pool. ``listen_url`` is the login URL
    for the dedicated LISTEN connection (``None`` polls only). ``lease_seconds`` is a taken row's
    publishing lease, ``concurrency`` the starts in flight at once, ``passes`` the batches in flight at
    once (a second batch is taken while the first one's last starts finish; they share ``concurrency``).
    The ``before_publish`` and ``after_start`` hooks are test seams, awaited outside any transaction,
    with the row leased, before and after the workflow start; an exception from either gives that row
    back, unpublished, for the next pass.
    """

    def __init__(
        self,
        store: DispatcherStore,
        client: Client,
        settings: Settings,
        *,
        listen_url: str | None,
        poll_seconds: float | None = None,
        lease_seconds: float | None = None,
        concurrency: int | None = None,
        passes: int = 2,
        start_timeout: timedelta = START_TIMEOUT,
        before_publish: MessageHook | None = None,
        after_start: MessageHook | None = None,
    ) -> None:
        lease_seconds = settings.dispatcher_lease_seconds if lease_seconds is None else lease_seconds
        concurrency = settings.dispatcher_concurrency if concurrency is None else concurrency
        if lease_seconds <= start_timeout.total_seconds() + LEASE_MARGIN_SECONDS:
            raise ValueError(
                f"lease_seconds ({lease_seconds:g}) must exceed the start timeout "
                f"({start_timeout.total_seconds():g} s) plus {LEASE_MARGIN_SECONDS:g} s"
            )
        if concurrency < 1 or passes < 1:
            raise ValueError("concurrency and passes must be at least 1")
        self.store = store
        self.client = client
        self.settings = settings
        self.task_queue = settings.task_queue
        self.listen_url = listen_url
        self.poll_seconds = settings.dispatcher_poll_seconds if poll_seconds is None else poll_seconds
        self.batch = settings.dispatcher_batch
        self.lease_seconds = lease_seconds
        self.concurrency = concurrency
        self.passes = passes
        self.start_timeout = start_timeout
        self.before_publish = before_publish
        self.after_start = after_start
        self.published_count = 0
        # Set once LISTEN is in place and the first drain is done: a row inserted after this wakes us.
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._listening = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)

    async def publish(self, msg: OutboxMessage) -> None:
        """Start the wake-up's ExportWorkflow in its request's trace; an already started or finished one
        counts as published."""
        if self.before_publish is not None:
            await self.before_publish(msg)
        workflow_id = export_workflow_id(msg.job_id, msg.message_id)
        try:
            with continue_trace(msg.traceparent):
                async with asyncio.timeout(self.start_timeout.total_seconds()):
                    await self.client.start_workflow(
                        ExportWorkflow.run,
                        export_input(self.settings, msg),
                        id=workflow_id,
                        task_queue=self.task_queue,
                        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                        static_summary=export_summary(msg.job_id),
                        static_details=f"wake-up {msg.message_id} ({msg.kind}), job {msg.job_id}",
                        rpc_timeout=self.start_timeout,
                    )
        except WorkflowAlreadyStartedError:
            # A retried row whose workflow already ran to its end: it was published before.
            log.info("workflow %s already ran; wake-up %s counts as published", workflow_id, msg.message_id)
        if self.after_start is not None:
            await self.after_start(msg)

    async def dispatch_once(self) -> int:
        """Publish unpublished rows until a pass finds fewer than a batch or a start fails; returns how
        many rows this dispatcher marked published."""
        # Each pass ends by itself (never cancelled half-way, which would leave its rows to their leases);
        # the first failure is raised once all of them have.
        outcomes = await asyncio.gather(*(self._passes() for _ in range(self.passes)), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return sum(o for o in outcomes if isinstance(o, int))

    async def _passes(self) -> int:
        total = 0
        while True:
            result = await self.dispatch_pass()
            total += result.published
            # A short batch means the outbox is drained; a failure waits for the next wake-up or poll.
            if result.taken < self.batch or result.failed:
                return total

    async def dispatch_pass(self) -> PassResult:
        """Take one leased batch, start its workflows concurrently, mark the started ones published and
        give the others back."""
        loop = asyncio.get_running_loop()
        taken_at = loop.time()
        taken = await self.store.take_unpublished(self.batch, self.lease_seconds)
        if not taken:
            return PassResult(0, 0, 0)
        # Measured from before the take, so it is never later than the lease's own clock.
        last_start = taken_at + self.lease_seconds - self.start_timeout.total_seconds() - LEASE_MARGIN_SECONDS
        elapsed = await asyncio.gather(*(self._start_leased(msg, last_start, taken_at) for msg in taken))
        started = {
            msg.message_id: (msg, seconds)
            for msg, seconds in zip(taken, elapsed, strict=True)
            if seconds is not None
        }
        failed = [msg for msg, seconds in zip(taken, elapsed, strict=True) if seconds is None]
        marked: set[UUID] = set()
        if started:
            try:
                marked = await self.store.mark_published(list(started))
            except StoreError as exc:
                # The workflows started; the rows stay leased and are published again, to the same
                # workflows, once their leases pass.
                log.warning("marking %d wake-ups published failed (%s)", len(started), type(exc).__name__)
        metrics = get_metrics()
        for message_id in marked:
            msg, seconds = started[message_id]
            metrics.observe_outbox_lag(msg.waited_seconds + seconds)
        if failed:
            try:
                await self.store.release_unpublished(failed)
            except StoreError as exc:
                log.warning(
                    "giving back %d wake-ups failed (%s); their leases will pass",
                    len(failed),
                    type(exc).__name__,
                )
        self.published_count += len(marked)
        return PassResult(len(taken), len(marked), len(failed))

    async def _start_leased(self, msg: OutboxMessage, last_start: float, taken_at: float) -> float | None:
        """Publish one leased row within its lease; seconds from the take to the start, or ``None``."""
        loop = asyncio.get_running_loop()
        async with self._slots:
            if loop.time() > last_start:
                log.info("wake-up %s: too little of its lease left to start; next pass", msg.message_id)
                return None
            try:
                await self.publish(msg)
            except Exception as exc:  # noqa: BLE001 - any publish failure gives the row back for a retry
                log.warning(
                    "publishing wake-up %s failed (%s); it stays in the outbox",
                    msg.message_id,
                    type(exc).__name__,
                )
                return None
            return loop.time() - taken_at

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

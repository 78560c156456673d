"""A host's drain: run its Temporal workers and outbox dispatcher until told to stop, then stop in four
steps so that nothing authorized is cut short and nothing unauthorized crosses cutoff 2 (000 "Shutdown").

``worker.py`` wires the pieces and calls :func:`serve_then_drain`; the attempts it stops and waits on are
the host's :class:`runtime.attempts.AttemptRegistry`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from temporalio.worker import Worker

from runtime.attempts import AttemptRegistry

log = logging.getLogger("worker")

# After a drain with nothing left to finish, how long to wait for Temporal to release the workers' polls.
POLL_RELEASE_SECONDS = 3.0


class Dispatching(Protocol):
    """What the drain needs of the outbox dispatcher (``runtime.dispatcher.OutboxDispatcher``): run until
    ``stop``, and say when it listens."""

    ready: asyncio.Event

    async def run(self, stop: asyncio.Event) -> None: ...


@dataclass
class HostWorkers:
    """The three Temporal workers of one host. The shared queue is served by two, so a drain can stop
    claiming at once (``claims``) while workflow tasks and this host's own queue keep going until the
    deliveries it authorized reach their terminal writes."""

    workflows: Worker  # shared queue: ExportWorkflow, RecoveryWorkflow, SweeperWorkflow
    claims: Worker  # shared queue: the claim, a Temporal cancel's record, recovery and the sweeper
    own: Worker  # this host's queue: the build, cutoff 2 and the delivery

    def __iter__(self) -> Iterator[Worker]:
        return iter((self.workflows, self.claims, self.own))


async def serve_then_drain(
    workers: HostWorkers,
    dispatcher: Dispatching,
    attempts: AttemptRegistry,
    grace_seconds: float,
    *,
    stop: asyncio.Event,
    ready: asyncio.Event | None,
) -> bool:
    """Run the workers and the dispatcher until ``stop`` (or one of them ends), then drain:

    1. no new wake-ups (the dispatcher stops) and no new claims (the claim worker shuts down at once);
    2. builds in progress stop and give their attempts back to the queue, not counted as attempts, and no
       attempt crosses cutoff 2 any more (``AttemptRegistry.begin_drain``);
    3. deliveries this host already authorized run to their terminal write, the workflow and own-queue
       workers still serving them, for at most ``grace_seconds``;
    4. then everything stops. An attempt still held at the end is left to its lease and recovery.
    """
    dispatcher_stop = asyncio.Event()
    runs = [
        asyncio.create_task(workers.workflows.run(), name="workflow-worker"),
        asyncio.create_task(workers.claims.run(), name="claim-worker"),
        asyncio.create_task(workers.own.run(), name="own-worker"),
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

    log.info("draining: no new wake-ups or claims; builds give their attempts back; deliveries finish")
    dispatcher_stop.set()
    attempts.begin_drain()
    began = time.monotonic()
    # In-flight claims finish first (bounded by the grace), so the attempts they open are drained too.
    # (Bounded: a partitioned Temporal server never releases the claim worker's polls.)
    claims_down = asyncio.ensure_future(workers.claims.shutdown())
    await asyncio.wait([claims_down], timeout=grace_seconds)
    left = max(0.0, grace_seconds - (time.monotonic() - began))
    if not await attempts.wait_quiet(left):
        log.warning(
            "drain: %d attempt(s) still held after the grace window; their leases decide", attempts.busy
        )
    finishing = asyncio.ensure_future(
        asyncio.gather(
            workers.workflows.shutdown(), workers.own.shutdown(), claims_down, return_exceptions=True
        )
    )
    if attempts.busy:
        await finishing  # an upload still running is never cut short by the drain
    else:
        # Nothing is held any more: what is left is Temporal releasing the polls, which a partitioned or
        # hung server never answers. That must not hold up a deploy.
        await asyncio.wait([finishing], timeout=POLL_RELEASE_SECONDS)
    # Judged now, not after the cancels below: cancelling the runs can complete ``finishing`` while
    # the core still waits for the polls, and an interpreter shutdown would then hang on them.
    released = finishing.done()
    if not released:
        log.warning(
            "drain: Temporal did not release the polls in %.0fs; stopping anyway", POLL_RELEASE_SECONDS
        )
        for run in runs:
            run.cancel()
    done, hung = await asyncio.wait(runs, timeout=POLL_RELEASE_SECONDS)
    if hung:
        log.warning(
            "drain: %s did not stop; exiting without it", ", ".join(sorted(t.get_name() for t in hung))
        )
    failures = [
        (task.get_name(), error)
        for task in done
        if not task.cancelled() and (error := task.exception()) is not None
    ]
    for name, outcome in failures:
        log.error("%s ended with %s", name, type(outcome).__name__)
    if failures and not stop.is_set():
        raise RuntimeError(f"{failures[0][0]} ended unexpectedly") from failures[0][1]
    return released and not hung

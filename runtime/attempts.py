"""This host's attempt registry: one record, one lease keeper and one stop switch per attempt.

From the confirmed claim to the attempt's last write (000 "one stop source and one lease keeper") the
attempt has one :class:`Attempt` here: the claim opens it, each activity of the attempt holds it while it
works, and its keeper keeps renewing across the gaps between them. When no activity of the attempt holds
it within the schedule-to-start bound (its workflow is gone), the keeper stops and the
lease expires for recovery. The registry is also what a drain stops (:meth:`AttemptRegistry.begin_drain`)
and waits on (:meth:`AttemptRegistry.wait_quiet`): see :mod:`runtime.drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from uuid import UUID

from db.stores.protocol import WorkerStore
from domain.destination import Destination
from domain.models import ExportJob
from runtime.lease import LeaseKeeper
from settings import Settings

log = logging.getLogger(__name__)


class StopReason(StrEnum):
    STOP_REQUESTED = "stop requested"  # the keeper's renewal or the signal's confirmation saw a stop request
    OWNERSHIP_LOST = "ownership lost"  # a renewal changed no row: a takeover committed
    CANCELLED = "activity cancelled"  # Temporal cancelled the activity (workflow, timeout, worker shutdown)
    DRAINING = "worker draining"  # this worker is shutting down: the attempt is given back


@dataclass
class Attempt:
    """One attempt on this host: its one lease keeper, its stop switch, and who is working for it."""

    job_id: UUID
    attempt_id: UUID
    keeper: LeaseKeeper
    build: asyncio.Task[Any] | None = None
    reason: StopReason | None = None
    stage: str = "claimed"
    rows: int = 0
    bytes: int = 0
    sent: int = 0
    holders: int = 0
    idle: asyncio.Task[None] | None = None
    ended: bool = False
    # The partner session opened and verified before cutoff 2, kept for the upload (issue #24.4): a
    # ``partner.protocol.PartnerSession`` (this module knows no partner); the upload takes it, and whatever
    # is left when the attempt ends here is closed.
    session: Any = None
    # Set while the attempt waits for one of its partner's session slots (issue #25.3): (in use, limit).
    waiting_for_slot: tuple[int, int] | None = None
    closing: asyncio.Task[None] | None = None  # the kept session's close after the attempt lost its job
    lost: bool = False  # a renewal found the job taken over (whatever stopped the attempt first)
    # The row as the claim on this host wrote it, handed on to the build, which then reads it no more (its
    # ownership is the keeper's to watch, and cutoff 2 decides).
    claimed: ExportJob | None = None
    # The destination as the build read it, handed on at cutoff 2's authorization to the upload on this host,
    # which uses it when cutoff 2 authorized that same version (and reads the version it did otherwise).
    contract: Destination | None = None

    def stop(self, reason: StopReason) -> None:
        """Stop the build phase (never cutoff 2 or the upload) for ``reason``; the first reason stands."""
        if self.reason is None:
            self.reason = reason
        if self.build is not None and not self.build.done():
            self.build.cancel()

    def take_session(self) -> Any:
        """The kept partner session, handed over (whoever takes it closes it); ``None`` when there is none."""
        session, self.session = self.session, None
        return session

    async def close_session(self) -> None:
        """Close the kept partner session, if any, off the event loop (closing a transport joins its thread)."""
        session = self.take_session()
        if session is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(session.close)


class AttemptRegistry:
    """The attempts this host holds, each with its lease keeper over ``store`` renewing every
    ``settings.renew_every_seconds``; an attempt no activity holds for ``settings.schedule_to_start_seconds``
    is ended. Both are read when used, so a test may change them on the running host."""

    def __init__(self, store: WorkerStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self._attempts: dict[UUID, Attempt] = {}
        self.draining = False
        self._quiet = asyncio.Event()
        self._quiet.set()

    def get(self, attempt_id: UUID) -> Attempt | None:
        """This host's record of ``attempt_id``, if it holds one."""
        return self._attempts.get(attempt_id)

    def open(
        self,
        job_id: UUID,
        attempt_id: UUID,
        *,
        timer: bool = True,
        before_renewal: Callable[[], Awaitable[None]] | None = None,
        watch_stops: Callable[[], bool] = lambda: True,
    ) -> tuple[Attempt, bool]:
        """This host's record of an attempt, created with its keeper when missing; (attempt, created).

        ``timer`` runs the keeper's renewal timer (off: only on-demand renewals, a paused worker);
        ``before_renewal`` runs before each renewal; a stop request a renewal sees stops the attempt only
        while ``watch_stops()`` (a test seam: stop requests are then caught by cutoff 2 alone).
        """
        found = self._attempts.get(attempt_id)
        if found is not None and not found.ended:
            return found, False
        keeper = LeaseKeeper(
            self.store,
            job_id,
            attempt_id,
            every=self.settings.renew_every_seconds,
            timer=timer,
            before_renewal=before_renewal,
        )
        attempt = Attempt(job_id=job_id, attempt_id=attempt_id, keeper=keeper)

        def stop_requested() -> None:
            if watch_stops():
                attempt.stop(StopReason.STOP_REQUESTED)

        def lost() -> None:
            attempt.lost = True
            attempt.stop(StopReason.OWNERSHIP_LOST)
            if attempt.session is not None:
                # A takeover committed: the job's slot is no longer this attempt's, so neither may its session
                # be held open (another attempt may take the slot and connect).
                attempt.closing = asyncio.ensure_future(attempt.close_session())

        keeper.on_stop_requested = stop_requested
        keeper.on_lost = lost
        self._attempts[attempt_id] = attempt
        self._quiet.clear()
        return attempt, True

    def watch_idle(self, attempt: Attempt) -> None:
        """End ``attempt`` unless an activity holds it within the schedule-to-start bound (after the claim opened it)."""
        attempt.idle = asyncio.create_task(self._end_when_idle(attempt))

    @contextlib.asynccontextmanager
    async def holding(self, attempt: Attempt) -> AsyncIterator[Attempt]:
        """An activity works for ``attempt``: its keeper keeps renewing, and is not idle."""
        attempt.holders += 1
        if attempt.idle is not None:
            attempt.idle.cancel()
            attempt.idle = None
        try:
            yield attempt
        finally:
            attempt.holders -= 1
            if not attempt.ended and attempt.holders == 0:
                self.watch_idle(attempt)

    async def _end_when_idle(self, attempt: Attempt) -> None:
        # Between the claim and the build, or cutoff 2 and the upload, the keeper renews; if the next
        # activity never comes (its workflow is gone), renewing stops and the lease expires for recovery.
        await asyncio.sleep(self.settings.schedule_to_start_seconds)
        if attempt.holders == 0:
            log.info(
                "job %s attempt %s: no activity came; its lease is left to expire",
                attempt.job_id,
                attempt.attempt_id,
            )
            await self.end(attempt)

    async def end(self, attempt: Attempt) -> None:
        """The attempt's last write is behind it (or nothing more will be done here): stop its keeper."""
        attempt.ended = True
        if attempt.idle is not None and attempt.idle is not asyncio.current_task():
            attempt.idle.cancel()
        await attempt.close_session()  # never left open past the attempt's last write here
        await attempt.keeper.finish()
        if attempt.lost:
            # Recovery took the job over while this attempt could still hold a partner session, and left its
            # slot held for it (0041); every session of the attempt is closed now, so the slot is given back.
            with contextlib.suppress(Exception):
                await self.store.release_taken_over_slot(attempt.attempt_id)
        if self._attempts.get(attempt.attempt_id) is attempt:
            del self._attempts[attempt.attempt_id]
        if not self._attempts:
            self._quiet.set()

    async def end_all(self) -> None:
        """Stop every keeper still running (the host is closing)."""
        for attempt in list(self._attempts.values()):
            await self.end(attempt)

    # -- draining -----------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop claiming work at this host: builds in progress stop and give their attempts back, and no
        attempt crosses cutoff 2 from now on. Deliveries already authorized run to their terminal write."""
        self.draining = True
        for attempt in list(self._attempts.values()):
            if attempt.stage in ("claimed", "building"):
                attempt.stop(StopReason.DRAINING)

    async def wait_quiet(self, seconds: float) -> bool:
        """Wait until this host holds no attempt (every one reached its last write, was given back, or was
        left to its lease), or ``seconds``; True when quiet. Authorized deliveries are waited for."""
        if self._quiet.is_set():
            return True
        try:
            await asyncio.wait_for(self._quiet.wait(), seconds)
        except TimeoutError:
            return False
        return True

    @property
    def busy(self) -> int:
        """How many attempts have an activity running on this host."""
        return sum(1 for a in self._attempts.values() if a.holders > 0)

"""The lease keeper: renews one attempt's lease on a timer and on demand, and watches for stop requests.

000 "Leases, Expiry, and Ownership": one keeper per attempt, from the confirmed claim until the attempt's
last write. Each renewal is the conditional ``renew_lease`` statement, which answers in the same round
trip whether a stop request is recorded, so the renewal is also the stop watcher. Timer and on-demand
renewals are serialized. A renewal that throws is retried at the next interval and stops nothing. A
renewal that changes no row means ownership is lost, unless ``finish`` has begun: a renewal in flight when
the terminal write commits finds no row, and that is not a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

from db.errors import StoreError
from db.stores.protocol import WorkerStore
from domain.models import Renewal
from observability.metrics import RenewalResult, get_metrics

log = logging.getLogger(__name__)

Callback = Callable[[], None]
Seam = Callable[[], Awaitable[None]]

# A renewal that throws: transport, timeout or a store error the store could not translate into an answer.
RENEWAL_ERRORS = (StoreError, OSError, TimeoutError)


class LeaseKeeper:
    """Keeps one attempt's lease renewed every ``every`` seconds until ``finish``.

    ``on_stop_requested`` is called once, when a renewal first reports a recorded stop request;
    ``on_lost`` once, when a renewal first changes no row before ``finish``. Both run on the event loop
    and must not block. ``timer=False`` keeps only on-demand renewals (a paused worker, for tests).
    ``before_renewal`` is a test seam awaited before each renewal's statement; it may raise to inject a
    fault.
    """

    def __init__(
        self,
        store: WorkerStore,
        job_id: UUID,
        attempt_id: UUID,
        *,
        every: float,
        on_stop_requested: Callback | None = None,
        on_lost: Callback | None = None,
        timer: bool = True,
        before_renewal: Seam | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.every = every
        self.on_stop_requested = on_stop_requested
        self.on_lost = on_lost
        self.timer = timer
        self.before_renewal = before_renewal
        self.renewals = 0  # renewals that answered
        self.failures = 0  # renewals that threw
        self.owned = True
        self.stop_requested = False
        self._lock = asyncio.Lock()
        self._finishing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # From the first renewal or timer to finish: counted in fenced_exports_leases_held.
        self._held: contextlib.ExitStack | None = None

    async def start(self) -> Renewal | None:
        """Renew once now, then start the timer; returns the first renewal's answer, ``None`` if it threw."""
        first = await self._renew_once("start")
        self.start_timer()
        return first

    def start_timer(self) -> None:
        """Start renewing every ``every`` seconds (the claim has just set the lease: no renewal now)."""
        self._hold()
        if self.timer and self._task is None and not self._finishing.is_set():
            self._task = asyncio.create_task(self._run(), name=f"lease-keeper-{self.attempt_id}")

    def _hold(self) -> None:
        if self._held is None and not self._finishing.is_set():
            self._held = contextlib.ExitStack()
            self._held.enter_context(get_metrics().holding_lease())

    async def renew_now(self, tries: int = 3, backoff: float = 0.2) -> Renewal | None:
        """Renew on demand, serialized with the timer; transient failures are retried with backoff.

        Returns the renewal's answer, or ``None`` when every try threw or the keeper has finished.
        """
        for attempt in range(tries):
            answer = await self._renew_once("on demand")
            if answer is not None or self._finishing.is_set():
                return answer
            if attempt + 1 < tries:
                await asyncio.sleep(backoff * (2**attempt))
        return None

    async def finish(self) -> None:
        """Stop renewing and wait for a renewal in flight; never raises. Call right after the last write."""
        self._finishing.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        # Taking the lock waits for an on-demand renewal in flight too.
        async with self._lock:
            pass
        if self._held is not None:
            self._held.close()

    @property
    def finished(self) -> bool:
        return self._finishing.is_set()

    async def _run(self) -> None:
        while not self._finishing.is_set():
            try:
                await asyncio.wait_for(self._finishing.wait(), timeout=self.every)
                return
            except TimeoutError:
                pass
            await self._renew_once("timer")

    async def _renew_once(self, source: str) -> Renewal | None:
        async with self._lock:
            if self._finishing.is_set():
                return None
            self._hold()
            started = time.perf_counter()
            try:
                if self.before_renewal is not None:
                    await self.before_renewal()
                    started = time.perf_counter()
                answer = await self.store.renew_lease(self.job_id, self.attempt_id)
            except RENEWAL_ERRORS as exc:
                get_metrics().observe_lease_renewal(time.perf_counter() - started, RenewalResult.ERROR)
                self.failures += 1
                log.warning(
                    "lease renewal (%s) for job %s attempt %s threw %s; retrying at the next interval",
                    source,
                    self.job_id,
                    self.attempt_id,
                    type(exc).__name__,
                )
                return None
            self.renewals += 1
            seconds = time.perf_counter() - started
            # The terminal write may have committed while this renewal was in flight: not a loss.
            if self._finishing.is_set():
                if answer.owned:
                    get_metrics().observe_lease_renewal(seconds, RenewalResult.RENEWED)
                return answer
            get_metrics().observe_lease_renewal(
                seconds, RenewalResult.RENEWED if answer.owned else RenewalResult.LOST
            )
            self._observe(answer)
            return answer

    def _observe(self, answer: Renewal) -> None:
        if not answer.owned:
            if self.owned:
                self.owned = False
                log.info(
                    "job %s attempt %s: renewal changed no row; ownership lost", self.job_id, self.attempt_id
                )
                if self.on_lost is not None:
                    self.on_lost()
            return
        if answer.stop_requested and not self.stop_requested:
            self.stop_requested = True
            if self.on_stop_requested is not None:
                self.on_stop_requested()

"""The webhook dispatcher: delivers outcome notifications to the endpoints subscribed to them.

It runs inside ``worker.py`` beside the outbox dispatcher, as ``exports_dispatcher``. Each pass:

1. fans new events out (``fan_out_notification_events``): one delivery row per (event, enabled endpoint of
   its tenant subscribed to its type), in one statement per batch;
2. leases a batch of due deliveries (``take_due_webhook_deliveries``: one committed statement, ``FOR UPDATE
   SKIP LOCKED``, a lease on each row), so no lock is held while an endpoint answers;
3. POSTs them concurrently, each signed in the Standard Webhooks form (``rules.webhooks``) with the event ID
   as ``webhook-id``, the same on every attempt;
4. records every answer of the batch in one statement (``record_webhook_attempts``): a 2xx is delivered;
   anything else, or no answer, is retried after ``min(cap, base * 2^n)`` with jitter, on the database
   clock, until the delivery's retry window (a day by default) has passed: then it is given up (``failed``),
   visible per endpoint in the console, and redelivered only by hand.

At least once: a dispatcher that dies after a POST and before its record leaves the row to its lease, and
the next attempt sends the same event again (the same ``webhook-id``, the same body). Receivers de-duplicate
by ``webhook-id``. Several dispatchers (one per worker) share the work through the leases.

It polls (``EXPORTS_WEBHOOK_POLL_SECONDS``) rather than LISTENs: a NOTIFY from the trigger that writes the
events would put a cluster-wide lock into the commit of every terminal write.

Nothing it logs carries an endpoint's URL (a path may hold a receiver's token), its secret, or an event's
body: IDs, status codes and error types only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from db.errors import StoreError
from db.stores.notifications import NotificationStore
from domain.notifications import AttemptRecord, DueDelivery
from rules.webhooks import event_body, signed_headers
from settings import Settings

log = logging.getLogger(__name__)

USER_AGENT = "fenced-exports-webhooks/1"

AttemptHook = Callable[[DueDelivery], Awaitable[None]]


@dataclass(frozen=True)
class WebhookPass:
    """What one pass did: events fanned out, deliveries made, attempts sent, of which delivered."""

    events: int
    deliveries: int
    attempts: int
    delivered: int


class WebhookDispatcher:
    """Fans events out and delivers them; ``run`` until ``stop`` is set.

    ``store`` is a ``NotificationStore`` over an ``exports_dispatcher`` pool. ``http`` defaults to a client
    of its own (no redirects followed, no proxy from the environment, ``webhook_timeout_seconds``).
    ``before_attempt`` is a test seam awaited with the row leased, before its POST.
    """

    def __init__(
        self,
        store: NotificationStore,
        settings: Settings,
        *,
        http: httpx.AsyncClient | None = None,
        before_attempt: AttemptHook | None = None,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if settings.webhook_lease_seconds <= settings.webhook_timeout_seconds:
            raise ValueError("EXPORTS_WEBHOOK_LEASE_SECONDS must exceed EXPORTS_WEBHOOK_TIMEOUT_SECONDS")
        self.store = store
        self.settings = settings
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(
            timeout=settings.webhook_timeout_seconds, follow_redirects=False, trust_env=False
        )
        self.before_attempt = before_attempt
        self.jitter = jitter
        self.clock = clock
        self._slots = asyncio.Semaphore(settings.webhook_concurrency)

    async def aclose(self) -> None:
        """Close the HTTP client if it is this dispatcher's own."""
        if self._own_http:
            await self.http.aclose()

    async def fan_out(self) -> tuple[int, int]:
        """Fan out every new event, a batch per statement; (events, deliveries made)."""
        events = deliveries = 0
        while True:
            done = await self.store.fan_out_notification_events(
                self.settings.webhook_batch, self.settings.webhook_retry_window_seconds
            )
            events += done.events
            deliveries += done.deliveries
            if done.events < self.settings.webhook_batch:
                return events, deliveries

    async def deliver_due(self) -> tuple[int, int]:
        """Lease one batch of due deliveries, POST them concurrently, record every answer in one statement;
        (attempts, delivered)."""
        due = await self.store.take_due_webhook_deliveries(
            self.settings.webhook_batch, self.settings.webhook_lease_seconds
        )
        if not due:
            return 0, 0
        records = await asyncio.gather(*(self._attempt(d) for d in due))
        try:
            await self.store.record_webhook_attempts(
                list(records),
                base_seconds=self.settings.webhook_retry_base_seconds,
                cap_seconds=self.settings.webhook_retry_cap_seconds,
            )
        except StoreError as exc:
            # The POSTs happened; the rows keep their leases and are sent again once those pass (at least
            # once: the same webhook-id, which receivers de-duplicate).
            log.warning("recording %d webhook attempts failed (%s)", len(records), type(exc).__name__)
        return len(records), sum(1 for r in records if r.delivered)

    async def dispatch_once(self) -> WebhookPass:
        """Fan out what is new, then deliver due batches until a batch comes back short."""
        events, deliveries = await self.fan_out()
        attempts = delivered = 0
        while True:
            sent, ok = await self.deliver_due()
            attempts += sent
            delivered += ok
            if sent < self.settings.webhook_batch:
                return WebhookPass(events, deliveries, attempts, delivered)

    async def _attempt(self, due: DueDelivery) -> AttemptRecord:
        """One POST of one delivery; how it ended (never raises)."""
        async with self._slots:
            status: int | None = None
            error: str | None = None
            try:
                if self.before_attempt is not None:
                    await self.before_attempt(due)
                body = event_body(due.event_id, due.kind, due.event_created_at, due.tenant_id, due.payload)
                headers = signed_headers(
                    due.secret.get_secret_value(), str(due.event_id), int(self.clock()), body
                )
                headers["user-agent"] = USER_AGENT
                response = await self.http.post(due.url, content=body, headers=headers)
                status = response.status_code
                if not 200 <= status < 300:
                    error = f"HTTP {status}"
            except Exception as exc:  # noqa: BLE001 - any failure to get an answer is a failed attempt
                error = type(exc).__name__
            if error is not None:
                log.info(
                    "webhook delivery %s of event %s to endpoint %s: %s (attempt %d)",
                    due.id,
                    due.event_id,
                    due.endpoint_id,
                    error,
                    due.attempts + 1,
                )
            return AttemptRecord(
                delivery_id=due.id,
                leased_until=due.leased_until,
                status_code=status,
                error=error,
                jitter=self.jitter(),
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch every ``webhook_poll_seconds`` until ``stop`` is set; a failed pass is retried at the
        next one."""
        try:
            while not stop.is_set():
                try:
                    await self.dispatch_once()
                except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the next poll
                    log.warning("webhook pass failed (%s); retrying at the next poll", type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.settings.webhook_poll_seconds)
        finally:
            await self.aclose()

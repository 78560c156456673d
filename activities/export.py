"""The export's activities on one worker host, as the worker registers them.

Each activity lives in the module of what it does; this only puts them together over one ``ExportHost``:

- ``claim`` (``activities.claim``, shared queue): cutoff 1; returns the claiming host's own queue;
- ``prepare_delivery`` (``activities.prepare``, own queue): build then cutoff 2;
- ``deliver`` (``activities.deliver``, own queue): fences, upload, evidence, the terminal write;
- ``confirm_stop`` (own queue) and ``record_temporal_cancel`` (shared queue) (``activities.stops``);
- ``test_connection`` (``activities.connection_test``, shared queue): a destination's connection test.

One lease keeper per attempt, from the confirmed claim to the attempt's last write (000 "one stop source
and one lease keeper"), kept by the host's attempt registry (``runtime.attempts``): the claim opens it,
``prepare_delivery`` and ``deliver`` hold it, and it keeps renewing across the gaps between them. When no
activity of the attempt arrives within the schedule-to-start bound (its workflow is gone), the keeper
stops and the lease expires for recovery. Every write is one of the store's conditional statements; an
activity never decides from an exception that a write did not happen. Payloads and logs carry IDs,
sizes, hashes and codes only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from activities.claim import ClaimActivity
from activities.connection_test import ConnectionTestActivity
from activities.deliver import DeliverActivity
from activities.host import ExportHost, ExportSeams
from activities.prepare import PrepareActivity
from activities.stops import StopActivities
from db.stores.ledger import LedgerStatements
from db.stores.protocol import WorkerStore
from partner.protocol import PartnerFor
from runtime.attempts import AttemptRegistry
from settings import Settings


class ExportActivities:
    """One host's export activities over one ``ExportHost`` (see ``activities.host`` for the parts).

    ``search_attributes`` says whether the server has the export search attributes registered (the
    worker registers them at start-up, ``runtime.search_attributes``). ``seams`` are the test seams at
    named points of an attempt (``ExportSeams``), all off by default.
    """

    def __init__(
        self,
        store: WorkerStore,
        build_pool: AsyncConnectionPool[Any],
        settings: Settings,
        worker_id: str,
        own_task_queue: str,
        *,
        cancellation_store: LedgerStatements,
        partners: PartnerFor,
        search_attributes: bool,
        max_concurrent_deliveries: int = 8,
    ) -> None:
        self.host = ExportHost(
            store=store,
            build_pool=build_pool,
            settings=settings,
            worker_id=worker_id,
            own_task_queue=own_task_queue,
            cancellation_store=cancellation_store,
            partners=partners,
        )
        self.claiming = ClaimActivity(self.host, search_attributes=search_attributes)
        self.preparing = PrepareActivity(self.host)
        self.delivering = DeliverActivity(self.host, max_concurrent_deliveries=max_concurrent_deliveries)
        self.stops = StopActivities(self.host)
        self.connection_tests = ConnectionTestActivity(self.host)

    @property
    def seams(self) -> ExportSeams:
        return self.host.seams

    @property
    def attempts(self) -> AttemptRegistry:
        return self.host.attempts

    @property
    def store(self) -> WorkerStore:
        return self.host.store

    @property
    def settings(self) -> Settings:
        return self.host.settings

    @property
    def worker_id(self) -> str:
        return self.host.worker_id

    @property
    def own_task_queue(self) -> str:
        return self.host.own_task_queue

    def shared_activities(self) -> list[Callable[..., Any]]:
        """Activities for the shared task queue: the claim, the recording of a Temporal cancel, and a
        destination's connection test (any host may run it)."""
        return [self.claiming.claim, self.stops.record_temporal_cancel, self.connection_tests.test_connection]

    def own_activities(self) -> list[Callable[..., Any]]:
        """Activities for this host's own task queue: everything that touches the local file."""
        return [self.preparing.prepare_delivery, self.stops.confirm_stop, self.delivering.deliver]

    async def aclose(self) -> None:
        """Stop every keeper still running and release the delivery threads (pools belong to their opener)."""
        await self.host.attempts.end_all()
        self.delivering.close()
        self.preparing.close()

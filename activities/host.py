"""What the export activities of one worker host share: the store, the attempt registry, the seams.

Each activity module (``claim``, ``prepare``, ``deliver``, ``stops``) takes one ``ExportHost``; nothing in
it decides anything. ``ExportSeams`` holds the test seams at named points of an attempt, all off by
default, as ``partner.protocol.DeliveryHooks`` does for the partner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from db.errors import TransientStoreError
from db.stores.ledger import LedgerStatements
from db.stores.protocol import WorkerStore
from domain.models import ExportJob
from partner.protocol import PartnerFor
from rules.releases import ReleasePolicy
from rules.retries import RetryPolicy
from runtime.attempts import Attempt, AttemptRegistry
from settings import Settings

JobSeam = Callable[[UUID], Awaitable[None]]
"""A seam that receives the job's ID at a named point of an attempt; it may wait, or raise."""

UploadSeam = Callable[[UUID, int], Coroutine[Any, Any, None]]
"""A seam that receives the job's ID and the bytes sent so far, from the delivering thread."""

READ_TRIES = 3  # a read before any side effect meets a dead pooled connection: retried, never fatal


@dataclass
class ExportSeams:
    """Test seams at named points of an attempt; every one is off by default.

    The hooks may wait (to hold an attempt at that point) or raise (a simulated crash there). The flags
    simulate a worker that is stalled or blind in one way.
    """

    after_load: JobSeam | None = None  # in the claim, after the row is read, before policy and claim
    after_claim: JobSeam | None = None  # the claim committed (or a retry found it): a raise is a lost answer
    before_build: JobSeam | None = None  # in the build phase, before the build waits for its turn
    after_build: JobSeam | None = None  # in the build phase, after the file is written (a stop cancels it)
    before_authorize: JobSeam | None = (
        None  # after the build, before the session slot, the session and cutoff 2
    )
    # in deliver, before the upload fence (after ownership is confirmed, for an attempt new on this host)
    before_upload: JobSeam | None = None
    during_upload: UploadSeam | None = None  # forwarded to DeliveryHooks.during_upload (bytes sent)
    before_rename_fence: JobSeam | None = None  # after the upload, before the rename fence
    after_rename_fence: JobSeam | None = None  # the rename fence matched, the rename not yet sent
    after_rename: JobSeam | None = None  # the data file renamed into place, its manifests not yet (#24.6)
    before_manifest_rename: JobSeam | None = None  # a manifest's temporary file written, its rename not sent
    before_renewal: Callable[[], Awaitable[None]] | None = None  # each lease renewal; may raise
    watcher_disabled: bool = False  # stop requests are then caught by cutoff 2 alone
    lease_timer_disabled: bool = False  # a paused worker: only on-demand renewals
    workflow_check_disabled: bool = False  # cutoff 2 without asking Temporal about the workflow
    heartbeats_paused: bool = False  # a stalled worker: its activities stop heartbeating

    def reset(self) -> None:
        """Turn every seam off again."""
        for name, value in vars(ExportSeams()).items():
            setattr(self, name, value)


@dataclass
class ExportHost:
    """One worker host's share of the export activities.

    ``store`` is a ``WorkerStore`` over an ``exports_worker`` pool: the protocol's statements. ``build_pool``
    (same role) feeds the builder's COPY only, so builds never hold the connections renewals need.
    ``cancellation_store`` is a ledger store over an ``exports_api`` pool, for recording a cancellation
    from Temporal (the worker role may not write cancellation requests). ``partners`` picks each
    destination's partner (injected, so activities never import a partner kind). ``own_task_queue`` is
    this host's queue, returned by the claim.
    """

    store: WorkerStore
    build_pool: AsyncConnectionPool[Any]
    settings: Settings
    worker_id: str
    own_task_queue: str
    cancellation_store: LedgerStatements
    partners: PartnerFor
    seams: ExportSeams = field(default_factory=ExportSeams)
    attempts: AttemptRegistry = field(init=False)
    release_policy: ReleasePolicy = field(init=False)
    retry_policy: RetryPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.attempts = AttemptRegistry(self.store, self.settings)
        self.release_policy = ReleasePolicy(
            base_seconds=self.settings.release_backoff_base_seconds,
            cap_seconds=self.settings.release_backoff_cap_seconds,
            max_releases=self.settings.max_transient_releases,
        )
        self.retry_policy = RetryPolicy(
            base_seconds=self.settings.delivery_retry_base_seconds,
            cap_seconds=self.settings.delivery_retry_cap_seconds,
            max_attempts=self.settings.max_attempts,
        )

    def open(self, job_id: UUID, attempt_id: UUID) -> tuple[Attempt, bool]:
        """This host's record of an attempt (``runtime.attempts``), its keeper under the seams; ``True``
        when this call created it."""
        return self.attempts.open(
            job_id,
            attempt_id,
            timer=not self.seams.lease_timer_disabled,
            before_renewal=self.seams.before_renewal,
            watch_stops=lambda: not self.seams.watcher_disabled,
        )

    async def read_job(self, job_id: UUID) -> ExportJob | None:
        """Read the row before any side effect; a dead pooled connection is retried, not fatal."""
        for attempt in range(READ_TRIES):
            try:
                return await self.store.get_job(job_id)
            except TransientStoreError:
                if attempt + 1 == READ_TRIES:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

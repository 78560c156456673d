"""The lease keeper against a real PostgreSQL (000 test matrix, "Renewal"). Faults enter at the keeper's
``before_renewal`` seam; interleavings are held with events, never won with sleeps."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry

from db.errors import TransientStoreError
from db.pool import open_pool
from db.stores.protocol import WorkerStore
from domain.models import CancellationOutcome, FailureCode, FinishResult, JobStatus
from observability.metrics import ExportMetrics, RenewalResult, get_metrics, set_metrics
from runtime.attempts import AttemptRegistry, StopReason
from runtime.lease import LeaseKeeper
from settings import Settings
from testbed import pg
from tests.support.factories import Factory


@pytest.fixture(scope="module")
async def keeper_store(database: pg.TestDatabase) -> AsyncIterator[WorkerStore]:
    pool = await open_pool(database.app_url, "exports_worker", max_size=6)
    yield WorkerStore(pool, lease_seconds=120)  # longer than the claim's 60 s, so a renewal shows
    await pool.close()


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh metrics registry installed as the process's for one test; the previous one restored."""
    previous = get_metrics()
    registry = CollectorRegistry()
    set_metrics(ExportMetrics(registry))
    yield registry
    set_metrics(previous)


def renewals_seen(registry: CollectorRegistry) -> dict[str, float]:
    """The renewal counter by result, and the renewal-duration histogram's count under ``duration``."""
    counter = "fenced_exports_lease_renewals_total"
    seen = {r.value: registry.get_sample_value(counter, {"result": r.value}) or 0.0 for r in RenewalResult}
    seen["duration"] = registry.get_sample_value("fenced_exports_lease_renewal_duration_seconds_count") or 0.0
    return seen


async def lease_of(factory: Factory, job_id: uuid.UUID):
    rows = await factory.admin("SELECT lease_expires_at FROM export_jobs WHERE id = %(id)s", {"id": job_id})
    return rows[0]["lease_expires_at"]


class Gate:
    """A renewal seam that counts renewals, can fail some, and can hold one open until released."""

    def __init__(self, fail: set[int] | None = None, hold: int | None = None) -> None:
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.fail = fail or set()
        self.hold = hold
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.reached: dict[int, asyncio.Event] = {}

    def reached_call(self, n: int) -> asyncio.Event:
        return self.reached.setdefault(n, asyncio.Event())

    async def __call__(self) -> None:
        self.calls += 1
        n = self.calls
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            self.reached_call(n).set()
            if n in self.fail:
                raise TransientStoreError("injected at the before_renewal seam")
            if n == self.hold:
                self.held.set()
                await self.release.wait()
        finally:
            self.active -= 1


async def test_keeper_renews_the_lease_on_the_database_clock(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    before = await lease_of(factory, job.id)
    gate = Gate()
    keeper = LeaseKeeper(keeper_store, job.id, attempt, every=0.05, before_renewal=gate)
    first = await keeper.start()
    assert first is not None and first.owned and not first.stop_requested
    await asyncio.wait_for(gate.reached_call(3).wait(), 10)
    await keeper.finish()
    assert await lease_of(factory, job.id) > before
    assert keeper.owned and keeper.renewals >= 2


async def test_a_renewal_that_throws_is_retried_at_the_next_interval(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    lost: list[bool] = []
    gate = Gate(fail={2, 3})
    keeper = LeaseKeeper(
        keeper_store, job.id, attempt, every=0.05, before_renewal=gate, on_lost=lambda: lost.append(True)
    )
    await keeper.start()
    await asyncio.wait_for(gate.reached_call(5).wait(), 10)
    await keeper.finish()
    assert keeper.failures == 2
    assert keeper.owned and not lost
    assert await factory.status(job.id) == JobStatus.RUNNING


async def test_on_demand_renewal_is_serialized_with_the_timer(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    gate = Gate(hold=2)  # the first timer renewal is held open
    keeper = LeaseKeeper(keeper_store, job.id, attempt, every=0.05, before_renewal=gate)
    await keeper.start()
    await asyncio.wait_for(gate.held.wait(), 10)
    on_demand = asyncio.create_task(keeper.renew_now())
    await asyncio.sleep(0)  # let it reach the lock; it must not enter the seam while the timer's is open
    assert gate.calls == 2 and not on_demand.done()
    gate.release.set()
    answer = await asyncio.wait_for(on_demand, 10)
    await keeper.finish()
    assert answer is not None and answer.owned
    assert gate.max_active == 1


async def test_finish_waits_for_a_renewal_in_flight_and_ignores_its_missing_row(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    lost: list[bool] = []
    gate = Gate(hold=2)
    keeper = LeaseKeeper(
        keeper_store, job.id, attempt, every=0.05, before_renewal=gate, on_lost=lambda: lost.append(True)
    )
    await keeper.start()
    await asyncio.wait_for(gate.held.wait(), 10)
    # The attempt's terminal write commits while that renewal is in flight.
    written = await factory.worker.finish_failed(job.id, attempt, FailureCode.BUILD_FAILED, "BuildError")
    assert written == FinishResult.WRITTEN
    finishing = asyncio.create_task(keeper.finish())
    await asyncio.sleep(0)
    assert not finishing.done()  # it waits for the renewal in flight
    gate.release.set()
    await asyncio.wait_for(finishing, 10)
    calls = gate.calls
    assert not lost and keeper.owned  # the renewal found no row, after finish began: not a loss
    assert await keeper.renew_now() is None and gate.calls == calls  # nothing renews after finish


async def test_a_renewal_after_a_takeover_reports_lost_ownership_once(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    lost: list[bool] = []
    keeper = LeaseKeeper(
        keeper_store, job.id, attempt, every=60, timer=False, on_lost=lambda: lost.append(True)
    )
    assert (await keeper.start()).owned
    await factory.expire_lease(job.id)
    assert await factory.recovery.requeue_expired_attempt(job.id, attempt, 3, "recovery-test")
    first = await keeper.renew_now()
    second = await keeper.renew_now()
    await keeper.finish()
    assert first is not None and not first.owned and second is not None and not second.owned
    assert lost == [True]
    assert await factory.status(job.id) == JobStatus.QUEUED


async def test_an_expired_lease_can_still_be_renewed_until_a_takeover_commits(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    for status in (JobStatus.RUNNING, JobStatus.DELIVERING):
        job, attempt = await factory.in_status(status)
        assert attempt is not None
        await factory.expire_lease(job.id, seconds_ago=30)
        keeper = LeaseKeeper(keeper_store, job.id, attempt, every=60, timer=False)
        answer = await keeper.start()
        await keeper.finish()
        assert answer is not None and answer.owned and answer.status == status
        assert (await factory.worker.read_ownership(job.id)).lease_current


async def test_the_renewal_reports_a_recorded_stop_request(
    factory: Factory, keeper_store: WorkerStore
) -> None:
    job, attempt = await factory.running()
    stops: list[bool] = []
    keeper = LeaseKeeper(
        keeper_store,
        job.id,
        attempt,
        every=60,
        timer=False,
        on_stop_requested=lambda: stops.append(True),
    )
    assert not (await keeper.start()).stop_requested
    assert (await factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED
    assert (await keeper.renew_now()).stop_requested
    await keeper.renew_now()
    await keeper.finish()
    assert stops == [True]


async def test_each_renewal_is_counted_by_its_result_and_timed(
    registry: CollectorRegistry, factory: Factory, keeper_store: WorkerStore
) -> None:
    # FencedExportsWorkerWithoutRenewals reads these series: the keeper itself must record them.
    job, attempt = await factory.running()
    keeper = LeaseKeeper(keeper_store, job.id, attempt, every=60, timer=False)
    before = renewals_seen(registry)
    assert (await keeper.start()).owned
    renewed = renewals_seen(registry)
    assert renewed["renewed"] >= before["renewed"] + 1
    assert renewed["duration"] >= before["duration"] + 1
    assert renewed["lost"] == before["lost"]

    await factory.expire_lease(job.id)
    assert await factory.recovery.requeue_expired_attempt(job.id, attempt, 3, "recovery-test")
    answer = await keeper.renew_now()
    await keeper.finish()
    assert answer is not None and not answer.owned
    lost = renewals_seen(registry)
    assert lost["lost"] >= renewed["lost"] + 1
    assert lost["duration"] >= renewed["duration"] + 1
    assert lost["renewed"] == renewed["renewed"]


@pytest.mark.parametrize(
    "stopped_first", [None, StopReason.STOP_REQUESTED], ids=["lost", "stop-requested-then-lost"]
)
async def test_an_attempt_that_lost_its_job_to_a_takeover_gives_its_held_slot_back_when_it_ends(
    factory: Factory, keeper_store: WorkerStore, stopped_first: StopReason | None
) -> None:
    # Recovery's takeover leaves the attempt's session slot held (0041): its worker may be alive with the
    # session open. The registry's attempt finds the loss at a renewal, closes what it holds, and at its end
    # gives the slot back, so the partner's limit is not kept waiting for the hold. An attempt stopped for
    # another reason first (a stop request) keeps that reason, and losing the job still gives the slot back.
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, max_sessions=1)
    job, attempt_id = await factory.running(await factory.queued(tenant_id, destination_id))
    other, other_attempt = await factory.running(await factory.queued(tenant_id, destination_id))
    registry = AttemptRegistry(keeper_store, Settings(renew_every_seconds=60))
    attempt, created = registry.open(job.id, attempt_id, timer=False)
    assert created and (await attempt.keeper.start()).owned
    taken = await keeper_store.take_session_slot(tenant_id, destination_id, attempt_id, job_id=job.id)
    assert taken.slot == 1
    if stopped_first is not None:
        attempt.stop(stopped_first)
    await factory.expire_lease(job.id)
    assert await factory.recovery.requeue_expired_attempt(job.id, attempt_id, 3, "recovery-test")
    held = await keeper_store.take_session_slot(tenant_id, destination_id, other_attempt, job_id=other.id)
    assert held.slot is None  # held for the attempt recovery took over

    renewal = await attempt.keeper.renew_now()
    assert renewal is not None and not renewal.owned
    assert attempt.lost and attempt.reason == (stopped_first or StopReason.OWNERSHIP_LOST)
    await registry.end(attempt)

    taken = await keeper_store.take_session_slot(tenant_id, destination_id, other_attempt, job_id=other.id)
    assert taken.slot == 1

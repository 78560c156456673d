"""End to end on the Temporal dev server: the fenced export against the same workflow without its database
writes, side by side in one run, and the time from a stop request to Stopped while building.

Both variants run the same ``ExportWorkflow`` code: claim on a shared queue, build and cutoff 2 on the
claiming worker's queue, deliver there, with the same search attributes. The fenced variant registers
``ExportActivities``. The unfenced variant registers :class:`UnfencedActivities` under the same activity
names: it reads the job row, builds the same file with the same builder and uploads it with the same
``deliver()``, but makes no claim, no lease renewal, no cutoff 2, no evidence and no terminal write. Each
variant has the pools of a worker process (``worker.py``: the protocol's statements on one, the builds on
another), and the partner is OpenSSH's sshd in processes of its own, as a partner's server is on its own
machine (the in-process asyncssh server only where there is no sshd). The ratio of their wall times for ``N``
small exports started together is the overhead of the fencing (target: under 1.20x with issue 26's writes).

Outcome notifications are on for the fenced variant (issue 26): every export's terminal write fires the
trigger that writes its event, each tenant has a webhook endpoint subscribed to every event on a real HTTP
receiver, and the webhook dispatcher fans out, signs and POSTs while the batch runs. Rounds alternate the
order of the variants; each round's fenced/unfenced ratio is one pair, and the median of the pairs is
reported with its 95 % bootstrap interval (as ``bench obs`` does). Each round also runs the fenced variant with
the trigger disabled ("quiet": the same workflow and writes as before issue 26), so the run says what the new
writes cost (fenced / quiet) beside what the fencing costs. The quiet variant has a database of its own, whose
trigger is disabled before anything is measured: an ``ALTER TABLE`` between batches would throw away every
plan the fenced side's connections keep for their statements, a cost only that side would pay. After a fenced
batch the webhooks still pending are drained (outside every wall), so no other batch shares the machine with
them.

The stop latency is measured with a build held open at the ``after_build`` seam: from the moment the
cancellation transaction commits a stop request to the moment the row reads Stopped, once with the
``stop_requested`` signal (target: under 1 s) and once with no signal, when only the lease renewal can see
it (target: under one renewal interval).

    python -m bench.e2e [--exports 20] [--contacts 200] [--rounds 10] [--stops 5] [--renew-every 2]
                        [--partner sshd|asyncssh]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.worker import Worker

from activities.export import ExportActivities
from activities.heartbeat import keep_heartbeating
from bench.obs.measures import median_interval
from db.builder import build_export, remove_export_file
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.notifications import NotificationStore
from db.stores.protocol import WorkerStore
from domain.models import CancellationOutcome, ExportJob, FinishResult, JobStatus
from partner.delivery import FileToDeliver, deliver
from partner.kinds import partner_for
from partner.local_server import LocalSftpServer
from rules.webhooks import new_secret
from runtime.webhooks import WebhookDispatcher
from settings import Settings
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server
from testbed.sftp import Sshd, sshd_available
from testbed.temporal import start_dev_server
from testbed.webhook_receiver import WebhookReceiver
from workflows.export import ExportWorkflow, export_summary, export_workflow_id
from workflows.models import (
    SEARCH_ATTRIBUTE_NAMES,
    AttemptOutcome,
    ClaimInput,
    ClaimOutcome,
    ClaimStep,
    ConfirmStopInput,
    ConfirmStopResult,
    DeliverInput,
    DeliverResult,
    ExportInput,
    LocalFile,
    PrepareInput,
    PrepareResult,
    RecordCancelInput,
    RecordCancelResult,
)

DISABLE_TRIGGER = "ALTER TABLE export_jobs DISABLE TRIGGER tr_export_jobs_notify_outcome"
# Each variant's database: the quiet one has its own, with the notification trigger disabled from the start.
DATABASE_OF = {"fenced": "fenced", "plain": "fenced", "quiet": "quiet"}
BATCH_TIMEOUT_SECONDS = 300.0  # a batch that has not ended by then is a hang, reported as one


class UnfencedActivities:
    """The export's activities with every database write removed (reads and the builder's COPY stay)."""

    def __init__(self, store: WorkerStore, worker_pool: Any, work_dir: Path, own_task_queue: str) -> None:
        self.store = store
        self.pool = worker_pool
        self.work_dir = work_dir
        self.own_task_queue = own_task_queue
        self.delivery_threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="plain-deliver")

    def shared_activities(self) -> list[Callable[..., Any]]:
        return [self.claim, self.record_temporal_cancel]

    def own_activities(self) -> list[Callable[..., Any]]:
        return [self.prepare_delivery, self.confirm_stop, self.deliver]

    @activity.defn(name="export.claim")
    async def claim(self, inp: ClaimInput) -> ClaimOutcome:
        job = await self._job(inp.job_id)
        # The same workflow as the fenced variant's, search attributes included (the server has them)
        return ClaimOutcome(
            step=ClaimStep.CLAIMED,
            tenant_id=job.tenant_id,
            task_queue=self.own_task_queue,
            search_attributes=True,
        )

    @activity.defn(name="export.prepare_delivery")
    async def prepare_delivery(self, inp: PrepareInput) -> PrepareResult:
        job = await self._job(inp.job_id)
        built = await build_export(
            self.pool,
            tenant_id=job.tenant_id,
            list_name=job.list_name,
            delivery_key=job.delivery_key,
            attempt_id=inp.attempt_id,
            work_dir=self.work_dir,
            progress=lambda rows, size: activity.heartbeat({"rows": rows, "bytes": size}),
        )
        return PrepareResult(
            file=LocalFile(
                path=str(built.path),
                final_name=built.final_name,
                size=built.size,
                sha256=built.sha256.hex(),
                rows=built.rows,
            )
        )

    @activity.defn(name="export.confirm_stop")
    async def confirm_stop(self, inp: ConfirmStopInput) -> ConfirmStopResult:
        return ConfirmStopResult(confirmed=False)

    @activity.defn(name="export.deliver")
    async def deliver(self, inp: DeliverInput) -> DeliverResult:
        job = await self._job(inp.job_id)
        destination = await self.store.load_destination(job.tenant_id, job.destination_id)
        file = FileToDeliver(
            path=Path(inp.file.path),
            final_name=inp.file.final_name,
            size=inp.file.size,
            sha256=bytes.fromhex(inp.file.sha256),
        )
        heartbeat = asyncio.create_task(keep_heartbeating(lambda: {"stage": "delivering"}))
        try:
            report = await asyncio.get_running_loop().run_in_executor(
                self.delivery_threads,
                functools.partial(
                    deliver,
                    destination,
                    file,
                    inp.attempt_id,
                    original=None,
                    overwrite_agreed=False,
                    on_evidence=lambda evidence: None,
                ),
            )
        finally:
            heartbeat.cancel()
            remove_export_file(Path(inp.file.path))
        return DeliverResult(
            delivery=report.outcome, failure_code=report.failure_code, finish=FinishResult.WRITTEN
        )

    @activity.defn(name="export.record_temporal_cancel")
    async def record_temporal_cancel(self, inp: RecordCancelInput) -> RecordCancelResult:
        return RecordCancelResult(outcome=CancellationOutcome.NOT_FOUND)

    async def _job(self, job_id: uuid.UUID) -> ExportJob:
        job = await self.store.get_job(job_id)
        assert job is not None
        return job


class Bench:
    """One dev server and one SFTP server; a fenced, a quiet (its own database) and an unfenced worker host."""

    def __init__(
        self,
        database: TestDatabase,
        quiet_database: TestDatabase,
        client: Client,
        sftp: Sshd | LocalSftpServer,
        work_root: Path,
    ) -> None:
        self.database = database
        self.databases = {"fenced": database, "quiet": quiet_database}
        self.client = client
        self.sftp = sftp
        self.work_root = work_root
        self.run_id = uuid.uuid4().hex[:6]
        self.closers: list[Callable[[], Awaitable[Any]]] = []
        self.fenced: ExportActivities | None = None
        self.api: ApiStore | None = None
        self.apis: dict[str, ApiStore] = {}
        self.receiver = WebhookReceiver()
        self.notifications: NotificationStore | None = None

    async def start(self, renew_every: float) -> None:
        settings = Settings(
            database_url=self.database.app_url,
            work_dir=self.work_root / "fenced",
            renew_every_seconds=renew_every,
            lease_seconds=60,
        )
        # Each variant has the pools of its own worker process (worker.py): the protocol's statements on one,
        # the builder's COPY on another of max_concurrent_builds connections, so no renewal, fence or read
        # waits behind a build.
        with psycopg.connect(self.databases["quiet"].admin_url, autocommit=True) as admin:
            admin.execute(DISABLE_TRIGGER)  # once, before anything is measured
        pools = {}
        for variant in ("fenced", "quiet", "plain"):
            database = self.databases[DATABASE_OF[variant]]
            protocol_pool = await open_pool(
                database.app_url,
                "exports_worker",
                max_size=settings.worker_pool_size,
                name=f"bench-{variant}-worker",
            )
            build_pool = await open_pool(
                database.app_url,
                "exports_worker",
                min_size=0,
                max_size=settings.max_concurrent_builds,
                name=f"bench-{variant}-build",
            )
            self.closers += [protocol_pool.close, build_pool.close]
            pools[variant] = (WorkerStore(protocol_pool, lease_seconds=60), build_pool)
        for name, database in self.databases.items():
            api_pool = await open_pool(database.app_url, "exports_api", max_size=4, name=f"bench-{name}-api")
            self.closers.append(api_pool.close)
            self.apis[name] = ApiStore(api_pool)
        self.api = self.apis["fenced"]
        fenced_sides: dict[str, ExportActivities] = {}
        for variant in ("fenced", "quiet"):
            store, build_pool = pools[variant]
            fenced_sides[variant] = ExportActivities(
                store,
                build_pool,
                settings.model_copy(update={"work_dir": self.work_root / variant}),
                f"bench-{variant}",
                self.queue(f"{variant}-own"),
                cancellation_store=self.apis[DATABASE_OF[variant]],
                search_attributes=True,
                partners=partner_for,
            )
        self.fenced = fenced_sides["fenced"]
        store, build_pool = pools["plain"]
        unfenced = UnfencedActivities(store, build_pool, self.work_root / "unfenced", self.queue("plain-own"))
        workers = []
        for variant, activities in (*fenced_sides.items(), ("plain", unfenced)):
            workers += [
                Worker(
                    self.client,
                    task_queue=self.queue(variant),
                    workflows=[ExportWorkflow],
                    activities=activities.shared_activities(),
                ),
                Worker(
                    self.client,
                    task_queue=self.queue(f"{variant}-own"),
                    activities=activities.own_activities(),
                ),
            ]
        tasks = [asyncio.create_task(w.run()) for w in workers]

        async def stop_workers() -> None:
            await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
            await asyncio.gather(*tasks, return_exceptions=True)

        self.closers.insert(0, stop_workers)
        # Outcome notifications: a real receiver and the worker's webhook dispatcher, polling often enough to
        # work during a batch, on its own exports_dispatcher pool.
        self.receiver.start()
        dispatcher_pool = await open_pool(
            self.database.app_url, "exports_dispatcher", max_size=3, name="bench-webhooks"
        )
        self.notifications = NotificationStore(dispatcher_pool)
        webhooks = WebhookDispatcher(
            self.notifications, settings.model_copy(update={"webhook_poll_seconds": 0.2})
        )
        stop_webhooks = asyncio.Event()
        webhook_task = asyncio.create_task(webhooks.run(stop_webhooks))

        async def close_webhooks() -> None:
            stop_webhooks.set()
            await webhook_task
            await dispatcher_pool.close()
            self.receiver.stop()

        self.closers.insert(0, close_webhooks)

    async def close(self) -> None:
        for close in self.closers:
            await close()

    def queue(self, name: str) -> str:
        return f"bench-{self.run_id}-{name}"

    async def queue_exports(self, n: int, contacts: int, variant: str = "fenced") -> list[uuid.UUID]:
        """``n`` queued exports in ``variant``'s database, each of its own tenant with ``contacts`` synthetic
        contacts."""
        jobs = []
        database = self.databases[DATABASE_OF[variant]]
        with psycopg.connect(database.admin_url, autocommit=True) as admin:
            for _ in range(n):
                tenant_id, destination_id, job_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
                admin.execute("INSERT INTO tenants (id, name) VALUES (%(id)s, 'bench')", {"id": tenant_id})
                # A session limit (issue #25.3), so the fenced variant takes and ends a slot as every export
                # to a limited partner does; the unfenced one ignores it.
                admin.execute(
                    # Every destination has a delivery window (issue #25.2), always open but read in full by the
                    # claim, cutoff 2 and the rename fence (a time zone, hours, a blackout date to compare).
                    "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key,"
                    " credential_ref, remote_dir, intake_time_zone, intake_hours, blackout_dates, max_sessions)"
                    " VALUES (%(id)s, %(t)s, 'bench', %(host)s, %(port)s,"
                    " 'partner', %(key)s, %(cred)s, %(dir)s, 'Europe/Berlin', ARRAY['Mon-Sun 00:00-24:00'],"
                    " ARRAY[DATE '2099-12-31'], 2)",
                    {
                        "id": destination_id,
                        "t": tenant_id,
                        "host": self.sftp.host,
                        "port": self.sftp.port,
                        "key": self.sftp.host_key_line,
                        "cred": str(self.sftp.client_key_path),
                        "dir": str(self.sftp.upload_dir) if isinstance(self.sftp, Sshd) else "/",
                    },
                )
                # Deliveries are fail-closed and the policy checks the creator (issue 9): enable both scopes
                # and make the creator a principal of the tenant.
                admin.execute(
                    "INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
                    " VALUES ('tenant', %(t)s, NULL, true, 'bench', 'bench'),"
                    " ('destination', %(t)s, %(d)s, true, 'bench', 'bench')",
                    {"t": tenant_id, "d": destination_id},
                )
                admin.execute(
                    "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, 'bench', 'operator')",
                    {"t": tenant_id},
                )
                # every tenant is notified of every outcome (issue 26), on the bench's receiver
                secret = new_secret()
                admin.execute(
                    "INSERT INTO webhook_endpoints (tenant_id, url, secret, events, created_by)"
                    " VALUES (%(t)s, %(url)s, %(s)s, ARRAY['export.completed', 'export.failed', 'export.stopped',"
                    " 'export.canceled', 'export.rejected', 'export.outcome_unknown',"
                    " 'export.cancellation_lost'], 'bench')",
                    {"t": tenant_id, "url": self.receiver.url(f"/hooks/{tenant_id}"), "s": secret},
                )
                self.receiver.expect(f"/hooks/{tenant_id}", secret)
                admin.execute(
                    "INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)"
                    " SELECT %(t)s, 'main', 'person' || g || '@bench.example', 'First' || g, 'Last' || g"
                    " FROM generate_series(1, %(n)s) g",
                    {"t": tenant_id, "n": contacts},
                )
                created = await self.apis[DATABASE_OF[variant]].create_original(
                    tenant_id=tenant_id,
                    destination_id=destination_id,
                    list_name="main",
                    created_by="bench",
                    job_id=job_id,
                )
                jobs.append(created.job_id)
        return jobs

    async def run_batch(self, variant: str, jobs: list[uuid.UUID]) -> tuple[float, list[float]]:
        """Start every job's workflow at once; wall time until all ended, and each one's latency."""
        started = time.perf_counter()

        async def one(job_id: uuid.UUID) -> float:
            handle = await self.client.start_workflow(
                ExportWorkflow.run,
                ExportInput(job_id=job_id, message_id=uuid.uuid4()),
                id=export_workflow_id(job_id, uuid.uuid4()),
                task_queue=self.queue(variant),
                static_summary=export_summary(job_id),
            )
            result = await handle.result()
            if result.outcome != AttemptOutcome.COMPLETED:
                raise SystemExit(f"{variant} export {job_id} ended {result.outcome}")
            return time.perf_counter() - started

        latencies = await asyncio.wait_for(asyncio.gather(*(one(j) for j in jobs)), BATCH_TIMEOUT_SECONDS)
        return time.perf_counter() - started, list(latencies)

    async def drain_webhooks(self, bound: float = 60.0) -> float:
        """Wait until every event is fanned out and no delivery is pending; the seconds it took."""
        started = time.perf_counter()
        with psycopg.connect(self.database.admin_url, autocommit=True) as admin:
            while time.perf_counter() - started < bound:
                row = admin.execute(
                    "SELECT (SELECT count(*) FROM notification_events WHERE fanned_out_at IS NULL)"
                    " + (SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered')"
                ).fetchone()
                if row is not None and row[0] == 0:
                    return time.perf_counter() - started
                await asyncio.sleep(0.05)
        raise SystemExit(f"webhooks still pending after {bound:g} s")

    async def stop_latency(self, with_signal: bool, phase: float = 0.0) -> float:
        """Seconds from a committed stop request to the row reading Stopped, a build held open.

        ``phase`` delays the request after the build is held, so requests land at varied points of the
        renewal cycle (a request right after a renewal waits a whole interval; one just before, almost none).
        """
        assert self.fenced is not None and self.api is not None
        [job_id] = await self.queue_exports(1, 50)
        building = asyncio.Event()

        async def hold(_: uuid.UUID) -> None:
            building.set()
            await asyncio.Event().wait()

        self.fenced.seams.after_build = hold
        try:
            handle = await self.client.start_workflow(
                ExportWorkflow.run,
                ExportInput(job_id=job_id, message_id=uuid.uuid4()),
                id=export_workflow_id(job_id, uuid.uuid4()),
                task_queue=self.queue("fenced"),
            )
            await asyncio.wait_for(building.wait(), 60)
            await asyncio.sleep(phase)
            job = await self.api.get_job(job_id)
            assert job is not None
            started = time.perf_counter()
            answer = await self.api.request_cancellation(
                tenant_id=job.tenant_id,
                job_id=job_id,
                request_id=uuid.uuid4(),
                requested_by="bench",
                reason="stop latency",
            )
            if answer.outcome != CancellationOutcome.STOP_REQUESTED:
                raise SystemExit(f"stop request answered {answer.outcome}")
            if with_signal:
                await handle.signal(ExportWorkflow.stop_requested, str(answer.request_id))
            elapsed = await self._stopped_at(job_id) - started
            await handle.result()
            return elapsed
        finally:
            self.fenced.seams.after_build = None

    async def _stopped_at(self, job_id: uuid.UUID) -> float:
        """Poll the row (5 ms) until it reads Stopped; the clock reading when it did."""
        assert self.api is not None
        while True:
            job = await self.api.get_job(job_id)
            if job is not None and job.status == JobStatus.STOPPED:
                return time.perf_counter()
            await asyncio.sleep(0.005)


async def main(
    exports: int, contacts: int, rounds: int, stops: int, renew_every: float, partner_kind: str = "sshd"
) -> dict[str, float]:
    """Run both comparisons; print and return the figures."""
    work_root = Path(tempfile.mkdtemp(prefix="fenced-bench-e2e-"))
    with postgres_server() as server_url:
        template = make_template(server_url)
        database, quiet_database = clone_database(server_url, template), clone_database(server_url, template)
        env = await start_dev_server(
            search_attributes=[SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTE_NAMES]
        )
        # The partner is OpenSSH's sshd, in processes of its own as a partner's server is on its own machine.
        # The in-process asyncssh server shares this process's event loop and GIL with the workers, so it
        # would bill every worker-side instruction to the partner's answers (only where sshd is missing).
        partner: Sshd | LocalSftpServer
        if partner_kind == "sshd" and sshd_available():
            partner = Sshd.start(max_sessions=4 * exports)
        else:
            partner = LocalSftpServer(work_root / "partner")
            await partner.start()
        bench = Bench(database, quiet_database, env.client, partner, work_root)
        try:
            await bench.start(renew_every)
            # Warm both paths (workflow caches, pools, SSH) before measuring.
            for variant in ("fenced", "quiet", "plain"):
                await bench.run_batch(variant, await bench.queue_exports(2, contacts, variant))
            await bench.drain_webhooks()
            walls: dict[str, list[float]] = {"fenced": [], "quiet": [], "plain": []}
            p50: dict[str, list[float]] = {"fenced": [], "quiet": [], "plain": []}
            drains: list[float] = []
            order = ["fenced", "quiet", "plain"]
            for r in range(rounds):
                # each round runs the three, in an order that rotates, so none always follows another
                for variant in order[r % 3 :] + order[: r % 3]:
                    jobs = await bench.queue_exports(exports, contacts, variant)
                    wall, latencies = await bench.run_batch(variant, jobs)
                    walls[variant].append(wall)
                    p50[variant].append(statistics.median(latencies))
                    if variant == "fenced":
                        drains.append(await bench.drain_webhooks())
            received = bench.receiver.received()
            verified = sum(1 for r in received if r.verified)
            distinct = len({r.webhook_id for r in received})
            signal = [await bench.stop_latency(with_signal=True) for _ in range(stops)]
            phases = [renew_every * (i + 0.5) / stops for i in range(stops)]  # spread over one interval
            renewal = [await bench.stop_latency(with_signal=False, phase=p) for p in phases]
        finally:
            await bench.close()
            if isinstance(partner, Sshd):
                partner.stop()
            else:
                await partner.stop()
            await env.shutdown()
    fenced, plain = statistics.median(walls["fenced"]), statistics.median(walls["plain"])
    # Each round runs both variants back to back: its ratio is a pair, and the median of the pairs comes with
    # its 95 % bootstrap interval (as bench obs reports), so a median near the target shows which side it is on.
    pairs = [f / p for f, p in zip(walls["fenced"], walls["plain"], strict=True)]
    low, high = median_interval(pairs)
    quiet_pairs = [q / p for q, p in zip(walls["quiet"], walls["plain"], strict=True)]
    qlow, qhigh = median_interval(quiet_pairs)
    cost_pairs = [f / q for f, q in zip(walls["fenced"], walls["quiet"], strict=True)]
    clow, chigh = median_interval(cost_pairs)
    result = {
        "fenced_s": fenced,
        "unfenced_s": plain,
        "ratio": fenced / plain,
        "pair_ratio_median": statistics.median(pairs),
        "pair_ratio_low": low,
        "pair_ratio_high": high,
        "webhook_posts": float(len(received)),
        "quiet_pair_ratio_median": statistics.median(quiet_pairs),
        "notifications_cost_median": statistics.median(cost_pairs),
        "stop_with_signal_s": statistics.median(signal),
        "stop_by_renewal_s": statistics.median(renewal),
    }
    print(
        f"exports: {exports} x {contacts} contacts, started together; rounds: {rounds} (medians); partner:"
        f" {'OpenSSH sshd' if isinstance(partner, Sshd) else 'in-process asyncssh'}"
        f"  cpus: {os.cpu_count()}  load: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"fenced   : {fenced:6.2f} s for the batch ({exports / fenced:5.1f} exports/s), "
        f"median latency {statistics.median(p50['fenced']):.2f} s   walls {[round(w, 2) for w in walls['fenced']]}"
    )
    print(
        f"unfenced : {plain:6.2f} s for the batch ({exports / plain:5.1f} exports/s), "
        f"median latency {statistics.median(p50['plain']):.2f} s   walls {[round(w, 2) for w in walls['plain']]}"
    )
    print(f"ratio of the median walls fenced/unfenced: {result['ratio']:.2f}x")
    print(
        f"ratio per round (pairs): median {result['pair_ratio_median']:.2f}x, 95 % interval"
        f" {low:.2f}-{high:.2f}x over {len(pairs)} rounds {[round(x, 2) for x in pairs]}  (target <= 1.20x)"
    )
    print(
        f"without notifications (the trigger disabled, nothing to send) against unfenced: median"
        f" {result['quiet_pair_ratio_median']:.2f}x, 95 % interval {qlow:.2f}-{qhigh:.2f}x"
        f" {[round(x, 2) for x in quiet_pairs]}"
    )
    print(
        f"the cost of notifications (with / without, per round): median {result['notifications_cost_median']:.2f}x,"
        f" 95 % interval {clow:.2f}-{chigh:.2f}x"
    )
    print(
        f"webhooks (fenced side): {len(received)} POSTs, {distinct} events, {verified} verified; drained"
        f" between rounds in a median {statistics.median(drains):.2f} s (outside both walls)"
    )
    print(
        f"per-round ratios: median {result['pair_ratio_median']:.3f}x, 95 % interval of the median (bootstrap)"
        f" {low:.3f}-{high:.3f}x  {[round(r, 3) for r in pairs]}"
    )
    print(
        f"stop request -> Stopped while building, with the signal: median {result['stop_with_signal_s']:.3f} s"
        f" {[round(s, 3) for s in signal]}  (target < 1 s)"
    )
    print(
        f"stop request -> Stopped while building, renewal only (every {renew_every:g} s; requests spread"
        f" over the cycle): median {result['stop_by_renewal_s']:.3f} s, max {max(renewal):.3f} s"
        f" {[round(s, 3) for s in renewal]}  (target < {renew_every:g} s)"
    )
    return result


def run_with_defaults() -> None:
    """``python -m bench e2e``: the default configuration."""
    asyncio.run(main(exports=20, contacts=200, rounds=10, stops=5, renew_every=2.0))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=20)
    parser.add_argument("--contacts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--stops", type=int, default=5)
    parser.add_argument("--renew-every", type=float, default=2.0)
    parser.add_argument(
        "--partner",
        choices=["sshd", "asyncssh"],
        default="sshd",
        help="the partner's server: OpenSSH's sshd (its own processes) or the in-process asyncssh server",
    )
    options = parser.parse_args()
    asyncio.run(
        main(
            options.exports,
            options.contacts,
            options.rounds,
            options.stops,
            options.renew_every,
            options.partner,
        )
    )

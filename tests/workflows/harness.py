"""A harness for ExportWorkflow tests: simulated worker hosts on a real Temporal server, real PostgreSQL,
a real SFTP server. Each host has its own client, its own pools and its own task queue, as a separate
machine would; seams on ``host.activities`` are the named points tests hook into."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.export import ExportActivities
from db.stores.protocol import WorkerStore
from domain.models import ExportJob, JobStatus
from partner.kinds import partner_for
from service.temporal import connect_client
from settings import Settings
from testbed.pg import TestDatabase
from testbed.sftp import SftpTarget  # one type for every SFTP target (tests/fix_sftp.py)
from tests.support.factories import Factory
from worker import HostWorkers, build_workers, open_export_activities
from workflows.export import ExportWorkflow, export_summary, export_workflow_id
from workflows.models import ExportInput, ExportResult

CONTACT_DOMAIN = "contacts.example"  # every test contact's address; its presence in a history is a leak
# Every test contact is c<12 hex>@contacts.example, First<12 hex>, Last<12 hex> (see add_contacts).
LEAK = re.compile(
    rb"(?:First|Last)[0-9a-f]{12}|c[0-9a-f]{12}@|"
    + re.escape(CONTACT_DOMAIN.encode())
    + rb"|email,first_name"
)


@dataclass
class Host:
    """One simulated worker host: a worker on the shared queue and one on its own queue."""

    name: str
    activities: ExportActivities
    store: WorkerStore
    resources: contextlib.AsyncExitStack
    client: Client
    shared_queue: str
    own_queue: str
    work_dir: Path
    timings: tuple[float, float] = (60.0, 20.0)  # the host's lease and renewal interval, restored by reset
    _workers: list[Worker] = field(default_factory=list)
    _built: HostWorkers | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        # The worker's own wiring: the same workers as worker.py, without recovery and the sweeper.
        self.start_only("workflows", "claims", "own")

    def start_only(self, *names: str) -> None:
        """Start some of the host's workers ("workflows", "claims", "own"), wired as worker.py wires them;
        the others can be started later (a host whose own queue is slow to come up)."""
        if self._built is None:
            self._built = build_workers(self.client, self.activities.settings, self.activities)
        for name in names:
            worker = getattr(self._built, name)
            self._workers.append(worker)
            self._tasks.append(asyncio.create_task(worker.run()))

    async def stop(self) -> None:
        """Stop both workers (a host going away); what it had not finished is left to the lease."""
        await asyncio.gather(*(w.shutdown() for w in self._workers), return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._workers, self._tasks, self._built = [], [], None

    async def close(self) -> None:
        await self.stop()
        await self.resources.aclose()

    def set_timings(self, lease_seconds: float, renew_every_seconds: float) -> None:
        """Shorten the lease each claim and renewal sets, and the renewal interval (restored by reset)."""
        self.store.lease_seconds = lease_seconds
        self.activities.settings.renew_every_seconds = renew_every_seconds

    def reset_seams(self) -> None:
        self.set_timings(*self.timings)
        self.activities.settings.work_dir = self.work_dir
        self.activities.seams.reset()

    def files_on_disk(self) -> list[Path]:
        """Every file left under this host's work directory (the builder's private dirs included)."""
        if not self.work_dir.exists():
            return []
        return [p for p in self.work_dir.rglob("*") if p.is_file()]


async def separate_client(env_client: Client) -> Client:
    """A separate client to the same server, as a separate host would have."""
    return await connect_client(
        Settings(
            temporal_address=env_client.service_client.config.target_host,
            temporal_namespace=env_client.namespace,
        )
    )


async def make_host(
    name: str,
    *,
    env_client: Client,
    database: TestDatabase,
    shared_queue: str,
    work_root: Path,
    lease_seconds: float = 60.0,
    renew_every_seconds: float = 20.0,
    own_client: bool = True,
    search_attributes: bool = True,
    worker_url: str | None = None,
    reread_timeout: float = 5.0,
    worker_pool_size: int | None = None,
    max_concurrent_builds: int = 4,
    build_url: str | None = None,
    build_pool_timeout: float = 15.0,
) -> Host:
    """A started host, wired as worker.py wires one: an ``exports_worker`` pool (and ``exports_api`` for a
    Temporal cancel), its export activities, and the two workers.

    ``worker_url`` points the worker pool elsewhere (through a TCP proxy); that pool then opens one
    connection at start, so a fault on it leaves no spare connection for the re-read.
    """
    work_dir = work_root / name
    settings = Settings(
        database_url=database.app_url,
        task_queue=shared_queue,
        worker_id=name,
        lease_seconds=lease_seconds,
        renew_every_seconds=renew_every_seconds,
        work_dir=work_dir,
        worker_pool_size=worker_pool_size or (4 if worker_url else 8),
        max_concurrent_builds=max_concurrent_builds,
        shutdown_grace_seconds=0,  # a host stopping in a test goes away at once
    )
    resources = contextlib.AsyncExitStack()
    activities = await open_export_activities(
        settings,
        resources,
        worker_id=name,
        search_attributes=search_attributes,  # True: registered by the session's conftest
        worker_url=worker_url,
        build_url=build_url,
        build_pool_timeout=build_pool_timeout,
        reread_timeout=reread_timeout,
    )
    client = await separate_client(env_client) if own_client else env_client
    host = Host(
        name=name,
        activities=activities,
        store=activities.store,
        resources=resources,
        client=client,
        shared_queue=shared_queue,
        own_queue=activities.own_task_queue,
        work_dir=work_dir,
        timings=(lease_seconds, renew_every_seconds),
    )
    host.start()
    return host


class Harness:
    """Queues exports, wakes them up as the dispatcher would, and reads what happened."""

    def __init__(
        self,
        *,
        client: Client,
        factory: Factory,
        sftp: SftpTarget,
        shared_queue: str,
        hosts: list[Host],
        track_histories: bool = True,
    ) -> None:
        self.track_histories = track_histories  # searched for contact data when the module ends
        self.started: list[WorkflowHandle[Any, Any]] = []  # every workflow this harness started
        self.contact_values: set[str] = set()  # every contact value this harness inserted
        self.client = client
        self.factory = factory
        self.sftp = sftp
        self.shared_queue = shared_queue
        self.hosts = hosts

    @property
    def host(self) -> Host:
        return self.hosts[0]

    # -- set-up -------------------------------------------------------------------------------------

    async def destination(self, tenant_id: uuid.UUID, **fields: Any) -> uuid.UUID:
        row = {
            "host": self.sftp.host,
            "port": self.sftp.port,
            "username": self.sftp.username,
            "host_key": self.sftp.host_key,
            "credential_ref": str(self.sftp.client_key_path),
            "remote_dir": self.sftp.remote_dir,
        }
        row.update(fields)
        return await self.factory.destination(tenant_id, **row)

    async def queue_export(self, contacts: int = 3, list_name: str = "main", **destination: Any) -> ExportJob:
        """A tenant, a destination on the test SFTP server, ``contacts`` contacts, and a queued export."""
        tenant_id = await self.factory.tenant()
        destination_id = await self.destination(tenant_id, **destination)
        if contacts:
            await self.add_contacts(tenant_id, list_name, contacts)
        return await self.factory.queued(tenant_id, destination_id, list_name=list_name)

    async def add_contacts(self, tenant_id: uuid.UUID, list_name: str, n: int) -> None:
        rows = []
        for _ in range(n):
            tag = uuid.uuid4().hex[:12]
            row = (f"c{tag}@{CONTACT_DOMAIN}", f"First{tag}", f"Last{tag}")
            self.contact_values.update(row)
            rows.append(row)
        await self.factory.contacts(tenant_id, list_name, rows)

    # -- wake-ups -----------------------------------------------------------------------------------

    async def start(
        self,
        job: ExportJob | uuid.UUID,
        message_id: uuid.UUID | None = None,
        client: Client | None = None,
        task_queue: str | None = None,
        **inp: Any,
    ) -> WorkflowHandle[Any, ExportResult]:
        """Start the wake-up's workflow as the dispatcher does: its ID, the shared queue, a summary."""
        job_id = job if isinstance(job, uuid.UUID) else job.id
        message_id = message_id or uuid.uuid4()
        handle = await (client or self.client).start_workflow(
            ExportWorkflow.run,
            ExportInput(job_id=job_id, message_id=message_id, **inp),
            id=export_workflow_id(job_id, message_id),
            task_queue=task_queue or self.shared_queue,
            static_summary=export_summary(job_id),
        )
        if self.track_histories:
            self.started.append(handle)
        return handle

    async def run(self, job: ExportJob | uuid.UUID, **kw: Any) -> ExportResult:
        handle = await self.start(job, **kw)
        return await handle.result()

    # -- what happened ------------------------------------------------------------------------------

    async def status(self, job: ExportJob) -> JobStatus:
        return await self.factory.status(job.id)

    def uploads(self, job: ExportJob) -> list[Path]:
        """Files at the partner under this job's final name (temporary names are listed separately)."""
        return [p for p in self.sftp.local_dir.glob(f"*{job.delivery_key}*") if p.name == job.final_name]

    def partner_files(self, job: ExportJob) -> list[Path]:
        """Every file at the partner naming this job's delivery key: final, temporary or acknowledgment."""
        return list(self.sftp.local_dir.glob(f"*{job.delivery_key}*"))

    def files_on_disk(self) -> list[Path]:
        return [p for h in self.hosts for p in h.files_on_disk()]

    async def wait_for_row(
        self, job: ExportJob, condition: Callable[[dict[str, Any]], bool], within: float = 20.0
    ) -> dict[str, Any]:
        """Wait until the job's row satisfies ``condition``; a condition, not a race (bounded, fails loudly)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            rows = await self.factory.admin("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": job.id})
            if rows and condition(rows[0]):
                return rows[0]
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job {job.id} never reached the condition; row is {rows}")
            await asyncio.sleep(0.02)

    async def wait_until_db_clock_passes(self, instant: Any) -> None:
        """Block on the database clock (not the test's) until ``instant`` has passed."""
        await self.factory.admin(
            "SELECT pg_sleep(greatest(0, extract(epoch FROM (%(t)s::timestamptz - clock_timestamp()))) + 0.05)",
            {"t": instant},
        )


async def backends_blocked_by(factory: Factory, blocker_pid: int) -> list[int]:
    """Backends of this database waiting on a lock that ``blocker_pid`` holds (pg_blocking_pids)."""
    rows = await factory.admin(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND %(b)s = ANY(pg_blocking_pids(pid)) ORDER BY pid",
        {"b": blocker_pid},
    )
    return [r["pid"] for r in rows]


async def wait_until_blocked_by(
    factory: Factory, blocker_pid: int, *, besides: tuple[int, ...] = (), within: float = 10.0
) -> int:
    """Wait until a backend (not in ``besides``) is blocked by ``blocker_pid``; fails after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        waiting = [pid for pid in await backends_blocked_by(factory, blocker_pid) if pid not in besides]
        if waiting:
            return waiting[0]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"nothing waited on backend {blocker_pid} within {within} s")
        await asyncio.sleep(0.01)


async def idle_in_transaction_pid(factory: Factory, role_suffix: str = "exports_api") -> int:
    """The one backend of this database holding a transaction open as ``role_suffix``'s pool."""
    rows = await factory.admin(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle in transaction' AND application_name LIKE %(app)s",
        {"app": f"%{role_suffix}"},
    )
    assert len(rows) == 1, rows
    return rows[0]["pid"]


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, within: float = 20.0) -> None:
    """Wait for a condition another party makes true (a row, a query answer); fails after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never happened within {within} s: {what}")
        await asyncio.sleep(0.01)


async def recover(harness: Harness, job: ExportJob, *, max_attempts: int = 3) -> str:
    """Run recovery's takeover for this job's expired lease, as its scheduled batch would; returns it."""
    from activities.recovery import RecoveryActivities

    store = harness.factory.recovery
    candidates = [c for c in await store.find_expired_leases(limit=1000) if c.id == job.id]
    assert len(candidates) == 1, f"job {job.id} has no expired lease to take over"
    recovery = RecoveryActivities(store, Settings(max_attempts=max_attempts), partners=partner_for)
    return (await recovery.take_over(candidates[0], f"recovery-{uuid.uuid4().hex[:8]}")).value


async def history_leaks(handles: list[WorkflowHandle[Any, Any]]) -> list[tuple[str, str]]:
    """(workflow ID, what matched) for every history among ``handles`` that holds contact data."""
    leaks = []
    for handle in handles:
        text = await history_text(handle)
        assert b"ExportWorkflow" in text  # the history really was read
        found = LEAK.search(text)
        if found:
            leaks.append((handle.id, found.group(0).decode(errors="replace")))
    return leaks


async def history_text(handle: WorkflowHandle[Any, Any]) -> bytes:
    """Every field of a workflow's history as text; payload bytes appear as they are stored."""
    history = await handle.fetch_history()
    return text_format.MessageToString(History(events=history.events), as_utf8=True).encode()

"""A real worker process killed with SIGKILL at four named points: recovery takes the attempt over, and
the partner never receives a second upload.

Each test starts ``tests/e2e/killed_worker_runner.py`` (``worker.run_worker`` with one seam that writes a
marker file and then never returns) against the module's real PostgreSQL, the real time-skipping Temporal
server and the in-process asyncssh partner. Once the marker says the attempt is at its point, the test
sends SIGKILL and waits for the process to be gone; nothing of it runs afterwards: no graceful shutdown,
no renewal, no terminal write. The lease is then expired on the row (the database clock decides) and
recovery's takeover runs as its scheduled batch would. What happened is read from the row, its events,
the outbox and the partner's directory on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.recovery import RecoveryActivities
from db.builder import build_dirs
from db.stores.recovery import RecoveryStore
from domain.evidence import set_aside_name_for, temp_name_for
from domain.models import ExportJob, FailureCode, JobStatus
from partner.kinds import partner_for
from partner.local_server import LocalSftpServer
from runtime.scavenger import scavenge_export_files
from settings import Settings
from tests.support.factories import Factory
from worker import run_worker
from workflows.export import ExportWorkflow, export_summary, export_workflow_id
from workflows.models import AttemptOutcome, ExportInput, ExportResult, Takeover

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # a bound on waiting for a condition, never a delay that decides one
MAX_ATTEMPTS = 3
UPLOAD_CONTACTS = 1500  # about 90 KB: several 32 KB write requests, so the kill lands mid-upload


@dataclass
class Partner:
    """One test's directory on the asyncssh partner: the destination's columns and the same place on disk."""

    row: dict[str, Any]
    local_dir: Path

    def files(self) -> dict[str, int]:
        """Every file in the directory now, name to size, as the partner's own disk shows it."""
        return {p.name: p.stat().st_size for p in sorted(self.local_dir.iterdir()) if p.is_file()}


@pytest.fixture
def partner(local_sftp_server: LocalSftpServer) -> Iterator[Partner]:  # noqa: F811 - the imported fixture
    """A fresh, empty directory on the partner for this test alone."""
    name = uuid.uuid4().hex
    local_dir = local_sftp_server.root / name
    local_dir.mkdir()
    yield Partner(row=local_sftp_server.destination_fields(remote_dir=f"/{name}"), local_dir=local_dir)
    shutil.rmtree(local_dir, ignore_errors=True)


@pytest.fixture
def task_queue() -> str:
    """A shared queue of this test's own: a killed attempt's workflow never meets another test's worker."""
    return f"exports-{uuid.uuid4().hex[:8]}"


async def queue_export(factory: Factory, partner: Partner, contacts: int, **contract: Any) -> ExportJob:
    """A tenant, a destination on the partner (with ``contract``'s columns), ``contacts`` contacts on list
    ``main``, and a queued export."""
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, **{**partner.row, **contract})
    rows = [(f"c{i}-{uuid.uuid4().hex[:8]}@example.test", f"First{i}", f"Last{i}") for i in range(contacts)]
    await factory.contacts(tenant_id, "main", rows)
    return await factory.queued(tenant_id, destination_id, list_name="main")


@dataclass
class KillableWorker:
    """A ``killed_worker_runner`` process held at ``point`` for one job."""

    process: asyncio.subprocess.Process
    marker: Path
    log: Path

    async def reached(self) -> dict[str, Any]:
        """Wait until the seam's marker exists (the attempt is at its point) and return what it says."""
        deadline = asyncio.get_running_loop().time() + WAIT
        while not self.marker.exists():
            if self.process.returncode is not None:
                raise AssertionError(f"the worker exited with {self.process.returncode}:\n{self.log_tail()}")
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the worker never reached its seam:\n{self.log_tail()}")
            await asyncio.sleep(0.02)
        return json.loads(self.marker.read_text())

    async def terminate(self) -> int:
        """SIGTERM (a deploy), and wait for the process to end by itself; returns its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), WAIT)

    async def kill(self) -> None:
        """SIGKILL, and wait until the kernel has reaped it: its sockets are closed from here on."""
        self.process.send_signal(signal.SIGKILL)
        code = await asyncio.wait_for(self.process.wait(), WAIT)
        assert code == -signal.SIGKILL

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""


def worker_paths(work_dir: Path) -> tuple[Path, Path]:
    """The runner's marker file and log in a fresh ``work_dir`` (its built files go under ``files/``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    return work_dir / "reached.json", work_dir / "worker.log"


@asynccontextmanager
async def killable_worker(
    point: str,
    job: ExportJob,
    *,
    database_url: str,
    client: Client,
    task_queue: str,
    work_dir: Path,
    drain_on_sigterm: bool = False,
) -> AsyncIterator[KillableWorker]:
    """Start the runner process blocked at ``point`` for ``job``; it is killed on the way out if still alive."""
    marker, log = worker_paths(work_dir)
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database_url,
        "EXPORTS_TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "EXPORTS_TEMPORAL_NAMESPACE": client.namespace,
        "EXPORTS_TASK_QUEUE": task_queue,
        "EXPORTS_WORK_DIR": str(work_dir / "files"),
        "EXPORTS_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
    }
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.e2e.killed_worker_runner",
            "--block-at",
            point,
            "--job",
            str(job.id),
            "--marker",
            str(marker),
            *(["--drain-on-sigterm"] if drain_on_sigterm else []),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=output,
        )
    worker = KillableWorker(process=process, marker=marker, log=log)
    try:
        yield worker
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def healthy_worker(
    client: Client, database_url: str, task_queue: str, work_dir: Path
) -> AsyncIterator[None]:
    """``worker.run_worker`` in this process on ``task_queue``, no seams; stopped gracefully on the way out."""
    settings = Settings(
        database_url=database_url, task_queue=task_queue, work_dir=work_dir, max_attempts=MAX_ATTEMPTS
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_worker(settings, stop=stop, client=client, ready=ready, schedules=False))
    try:
        done, _ = await asyncio.wait(
            [task, asyncio.create_task(ready.wait())], timeout=WAIT, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            task.result()  # raises what stopped it
        assert ready.is_set()
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)


async def recover(recovery_store: RecoveryStore, job_id: UUID) -> Takeover:
    """Recovery's takeover of this job's expired lease, as its scheduled batch would run it."""
    candidates = [c for c in await recovery_store.find_expired_leases(limit=1000) if c.id == job_id]
    assert len(candidates) == 1, f"job {job_id} has no expired lease to take over"
    recovery = RecoveryActivities(recovery_store, Settings(max_attempts=MAX_ATTEMPTS), partners=partner_for)
    return await recovery.take_over(candidates[0], f"recovery-{uuid.uuid4().hex[:8]}")


async def wait_for_job(factory: Factory, job_id: UUID, condition: Callable[[ExportJob], bool]) -> ExportJob:
    """Wait until the row satisfies ``condition`` (bounded, fails loudly with the row)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition(job := await factory.job(job_id)):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"job {job_id} never reached the condition; row is {job!r}")
        await asyncio.sleep(0.02)
    return job


async def wait_for_partner_file(partner: Partner, name: str, size: int) -> None:
    """Wait until the partner's disk holds ``name`` with at least ``size`` bytes (pipelined writes land)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while partner.files().get(name, -1) < size:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{name} never reached {size} bytes; the partner has {partner.files()}")
        await asyncio.sleep(0.02)


async def wake_up_again(client: Client, job_id: UUID, task_queue: str) -> ExportResult:
    """Run one more wake-up of the job, as a redelivered or swept outbox row would, to its end."""
    message_id = uuid.uuid4()
    return await client.execute_workflow(
        ExportWorkflow.run,
        ExportInput(job_id=job_id, message_id=message_id),
        id=export_workflow_id(job_id, message_id),
        task_queue=task_queue,
        static_summary=export_summary(job_id),
        result_type=ExportResult,
    )


async def outbox_unpublished(factory: Factory, job_id: UUID) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM outbox WHERE job_id = %(id)s AND published_at IS NULL", {"id": job_id}
    )
    return rows[0]["n"]


async def test_killed_while_building_is_requeued_by_recovery_and_delivered_once_by_another_worker(
    ts_env, database, factory, worker_store, partner, task_queue, tmp_path, recovery_store
):
    job = await queue_export(factory, partner, contacts=20)
    async with killable_worker(
        "after_build",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "killed",
    ) as killed:
        await killed.reached()
        building = await factory.job(job.id)
        assert (building.status, building.attempt_count) == (JobStatus.RUNNING, 1)
        await killed.kill()

    files = tmp_path / "killed" / "files"
    assert set(build_dirs(files)) == {building.attempt_id}  # the killed build left contact data on disk
    assert await scavenge_export_files(files, worker_store.live_attempts) == []  # kept: still Running

    await factory.expire_lease(job.id)
    assert await recover(recovery_store, job.id) == Takeover.REQUEUED
    assert await scavenge_export_files(files, worker_store.live_attempts) == [building.attempt_id]
    assert build_dirs(files) == {}

    requeued = await factory.job(job.id)
    assert (requeued.status, requeued.attempt_id) == (JobStatus.QUEUED, None)
    assert await factory.event_kinds(job.id) == ["Claimed", "RequeuedByRecovery"]
    assert await factory.outbox_count(job.id) == 2  # the requeue's own wake-up
    assert partner.files() == {}  # the killed attempt never reached cutoff 2

    async with healthy_worker(ts_env.client, database.app_url, task_queue, tmp_path / "healthy"):
        claimed = await wait_for_job(factory, job.id, lambda j: j.attempt_count == 2 and j.workflow_id)
        assert claimed.workflow_id is not None and claimed.workflow_id != building.workflow_id
        second = await ts_env.client.get_workflow_handle(
            claimed.workflow_id, result_type=ExportResult
        ).result()

    assert second.outcome == AttemptOutcome.COMPLETED
    done = await factory.job(job.id)
    assert (done.status, done.attempt_count) == (JobStatus.COMPLETED, 2)
    assert done.attempt_id == second.attempt_id != building.attempt_id
    assert (await factory.event_kinds(job.id)).count("Finished") == 1
    assert partner.files() == {done.final_name: done.expected_file_bytes}
    delivered = (partner.local_dir / done.final_name).read_bytes()
    assert hashlib.sha256(delivered).digest() == done.expected_file_sha256
    assert await outbox_unpublished(factory, job.id) == 0


async def taken_over_as_not_delivered(
    factory: Factory, recovery_store: RecoveryStore, job: ExportJob, attempt_id: UUID | None
) -> list[str]:
    """Expire the killed attempt's lease and run recovery's takeover: Failed NotDelivered for that attempt,
    and no terminal write of its own. Returns the job's event kinds."""
    await factory.expire_lease(job.id)
    assert await recover(recovery_store, job.id) == Takeover.NOT_DELIVERED
    ended = await factory.job(job.id)
    assert (ended.status, ended.failure_reason, ended.attempt_id) == (
        JobStatus.FAILED,
        FailureCode.NOT_DELIVERED,
        attempt_id,
    )
    kinds = await factory.event_kinds(job.id)
    assert "Finished" not in kinds
    return kinds


async def a_second_wake_up_settles(
    ts_env: WorkflowEnvironment,
    database: Any,
    factory: Factory,
    job: ExportJob,
    task_queue: str,
    work_dir: Path,
    attempt_id: UUID | None,
) -> None:
    """Nothing can start a second upload: a healthy worker drains the outbox, one more wake-up settles, and
    the row still says Failed for the one attempt."""
    async with healthy_worker(ts_env.client, database.app_url, task_queue, work_dir):
        again = await wake_up_again(ts_env.client, job.id, task_queue)
    assert again.outcome == AttemptOutcome.ALREADY_SETTLED
    after = await factory.job(job.id)
    assert (after.status, after.attempt_count, after.attempt_id) == (JobStatus.FAILED, 1, attempt_id)
    assert await factory.outbox_count(job.id) == 1 and await outbox_unpublished(factory, job.id) == 0


async def test_killed_after_cutoff_2_before_the_upload_ends_not_delivered_and_is_never_uploaded(
    ts_env, database, factory, worker_store, partner, task_queue, tmp_path, recovery_store
):
    job = await queue_export(factory, partner, contacts=20)
    async with killable_worker(
        "before_upload",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "killed",
    ) as killed:
        await killed.reached()
        authorized = await factory.job(job.id)
        assert authorized.status == JobStatus.DELIVERING
        await killed.kill()

    # Issue 10: killed before its upload fence, the attempt sent nothing; recovery proves it.
    kinds = await taken_over_as_not_delivered(factory, recovery_store, job, authorized.attempt_id)
    assert kinds[:2] == ["Claimed", "DeliveryAuthorized"] and kinds[-1] == "ResolvedByRecovery"
    assert "UploadFenced" not in kinds
    assert partner.files() == {}  # no final name, and not even a temporary file

    await a_second_wake_up_settles(
        ts_env, database, factory, job, task_queue, tmp_path / "healthy", authorized.attempt_id
    )
    assert partner.files() == {}


async def test_killed_mid_upload_ends_not_delivered_with_the_attempts_temp_file_and_no_second_upload(
    ts_env, database, factory, worker_store, partner, task_queue, tmp_path, recovery_store
):
    job = await queue_export(factory, partner, contacts=UPLOAD_CONTACTS)
    async with killable_worker(
        "during_upload",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "killed",
    ) as killed:
        reached = await killed.reached()
        uploading = await factory.job(job.id)
        assert uploading.status == JobStatus.DELIVERING and uploading.attempt_id is not None
        assert uploading.expected_file_bytes is not None
        sent = reached["bytes_sent"]
        assert 0 < sent < uploading.expected_file_bytes  # really mid-upload
        temp_name = temp_name_for(uploading.attempt_id, uploading.final_name)
        await wait_for_partner_file(partner, temp_name, sent)
        await killed.kill()

    left = partner.files()
    assert set(left) == {temp_name}  # attributable to the attempt: its name carries the attempt ID
    assert str(uploading.attempt_id) in temp_name and left[temp_name] < uploading.expected_file_bytes

    # Issue 10: killed before its rename fence, the attempt never wrote the final name; recovery proves it.
    kinds = await taken_over_as_not_delivered(factory, recovery_store, job, uploading.attempt_id)
    files = tmp_path / "killed" / "files"
    assert await scavenge_export_files(files, worker_store.live_attempts) == [uploading.attempt_id]
    assert kinds[-1] == "ResolvedByRecovery"
    assert "UploadFenced" in kinds and "RenameFenced" not in kinds

    await a_second_wake_up_settles(
        ts_env, database, factory, job, task_queue, tmp_path / "healthy", uploading.attempt_id
    )
    assert partner.files() == left  # nothing new, nothing grown: no second upload


@pytest.mark.parametrize("temporary_files", ["keep", "remove"])
async def test_killed_after_the_rename_fence_is_set_aside_by_recovery_and_never_published(
    ts_env, database, factory, worker_store, partner, task_queue, tmp_path, recovery_store, temporary_files
):
    # Past its rename fence the attempt was free to rename, so "absent" alone proves nothing; recovery sets
    # its temporary file aside (a rename can then never publish it) and records Failed NotDelivered. Under
    # the partner's cleanup agreement the set-aside file is removed as well.
    job = await queue_export(factory, partner, contacts=UPLOAD_CONTACTS, temporary_files=temporary_files)
    async with killable_worker(
        "after_rename_fence",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "killed",
    ) as killed:
        await killed.reached()
        fenced = await factory.job(job.id)
        assert fenced.status == JobStatus.DELIVERING and fenced.rename_fenced_at is not None
        temp_name = temp_name_for(fenced.attempt_id, fenced.final_name)
        await wait_for_partner_file(partner, temp_name, fenced.expected_file_bytes)
        await killed.kill()
    assert partner.files() == {temp_name: fenced.expected_file_bytes}  # the whole file, never renamed

    kinds = await taken_over_as_not_delivered(factory, recovery_store, job, fenced.attempt_id)
    transitions = [k for k in kinds if k != "DeliveryEvidence"]  # evidence: recovery's listing, move, cleanup
    assert transitions[-1] == "ResolvedByRecovery" and "RenameFenced" in kinds
    aside = set_aside_name_for(fenced.attempt_id, fenced.final_name)
    expected = {} if temporary_files == "remove" else {aside: fenced.expected_file_bytes}
    assert partner.files() == expected  # the final name was never written

    await a_second_wake_up_settles(
        ts_env, database, factory, job, task_queue, tmp_path / "healthy", fenced.attempt_id
    )
    assert partner.files() == expected  # no second upload


# -- a drain (issue 10: a deploy's SIGTERM) -------------------------------------------------------------


async def test_sigterm_while_building_gives_the_attempt_back_at_once_without_using_it_up(
    ts_env, database, factory, worker_store, partner, task_queue, tmp_path
):
    job = await queue_export(factory, partner, contacts=20)
    async with killable_worker(
        "after_build",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "draining",
        drain_on_sigterm=True,
    ) as draining:
        await draining.reached()
        building = await factory.job(job.id)
        assert (building.status, building.attempt_count) == (JobStatus.RUNNING, 1)
        assert await draining.terminate() == 0  # it drained and exited by itself

    # Requeued at once by its own worker, with a fresh wake-up, not waiting out its lease ...
    released = await factory.job(job.id)
    assert (released.status, released.attempt_id, released.attempts_released) == (JobStatus.QUEUED, None, 1)
    assert await factory.event_kinds(job.id) == ["Claimed", "Released"]
    assert await factory.outbox_count(job.id) == 2
    assert build_dirs(tmp_path / "draining" / "files") == {}  # the partial build is gone
    assert partner.files() == {}

    # ... and delivered once by the next worker, the drained attempt not counted against the cap.
    async with healthy_worker(ts_env.client, database.app_url, task_queue, tmp_path / "healthy"):
        claimed = await wait_for_job(factory, job.id, lambda j: j.attempt_count == 2 and j.workflow_id)
        assert claimed.workflow_id is not None
        second = await ts_env.client.get_workflow_handle(
            claimed.workflow_id, result_type=ExportResult
        ).result()
    assert second.outcome == AttemptOutcome.COMPLETED
    done = await factory.job(job.id)
    assert (done.status, done.attempt_count, done.attempts_released) == (JobStatus.COMPLETED, 2, 1)
    assert partner.files() == {done.final_name: done.expected_file_bytes}


async def test_sigterm_during_an_upload_lets_it_finish_its_terminal_write_before_exiting(
    ts_env, database, factory, partner, task_queue, tmp_path
):
    job = await queue_export(factory, partner, contacts=UPLOAD_CONTACTS)
    async with killable_worker(
        "during_upload",
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "draining",
        drain_on_sigterm=True,
    ) as draining:
        reached = await draining.reached()
        assert reached["bytes_sent"] > 0
        assert await draining.terminate() == 0

    done = await factory.job(job.id)
    assert (done.status, done.attempt_count, done.attempts_released) == (JobStatus.COMPLETED, 1, 0)
    kinds = await factory.event_kinds(job.id)
    assert kinds.count("Finished") == 1 and "ResolvedByRecovery" not in kinds
    assert partner.files() == {done.final_name: done.expected_file_bytes}  # delivered once, no temp left

"""worker.py's ``run_worker`` in-process against a real PostgreSQL and the real time-skipping server:
it serves the shared queue, stops within the grace window, lets an activity in flight finish its write,
and cancels one that outlasts the window, leaving the job to recovery and the sweeper."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from uuid import UUID

import pytest

from activities.export import ExportActivities
from db.builder import PRIVATE_DIR_PREFIX
from domain.models import FailureCode, JobStatus
from runtime.drain import POLL_RELEASE_SECONDS
from settings import Settings
from testbed.tcp_proxy import TcpProxy
from tests.runtime.conftest import MAX_ATTEMPTS
from tests.support.eventually import eventually
from worker import run_worker
from workflows.models import RecoveryBatchResult, RecoveryInput
from workflows.recovery import RecoveryWorkflow

GRACE = 3.0
WORKER_PY = str(Path(__file__).resolve().parents[2] / "worker.py")
WAIT = 30  # a bound on waiting for an outcome, never a delay that decides one


@pytest.fixture
def host_settings(settings: Settings) -> Settings:
    """A host with its own shared queue, so it never shares a queue with the module's recovery worker."""
    return settings.model_copy(
        update={"task_queue": f"exports-{uuid.uuid4().hex[:8]}", "shutdown_grace_seconds": GRACE}
    )


class HeldClaim:
    """The claim's ``after_load`` seam for one job: holds the claim until released."""

    def __init__(self, job_id: UUID | None = None) -> None:
        self.job_id = job_id
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    def install(self, activities: ExportActivities) -> None:
        activities.seams.after_load = self.after_load

    async def after_load(self, job_id: UUID) -> None:
        if job_id != self.job_id:
            return
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def start_host(client, host_settings, hold: HeldClaim | None = None):
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_worker(
            host_settings,
            stop=stop,
            client=client,
            ready=ready,
            export_hooks=hold.install if hold else None,
        )
    )
    done, _ = await asyncio.wait(
        [task, asyncio.create_task(ready.wait())], timeout=WAIT, return_when="FIRST_COMPLETED"
    )
    if task in done:
        task.result()  # raises what stopped it
    assert ready.is_set()
    return stop, task


async def stop_host(stop: asyncio.Event, task: asyncio.Task) -> float:
    began = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, WAIT)
    return time.monotonic() - began


async def test_run_worker_serves_the_shared_queue_and_stops_cleanly_within_the_grace_window(
    client, host_settings
):
    stop, task = await start_host(client, host_settings)

    result = await client.execute_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(),
        id=f"recovery-{uuid.uuid4()}",
        task_queue=host_settings.task_queue,
        result_type=RecoveryBatchResult,
    )
    assert result.scanned == 0

    elapsed = await stop_host(stop, task)
    assert elapsed < GRACE + 2  # nothing in flight: no reason to use the window at all
    assert task.exception() is None


async def test_an_activity_in_flight_at_shutdown_finishes_its_write_within_the_grace_window(
    client, host_settings, factory
):
    job = await factory.queued()
    hold = HeldClaim(job.id)
    stop, task = await start_host(client, host_settings, hold)
    await asyncio.wait_for(hold.entered.wait(), WAIT)  # the dispatcher woke it; the claim is running

    stop.set()  # SIGTERM: stop taking work
    hold.release.set()  # the claim's write goes on during the grace window
    elapsed = await stop_host(stop, task)

    assert not hold.cancelled
    assert elapsed < GRACE + 5
    # The claim committed during the drain; its build never starts: the draining worker gives the attempt
    # back at once (issue 10), instead of leaving it to wait out its lease and use up an attempt.
    given_back = await factory.job(job.id)
    assert (given_back.status, given_back.attempt_count, given_back.attempts_released) == (
        JobStatus.QUEUED,
        1,
        1,
    )
    assert await factory.event_kinds(job.id) == ["Claimed", "Released"]


async def test_an_activity_that_outlasts_the_grace_window_is_cancelled_and_left_to_recovery(
    client, host_settings, factory
):
    job = await factory.queued()
    hold = HeldClaim(job.id)
    stop, task = await start_host(client, host_settings, hold)
    await asyncio.wait_for(hold.entered.wait(), WAIT)

    elapsed = await stop_host(stop, task)  # never released: the window runs out

    assert hold.cancelled
    assert GRACE - 0.5 <= elapsed < GRACE + 5
    still = await factory.job(job.id)
    assert still.status == JobStatus.QUEUED and still.attempt_count == 0  # the sweeper wakes it again


async def test_a_job_that_crashes_its_worker_every_time_ends_failed_at_the_cap_through_the_outbox(
    client, host_settings, factory
):
    """Claim, crash, recovery requeues with a new outbox row, the dispatcher wakes a new workflow, which
    claims again ... until recovery finds the attempt cap and ends it Failed with AttemptsExhausted."""
    job = await factory.queued()
    crashed: asyncio.Queue[UUID] = asyncio.Queue()

    def crash_after_every_build(activities: ExportActivities) -> None:
        activities.seams.lease_timer_disabled = True  # a dead worker renews nothing

        async def after_build(job_id: UUID) -> None:
            if job_id == job.id:
                await crashed.put(job_id)
                await asyncio.Event().wait()  # the worker is gone; only the host's shutdown ends this

        activities.seams.after_build = after_build

    stop, ready = asyncio.Event(), asyncio.Event()
    host = asyncio.create_task(
        run_worker(host_settings, stop=stop, client=client, ready=ready, export_hooks=crash_after_every_build)
    )
    try:
        await asyncio.wait_for(ready.wait(), WAIT)
        workflows = []
        for attempt_number in range(1, MAX_ATTEMPTS + 1):
            await asyncio.wait_for(crashed.get(), WAIT)  # claimed and built by a new workflow, then dead
            running = await factory.job(job.id)
            assert (running.status, running.attempt_count) == (JobStatus.RUNNING, attempt_number)
            workflows.append(running.workflow_id)
            await factory.expire_lease(job.id)
            await client.execute_workflow(
                RecoveryWorkflow.run,
                RecoveryInput(),
                id=f"recovery-{uuid.uuid4()}",
                task_queue=host_settings.task_queue,
                result_type=RecoveryBatchResult,
            )
    finally:
        stop.set()
        await asyncio.wait_for(host, WAIT)

    failed = await factory.job(job.id)
    assert (failed.status, failed.failure_reason) == (JobStatus.FAILED, FailureCode.ATTEMPTS_EXHAUSTED)
    assert failed.attempt_count == MAX_ATTEMPTS
    assert len(set(workflows)) == MAX_ATTEMPTS  # each requeue's new outbox row woke a new workflow
    kinds = await factory.event_kinds(job.id)
    assert kinds == ["Claimed", "RequeuedByRecovery"] * (MAX_ATTEMPTS - 1) + ["Claimed", "AttemptsExhausted"]
    assert await factory.outbox_count(job.id) == MAX_ATTEMPTS


async def test_python_worker_py_stops_on_sigterm_within_the_grace_window(client, host_settings):
    """The real process: ``python worker.py`` configured by EXPORTS_ variables, stopped by SIGTERM."""
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": host_settings.database_url,
        "EXPORTS_TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "EXPORTS_TASK_QUEUE": host_settings.task_queue,
        "EXPORTS_SHUTDOWN_GRACE_SECONDS": str(GRACE),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        WORKER_PY,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.wait_for(_line_containing(process, "own queue"), WAIT)  # both workers are wired

        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(_line_containing(process, "stopped"), WAIT)
        code = await asyncio.wait_for(process.wait(), WAIT)
        elapsed = time.monotonic() - began
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert code == 0
    assert elapsed < GRACE + 5


async def _line_containing(process: asyncio.subprocess.Process, text: str) -> str:
    assert process.stderr is not None
    while line := (await process.stderr.readline()).decode():
        if text in line:
            return line
    raise AssertionError(f"worker.py ended without logging {text!r} (exit {await process.wait()})")


async def test_the_worker_removes_local_files_of_ended_attempts_and_keeps_live_ones(
    client, factory, host_settings, tmp_path
):
    # A killed worker leaves contact data in its private build directory; the next worker on the host
    # removes it once the row says the attempt has ended, and never touches a live attempt's.
    _, live_attempt = await factory.running()
    ended = uuid.uuid4()
    dirs = {}
    for attempt in (live_attempt, ended):
        d = tmp_path / f"{PRIVATE_DIR_PREFIX}{attempt}-abc"
        d.mkdir()
        (d / "contacts-x.csv").write_text("email,first_name,last_name\n")
        dirs[attempt] = d

    stop, task = await start_host(client, host_settings.model_copy(update={"work_dir": tmp_path}))
    try:
        # a condition, bounded; the first pass runs at start
        await eventually(lambda: not dirs[ended].exists(), "the ended attempt's files removed", within=WAIT)
        assert not dirs[ended].exists()
        assert dirs[live_attempt].exists()
    finally:
        stop.set()
        await task


@pytest.mark.parametrize("outage", ["refused", "partitioned"])
@pytest.mark.slow
async def test_python_worker_py_drains_within_the_grace_window_while_temporal_is_unreachable(
    client, host_settings, outage
):
    """A deploy during a Temporal outage: SIGTERM while the server cannot be reached (the worker's
    connection goes through a TCP proxy), refused or partitioned. With no attempt held, nothing waits for
    Temporal to release the polls: the process exits within the grace window."""
    host, port = client.service_client.config.target_host.rsplit(":", 1)
    proxy = TcpProxy(host, int(port)).start()
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": host_settings.database_url,
        "EXPORTS_TEMPORAL_ADDRESS": f"127.0.0.1:{proxy.port}",
        "EXPORTS_TASK_QUEUE": host_settings.task_queue,
        "EXPORTS_SHUTDOWN_GRACE_SECONDS": str(GRACE),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, WORKER_PY, env=env, stderr=asyncio.subprocess.PIPE
    )
    lines: list[str] = []
    try:
        await asyncio.wait_for(_line_containing(process, "own queue"), WAIT)
        reading = asyncio.create_task(_read_all(process, lines))  # a full pipe would block its logging
        if outage == "refused":
            proxy.refuse_new_connections()
            proxy.close_all()
        else:
            proxy.blackhole()
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(process.wait(), WAIT)
        except TimeoutError:
            pytest.fail(f"worker.py still running {WAIT}s after SIGTERM:\n" + "".join(lines[-30:]))
        elapsed = time.monotonic() - began
        await reading
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        proxy.stop()

    log = "".join(lines[-15:])
    assert code == 0, log
    # The grace, the wait for the polls, and the process's own start-to-exit time on a busy machine.
    bound = GRACE + POLL_RELEASE_SECONDS + 5
    assert elapsed < bound, f"the drain took {elapsed:.1f}s with a {GRACE}s grace:\n{log}"
    assert any("worker" in line and "stopped" in line for line in lines), log


async def _read_all(process: asyncio.subprocess.Process, lines: list[str]) -> None:
    assert process.stderr is not None
    while line := (await process.stderr.readline()).decode():
        lines.append(line)

"""One soak run, start to end: bring up the stack, run the plan's clients and faults together, let
recovery settle, audit, report, and take everything down again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import psycopg
from temporalio.client import Client

from chaos.audit import AuditInput, Auditor
from chaos.client import ApiClient, StatusBoard
from chaos.config import SoakConfig
from chaos.driver import Driver
from chaos.faults import FaultInjector
from chaos.plan import make_plan
from chaos.recurring import ADMIN, RecurringLoad
from chaos.report import build_report
from chaos.stack import Stack

APPROVER = "olga.ops"  # the soak's second operator: an overwrite replacement takes two people


class Progress:
    """Timestamped lines on ``out``: seconds since the soak started."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=self.out, flush=True)


async def run_soak(config: SoakConfig, command: str, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Run one soak and return its report (a JSON-able dict; ``report["violations"]`` empty on success)."""
    say = Progress(out)
    plan = make_plan(config)
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix=f"chaos-s{config.seed}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o755)  # PostgreSQL runs as its own user below it
    say(f"seed {config.seed}, plan {plan.digest()}: {len(plan.exports)} exports, {len(plan.faults)} faults "
        f"over {config.load_seconds:.0f}s; logs in {run_dir}")  # fmt: skip
    timings: dict[str, float] = {}
    loads = [os.getloadavg()[0]]  # 1-minute load average, sampled every 10 s: timing findings depend on it
    stack = Stack(config, run_dir)
    harness: list[str] = []
    api: ApiClient | None = None
    admin_api: ApiClient | None = None
    approver_api: ApiClient | None = None
    board: StatusBoard | None = None
    drive: asyncio.Task[None] | None = None
    try:
        await stack.start(say)
        timings["start"] = stack.timings["start"]
        assert stack.temporal is not None and stack.token is not None and stack.watch is not None
        api = ApiClient(stack.api_url, stack.token)
        board = StatusBoard(api)
        board.start()
        client = await Client.connect(stack.temporal.address)
        from service.auth import mint_token

        admin_token = await mint_token(
            stack.admin_url, tenant_id=stack.tenant_id, principal=ADMIN, role="admin"
        )
        admin_api = ApiClient(stack.api_url, admin_token)
        # the second person of a replacement with an overwrite agreement (issue #26)
        approver_token = await mint_token(
            stack.admin_url, tenant_id=stack.tenant_id, principal=APPROVER, role="operator"
        )
        approver_api = ApiClient(stack.api_url, approver_token)
        recurring = RecurringLoad(
            admin_api, client, str(stack.destination_id), count=config.recurring, list_name="tiny"
        )
        await recurring.define()
        say(f"{len(recurring.records.defined)} recurring exports defined, firing every minute")
        t0 = time.monotonic()
        load = config.load_seconds
        hard_deadline = t0 + load + config.settle
        driver = Driver(
            api,
            board,
            str(stack.destination_id),
            plan.exports,
            t0=t0,
            hard_deadline=hard_deadline,
            encrypted_destination_id=str(stack.encrypted_destination_id)
            if stack.encrypted_destination_id
            else None,
            approver=approver_api,
        )
        injector = FaultInjector(stack, plan.faults, t0=t0, client=client, say=say)
        say("load and faults begin")
        drive = asyncio.create_task(driver.run(), name="driver")
        reporter = asyncio.create_task(
            _report_progress(say, driver, board, injector, api, len(plan.exports), loads)
        )
        outage = asyncio.create_task(_receiver_outage(stack, t0, load, say), name="receiver-outage")
        duplicates = asyncio.create_task(recurring.duplicates(until=t0 + load), name="recurring-duplicates")
        await injector.run()
        await asyncio.sleep(max(0.0, t0 + load - time.monotonic()))
        await outage
        duplicates.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await duplicates
        await stack.ensure_all_running()
        await recurring.delete_all()  # the exports they made are untouched, and settle like the others
        say(f"recurring exports: {recurring.summary()}")
        timings["load"] = time.monotonic() - t0
        load_ended_at = time.time()

        settle_started = time.monotonic()
        say("faults stopped; every process resumed; waiting for recovery to settle")
        await stack.ensure_all_running()
        settled = await _wait_settled(stack, drive, hard_deadline, say)
        # Late writes on the partner (a resumed worker finishing an upload) land within a lease or two.
        await asyncio.sleep(2 * config.lease_seconds)
        await _wait_webhooks_delivered(stack, say)
        timings["settle"] = time.monotonic() - settle_started
        reporter.cancel()
        await board.stop()
        if not drive.done():
            drive.cancel()
            harness.append("some clients were still waiting at the settle bound")
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drive
        harness += driver.errors
        harness += [f"recurring: {e}" for e in recurring.records.errors if e.startswith("define")]
        harness += [
            f"recurring: delete of {r} answered {status}"
            for r, status in recurring.records.deletions.items()
            if status != 200
        ]

        say("auditing: database, partner watch, client answers, API log, workflow histories")
        audit_started = time.monotonic()
        logs = {m.name: m.child.log_path for m in stack.managed()}
        logs["temporal"] = stack.temporal.child.log_path
        assert stack.upload_dir is not None and stack.tenant_id is not None
        audit = await Auditor(
            AuditInput(
                admin_url=stack.admin_url,
                tenant_id=str(stack.tenant_id),
                upload_dir=stack.upload_dir,
                watch_events=stack.watch.snapshot(),
                watch_problems=[
                    *stack.watch.errors,
                    *(["inotify queue overflowed"] if stack.watch.overflowed else []),
                ],
                records=driver.records,
                journal=sorted([*api.journal, *approver_api.journal], key=lambda r: r.t),
                faults=injector.records,
                exits=[e for m in stack.managed() for e in m.exits],
                lists=config.lists,
                marker=stack.marker,
                temporal_address=stack.temporal.address,
                logs=logs,
                shutdown_grace_seconds=config.shutdown_grace_seconds,
                recovery_every_seconds=config.recovery_every_seconds,
                max_transient_releases=config.max_transient_releases,
                load_ended_at=load_ended_at,
                webhooks=stack.receiver.received() if stack.receiver is not None else [],
                webhook_endpoint_id=stack.webhook_endpoint_id,
                file_suffixes={str(stack.encrypted_destination_id): ".csv.gz.pgp"}
                if stack.encrypted_destination_id
                else {},
                partner_key=stack.partner_key,
                signer_fingerprint=stack.tenant_key.fingerprint if stack.tenant_key else None,
                session_limit=config.session_limit,
                partner_sessions_high_water=stack.sftp_proxy.open_high_water if stack.sftp_proxy else None,
                partner_sessions_timeline=list(stack.sftp_proxy.open_timeline) if stack.sftp_proxy else [],
            )
        ).run()
        timings["audit"] = time.monotonic() - audit_started
        timings["total"] = time.monotonic() - say.started
        return build_report(
            config=config,
            plan=plan,
            command=command,
            run_dir=run_dir,
            timings=timings,
            settled=settled,
            audit=audit,
            faults=injector.records,
            records=driver.records,
            harness=harness,
            load={
                "cpus": os.cpu_count(),
                "at_start": loads[0],
                "max": max(loads),
                "mean": sum(loads) / len(loads),
            },
        )
    finally:
        if drive is not None and not drive.done():
            drive.cancel()
        if board is not None:
            await board.stop()
        if api is not None:
            await api.aclose()
        if admin_api is not None:
            await admin_api.aclose()
        if approver_api is not None:
            await approver_api.aclose()
        say("stopping everything the soak started")
        await stack.stop()


async def _wait_settled(stack: Stack, drive: asyncio.Task[None], deadline: float, say: Progress) -> bool:
    """Until no job is Queued, Running or Delivering and every client is done, or ``deadline``."""
    last_report = 0.0
    open_jobs = -1
    while time.monotonic() < deadline:
        try:
            async with await psycopg.AsyncConnection.connect(stack.admin_url, connect_timeout=3) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM export_jobs WHERE status IN ('Queued', 'Running', 'Delivering')"
                )
                row = await cur.fetchone()
                open_jobs = row[0] if row else -1
        except psycopg.Error:
            open_jobs = -1
        if open_jobs == 0 and drive.done():
            say("settled: no open job, every client done")
            return True
        if time.monotonic() - last_report > 10:
            say(f"settling: {open_jobs} open jobs, clients {'done' if drive.done() else 'still waiting'}")
            last_report = time.monotonic()
        await asyncio.sleep(1.0)
    say(f"not settled at the bound: {open_jobs} open jobs")
    return False


async def _receiver_outage(stack: Stack, t0: float, load: float, say: Progress) -> None:
    """The webhook receiver is down (its port closed) for a tenth of the load, from its middle: every POST
    meanwhile fails to connect and is retried once it is back. Not part of the plan: its schedule stays."""
    if stack.receiver is None:
        return
    await asyncio.sleep(max(0.0, t0 + load * 0.5 - time.monotonic()))
    say("webhook receiver down")
    stack.receiver.stop()
    try:
        await asyncio.sleep(max(1.0, load * 0.1))
    finally:
        stack.receiver.start()
        say("webhook receiver back")


async def _wait_webhooks_delivered(stack: Stack, say: Progress, bound: float = 60.0) -> bool:
    """Until every event is fanned out and no delivery is pending (retries land within seconds), or
    ``bound``: the auditor reports what is still pending."""
    deadline = time.monotonic() + bound
    left = -1
    while time.monotonic() < deadline:
        try:
            async with await psycopg.AsyncConnection.connect(stack.admin_url, connect_timeout=3) as conn:
                cur = await conn.execute(
                    "SELECT (SELECT count(*) FROM notification_events WHERE fanned_out_at IS NULL)"
                    " + (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending')"
                )
                row = await cur.fetchone()
                left = row[0] if row else -1
        except psycopg.Error:
            left = -1
        if left == 0:
            say("webhooks: every event delivered")
            return True
        await asyncio.sleep(0.5)
    say(f"webhooks: {left} events or deliveries still pending at the bound")
    return False


async def _report_progress(
    say: Progress,
    driver: Driver,
    board: StatusBoard,
    injector: FaultInjector,
    api: ApiClient,
    planned: int,
    loads: list[float],
) -> None:
    while True:
        await asyncio.sleep(10)
        loads.append(os.getloadavg()[0])
        statuses = Counter(row["status"] for row in board.jobs.values())
        fivexx = sum(1 for r in api.journal if r.status is not None and r.status >= 500)
        errors = sum(1 for r in api.journal if r.status is None)
        done = sum(1 for f in injector.records if f.ended)
        say(
            f"{sum(1 for r in driver.records if r.job_id and r.role == 'original')}/{planned} created; "
            + ", ".join(f"{k} {v}" for k, v in statuses.most_common())
            + f"; faults {done}/{len(injector.faults)}; 5xx {fivexx}; client errors {errors}; load {loads[-1]:.1f}"
        )


def config_dict(config: SoakConfig) -> dict[str, Any]:
    data = asdict(config)
    data["report_json"] = str(config.report_json) if config.report_json else None
    data["run_dir"] = str(config.run_dir) if config.run_dir else None
    data["load_seconds"] = config.load_seconds
    return data

"""Faults by real means, at the plan's times: signals to worker and API processes by PID, cuts at the TCP
proxies, PostgreSQL and Temporal server restarts, and workflow terminate/cancel through the Temporal CLI.

Each fault holds a lock on what it acts on (a worker slot, the database, the Temporal server, the API),
so two faults never fight over one process; a fault whose time came while its resource was busy runs
late and says so. Every fault brings what it took down back up before it ends.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from temporalio.client import Client

from chaos.histories import job_of_workflow
from chaos.plan import FaultPlan
from chaos.stack import Managed, Stack

TARGET_WAIT = 10.0  # seconds a targeted fault waits for something to act on


@dataclass
class FaultRecord:
    """One fault as it happened: when (unix time), on what, with what result."""

    index: int
    kind: str
    planned_at: float
    started: float = 0.0
    ended: float = 0.0
    target: str = ""
    detail: str = ""
    ok: bool = True
    skipped: bool = False
    job_id: str | None = None
    workflow_id: str | None = None
    job_status: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class FaultInjector:
    """Runs the plan's faults against ``stack``, starting at monotonic time ``t0``."""

    def __init__(
        self,
        stack: Stack,
        faults: list[FaultPlan],
        *,
        t0: float,
        client: Client | None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.say = say or (lambda _text: None)
        self.stack = stack
        self.faults = faults
        self.t0 = t0
        self.client = client
        self.records: list[FaultRecord] = []
        self.t0_wall = time.time() - (time.monotonic() - t0)
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def run(self) -> None:
        await asyncio.gather(*(self._one(fault) for fault in self.faults))

    async def _one(self, fault: FaultPlan) -> None:
        await asyncio.sleep(max(0.0, self.t0 + fault.at - time.monotonic()))
        record = FaultRecord(index=fault.index, kind=fault.kind, planned_at=fault.at)
        self.records.append(record)
        worker: Managed | None = None
        resource = _resource(fault)
        if fault.kind.startswith("worker_"):
            worker = await self._worker(fault, record)
            resource = f"worker-{worker.name}"
        async with self._lock(resource):
            record.started = time.time()
            try:
                await self._execute(fault, record, worker)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be done is reported, not fatal
                record.ok = False
                record.detail += f" failed: {type(exc).__name__}: {exc}"[:400]
            record.ended = time.time()
        late = record.started - (self.t0_wall + fault.at)
        self.say(
            f"fault #{fault.index} {fault.kind} {record.target}: {record.detail.strip()}"
            + (f" (started {late:.1f}s late: its resource was busy)" if late > 1 else "")
            + ("" if record.ok else " [FAILED]")
        )

    async def _execute(self, fault: FaultPlan, record: FaultRecord, worker: Managed | None) -> None:
        stack = self.stack
        match fault.kind:
            case "worker_kill":
                assert worker is not None
                await self._worker_down(worker, signal.SIGKILL, fault.hold, record)
            case "worker_drain":
                assert worker is not None
                await self._worker_down(worker, signal.SIGTERM, fault.hold, record)
            case "worker_pause":
                assert worker is not None
                await self._worker_pause(worker, fault.hold, record)
            case "pg_sever":
                assert stack.pg_proxy is not None
                record.target = "workers->postgres proxy"
                record.detail = _sever(stack.pg_proxy, fault.hold)
                await asyncio.sleep(fault.hold)
                stack.pg_proxy.refuse_new_connections(False)
            case "sftp_sever":
                assert stack.sftp_proxy is not None
                record.target = "workers->partner proxies"
                proxies = [p for p in (stack.sftp_proxy, stack.sftp_pgp_proxy) if p is not None]
                record.detail = "; ".join(_sever(p, fault.hold) for p in proxies)
                await asyncio.sleep(fault.hold)
                for p in proxies:
                    p.refuse_new_connections(False)
            case "partner_outage":
                # issue #25.4: the partner is down long enough that deliveries fail NotDelivered (connect
                # refused) and wait to be tried again; the auditor checks each was delivered at most once
                assert stack.sftp_proxy is not None
                record.target = "workers->partner proxies"
                proxies = [p for p in (stack.sftp_proxy, stack.sftp_pgp_proxy) if p is not None]
                record.detail = "; ".join(_sever(p, fault.hold) for p in proxies) + " (partner down)"
                await asyncio.sleep(fault.hold)
                for p in proxies:
                    p.refuse_new_connections(False)
            case "pg_restart_immediate" | "pg_restart_fast":
                mode = fault.kind.removeprefix("pg_restart_")
                record.target = "postgres"
                down = await stack.restart_postgres(mode, fault.hold)
                record.detail = f"pg_ctl stop -m {mode}; down {down:.1f}s"
            case "temporal_restart":
                assert stack.temporal is not None
                sig = signal.SIGKILL if fault.mode == "kill" else signal.SIGTERM
                record.target = "temporal dev server"
                down = await stack.temporal.restart(sig=sig, down_for=fault.hold)
                record.detail = f"{sig.name}, same --db-filename; down {down:.1f}s"
            case "workflow_terminate" | "workflow_cancel":
                await self._workflow(fault, record)
            case "api_restart":
                await self._api_restart(fault.hold, record)
            case _:
                raise ValueError(f"unknown fault kind {fault.kind}")

    async def _worker(self, fault: FaultPlan, record: FaultRecord) -> Managed:
        """The planned slot, or (mode building/delivering) a worker holding an attempt in that state, waited
        for up to ``TARGET_WAIT`` seconds; ties and misses fall back to the planned slot."""
        workers = self.stack.workers
        if fault.mode == "planned":
            return workers[fault.target]
        wanted = "Running" if fault.mode == "building" else "Delivering"
        deadline = time.monotonic() + TARGET_WAIT
        while True:
            holders = await self._attempt_holders(wanted)
            current = {f"{m.name}.{m.generation}": m for m in workers if not m.held}
            busy = [current[h] for h in holders if h in current]
            if busy:
                record.extra["chosen_for"] = f"holds a {wanted} attempt"
                return busy[int(fault.pick * len(busy)) % len(busy)]
            if time.monotonic() > deadline:
                record.extra["chosen_for"] = f"no worker held a {wanted} attempt; planned slot"
                return workers[fault.target]
            await asyncio.sleep(0.2)

    async def _attempt_holders(self, status: str) -> list[str]:
        """Worker IDs holding an attempt in ``status`` now, sorted (empty when the database does not answer)."""
        try:
            async with await psycopg.AsyncConnection.connect(self.stack.admin_url, connect_timeout=3) as conn:
                cur = await conn.execute(
                    "SELECT DISTINCT claimed_by FROM export_jobs WHERE status = %(s)s AND claimed_by IS NOT NULL"
                    " ORDER BY claimed_by",
                    {"s": status},
                )
                return [row[0] for row in await cur.fetchall()]
        except psycopg.Error:
            return []

    async def _worker_down(
        self, managed: Managed, sig: signal.Signals, hold: float, record: FaultRecord
    ) -> None:
        record.target = f"{managed.name}.{managed.generation} pid {managed.child.pid}"
        managed.held = True
        try:
            was_running = managed.child.running()
            managed.child.send(signal.SIGCONT)  # a paused worker gets the signal too
            managed.child.send(sig)
            budget = 10.0 if sig == signal.SIGKILL else self.stack.config.shutdown_grace_seconds + 30.0
            began = time.monotonic()
            code = await asyncio.to_thread(managed.child.wait, budget)
            took = time.monotonic() - began
            if code is None:
                managed.child.send(signal.SIGKILL)
                code = await asyncio.to_thread(managed.child.wait, 10.0)
                record.ok = False
                record.detail = f"did not exit {budget:.0f}s after {sig.name}; killed. "
            record.detail += (
                f"{sig.name}: exited {code} after {took:.1f}s" if was_running else "was not running"
            )
            record.extra["exit_seconds"] = round(took, 2)
            await asyncio.sleep(hold)
        finally:
            ready = await self.stack.restart_worker(managed)
        record.detail += f"; restarted as {managed.name}.{managed.generation}" + (
            "" if ready else " (not ready)"
        )

    async def _worker_pause(self, managed: Managed, hold: float, record: FaultRecord) -> None:
        record.target = f"{managed.name}.{managed.generation} pid {managed.child.pid}"
        managed.held = True
        managed.paused = True
        try:
            managed.child.send(signal.SIGSTOP)
            await asyncio.sleep(hold)
        finally:
            managed.child.send(signal.SIGCONT)
            managed.paused = False
            managed.held = False
        record.detail = f"SIGSTOP for {hold:.1f}s (lease {self.stack.config.lease_seconds:.0f}s), SIGCONT"

    async def _api_restart(self, hold: float, record: FaultRecord) -> None:
        api = self.stack.api
        assert api is not None
        record.target = f"api pid {api.child.pid}"
        api.held = True
        try:
            code = await asyncio.to_thread(api.child.stop, 15.0, signal.SIGTERM)
            record.detail = f"SIGTERM: exited {code}"
            await asyncio.sleep(hold)
        finally:
            ready = await self.stack.restart_api()
        record.detail += f"; down {hold:.1f}s; restarted" + ("" if ready else " (not ready)")

    async def _workflow(self, fault: FaultPlan, record: FaultRecord) -> None:
        stack = self.stack
        assert stack.temporal is not None
        verb = "terminate" if fault.kind == "workflow_terminate" else "cancel"
        record.target = f"an open export workflow ({fault.mode})"
        deadline = time.monotonic() + TARGET_WAIT
        while True:
            candidates = await self._candidates(fault.mode)
            if not candidates and fault.mode != "any":
                candidates = await self._candidates("any")
            if candidates or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)  # nothing open right now: wait a little for the next export
        if not candidates:
            record.skipped = True
            record.detail = "no open export workflow to act on"
            return
        job_id, workflow_id, status = candidates[int(fault.pick * len(candidates)) % len(candidates)]
        record.job_id, record.workflow_id, record.job_status = job_id, workflow_id, status
        args = ["workflow", verb, "--workflow-id", workflow_id]
        if verb == "terminate":
            args += ["--reason", "chaos soak"]
        code, output = await stack.temporal.cli(*args)
        record.detail = f"temporal workflow {verb} (job {status or '?'}): exit {code} {output[:200]}"
        if code != 0 and "already completed" in output:
            # The job's workflow ended meanwhile (or ended before its row did: left to recovery).
            record.skipped = True
        else:
            record.ok = code == 0

    async def _candidates(self, mode: str) -> list[tuple[str, str, str | None]]:
        """(job ID, workflow ID, job status) of open export workflows, sorted, for the chosen mode."""
        if mode in ("running", "delivering"):
            wanted = "Running" if mode == "running" else "Delivering"
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.stack.admin_url, connect_timeout=3
                ) as conn:
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(
                        "SELECT id::text AS id, workflow_id, status FROM export_jobs"
                        " WHERE status = %(s)s AND workflow_id IS NOT NULL ORDER BY id",
                        {"s": wanted},
                    )
                    return [(r["id"], r["workflow_id"], r["status"]) for r in await cur.fetchall()]
            except psycopg.Error:
                return []
        if self.client is None:
            return []
        found: list[tuple[str, str, str | None]] = []
        try:
            async for execution in self.client.list_workflows(
                "WorkflowType = 'ExportWorkflow' AND ExecutionStatus = 'Running'"
            ):
                job_id = job_of_workflow(execution.id)
                if job_id is not None:
                    found.append((job_id, execution.id, None))
        except Exception:  # noqa: BLE001 - the server may be restarting: no target this time
            return []
        return sorted(found, key=lambda c: c[1])


def _sever(proxy: Any, refuse_for: float) -> str:
    open_links = len(getattr(proxy, "_links", []))
    if refuse_for > 0:
        proxy.refuse_new_connections(True)
    proxy.close_all()
    return f"cut {open_links} connections; new ones refused for {refuse_for:.1f}s"


def _resource(fault: FaultPlan) -> str:
    if fault.kind.startswith("pg_restart"):
        return "postgres"
    if fault.kind.startswith("workflow_"):
        return f"workflow-{fault.index}"  # independent of each other
    if fault.kind == "partner_outage":
        return "sftp_sever"  # the same proxies: one fault at a time on them
    return fault.kind

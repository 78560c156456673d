"""The overhead of metrics and tracing, end to end (``python -m bench.obs overhead``; see the package's
docstring): the real stack, its batches, the rounds in on/off pairs, and the report."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

from api.app import create_app
from api.server import BackgroundServer
from bench.obs.measures import (
    CollectorClock,
    NamingExporter,
    median_interval,
    per_call_costs,
    thread_cpu,
    transitions_per_export,
)
from bench.obs.switching import PARTS, SwitchedTracing, switched, switched_app, tracing_for
from db.admin import seed_tenant
from db.embedded import free_port
from observability import tracing
from observability.logs import configure_logging
from observability.metrics import ExportMetrics, process_metrics
from observability.temporal import temporal_interceptors
from partner.local_server import LocalSftpServer
from service.auth import mint_token
from service.exports import open_exports
from service.signals import NoSignaller
from settings import Settings
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server
from testbed.sftp import PARTNER_USER, Sshd, sshd_available
from testbed.temporal import start_dev_server
from worker import run_worker
from workflows.models import SEARCH_ATTRIBUTE_NAMES

OVERHEAD_TARGET = 1.03
# 40 exports a batch: with 10, identical batches (both sides off) spread by a standard deviation of 12 %
# per pair and a 40-pair median by +-2 %, as much as the target; with 40 (and the collection before each
# batch) by 4 % per pair.
EXPORTS = 40
ROUNDS = 20
CONTACTS = 200
# The export of the seeds' story (seeds/001: "48,112 contacts"), fewer to a batch: the same minutes of work.
SEED_EXPORTS, SEED_CONTACTS = 8, 48_112
MEASURED_BATCH = 5  # the warm-up batches are smaller
SETTLED = ("Completed", "Failed", "Stopped", "Canceled", "Rejected", "OutcomeUnknown")
BATCH_TIMEOUT_SECONDS = 300.0


class Stack:
    """The real stack: a database, ``run_worker`` (its client carries ``SwitchedTracing``), the API on a
    port (``switched_app``), the dev server and the SFTP partner. Rounds switch it on and off."""

    def __init__(self, database: TestDatabase, provider: Any) -> None:
        self.provider = provider
        self.database = database
        self.stop = asyncio.Event()
        self.closers: list[Any] = []
        self.http: httpx.AsyncClient | None = None
        self.destination_id: uuid.UUID | None = None
        self.list_name = ""
        self.metrics_url: str | None = None
        self.exports_run: collections.Counter[str] = collections.Counter()  # by side
        self.threads: dict[str, collections.Counter[str]] = {  # CPU seconds by side and thread kind
            "on": collections.Counter(),
            "off": collections.Counter(),
        }
        self.collections: dict[str, collections.Counter[str]] = {  # garbage collections and their seconds
            "on": collections.Counter(),
            "off": collections.Counter(),
        }

    async def start(self, env: Any, seeded: Any, work_root: Path, run_id: str) -> None:
        """``seeded``: the tenant, destination and list already in the database."""
        self.destination_id, self.list_name = seeded.destination_id, seeded.list_name
        token = await mint_token(
            self.database.admin_url, tenant_id=seeded.tenant_id, principal="bench", role="operator"
        )
        metrics_port = free_port()
        settings = Settings(
            database_url=self.database.app_url,
            task_queue=f"obs-{run_id}",
            worker_id="bench",
            work_dir=work_root / "worker",
            metrics_port=metrics_port,
            temporal_metrics_port=0,
            metrics_db_gauges=True,
            dispatcher_poll_seconds=1.0,
        )
        self.metrics_url = f"http://127.0.0.1:{metrics_port}"
        with tracing_for(True, self.provider):
            (traced,) = temporal_interceptors()  # what production passes to Client.connect
        client_ = Client(**{**env.client.config(), "interceptors": [SwitchedTracing(traced)]})
        ready = asyncio.Event()
        worker = asyncio.create_task(
            run_worker(settings, stop=self.stop, client=client_, ready=ready, schedules=False)
        )

        async def stop_worker() -> None:
            self.stop.set()
            await asyncio.gather(worker, return_exceptions=True)

        self.closers.append(stop_worker)
        await asyncio.wait_for(ready.wait(), 60)
        stack = contextlib.AsyncExitStack()
        self.closers.append(stack.aclose)
        exports = await stack.enter_async_context(open_exports(settings, signaller=NoSignaller()))
        with tracing_for(True, self.provider):
            instrumented = create_app(settings, exports=exports)
        with tracing_for(False, self.provider):
            plain = create_app(settings, exports=exports)
        server = BackgroundServer(switched_app(instrumented, plain))
        url = await server.start()
        stack.push_async_callback(server.stop)
        self.http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            # Below uvicorn's 5 s keep-alive: a connection idle through a gap is not reused just as the
            # server closes it.
            limits=httpx.Limits(keepalive_expiry=1.0),
        )
        stack.push_async_callback(self.http.aclose)

    async def close(self) -> None:
        for close in reversed(self.closers):
            await close()

    async def create(self) -> uuid.UUID:
        assert self.http is not None
        answer = await self.http.post(
            "/exports",
            json={"destination_id": str(self.destination_id), "list_name": self.list_name},
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        answer.raise_for_status()
        return uuid.UUID(answer.json()["export"]["id"])

    async def batch(self, n: int, side: str) -> tuple[float, float]:
        """``n`` exports created at once through the API; wall and CPU seconds until all are Completed.

        A full collection first, outside the timing: a generation-2 collection landing in one batch and not
        in its pair was the largest single source of spread between identical batches."""
        gc.collect()
        threads = thread_cpu()
        collector = CollectorClock()
        gc.callbacks.append(collector)
        wall, cpu = time.perf_counter(), time.process_time()
        jobs = await asyncio.gather(*(self.create() for _ in range(n)))
        async with await psycopg.AsyncConnection.connect(self.database.admin_url, autocommit=True) as conn:
            deadline = time.monotonic() + BATCH_TIMEOUT_SECONDS
            while True:
                cur = await conn.execute(
                    "SELECT status, count(*) FROM export_jobs WHERE id = ANY(%(ids)s) GROUP BY status",
                    {"ids": jobs},
                )
                statuses = dict(await cur.fetchall())
                if sum(v for k, v in statuses.items() if k in SETTLED) == n:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{side}: the batch did not settle: {statuses}")
                await asyncio.sleep(0.05)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        gc.callbacks.remove(collector)
        if n >= MEASURED_BATCH:
            self.threads[side].update(thread_cpu() - threads)
            self.collections[side].update(collector.seen)
        self.exports_run[side] += n
        if statuses != {"Completed": n}:
            async with await psycopg.AsyncConnection.connect(self.database.admin_url) as conn:
                cur = await conn.execute(
                    "SELECT j.id, j.failure_reason, array_agg(e.kind || ': ' || coalesce(e.detail, '')"
                    " ORDER BY e.id) FROM export_jobs j JOIN export_attempt_events e ON e.job_id = j.id"
                    " WHERE j.id = ANY(%(ids)s) AND j.status <> 'Completed' GROUP BY j.id, j.failure_reason",
                    {"ids": jobs},
                )
                for row in await cur.fetchall():
                    print(row, file=sys.stderr)
            raise SystemExit(f"{side}: the batch ended {statuses}")
        return wall, cpu


class _Discard(io.TextIOBase):
    """A stream that takes every line and keeps none."""

    def write(self, text: str) -> int:
        return len(text)


@contextlib.asynccontextmanager
async def partner_server(kind: str, work_root: Path) -> AsyncIterator[tuple[str, dict[str, Any], Path]]:
    """The partner: OpenSSH's sshd in processes of its own, as a partner is (``"sshd"``; root and Debian's
    ``openssh-server``), or the asyncssh server on this process's event loop (``"asyncssh"``), which then
    shares the loop, the GIL and the CPU measured with the system under test. ``"auto"``: sshd where it
    can run. Yields the kind, the destination's columns and the directory the files land in."""
    if kind == "auto":
        kind = "sshd" if sshd_available() else "asyncssh"
    if kind == "sshd":
        sshd = await asyncio.to_thread(Sshd.start, max_sessions=64)
        try:
            upload = sshd.make_upload_dir()
            yield (
                kind,
                {
                    "host": sshd.host,
                    "port": sshd.port,
                    "username": PARTNER_USER,
                    "host_key": sshd.host_key_line,
                    "credential_ref": str(sshd.client_key_path),
                    "remote_dir": str(upload),
                    "max_write_request": 261_120,  # OpenSSH's (testbed/sftp.SftpTarget)
                },
                upload,
            )
        finally:
            sshd.stop()
        return
    local = LocalSftpServer(work_root / "partner")
    await local.start()
    try:
        yield kind, local.destination_fields(remote_dir="/"), local.root
    finally:
        await local.stop()


@dataclasses.dataclass
class Bench:
    """What a run works with: the stack, the provider and metrics its rounds switch, the exporter that counts
    the spans, and the directory the partner's files land in (emptied after each batch)."""

    stack: Stack
    provider: Any
    metrics: ExportMetrics
    spans: NamingExporter
    partner: str
    delivered_to: Path

    async def batch(
        self, exports: int, side: str, on: bool
    ) -> tuple[float, float, collections.Counter[str], collections.Counter[str]]:
        """One measured batch with the instrumentation ``on`` (what ``PARTS`` names) or off: wall and CPU
        seconds, the names of the spans exported after it and those of them begun during it."""
        self.spans.take()
        began = time.time_ns()  # the clock spans are stamped with
        with switched(on, self.provider, self.metrics):
            wall, cpu = await self.stack.batch(exports, side)
        for delivered in self.delivered_to.iterdir():  # the partner's files, between batches
            if delivered.is_file():
                delivered.unlink()
        self.provider.force_flush()
        finished, started_here = self.spans.take(since_ns=began)
        return wall, cpu, finished, started_here


@contextlib.asynccontextmanager
async def open_bench(contacts: int, partner: str = "asyncssh") -> AsyncIterator[Bench]:
    """The real stack on a fresh PostgreSQL server and Temporal dev server, a tenant with ``contacts``
    contacts and its partner, warmed with a small batch on each side; everything stopped and removed after."""
    sink = sys.stderr if os.environ.get("BENCH_LOGS") else _Discard()  # formatted as in production, dropped
    configure_logging("json", stream=sink, level=logging.INFO)  # JSON lines at INFO on both sides
    spans = NamingExporter()
    # Batched, as production exports (the OTLP exporter through a BatchSpanProcessor); flushed before reading.
    provider = tracing.setup_tracing("fenced-exports-bench", exporter=spans, batched=True, set_global=False)
    assert provider is not None  # an exporter was given
    metrics = process_metrics()
    work_root = Path(tempfile.mkdtemp(prefix="fenced-bench-obs-"))
    stack: Stack | None = None
    with postgres_server() as server_url:
        template = make_template(server_url)
        env = await start_dev_server(
            search_attributes=[SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTE_NAMES]
        )
        closing = contextlib.AsyncExitStack()
        try:
            kind, destination, delivered_to = await closing.enter_async_context(
                partner_server(partner, work_root)
            )
            seeded_db = clone_database(server_url, template)
            seeded = await seed_tenant(
                seeded_db.admin_url,
                tenant_name="bench",
                destination_name="partner",
                destination=destination,
                contacts=contacts,
            )
            stack = Stack(seeded_db, provider)
            await stack.start(env, seeded, work_root, uuid.uuid4().hex[:6])
            for variant in ("on", "off"):  # warm both (workflow caches, pools, SSH, the JIT of everything)
                with switched(variant == "on", provider, metrics):
                    await stack.batch(4, variant)
            yield Bench(stack, provider, metrics, spans, kind, delivered_to)
        finally:
            if stack is not None:
                await stack.close()
            await closing.aclose()
            await env.shutdown()
            tracing.shutdown_tracing()
            shutil.rmtree(work_root, ignore_errors=True)


async def overhead(exports: int, contacts: int, rounds: int, partner: str = "asyncssh") -> dict[str, float]:
    """The same batches through the real stack with metrics and tracing on and off, rounds alternating."""
    walls: dict[str, list[float]] = {"on": [], "off": []}
    cpus: dict[str, list[float]] = {"on": [], "off": []}
    span_counts: list[int] = []
    span_names: collections.Counter[str] = collections.Counter()
    spilled: collections.Counter[str] = collections.Counter()
    late: collections.Counter[str] = collections.Counter()  # spans begun in an "off" round
    async with open_bench(contacts, partner) as bench:
        stack, provider, spans, kind = bench.stack, bench.provider, bench.spans, bench.partner
        for r in range(rounds):
            if COMPARED_GC:  # each round under the next threshold (``--gc-thresholds``)
                gc.set_threshold(COMPARED_GC[r % len(COMPARED_GC)], *gc.get_threshold()[1:])
            # Which side goes first alternates (by threshold's turn, when thresholds alternate too).
            first = ("on", "off") if (r // max(1, len(COMPARED_GC))) % 2 == 0 else ("off", "on")
            for variant in first:
                wall, cpu, finished, started_here = await bench.batch(exports, variant, variant == "on")
                walls[variant].append(wall)
                cpus[variant].append(cpu)
                if variant == "on":
                    span_counts.append(sum(finished.values()))
                    span_names = finished
                else:  # what an "on" round began and ended just after it (its last completions, a poll)
                    spilled.update(finished)
                    late.update(started_here)
        scraped = ""
        url = stack.metrics_url
        if url is not None:
            async with httpx.AsyncClient(timeout=10) as http:
                scraped = (await http.get(f"{url}/metrics")).text
    delivered = 'fenced_exports_transitions_total{result="written",statement="finish_delivery"}'
    if "metrics" in PARTS and not any(
        line.startswith(delivered) and float(line.split()[-1]) > 0 for line in scraped.splitlines()
    ):
        raise SystemExit("the 'on' worker's /metrics did not count the deliveries")
    on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
    cpu_on, cpu_off = statistics.median(cpus["on"]), statistics.median(cpus["off"])
    # Rounds ran in pairs (on/off, then off/on): each pair shares the machine's load of its minute.
    pairs = [a / b for a, b in zip(walls["on"], walls["off"], strict=True)]
    cpu_pairs = [a / b for a, b in zip(cpus["on"], cpus["off"], strict=True)]
    spans_per_export = statistics.median(span_counts) / exports
    costs = per_call_costs(provider, spans)
    # What the instrumentation itself costs per export, from its measured unit costs: a steadier figure than
    # wall clocks on a shared machine.
    per_export = (
        spans_per_export * costs["span"]
        + transitions_per_export(scraped, stack.exports_run["on"]) * costs["transition"]
    )
    estimate = 1 + per_export / (cpu_off / exports)
    result = {
        "wall_on_s": on,
        "wall_off_s": off,
        "ratio": statistics.median(pairs),
        "cpu_ratio": statistics.median(cpu_pairs),
        "estimated_ratio": estimate,
        # The fixed cost, whatever the export's size: CPU seconds an export, on less off, pair by pair.
        "cpu_per_export_s": statistics.median(
            (a - b) / exports for a, b in zip(cpus["on"], cpus["off"], strict=True)
        ),
    }
    print(
        f"exports: {exports} x {contacts} contacts per batch, created together through POST /exports; "
        f"rounds: {rounds} each, in on/off pairs (medians); partner: {kind}  cpus: {os.cpu_count()}  "
        f"load: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"on  (metrics, {spans_per_export:.0f} spans per export): "
        f"{on:6.2f} s wall, {cpu_on:5.2f} s CPU   walls {[round(w, 2) for w in walls['on']]}"
    )
    print(
        f"off (neither)                         : "
        f"{off:6.2f} s wall, {cpu_off:5.2f} s CPU   walls {[round(w, 2) for w in walls['off']]}"
    )
    print(
        f"ratio on/off, median of pairs: {result['ratio']:.3f}x wall {[round(p, 2) for p in pairs]}, "
        f"{result['cpu_ratio']:.3f}x CPU of this process {[round(p, 2) for p in cpu_pairs]} "
        f"(target at most {OVERHEAD_TARGET}x, held at the seeds' export of {SEED_CONTACTS:,} contacts)"
    )
    print(
        f"what it adds to each export: {result['cpu_per_export_s'] * 1e3:+.2f} ms of CPU "
        f"(median of the pairs), of {cpu_off / exports * 1e3:.0f} ms with both off"
    )
    if COMPARED_GC:
        compare_gc_thresholds(pairs, cpu_pairs, cpus, exports)
    (wall_low, wall_high), (cpu_low, cpu_high) = median_interval(pairs), median_interval(cpu_pairs)
    result.update(ratio_low=wall_low, ratio_high=wall_high, cpu_ratio_low=cpu_low, cpu_ratio_high=cpu_high)
    print(
        f"95 % interval of the median (bootstrap): wall {wall_low:.3f}-{wall_high:.3f}x, "
        f"CPU {cpu_low:.3f}-{cpu_high:.3f}x"
    )
    print(
        f"unit costs here: {costs['span'] * 1e6:.0f} us per span (statement span, in-memory export), "
        f"{costs['transition'] * 1e6:.1f} us per counted transition, "
        f"{costs['off'] * 1e6:.1f} us per statement with both off; per export "
        f"{per_export * 1e3:.2f} ms of {cpu_off / exports * 1e3:.0f} ms CPU: estimated {estimate:.3f}x"
    )
    measured = exports * rounds
    print(
        "CPU per export by thread (ms, on / off / difference; of it in the kernel, on / off; context switches):"
    )
    on_threads, off_threads = stack.threads["on"], stack.threads["off"]
    kinds = on_threads + off_threads
    for kind, _ in kinds.most_common():
        if ":" in kind:
            continue
        a, b = on_threads[kind] / measured * 1e3, off_threads[kind] / measured * 1e3
        if max(a, b) >= 0.05:
            sys_a, sys_b = (side[kind + ":sys"] / measured * 1e3 for side in (on_threads, off_threads))
            sw_a, sw_b = (side[kind + ":switches"] / measured for side in (on_threads, off_threads))
            print(
                f"  {kind:24s} {a:7.2f} {b:7.2f} {a - b:+7.2f}   kernel {sys_a:5.2f} {sys_b:5.2f}"
                f"   switches {sw_a:6.1f} {sw_b:6.1f}"
            )
    print(f"garbage collections per export (threshold {gc.get_threshold()}), on / off:")
    for generation in range(3):
        counts = [stack.collections[side][f"gen{generation}"] / measured for side in ("on", "off")]
        seconds = [stack.collections[side][f"gen{generation}_s"] / measured * 1e3 for side in ("on", "off")]
        if max(counts):
            print(
                f"  generation {generation}: {counts[0]:.2f} / {counts[1]:.2f}, "
                f"{seconds[0]:.2f} / {seconds[1]:.2f} ms ({seconds[0] - seconds[1]:+.2f})"
            )
    # A CompleteWorkflow span carries the workflow's own completion time, which can follow the terminal
    # write the round waited for; any other span begun in an "off" round means "off" was not off.
    unexpected = sorted(name for name in late if not name.startswith("CompleteWorkflow:"))
    if unexpected:
        raise SystemExit(f"'off' rounds made spans: {unexpected}")
    print(
        f"spans ended in 'off' rounds, begun in the 'on' round before (its last completions, a poll): "
        f"{dict(spilled)}"
    )
    print(
        "spans per export, by name: "
        + ", ".join(f"{name} {count / exports:g}" for name, count in span_names.most_common())
    )
    return result


# ``--gc-thresholds 700,10000``: rounds take the collector's young-generation thresholds in turn, so each
# threshold's rounds share the run's minutes with the others'; printed per threshold: the on/off ratio and
# the CPU an export costs. (Measured so: 10,000 saved 0.9 % of an export's CPU with tracing off, nothing
# with it on, and raised the ratio from 0.994x to 1.058x wall; processes keep Python's 700.)
COMPARED_GC: list[int] = []


def compare_gc_thresholds(
    pairs: list[float], cpu_pairs: list[float], cpus: dict[str, list[float]], exports: int
) -> None:
    """Each threshold's rounds apart (round ``r`` ran under ``COMPARED_GC[r % len]``): the on/off ratios,
    and the CPU an export costs with both off, against the first threshold's round just before."""
    n = len(COMPARED_GC)
    baseline = cpus["off"][0::n]
    for i, threshold in enumerate(COMPARED_GC):
        off = cpus["off"][i::n]
        low, high = median_interval(pairs[i::n])
        against = [a / b for a, b in zip(off, baseline, strict=False)]  # round k*n+i against k*n
        print(
            f"gc threshold {threshold:>6}: {len(off)} pairs, {statistics.median(pairs[i::n]):.3f}x wall "
            f"({low:.3f}-{high:.3f}), {statistics.median(cpu_pairs[i::n]):.3f}x CPU; with both off "
            f"{statistics.median(off) / exports * 1e3:.1f} ms CPU an export, "
            f"{statistics.median(against):.3f}x threshold {COMPARED_GC[0]}'s"
        )

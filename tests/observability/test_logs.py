"""Structured logs: JSON lines on request, readable text by default, the export's IDs on every line
bound around it, and nothing but IDs, sizes and codes in what is bound."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from observability import logs, tracing

log = logging.getLogger("tests.logs")


@pytest.fixture
def output() -> Iterator[tuple[io.StringIO, list]]:
    stream = io.StringIO()
    installed: list[logging.Handler] = []
    yield stream, installed
    for handler in installed:
        logging.getLogger().removeHandler(handler)


def configure(output, log_format: str) -> io.StringIO:
    stream, installed = output
    installed.append(logs.configure_logging(log_format, stream=stream))
    return stream


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_is_one_object_per_line_with_the_bound_ids(output):
    stream = configure(output, "json")
    job_id, attempt_id, tenant_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with logs.bind(job_id=job_id, tenant_id=tenant_id, workflow_id=f"export-{job_id}-{uuid.uuid4()}"):
        with logs.bind(attempt_id=attempt_id):
            log.info("claimed, building")
        log.warning("multi\nline message stays one line")
    log.info("outside")
    first, second, third = lines(stream)
    assert first["message"] == "claimed, building" and first["level"] == "INFO"
    assert first["logger"] == "tests.logs" and "timestamp" in first
    assert (first["job_id"], first["attempt_id"], first["tenant_id"]) == (
        str(job_id),
        str(attempt_id),
        str(tenant_id),
    )
    assert first["workflow_id"].startswith("export-")
    assert "attempt_id" not in second and second["job_id"] == str(job_id)
    assert "job_id" not in third


def test_text_stays_readable_and_appends_the_ids(output):
    stream = configure(output, "text")
    job_id = uuid.uuid4()
    with logs.bind(job_id=job_id):
        log.info("delivery classified")
    line = stream.getvalue().strip()
    assert " INFO tests.logs: delivery classified [job_id=" in line
    assert str(job_id) in line
    assert not line.startswith("{")


def test_auto_is_json_unless_a_terminal(output):
    stream = configure(output, "auto")  # a StringIO is not a terminal
    log.info("hello")
    assert lines(stream)[0]["message"] == "hello"


def test_a_transition_line_carries_the_statement_and_its_result(output):
    stream = configure(output, "json")
    job_id = uuid.uuid4()
    logs.log_transition("authorize_delivery_if_running", "refused", job_id=job_id)
    (line,) = lines(stream)
    assert line["statement"] == "authorize_delivery_if_running" and line["result"] == "refused"
    assert line["job_id"] == str(job_id)


def test_the_trace_id_is_on_lines_written_inside_a_span(output):
    stream = configure(output, "json")
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("fenced-exports-test", exporter=exporter, set_global=False)
    try:
        with tracing.tracer().start_as_current_span("RunActivity:claim") as span:
            log.info("inside")
        log.info("outside")
    finally:
        tracing.shutdown_tracing()
    inside, outside = lines(stream)
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(span.get_span_context().span_id, "016x")
    assert "trace_id" not in outside


async def test_the_binding_follows_tasks_and_threads_and_stays_in_its_block(output):
    stream = configure(output, "json")
    job_id = uuid.uuid4()

    def in_thread() -> None:
        log.info("thread")

    async def in_task() -> None:
        log.info("task")

    with logs.bind(job_id=job_id):
        await asyncio.to_thread(in_thread)
        await asyncio.create_task(in_task())
    other = asyncio.create_task(in_task())  # created outside the block
    await other
    thread, task, unbound = lines(stream)
    assert thread["job_id"] == task["job_id"] == str(job_id)
    assert "job_id" not in unbound


@pytest.mark.parametrize(
    "values",
    [
        {"email": "alice@example.com"},
        {"first_name": "Alice"},
        {"job_id": "alice@example.com"},
        {"statement": "alice@example.com"},
        {"rows": "48112"},
    ],
)
def test_only_ids_sizes_and_codes_can_be_bound(values):
    with pytest.raises(ValueError):
        with logs.bind(**values):
            pass
    assert dict(logs.bound()) == {}


def test_extra_fields_win_over_the_bound_ones(output):
    stream = configure(output, "json")
    bound, explicit = uuid.uuid4(), uuid.uuid4()
    with logs.bind(attempt_id=bound):
        log.info("recovery looked at another attempt", extra={"attempt_id": str(explicit)})
    assert lines(stream)[0]["attempt_id"] == str(explicit)

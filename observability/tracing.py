"""OpenTelemetry traces: set up from the standard ``OTEL_*`` variables, off when none asks for them.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, or
``OTEL_TRACES_EXPORTER`` is ``otlp`` or ``console``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off. Off means no provider, no exporter, no interceptor: the
helpers below return the API's non-recording spans, which cost a few hundred nanoseconds. The rest of the
configuration is the SDK's own: ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS/TIMEOUT/PROTOCOL``
(``http/protobuf``, the default here, or ``grpc`` when ``opentelemetry-exporter-otlp-proto-grpc`` is
installed).

One trace per export: the FastAPI instrumentation opens it at ``POST /exports``; the store writes the
request's ``traceparent`` into the outbox row; the dispatcher continues that trace around its workflow
start (``continue_trace``); the temporalio ``TracingInterceptor`` (subclassed in ``observability.temporal``) carries it
through the workflow into every activity; inside them, ``statement_span`` and ``sftp_span`` add one span per protocol statement and
SFTP step. Span attributes go through ``observability.fields``: IDs, sizes, codes, never contact data.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from observability import fields

TRACER_NAME = "fenced_exports"
ATTRIBUTE_PREFIX = "fenced_exports."

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None  # the provider's, made once: get_tracer is not cheap
# Reads get no span unless asked: a span costs about 70-120 us of CPU here, and an export's reads (its row,
# its destination, the token) add nothing a trace needs that the statement latency histogram lacks.
_trace_reads = False


def trace_reads(on: bool) -> None:
    """Whether read statements get spans too (``EXPORTS_TRACE_READS``); writes and SFTP steps always do."""
    global _trace_reads
    _trace_reads = on


def traces_reads() -> bool:
    return _trace_reads


_propagator = TraceContextTextMapPropagator()


class SftpStep(StrEnum):
    """The SFTP steps of one delivery (partner/delivery.py), each one span."""

    CONNECT = "connect"
    LIST = "list"
    UPLOAD = "upload"
    RENAME = "rename"
    READ_BACK = "read_back"
    ACK_WAIT = "ack_wait"
    OBSERVE = "observe"
    SET_ASIDE = "set_aside"  # the temporary file moved away after a rename whose answer was lost
    CLEANUP = "cleanup"  # an attempt's temporary files removed after Failed, under the partner's agreement
    MANIFEST = "manifest"  # a manifest published beside the renamed data file (issue #24.6)


def requested_exporter(environ: Mapping[str, str] | None = None) -> str | None:
    """Which exporter the ``OTEL_*`` variables ask for: ``"otlp"``, ``"console"`` or ``None`` (off)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen == "none":
        return None
    if chosen in ("otlp", "console"):
        return chosen
    if chosen:
        raise ValueError(f"OTEL_TRACES_EXPORTER={chosen!r} is not supported here (otlp, console or none)")
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return None


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise RuntimeError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc installed;"
                " or use http/protobuf (port 4318)"
            ) from exc
        exporter: SpanExporter = GrpcExporter()  # untyped when the optional package is absent
        return exporter
    raise ValueError(f"OTLP protocol {protocol!r} is not supported here (http/protobuf or grpc)")


def setup_tracing(
    service_name: str,
    *,
    environ: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    batched: bool = False,
    set_global: bool = True,
) -> TracerProvider | None:
    """Build this process's tracer provider from the environment; ``None`` (tracing off) when nothing asks.

    Called once in ``main()`` of worker.py and ``starter.py serve`` (``service_name`` "fenced-exports-worker"
    / "fenced-exports-api"; ``OTEL_SERVICE_NAME`` wins). ``exporter`` bypasses the environment: spans go
    to it synchronously (tests pass an ``InMemorySpanExporter``), or with ``batched`` through the
    ``BatchSpanProcessor`` that exports in production (the in-process benchmark; ``force_flush`` before
    reading). With ``set_global`` the provider also becomes OpenTelemetry's global one (once per process).
    """
    global _provider, _tracer
    env = os.environ if environ is None else environ
    if exporter is not None:
        processor: Any = BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter)
    else:
        kind = requested_exporter(env)
        if kind is None:
            _provider = _tracer = None
            return None
        processor = BatchSpanProcessor(_otlp_exporter(env) if kind == "otlp" else ConsoleSpanExporter())
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: service_name}))
    provider.add_span_processor(processor)
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME)
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def use_provider(provider: TracerProvider | None) -> None:
    """Make ``provider`` this process's (``None``: tracing off) without shutting either down: the benchmark
    switches tracing off and on between the rounds of one run. Clients and apps instrumented earlier keep
    the provider they were given."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None


def shutdown_tracing() -> None:
    """Flush and stop the exporter (at the end of ``main()``); tracing is off afterwards."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def tracing_enabled() -> bool:
    """True when ``setup_tracing`` built a provider."""
    return _provider is not None


def tracer() -> trace.Tracer:
    """The project's tracer: the configured provider's, else the global (non-recording when unset)."""
    if _tracer is not None:
        return _tracer
    return trace.get_tracer(TRACER_NAME)


def provider() -> TracerProvider | None:
    """The provider ``setup_tracing`` built, or ``None`` when tracing is off (for the Temporal and FastAPI
    instrumentation in ``observability.temporal`` and ``observability.health``)."""
    return _provider


def _attributes(values: Mapping[str, Any]) -> dict[str, fields.Value]:
    return {ATTRIBUTE_PREFIX + k: v for k, v in fields.clean_all(values).items()}


def set_attributes(span: Span, **values: Any) -> None:
    """Add allowed attributes (IDs, sizes, codes) to a recording ``span``; ``ValueError`` for anything else."""
    if span.is_recording():
        span.set_attributes(_attributes(values))


class _CurrentSpan:
    """A span that is current for a ``with`` block and ended after it: what ``start_as_current_span`` does,
    without its three generator-based context managers (a third of a statement span's cost here).
    Exceptions are recorded by type only: a driver's message can quote a row's values."""

    __slots__ = ("_span", "_token")

    def __init__(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> None:
        self._span = tracer().start_span(name, kind=kind, attributes=attributes)
        self._token: object = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if kind is not None and issubclass(kind, Exception):
            self._span.set_status(Status(StatusCode.ERROR, kind.__name__))
            self._span.set_attribute("error.type", kind.__qualname__)
        otel_context.detach(self._token)  # type: ignore[arg-type]
        self._span.end()


@contextlib.contextmanager
def statement_span(statement: str, **values: Any) -> Iterator[Span]:
    """One span named after a protocol statement (``claim_if_queued``), around its round trip.

    Called by the stores' ``StoreBase`` (every named statement; pass ``**fields.from_params(params)``).
    ``values`` are IDs, sizes and codes (``observability.fields``, checked when tracing is on); set the
    answer afterwards with ``set_attributes(span, result=...)``. Off, it yields a non-recording span and
    does nothing else.
    """
    if _provider is None:  # off: no attribute work, no context change
        yield trace.INVALID_SPAN
        return
    with _statement_span(statement, fields.clean_all(values)) as span:
        yield span


@functools.cache
def _statement_attributes(statement: str) -> dict[str, fields.Value]:
    # The same three for every call of a statement: checked once per name.
    return {
        "db.system.name": "postgresql",
        "db.operation.name": statement,
        ATTRIBUTE_PREFIX + "statement": fields.clean("statement", statement),
    }


def _statement_span(statement: str, cleaned: Mapping[str, fields.Value]) -> _CurrentSpan:
    attributes = {**_statement_attributes(statement), **{ATTRIBUTE_PREFIX + k: v for k, v in cleaned.items()}}
    return _CurrentSpan(statement, SpanKind.CLIENT, attributes)


def add_statement_event(statement: str, cleaned: Mapping[str, fields.Value]) -> None:
    """Record ``statement`` as an event on the current span (its attributes as a statement span's)."""
    trace.get_current_span().add_event(
        statement,
        {
            ATTRIBUTE_PREFIX + "statement": _statement_attributes(statement)[ATTRIBUTE_PREFIX + "statement"],
            **{ATTRIBUTE_PREFIX + k: v for k, v in cleaned.items()},
        },
    )


# Off, every step gets this one: a context manager that yields the non-recording span and does nothing.
_NO_SPAN: contextlib.AbstractContextManager[Span] = contextlib.nullcontext(trace.INVALID_SPAN)


def sftp_span(step: SftpStep | str, **values: Any) -> contextlib.AbstractContextManager[Span]:
    """One span per SFTP step of a delivery (``sftp upload``), with byte counts and status codes; use it as
    ``with sftp_span(SftpStep.UPLOAD, bytes=n) as span:``.

    Called in partner/delivery.py around connect, the baseline listing, the upload, the rename, the
    read-back and the acknowledgment wait (it runs in a thread: ``asyncio.to_thread`` carries the
    trace context there). A ``_CurrentSpan`` rather than a generator, as a statement's: a span on the
    delivery thread cost 80-120 us in place (``python -m bench obs``, profiled with ``py-spy --gil``).
    """
    step = SftpStep(step)
    if _provider is None:
        return _NO_SPAN
    attributes = {"rpc.system": "sftp", **_attributes({"step": step.value, **values})}
    return _CurrentSpan(f"sftp {step.value}", SpanKind.CLIENT, attributes)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or ``None`` when there is no sampled trace.

    The store passes it as the outbox row's ``traceparent`` where a wake-up is written (create_original,
    create_replacement, edit_terms_if_queued, requeue_expired_attempt, sweep_stale_queued).
    """
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def continue_trace(traceparent: str | None) -> Iterator[None]:
    """Make ``traceparent`` (read from an outbox row) the current trace context for the block.

    The dispatcher wraps each workflow start in it, so the workflow joins the trace of the request that
    wrote the wake-up. ``None`` or a malformed value leaves the context as it was.
    """
    if not traceparent:
        yield
        return
    token = otel_context.attach(_propagator.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        otel_context.detach(token)


def current_trace_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` in hex of the current recording span, for log lines; ``None`` otherwise."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")

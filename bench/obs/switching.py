"""What "on" and "off" mean in the overhead benchmark: one stack, switched between rounds (the production
interceptor and the instrumented app, or past them), so nothing but the instrumentation differs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from temporalio import client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from observability import tracing
from observability.metrics import ExportMetrics, set_metrics

# What "on" turns on: metrics, statement and SFTP spans, the Temporal interceptor's three sides (the client's
# workflow start, each activity, the workflow's own spans and the header it passes to its activities), the
# FastAPI middleware. ``temporal`` in ``--on`` stands for its three sides.
TEMPORAL_SIDES = ("temporal-client", "temporal-activity", "temporal-workflow")
ALL_PARTS = ("metrics", "spans", *TEMPORAL_SIDES, "fastapi")
PARTS: set[str] = set(ALL_PARTS)


def parse_parts(text: str) -> set[str]:
    """``--on``'s comma-separated parts (``temporal`` for its three sides); ``ValueError`` for others."""
    named = {part.strip() for part in text.split(",") if part.strip()}
    if "temporal" in named:
        named = (named - {"temporal"}) | set(TEMPORAL_SIDES)
    unknown = named - set(ALL_PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}: choose from temporal, {', '.join(ALL_PARTS)}")
    return named


class NoMetrics(ExportMetrics):
    """The "metrics off" side: every recording method does nothing and nothing is registered."""

    def __init__(self) -> None:  # noqa: D107 - registers nothing on purpose
        self.registry = CollectorRegistry()
        self.tenant_labels = False

    def observe_transition(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_statement_duration(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_cancellation(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_build(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_upload(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_stop_latency(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_lease_renewal(self, *args: Any, **kwargs: Any) -> None:
        pass

    def observe_outbox_lag(self, *args: Any, **kwargs: Any) -> None:
        pass

    def describe_settings(self, **seconds: float) -> None:
        pass

    @contextlib.contextmanager
    def holding_lease(self) -> Iterator[None]:
        yield


# What is on in this round (``switched``). One stack serves both sides, switched between rounds, so nothing
# but the instrumentation differs between them: two stacks built alike differed by 2-3 % either way with
# everything off (``--on ""``), as much as the target.
ON: dict[str, bool] = dict.fromkeys(ALL_PARTS, False)
# The calibration (``--spin-us``): what a known amount of work on the event loop per export (a busy wait in
# each POST /exports of an "on" round) costs end to end, wall and CPU, in the same harness.
SPIN: dict[str, float] = {"seconds": 0.0, "on": 0.0}


class SwitchedTracing(client.Interceptor, Interceptor):
    """The production tracing interceptor (``temporal_interceptors()``) in "on" rounds, nothing otherwise:
    the dispatcher's workflow starts (``temporal-client``) and each activity call (``temporal-activity``) go
    through it or past it; a workflow gets its tracing side (``temporal-workflow``) when it starts in an
    "on" round (a batch's workflows start and end in their round)."""

    def __init__(self, tracing_interceptor: Any) -> None:
        self.tracing = tracing_interceptor

    def intercept_client(self, next: client.OutboundInterceptor) -> client.OutboundInterceptor:
        return _SwitchedClient(next, self.tracing.intercept_client(next))

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _SwitchedActivity(next, self.tracing.intercept_activity(next))

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> Any:
        traced = self.tracing.workflow_interceptor_class(input)  # registers its extern functions

        def interceptor(next: WorkflowInboundInterceptor) -> WorkflowInboundInterceptor:
            return traced(next) if ON["temporal-workflow"] else next

        return interceptor


class _SwitchedClient(client.OutboundInterceptor):
    def __init__(self, plain: client.OutboundInterceptor, traced: client.OutboundInterceptor) -> None:
        super().__init__(plain)
        self._traced = traced

    async def start_workflow(self, input: client.StartWorkflowInput) -> client.WorkflowHandle[Any, Any]:
        return await (self._traced if ON["temporal-client"] else self.next).start_workflow(input)


class _SwitchedActivity(ActivityInboundInterceptor):
    def __init__(self, plain: ActivityInboundInterceptor, traced: ActivityInboundInterceptor) -> None:
        super().__init__(plain)
        self._traced = traced

    def init(self, outbound: Any) -> None:
        self._traced.init(outbound)  # the traced one's next is the plain one: initialized once

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        return await (self._traced if ON["temporal-activity"] else self.next).execute_activity(input)


def switched_app(instrumented: Any, plain: Any) -> Any:
    """The API: the instrumented app in "on" rounds, the same app built without it otherwise (one server,
    one pool; both over the same ``Exports``). With ``--spin-us``, each POST of an "on" round first keeps
    the event loop busy that long: the calibration."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if SPIN["on"] and SPIN["seconds"] and scope["type"] == "http" and scope["method"] == "POST":
            until = time.perf_counter() + SPIN["seconds"]
            while time.perf_counter() < until:  # CPU on the loop, nothing else
                pass
        await (instrumented if ON["fastapi"] else plain)(scope, receive, send)

    return app


@contextlib.contextmanager
def tracing_for(on: bool, provider: Any) -> Iterator[None]:
    """Tracing on (or off) while a client or an app is built: they keep the provider they were given."""
    tracing.use_provider(provider if on else None)
    try:
        yield
    finally:
        tracing.use_provider(None)


@contextlib.contextmanager
def switched(on: bool, provider: Any, metrics: ExportMetrics) -> Iterator[None]:
    """Metrics and tracing on (or both off) for one round; logs are the same either way. ``PARTS`` (the
    ``--on`` option) narrows what "on" means, to find what costs."""
    tracing.use_provider(provider if on and "spans" in PARTS else None)
    set_metrics(metrics if on and "metrics" in PARTS else NoMetrics())
    ON.update({part: on and part in PARTS for part in ALL_PARTS})
    SPIN["on"] = float(on)
    try:
        yield
    finally:
        tracing.use_provider(None)
        set_metrics(metrics)
        ON.update(dict.fromkeys(ALL_PARTS, False))
        SPIN["on"] = 0.0

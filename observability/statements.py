"""One call per protocol statement that feeds all three signals: a span, the latency histogram and, for
a transition, the counter and a log line with the statement and its result.

The store calls it at two points:

- ``db/queries.fetch`` and ``execute``, where every named statement of a running process goes (and
  ``db/stores/ledger._observed`` around a pipeline's round trip)::

      with observe_statement(name, params):
          ...execute the statement...

  gives every statement a span (IDs from its parameters) and its latency;

- each transition method of a store (``db/stores/``) (``@transition(Statement.CLAIM_IF_QUEUED)``), once its
  lost-response re-read has decided, calls ``record_transition`` with the answer it returns
  (``ClaimResult``, ``AuthorizationResult``, ``FinishResult``, ``FenceResult`` or the bool of a
  conditional write), which counts it and logs it; the cancellation ledger records ``cancel_and_record``
  once its transaction committed a change of the job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from opentelemetry.trace import INVALID_SPAN, Span

from domain.models import Statement
from observability import fields, logs, tracing
from observability.metrics import TransitionResult, get_metrics, transition_result

# History appends that no transition depends on: traced as span events, not spans of their own.
EVENT_STATEMENTS = frozenset({"append_delivery_evidence", "append_delivery_evidence_many"})


class observe_statement:  # noqa: N801 - used as a function: ``with observe_statement(name, params):``
    """A span named ``name`` around the block and its duration in
    ``fenced_exports_statement_duration_seconds{statement=name}``, raised or not. A statement that only
    reads (``writes`` false) gets its span only when ``tracing.traces_reads()``.

    ``params`` (the statement's parameters) contribute only their IDs, sizes and codes
    (``fields.from_params``); ``values`` add more of the same. A class rather than a generator: it runs
    around every statement of the process, traced or not.
    """

    __slots__ = ("_name", "_params", "_writes", "_values", "_span", "_started")

    def __init__(
        self, name: str, params: Mapping[str, Any] | None = None, *, writes: bool = True, **values: Any
    ) -> None:
        self._name, self._params, self._writes, self._values = name, params, writes, values
        self._span: Any = None

    def __enter__(self) -> Span:
        self._started = time.perf_counter()
        name = self._name
        if not tracing.tracing_enabled() or not (self._writes or tracing.traces_reads()):  # timer + histogram
            return INVALID_SPAN
        carried = {
            **(fields.from_params(self._params) if self._params else {}),
            **fields.clean_all(self._values),
        }
        if name in EVENT_STATEMENTS:
            # An append to the attempt's history: an event on the span it belongs to (an SFTP step, the
            # deliver activity), a fraction of a span's cost; six per export were a fifth of its spans.
            tracing.add_statement_event(name, carried)
            return INVALID_SPAN
        self._span = tracing._statement_span(name, carried)
        entered: Span = self._span.__enter__()
        return entered

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._span is not None:
                self._span.__exit__(kind, exc, tb)
        finally:
            get_metrics().observe_statement_duration(self._name, time.perf_counter() - self._started)


def record_transition(
    statement: Statement | str,
    answer: Any,
    *,
    tenant_id: UUID | str | None = None,
    **values: Any,
) -> TransitionResult:
    """Count and log one transition's answer; returns the ``result`` label it was counted under.

    ``answer`` is what the store method returns (see ``metrics.transition_result``); ``tenant_id`` is
    used as a label only where tenant labels are enabled, and is logged either way.
    """
    statement = Statement(statement)
    result = answer if isinstance(answer, TransitionResult) else transition_result(answer)
    get_metrics().observe_transition(statement, result, tenant_id=tenant_id)
    logs.log_transition(statement.value, result.value, tenant_id=tenant_id, **values)
    return result

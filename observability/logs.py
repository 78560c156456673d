"""Structured logs on the standard ``logging`` module (python-json-logger for the JSON lines).

``EXPORTS_LOG_FORMAT=json`` gives one JSON object per line (``timestamp``, ``level``, ``logger``,
``message``, then every field); ``text`` (the default) keeps readable lines and appends the same fields
as ``key=value``; ``auto`` is JSON unless the stream is a terminal. Either way every record about an
export carries the context bound around it: ``job_id``, ``attempt_id``, ``tenant_id``, ``workflow_id``
(``bind`` / ``observability.temporal.LogContextInterceptor``), the statement and its result for transitions
(``log_transition``), and ``trace_id`` / ``span_id`` while a span is recording. Context keys go through
``observability.fields`` (IDs, sizes and codes only), so no binding can put contact data in a log line.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal, TextIO

from pythonjsonlogger.json import JsonFormatter

from observability import fields, tracing

LogFormat = Literal["text", "json", "auto"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The order fields are appended in text lines; JSON carries them as keys.
CONTEXT_ORDER = (
    "job_id",
    "attempt_id",
    "tenant_id",
    "workflow_id",
    "statement",
    "result",
    "trace_id",
    "span_id",
)

_context: contextvars.ContextVar[Mapping[str, fields.Value]] = contextvars.ContextVar(
    "fenced_exports_log_context", default=MappingProxyType({})
)

transition_log = logging.getLogger("fenced.transitions")


@contextlib.contextmanager
def bind(**values: Any) -> Iterator[Mapping[str, fields.Value]]:
    """Add fields to every log record emitted in this block (and in tasks and threads started from it).

    Nested binds merge; ``None`` values are ignored. Keys and values must pass ``observability.fields``.
    The activities bind ``job_id``/``attempt_id``/``tenant_id`` once they have read the row
    (``LogContextInterceptor`` has already bound ``workflow_id`` and what the input carries).
    """
    merged = {**_context.get(), **fields.clean_all(values)}
    token = _context.set(merged)
    try:
        yield merged
    finally:
        _context.reset(token)


def bind_rest_of_task(**values: Any) -> None:
    """Add fields to every record emitted from here to the end of the current asyncio task (and in tasks
    and threads started from it afterwards), without a block to indent.

    For an activity that learns the tenant only once it has read the row: each activity runs in a task
    of its own (and ``LogContextInterceptor``'s block resets the context when it returns), so nothing
    outlives it. Not for code whose task outlives the export (a dispatcher loop, the main task).
    """
    _context.set({**_context.get(), **fields.clean_all(values)})


def bound() -> Mapping[str, fields.Value]:
    """The fields bound here now."""
    return _context.get()


class ContextFilter(logging.Filter):
    """Copies the bound fields and the current trace IDs onto each record (``extra=`` values win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        if not hasattr(record, "trace_id"):
            ids = tracing.current_trace_ids()
            if ids is not None:
                record.trace_id, record.span_id = ids
        return True


class TextFormatter(logging.Formatter):
    """The readable default: ``TEXT_FORMAT`` then ``key=value`` for the export's fields present."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={getattr(record, k)}" for k in CONTEXT_ORDER if getattr(record, k, None) is not None]
        return f"{line} [{' '.join(extras)}]" if extras else line


def json_formatter() -> logging.Formatter:
    """One JSON object per record: timestamp (UTC, ISO 8601), level, logger, message, then the fields."""
    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
    )


_HANDLER_MARK = "_fenced_exports_handler"


def configure_logging(
    log_format: LogFormat = "text", *, level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Route the root logger to ``stream`` (stderr) in ``log_format``; replaces a handler it installed before.

    Called first thing in ``main()`` of worker.py and starter.py (instead of ``logging.basicConfig``),
    with ``settings.log_format``. Returns the handler (tests read what it wrote).
    """
    stream = stream or sys.stderr
    if log_format == "auto":
        log_format = "text" if getattr(stream, "isatty", lambda: False)() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter() if log_format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def log_transition(statement: str, result: str, **values: Any) -> None:
    """One INFO line for a transition's answer, carrying ``statement`` and ``result`` as fields.

    ``observe_statement`` calls it for every transition statement; ``values`` are extra IDs/codes.
    """
    if not transition_log.isEnabledFor(logging.INFO):
        return
    extra = fields.clean_all({"statement": statement, "result": result, **values})
    transition_log.info("%s: %s", extra["statement"], extra["result"], extra=extra)

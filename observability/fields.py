"""The fields a span attribute or a log context may carry: IDs, sizes, codes and statement names.

One allowlist for traces and logs, so neither can carry contact data, file contents or credentials: a
key outside it, or a value of the wrong shape (an ID that is not a UUID, a code with an ``@`` in it),
raises ``ValueError`` at the call site, in tests, before anything is exported.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any
from uuid import UUID

# Identifiers that are UUIDs in this system.
UUID_FIELDS = frozenset(
    {"job_id", "attempt_id", "tenant_id", "destination_id", "request_id", "message_id", "replaces_job_id"}
)
# Identifiers made by code (workflow IDs, worker IDs, run IDs): letters, digits, '-', '_', ':' and '.'.
NAME_FIELDS = frozenset({"workflow_id", "run_id", "worker_id", "recovery_run_id", "activity", "task_queue"})
# Sizes and counts.
NUMBER_FIELDS = frozenset(
    {"bytes", "rows", "sent_bytes", "attempt_count", "version", "batch", "count", "schedule_to_start_seconds"}
)
# Codes: enumerations of this system or of SFTP (status codes), never free text.
CODE_FIELDS = frozenset(
    {
        "statement",
        "result",
        "outcome",
        "failure_code",
        "status",
        "stop_point",
        "step",
        "error_code",
        "error_type",
        "source",
        "cipher",
    }
)
ALLOWED = UUID_FIELDS | NAME_FIELDS | NUMBER_FIELDS | CODE_FIELDS

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$")
_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_ .\-]{0,63}$")

# Parameters of db/queries.sql statements that are worth carrying, under the field name they become.
PARAM_FIELDS = {
    "job_id": "job_id",
    "attempt_id": "attempt_id",
    "expired_attempt_id": "attempt_id",
    "tenant_id": "tenant_id",
    "request_id": "request_id",
    "message_id": "message_id",
    "replaces_job_id": "replaces_job_id",
    "workflow_id": "workflow_id",
    "worker_id": "worker_id",
    "recovery_run_id": "recovery_run_id",
    "checked_version": "version",
    "expected_version": "version",
    "length": "bytes",
    "rows": "rows",
    "outcome": "outcome",
    "resolution": "outcome",
    "code": "failure_code",
    "stop_point": "stop_point",
    "batch": "batch",
}

Value = str | int | float | bool


@functools.lru_cache(maxsize=4096)
def _uuid_text(value: Any) -> str:
    # An export's job, attempt and tenant IDs are cleaned for every span and log line it makes: parsed and
    # formatted once (a few microseconds each time otherwise). ValueError for anything but a UUID.
    return str(value if isinstance(value, UUID) else UUID(str(value)))


def clean(key: str, value: Any) -> Value:
    """``value`` as it may be exported under ``key``; ``ValueError`` when the key or its shape is not allowed."""
    if key not in ALLOWED:
        raise ValueError(f"{key!r} may not be carried in traces or logs (IDs, sizes and codes only)")
    if key in UUID_FIELDS:
        try:
            return _uuid_text(value)
        except TypeError:  # unhashable: not an ID
            raise ValueError(f"{key!r} must be a UUID") from None
    if key in NUMBER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key!r} must be a number")
        return value
    text = str(value.value if hasattr(value, "value") else value)
    pattern = _NAME if key in NAME_FIELDS else _CODE
    if not pattern.match(text) or "@" in text:
        raise ValueError(f"{key!r} does not look like an identifier or code")
    return text


def clean_all(fields: Mapping[str, Any]) -> dict[str, Value]:
    """Every non-None field cleaned (see ``clean``)."""
    return {k: clean(k, v) for k, v in fields.items() if v is not None}


def from_params(params: Mapping[str, Any]) -> dict[str, Value]:
    """The carried fields of a statement's parameters: IDs, version, sizes and codes; nothing else
    (reasons, names, evidence and hashes are left out). Values that are not of their field's shape are
    skipped rather than raised: parameters are not always what their name suggests."""
    out: dict[str, Value] = {}
    for param, value in params.items():  # a statement has a few parameters; the table has many
        field = PARAM_FIELDS.get(param)
        if field is None or value is None:
            continue
        try:
            out[field] = clean(field, value)
        except ValueError:
            continue
    return out

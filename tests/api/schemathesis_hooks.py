"""Loaded by the schemathesis run in test_schema_contract.py (``SCHEMATHESIS_HOOKS``): a check that a
request the schema allows is never refused by validation.

Schemathesis's own ``positive_data_acceptance`` must accept some 4xx for schema-valid requests, because
those answers depend on state, not on the request's shape: a version that moved on (412), a destination
or batch that is not the caller's (422/404), a request or batch ID already used for something else (400).
What it cannot tell apart, this does: every refusal by validation carries ``errors`` (which field, why),
and no state-dependent answer does.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.check
def schema_valid_requests_pass_validation(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 422, 428):
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    if isinstance(body, dict) and body.get("errors"):
        raise AssertionError(f"a request the schema allows was refused by validation: {body['detail']}")
    return None

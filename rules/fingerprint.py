"""The canonical fingerprint of a create request (002 "Canonical fingerprint"), stated once: the API's
``POST /exports`` and a recurring export's firing bind their idempotency keys to it."""

from __future__ import annotations

import hashlib
import json
from uuid import UUID

CREATE_OPERATION = "create_export"
FINGERPRINT_VERSION = 1


def create_fingerprint(*, tenant_id: UUID, principal: str, destination_id: UUID, list_name: str) -> str:
    """SHA-256 of the canonical JSON of a create request and its scope: key order and whitespace do not
    matter, and the server-minted job ID is not included."""
    canonical = json.dumps(
        {
            "operation": CREATE_OPERATION,
            "version": FINGERPRINT_VERSION,
            "tenant_id": str(tenant_id),
            "principal": principal,
            "destination_id": str(destination_id),
            "list_name": list_name,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

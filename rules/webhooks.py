"""Webhooks in the Standard Webhooks form (https://www.standardwebhooks.com/), as pure functions: the body of
an event, its signature headers, a new secret, and which endpoint URLs are accepted.

- ``webhook-id``: the event's ID, the same on every attempt and redelivery: the receiver's idempotency key.
- ``webhook-timestamp``: the attempt's time, integer seconds since the epoch.
- ``webhook-signature``: ``v1,`` and the base64 of HMAC-SHA256, keyed with the secret's bytes (the base64
  after ``whsec_``), over ``{webhook-id}.{webhook-timestamp}.{body}``.

The body is the event as canonical JSON (sorted keys, no spaces, UTF-8), so every attempt of an event sends
the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
MAX_URL = 2000


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for; ``ValueError`` when it is not one (24 to 64 bytes)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with whsec_")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError as exc:
        raise ValueError("a signing secret is whsec_ and base64") from exc
    if not 24 <= len(key) <= 64:
        raise ValueError("a signing secret holds 24 to 64 bytes")
    return key


def event_body(
    event_id: UUID, kind: str, created_at: datetime, tenant_id: UUID, data: dict[str, Any]
) -> bytes:
    """The bytes every attempt of one event sends: ``{"data", "id", "tenant_id", "timestamp", "type"}``."""
    envelope = {
        "id": str(event_id),
        "type": kind,
        "timestamp": created_at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "tenant_id": str(tenant_id),
        "data": data,
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt: the three Standard Webhooks headers and the JSON content type."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str) -> str | None:
    """Why an endpoint URL is refused, or ``None``. HTTPS is required; plain HTTP only to a loopback host
    (a receiver on the same machine: tests, a local relay). No user or password in the URL (a credential
    that the console would show), no fragment, a host, at most 2000 characters."""
    if len(url) > MAX_URL:
        return f"the URL is longer than {MAX_URL} characters"
    if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        return "the URL has spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "the URL cannot be read (its port or host is malformed)"
    del port
    if parts.scheme not in ("https", "http"):
        return "the URL must start with https://"
    if not parts.hostname:
        return "the URL has no host"
    if parts.username is not None or parts.password is not None:
        return "the URL may not hold a user name or password: authenticate receivers by the signature"
    if parts.fragment:
        return "the URL may not have a #fragment"
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        return "the URL must use https:// (plain http:// only to localhost or a loopback address)"
    return None


def url_origin(url: str) -> str:
    """The URL without its path and query (which may carry a receiver's token): what a non-admin sees."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"

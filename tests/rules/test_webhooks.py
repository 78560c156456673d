"""The Standard Webhooks signature and body (rules/webhooks.py), against ``standardwebhooks`` (not ours) and
against the verification snippets docs/notifications.md gives receivers."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from rules.webhooks import event_body, new_secret, secret_key, signed_headers, url_problem

DOC = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def an_event() -> tuple[str, bytes]:
    event_id = uuid.uuid4()
    body = event_body(
        event_id,
        "export.completed",
        datetime(2026, 12, 3, 19, 48, 38, 159204, tzinfo=UTC),
        uuid.uuid4(),
        {"export_id": str(uuid.uuid4()), "file": {"sha256": "ab" * 32, "bytes": 10}, "list_name": "vip"},
    )
    return str(event_id), body


def test_our_signature_verifies_with_standardwebhooks_and_a_changed_byte_does_not():
    secret = new_secret()
    msg_id, body = an_event()
    headers = signed_headers(secret, msg_id, int(time.time()), body)

    assert Webhook(secret).verify(body, headers)["id"] == msg_id
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"vip", b"vIp"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    assert headers["webhook-signature"] == Webhook(secret).sign(
        msg_id, datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC), body
    )


def test_every_attempt_of_an_event_sends_the_same_canonical_body():
    event_id, tenant_id, at = uuid.uuid4(), uuid.uuid4(), datetime(2026, 12, 3, tzinfo=UTC)
    one = event_body(event_id, "export.failed", at, tenant_id, {"b": 1, "a": {"y": 2, "x": 1}})
    two = event_body(event_id, "export.failed", at, tenant_id, {"a": {"x": 1, "y": 2}, "b": 1})

    assert one == two
    assert b" " not in one and one.startswith(b'{"data":{"a":{"x":1,"y":2},"b":1},"id":')
    assert b'"timestamp":"2026-12-03T00:00:00.000000Z"' in one


def test_the_docs_standard_library_snippet_verifies_what_we_send():
    snippets = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    stdlib = next(s for s in snippets if "def verify(" in s)
    scope: dict[str, Any] = {}
    exec(stdlib, scope)  # noqa: S102 - the documentation's own code, run as a receiver would
    secret = new_secret()
    msg_id, body = an_event()
    headers = signed_headers(secret, msg_id, int(time.time()), body)

    assert scope["verify"](secret, body, headers) is True
    assert scope["verify"](secret, body + b" ", headers) is False
    stale = signed_headers(secret, msg_id, int(time.time()) - 600, body)
    assert scope["verify"](secret, body, stale) is False


def test_a_secret_is_whsec_and_24_to_64_bytes_of_base64():
    assert len(secret_key(new_secret())) == 32
    for bad in (
        "whsec_",
        "whsec_" + "A" * 20,
        "sk_" + "A" * 44,
        "whsec_!!!!" + "A" * 40,
        "whsec_" + "A" * 100,
    ):
        with pytest.raises(ValueError):
            secret_key(bad)


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://hooks.example.com/in?x=1", False),
        ("http://127.0.0.1:9000/in", False),
        ("http://127.8.9.10/in", False),
        ("http://localhost/in", False),
        ("http://[::1]:9/in", False),
        ("http://hooks.example.com/in", True),
        ("http://192.168.1.1/in", True),
        ("https://a:b@hooks.example.com/in", True),
        ("https://hooks.example.com/in#x", True),
        ("https://hooks.example.com/ in", True),
        ("https://[::1/in", True),
        ("gopher://hooks.example.com/in", True),
        ("https://" + "a" * 2000 + ".example", True),
    ],
)
def test_an_endpoint_url_is_https_or_loopback_http(url, refused):
    assert (url_problem(url) is not None) is refused

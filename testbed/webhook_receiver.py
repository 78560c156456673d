"""A real HTTP webhook receiver for the tests, the soak and the benchmark: a ``ThreadingHTTPServer`` on a
loopback port picked through ``servers.ports`` (never in the ephemeral range), in a thread of its own.

Every POST is recorded with its three Standard Webhooks headers and its body, and verified with the
``standardwebhooks`` package (an implementation independent of ours) against the secret registered for its
path. What it answers is scripted per path: a queue of status codes (then 204). ``stop`` closes its socket
(the endpoint is down: connections are refused) and ``start`` opens it again on the same port.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from servers.ports import pick_port


@dataclass(frozen=True)
class Received:
    """One POST as it arrived: its path, headers, body, whether its signature verified, and our answer."""

    path: str
    webhook_id: str | None
    timestamp: str | None
    signature: str | None
    body: bytes
    verified: bool
    answered: int

    @property
    def event(self) -> dict[str, Any]:
        """The body as JSON."""
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class WebhookReceiver:
    """Records and verifies webhook POSTs; see the module's docstring."""

    def __init__(self, host: str = "127.0.0.1", *, fail_every: int | None = None) -> None:
        self.host = host
        self.fail_every = fail_every  # answer 500 to every n-th POST (a flaky endpoint), unless scripted
        self._posts = 0
        self.port = pick_port(host=host)
        self._lock = threading.Lock()
        self._secrets: dict[str, str] = {}
        self._script: dict[str, deque[int]] = defaultdict(deque)
        self._received: list[Received] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        """The URL of ``path`` (``/hooks/a``) on this receiver."""
        return f"http://{self.host}:{self.port}{path}"

    def expect(self, path: str, secret: str) -> None:
        """Verify POSTs to ``path`` with ``secret`` (the one its endpoint was given)."""
        with self._lock:
            self._secrets[path] = secret

    def answer(self, path: str, *statuses: int) -> None:
        """Answer the next POSTs to ``path`` with these statuses, in order (then 204)."""
        with self._lock:
            self._script[path].extend(statuses)

    def received(self, path: str | None = None) -> list[Received]:
        """What arrived (at ``path``, or anywhere), in order of arrival."""
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def _handle(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            secret = self._secrets.get(path)
            self._posts += 1
            flaky = self.fail_every is not None and self._posts % self.fail_every == 0
            status = self._script[path].popleft() if self._script[path] else 500 if flaky else 204
        verified = False
        if secret is not None:
            try:
                Webhook(secret).verify(body, headers, json_parse=False)
                verified = True
            except WebhookVerificationError:
                verified = False
        record = Received(
            path=path,
            webhook_id=headers.get("webhook-id"),
            timestamp=headers.get("webhook-timestamp"),
            signature=headers.get("webhook-signature"),
            body=body,
            verified=verified,
            answered=status,
        )
        with self._lock:
            self._received.append(record)
        return status

    def start(self) -> WebhookReceiver:
        """Listen (again) on this receiver's port."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver._handle(self.path, headers, body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the hook's signature
                return

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the socket: connections to the endpoint are refused until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

"""A small threaded TCP proxy on loopback, for injecting real network faults at a named point.

The code under test connects to ``proxy.port`` instead of the server's port; the proxy forwards bytes both
ways until a fault that the test armed fires. Faults are one-shot unless said otherwise:

- ``drop_next_reply_after(marker)``: forward the client's request that contains ``marker``, let the
  server answer it completely (by default: up to PostgreSQL's ReadyForQuery, i.e. after the commit of an
  autocommit statement), swallow that answer and close both sockets. The client never hears that its
  statement committed: a lost response.
- ``drop_next_request_containing(marker)``: close both sockets instead of forwarding the request that
  contains ``marker``; the server never sees it.
- ``refuse_new_connections()``: accept new connections and close them at once (a fast, clean failure
  for the client's connect), until ``refuse_new_connections(False)``.
- ``close_all()``: cut every open connection now (a killed server session).

``open_now`` and ``open_high_water`` count the connections the server holds open, as the server sees them:
from the moment the proxy connected to it until the server's side of the connection ended (its EOF, an error,
or a cut). In front of a partner's sshd that is the partner's own witness of its concurrent sessions.

Markers are matched on the raw client bytes, so the protocol must be unencrypted (for PostgreSQL connect
with ``sslmode=disable&gssencmode=disable``). Pick a marker that only the target request carries, such as
a distinctive SQL fragment (``b"'Claimed'"``). For protocols other than PostgreSQL pass ``reply_complete``
(``any_reply`` closes at the first byte of the answer).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ReplyComplete = Callable[[bytes], bool]


def postgres_reply_complete(reply: bytes) -> bool:
    """True once ``reply`` (backend messages from a message boundary) holds a complete ReadyForQuery."""
    i = 0
    while i + 5 <= len(reply):
        kind, length = reply[i], int.from_bytes(reply[i + 1 : i + 5], "big")
        if i + 1 + length > len(reply):
            return False
        if kind == ord("Z"):
            return True
        i += 1 + length
    return False


def any_reply(reply: bytes) -> bool:
    """True as soon as the server has said anything."""
    return len(reply) > 0


@dataclass
class _DropReply:
    reply_complete: ReplyComplete
    on_drop: Callable[[], None] | None
    swallowed: bytearray = field(default_factory=bytearray)


class _Link:
    """One proxied connection: the client's socket, the server's socket, and a fault if one is doomed."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.doomed: _DropReply | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``, with faults armed by the test."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self.open_now = 0  # connections the server holds open now
        self.open_high_water = 0  # the most it ever held at once
        self.open_timeline: list[tuple[float, int]] = []  # (unix time, open_now) at each change
        self._refusing = False
        self._blackhole = threading.Event()
        self._drop_reply: tuple[bytes, ReplyComplete, Callable[[], None] | None] | None = None
        self._drop_request: bytes | None = None
        self.fired = threading.Event()  # set when an armed fault has fired
        self.accepted = 0  # connections accepted and forwarded
        self.refused = 0  # connections accepted and closed while refusing
        self.errors: list[BaseException] = []  # failures inside on_drop callbacks, re-raised by stop()

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        """Start accepting; returns ``self`` so ``proxy = TcpProxy(...).start()`` reads naturally."""
        self._spawn(self._accept_loop, "accept")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, wait for the threads; re-raise an on_drop failure."""
        self._stopping.set()
        self.close_all()
        for thread in list(self._threads):
            thread.join(timeout=5)
        self._listener.close()
        if self.errors:
            raise self.errors[0]

    # -- faults ---------------------------------------------------------------------------------------

    def drop_next_reply_after(
        self,
        marker: bytes,
        *,
        reply_complete: ReplyComplete = postgres_reply_complete,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        """Arm: the next request containing ``marker`` reaches the server, its complete reply is swallowed,
        then ``on_drop`` runs (in the proxy's thread, before the client sees anything) and both sockets close."""
        with self._lock:
            self.fired.clear()
            self._drop_reply = (marker, reply_complete, on_drop)

    def drop_next_request_containing(self, marker: bytes) -> None:
        """Arm: the next request containing ``marker`` never reaches the server; both sockets close."""
        with self._lock:
            self.fired.clear()
            self._drop_request = marker

    def refuse_new_connections(self, refuse: bool = True) -> None:
        """Close new connections as soon as they are accepted (existing ones are untouched)."""
        with self._lock:
            self._refusing = refuse

    def blackhole(self, on: bool = True) -> None:
        """A partition: every connection (open and new) stays open but nothing gets through either way,
        as with a server that hangs or a network that drops packets. Bytes sent meanwhile are lost."""
        if on:
            self._blackhole.set()
        else:
            self._blackhole.clear()

    def close_all(self) -> None:
        """Cut every open connection now."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=f"tcp-proxy-{self.port}-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                self.refused += 1
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
                self.accepted += 1
                self.open_now += 1
                self.open_high_water = max(self.open_high_water, self.open_now)
                self.open_timeline.append((time.time(), self.open_now))
            self._spawn(self._client_to_server, "up", link)
            self._spawn(self._server_to_client, "down", link)

    def _client_to_server(self, link: _Link) -> None:
        tail = b""
        try:
            while True:
                chunk = link.client.recv(65536)
                if not chunk:
                    link.server.shutdown(socket.SHUT_WR)
                    return
                if self._blackhole.is_set():
                    continue
                window = tail + chunk
                with self._lock:
                    if self._drop_request is not None and self._drop_request in window:
                        self._drop_request = None
                        self.fired.set()
                        link.close()
                        return
                    if self._drop_reply is not None and self._drop_reply[0] in window:
                        _, complete, on_drop = self._drop_reply
                        self._drop_reply = None
                        link.doomed = _DropReply(complete, on_drop)  # before the request goes out
                    markers = [m for m in (self._drop_request, self._drop_reply and self._drop_reply[0]) if m]
                keep = max((len(m) for m in markers), default=64) - 1
                tail = window[-keep:] if keep > 0 else b""
                link.server.sendall(chunk)
        except OSError:
            link.close()

    def _server_to_client(self, link: _Link) -> None:
        try:
            self._relay_from_server(link)
        finally:
            with self._lock:  # the server's side of this connection ended: one session fewer at the server
                self.open_now -= 1
                self.open_timeline.append((time.time(), self.open_now))

    def _relay_from_server(self, link: _Link) -> None:
        try:
            while True:
                chunk = link.server.recv(65536)
                if not chunk:
                    link.client.shutdown(socket.SHUT_WR)
                    return
                if self._blackhole.is_set():
                    continue
                doomed = link.doomed
                if doomed is None:
                    link.client.sendall(chunk)
                    continue
                doomed.swallowed.extend(chunk)
                if doomed.reply_complete(bytes(doomed.swallowed)):
                    if doomed.on_drop is not None:
                        try:
                            doomed.on_drop()
                        except BaseException as exc:  # noqa: BLE001 - reported by stop(), never lost
                            self.errors.append(exc)
                    self.fired.set()
                    link.close()
                    return
        except OSError:
            link.close()

"""Certificates made on the spot, and a real TLS terminator to put in front of a server that has none.

- :func:`make_pki` writes a test PKI into a directory: a CA, a server certificate for ``127.0.0.1`` and
  ``localhost``, a client certificate from the same CA, and an unrelated second CA with its own client
  certificate (for "wrong CA" and "client certificate not trusted" cases). Keys are PEM, unencrypted,
  mode 0600.
- :class:`TlsTerminator` listens on loopback with TLS (ALPN ``h2``), optionally requires a client
  certificate signed by a given CA, and forwards the decrypted bytes to a plain TCP server such as the
  Temporal dev server (which has no TLS options). With ``require_bearer`` it also reads the HTTP/2
  request headers and answers any request without ``authorization: Bearer <key>`` itself, with gRPC
  status 16 (UNAUTHENTICATED), as Temporal Cloud does; such a request never reaches the server.

Both are for tests and benchmarks only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# -- certificates -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """Paths of a test PKI; ``other_*`` belong to a second CA that has nothing to do with the first."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path
    other_client_cert: Path
    other_client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue(
    subject: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    dns: Iterable[str] = (),
    ips: Iterable[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), critical=False
        )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(signing_key, hashes.SHA256()), key


def make_pki(
    directory: Path,
    *,
    server_dns: Iterable[str] = ("localhost",),
    server_ips: Iterable[str] = ("127.0.0.1",),
    client_name: str = "fenced-exports-worker",
) -> Pki:
    """Write a CA, a server and a client certificate, and an unrelated CA with its own client, into
    ``directory`` (created 0700); returns their paths."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = _issue("Fenced Exports test CA", None, ca=True)
    server = _issue(
        "fenced-exports test server",
        ca,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        dns=server_dns,
        ips=server_ips,
    )
    client = _issue(client_name, ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other_ca = _issue("Unrelated test CA", None, ca=True)
    other_client = _issue(client_name, other_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    pki = Pki(
        directory=directory,
        ca_cert=directory / "ca.pem",
        ca_key=directory / "ca.key",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca_cert=directory / "other-ca.pem",
        other_client_cert=directory / "other-client.pem",
        other_client_key=directory / "other-client.key",
    )
    for (cert, key), cert_path, key_path in (
        (ca, pki.ca_cert, pki.ca_key),
        (server, pki.server_cert, pki.server_key),
        (client, pki.client_cert, pki.client_key),
        (other_client, pki.other_client_cert, pki.other_client_key),
    ):
        _write_cert(cert_path, cert)
        _write_key(key_path, key)
    _write_cert(pki.other_ca_cert, other_ca[0])
    return pki


# -- the terminator -----------------------------------------------------------------------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS, _CONTINUATION = 0x1, 0x9
_END_HEADERS = 0x4


@dataclass
class TerminatorStats:
    """What the terminator saw, for assertions."""

    connections: int = 0  # TLS handshakes completed
    handshake_failures: list[str] = field(default_factory=list)  # the SSL error of each failed one
    authorized_requests: int = 0  # requests that carried the expected bearer key (require_bearer)
    refused_requests: int = 0  # requests answered UNAUTHENTICATED, never forwarded
    client_subjects: list[str] = field(default_factory=list)  # client certificate subjects seen


class TlsTerminator:
    """TLS on ``127.0.0.1:<port>`` in front of a plain TCP ``upstream``, run on its own thread and loop.

    ``client_ca``: require a client certificate signed by this CA (mutual TLS). ``alpn``: the protocols
    offered (``("h2",)`` as a gRPC server would; ``()`` for none). ``require_bearer``: answer requests
    without ``authorization: Bearer <key>`` with gRPC UNAUTHENTICATED instead of forwarding them.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        alpn: Iterable[str] = ("h2",),
        require_bearer: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.require_bearer = require_bearer
        self.stats = TerminatorStats()
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._context.load_cert_chain(cert, key)
        if client_ca is not None:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(cafile=str(client_ca))
        protocols = list(alpn)
        if protocols:
            self._context.set_alpn_protocols(protocols)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-terminator", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, what a client connects to."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> TlsTerminator:
        """Listen on a free loopback port; returns ``self``."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and end the thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> TlsTerminator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- on the terminator's loop ---------------------------------------------------------------------

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accepted, "127.0.0.1", 0)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            # The handshake is ours (not start_server's) so that a refused one is seen and recorded.
            await writer.start_tls(self._context, ssl_handshake_timeout=10)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            self.stats.handshake_failures.append(getattr(exc, "reason", None) or type(exc).__name__)
            writer.close()
            self._tasks.discard(task)
            return
        self.stats.connections += 1
        peer = writer.get_extra_info("peercert")
        if peer:
            self.stats.client_subjects.append(
                ",".join(f"{k}={v}" for rdn in peer.get("subject", ()) for k, v in rdn)
            )
        try:
            if self.require_bearer is None:
                await self._pipe_raw(reader, writer)
            else:
                await self._pipe_checking_bearer(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.CancelledError):
            pass  # the client or the server went away, or the terminator is stopping
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def _pipe_raw(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            await _both_ways(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _pipe_checking_bearer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read the client's HTTP/2 frames; forward them while every request carries the key."""
        import hpack

        decoder = hpack.Decoder()
        decoder.max_allowed_table_size = 1 << 16
        pending = bytearray(await reader.readexactly(len(_PREFACE)))
        if bytes(pending) != _PREFACE:
            return
        block = bytearray()
        up_writer: asyncio.StreamWriter | None = None
        pump: asyncio.Task | None = None
        try:
            while True:
                header = await reader.readexactly(9)
                length = int.from_bytes(header[:3], "big")
                kind, flags = header[3], header[4]
                body = await reader.readexactly(length)
                frame = header + body
                if kind in (_HEADERS, _CONTINUATION):
                    block += _header_fragment(kind, flags, body)
                    if flags & _END_HEADERS:
                        headers = dict(decoder.decode(bytes(block), raw=True))
                        block.clear()
                        if b":method" in headers and not self._authorized(headers):
                            self.stats.refused_requests += 1
                            if up_writer is None:
                                # Nothing reached the server: answer every request on this connection.
                                await _refuse_connection(bytes(pending) + frame, reader, writer)
                            return
                        if b":method" in headers:
                            self.stats.authorized_requests += 1
                if up_writer is None:
                    pending += frame
                    if kind in (_HEADERS, _CONTINUATION) and flags & _END_HEADERS:
                        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
                        up_writer.write(bytes(pending))
                        pump = asyncio.create_task(_copy(up_reader, writer))
                else:
                    up_writer.write(frame)
                    await up_writer.drain()
        finally:
            if pump is not None:
                pump.cancel()
            if up_writer is not None:
                up_writer.close()

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        return headers.get(b"authorization") == f"Bearer {self.require_bearer}".encode()


def _header_fragment(kind: int, flags: int, body: bytes) -> bytes:
    """The header block fragment of a HEADERS or CONTINUATION frame, without padding and priority."""
    if kind == _CONTINUATION:
        return body
    start, end = 0, len(body)
    if flags & 0x8:  # PADDED
        start, end = 1, len(body) - body[0]
    if flags & 0x20:  # PRIORITY
        start += 5
    return body[start:end]


async def _refuse_connection(
    received: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Be the HTTP/2 server for this connection and answer each request with gRPC UNAUTHENTICATED."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.initiate_connection()
    data = received
    while data:
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                conn.send_headers(
                    event.stream_id,
                    [
                        (":status", "200"),
                        ("content-type", "application/grpc"),
                        ("grpc-status", "16"),
                        ("grpc-message", "missing or wrong API key"),
                    ],
                    end_stream=True,
                )
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                data = b""
        writer.write(conn.data_to_send())
        await writer.drain()
        if data:
            data = await reader.read(65536)


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    with contextlib.suppress(OSError, RuntimeError):
        if sink.can_write_eof():
            sink.write_eof()


async def _both_ways(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    tasks = [asyncio.create_task(_copy(reader, up_writer)), asyncio.create_task(_copy(up_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

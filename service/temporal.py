"""How every process reaches Temporal: the one place a client is built.

Workers, the API, the command line, the demo and the tests all connect through ``connect_client``, so
every client carries the pydantic data converter (payloads are pydantic models of IDs, sizes, hashes and
codes), the tracing interceptor when tracing is on, and the same connection options: TLS with a CA bundle, mutual TLS with a client certificate, an
API key (Temporal Cloud), the namespace.

Whatever stops a connection at start-up (an unreadable or malformed file, a certificate and key that do
not belong together, a server certificate the CA does not sign, a client certificate the server wants
or refuses, a refused API key, an unknown namespace, a server that does not answer in time) is one
:class:`TemporalConnectError` whose message is a single line beginning with the setting to fix. It
never carries a key or the API key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from observability.temporal import temporal_interceptors
from settings import Settings

DATA_CONVERTER: DataConverter = pydantic_data_converter

# Environment names of the settings an error can point at.
ADDRESS = "EXPORTS_TEMPORAL_ADDRESS"
NAMESPACE = "EXPORTS_TEMPORAL_NAMESPACE"
TLS = "EXPORTS_TEMPORAL_TLS"
TLS_CA = "EXPORTS_TEMPORAL_TLS_CA"
TLS_CERT = "EXPORTS_TEMPORAL_TLS_CERT"
TLS_KEY = "EXPORTS_TEMPORAL_TLS_KEY"
TLS_SERVER_NAME = "EXPORTS_TEMPORAL_TLS_SERVER_NAME"
API_KEY = "EXPORTS_TEMPORAL_API_KEY"
API_KEY_FILE = "EXPORTS_TEMPORAL_API_KEY_FILE"


class TemporalConnectError(Exception):
    """Temporal cannot be reached with these settings; ``str()`` is one line naming the setting to fix."""

    def __init__(self, setting: str, reason: str) -> None:
        super().__init__(f"{setting}: {reason}")
        self.setting = setting
        self.reason = reason


@dataclass(frozen=True)
class ConnectOptions:
    """What ``Client.connect`` gets besides the address: checked, read from files, ready to use."""

    address: str
    namespace: str
    tls: TLSConfig | None
    api_key: str | None
    api_key_setting: str  # where the API key came from, for errors
    connect_timeout: timedelta

    def __repr__(self) -> str:  # the API key and the client key stay out of logs and tracebacks
        return (
            f"ConnectOptions(address={self.address!r}, namespace={self.namespace!r}, "
            f"tls={self.tls is not None}, api_key={'set' if self.api_key else None})"
        )


def connect_options(settings: Settings) -> ConnectOptions:
    """Read and check the TLS files and the API key named in ``settings``, without any network.

    Raises :class:`TemporalConnectError` for a file that cannot be read or is not what its setting says,
    a certificate without its key (or the reverse), a key that does not belong to the certificate, or
    an API key given both as a value and as a file.
    """
    ca = _read_certificates(TLS_CA, settings.temporal_tls_ca) if settings.temporal_tls_ca else None
    cert = key = None
    if (settings.temporal_tls_cert is None) != (settings.temporal_tls_key is None):
        missing = TLS_KEY if settings.temporal_tls_key is None else TLS_CERT
        given = TLS_CERT if missing == TLS_KEY else TLS_KEY
        raise TemporalConnectError(missing, f"not set, but {given} is: mutual TLS needs both")
    if settings.temporal_tls_cert is not None and settings.temporal_tls_key is not None:
        cert = _read_certificates(TLS_CERT, settings.temporal_tls_cert)
        key = _read_private_key(settings.temporal_tls_key, cert)
    api_key = _read_api_key(settings)
    api_key_setting = API_KEY_FILE if settings.temporal_api_key_file is not None else API_KEY
    use_tls = (
        settings.temporal_tls
        or ca is not None
        or cert is not None
        or settings.temporal_tls_server_name is not None
        or api_key is not None
    )
    tls = (
        TLSConfig(
            server_root_ca_cert=ca,
            client_cert=cert,
            client_private_key=key,
            domain=settings.temporal_tls_server_name,
        )
        if use_tls
        else None
    )
    if settings.temporal_connect_timeout_seconds <= 0:
        raise TemporalConnectError("EXPORTS_TEMPORAL_CONNECT_TIMEOUT_SECONDS", "must be positive")
    return ConnectOptions(
        address=settings.temporal_address,
        namespace=settings.temporal_namespace,
        tls=tls,
        api_key=api_key,
        api_key_setting=api_key_setting,
        connect_timeout=timedelta(seconds=settings.temporal_connect_timeout_seconds),
    )


async def connect_client(settings: Settings, *, runtime: Runtime | None = None) -> Client:
    """A Temporal client for ``settings``: address, namespace, TLS or mutual TLS, API key; the tracing
    interceptor when tracing is on (workers made from the client inherit it); ``runtime`` (the worker's,
    serving the SDK's metrics: ``observability.setup.worker_runtime``) or the SDK's default.

    Checks the files first (:func:`connect_options`), connects within
    ``temporal_connect_timeout_seconds`` and asks the server about the namespace, so every way of not
    getting a usable client is one :class:`TemporalConnectError` at start-up, not a hang and not a
    failure later.
    """
    options = connect_options(settings)
    deadline = options.connect_timeout.total_seconds()
    try:
        client = await asyncio.wait_for(
            Client.connect(
                options.address,
                namespace=options.namespace,
                data_converter=DATA_CONVERTER,
                tls=options.tls if options.tls is not None else False,
                api_key=options.api_key,
                connect_timeout=options.connect_timeout,
                interceptors=temporal_interceptors(),
                runtime=runtime,
            ),
            deadline,
        )
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=options.namespace), timeout=options.connect_timeout
        )
    except TimeoutError:
        raise TemporalConnectError(
            ADDRESS,
            f"no answer from {options.address} within {deadline:g} s"
            + (" (is it a TLS endpoint? the client spoke TLS)" if options.tls else ""),
        ) from None
    except RPCError as exc:
        raise _explain_rpc_error(options, exc) from None
    except RuntimeError as exc:
        raise _explain_connect_failure(options, str(exc)) from None
    return client


# -- reading the files --------------------------------------------------------------------------------


def _read(setting: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TemporalConnectError(
            setting, f"cannot read {path} ({exc.strerror or type(exc).__name__})"
        ) from None
    if not data.strip():
        raise TemporalConnectError(setting, f"{path} is empty")
    return data


def _read_certificates(setting: str, path: Path) -> bytes:
    data = _read(setting, path)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise TemporalConnectError(setting, f"{path} holds no PEM certificate")
    return data


def _read_private_key(path: Path, certificate_pem: bytes) -> bytes:
    data = _read(TLS_KEY, path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TemporalConnectError(TLS_KEY, f"{path} is encrypted; give the key unencrypted (0600)") from None
    except ValueError:
        raise TemporalConnectError(TLS_KEY, f"{path} holds no PEM private key") from None
    certificate = x509.load_pem_x509_certificates(certificate_pem)[0]
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise TemporalConnectError(TLS_KEY, f"{path} is not the key of the certificate in {TLS_CERT}")
    return data


def _read_api_key(settings: Settings) -> str | None:
    if settings.temporal_api_key is not None and settings.temporal_api_key_file is not None:
        raise TemporalConnectError(API_KEY_FILE, f"give the API key once: {API_KEY} is set too")
    if settings.temporal_api_key_file is not None:
        return _read(API_KEY_FILE, settings.temporal_api_key_file).decode("utf-8", "replace").strip()
    if settings.temporal_api_key is not None:
        value = settings.temporal_api_key.get_secret_value().strip()
        if not value:
            raise TemporalConnectError(API_KEY, "is empty")
        return value
    return None


# -- explaining a failed connection -------------------------------------------------------------------


def _explain_connect_failure(options: ConnectOptions, message: str) -> TemporalConnectError:
    """Map the SDK's connection error text to the setting to fix (the SDK offers no error codes here)."""
    where = options.address
    if "code: Unauthenticated" in message:
        return _unauthenticated(options)
    if "code: PermissionDenied" in message:
        return _permission_denied(options)
    if "UnknownIssuer" in message or "UnknownCA" in message:
        if options.tls is not None and options.tls.server_root_ca_cert is not None:
            return TemporalConnectError(
                TLS_CA, f"the certificate of {where} is not signed by a CA in this file"
            )
        return TemporalConnectError(
            TLS_CA,
            f"the certificate of {where} is not signed by a CA this system trusts; name its CA's PEM file here",
        )
    if "NotValidForName" in message or "CertNotValidForName" in message:
        name = (options.tls.domain if options.tls else None) or where.rsplit(":", 1)[0]
        return TemporalConnectError(TLS_SERVER_NAME, f"the certificate of {where} is not valid for {name!r}")
    if "InvalidCertificate" in message:
        return TemporalConnectError(TLS_CA, f"the certificate of {where} was refused ({_short(message)})")
    if "H2NotNegotiated" in message:
        return TemporalConnectError(
            ADDRESS, f"{where} speaks TLS but not HTTP/2 (ALPN h2): not a Temporal frontend"
        )
    if "CorruptMessage" in message or "InvalidContentType" in message or "InvalidMessage" in message:
        return TemporalConnectError(
            TLS, f"{where} does not speak TLS; unset the TLS settings or fix the port"
        )
    if "ConnectionRefused" in message or "tcp connect error" in message:
        return TemporalConnectError(ADDRESS, f"nothing listens at {where} (connection refused)")
    if "dns error" in message or "failed to lookup address" in message:
        return TemporalConnectError(ADDRESS, f"cannot resolve the host of {where}")
    client_side = (
        "CertificateRequired" in message
        or "BadCertificate" in message
        or "transport error" in message
        or "UnexpectedEof" in message
        or "BrokenPipe" in message
        or "ConnectionReset" in message
        # The same close, reaching the client after its first call was sent (a loaded machine): hyper
        # cancels the call in flight.
        or "operation was canceled" in message
    )
    if client_side and options.tls is None:
        return TemporalConnectError(
            TLS, f"{where} closed the connection: it probably expects TLS; set {TLS}=true or {TLS_CA}"
        )
    if client_side and options.tls is not None and options.tls.client_cert is None:
        return TemporalConnectError(
            TLS_CERT,
            f"{where} closed the connection after the TLS handshake: it requires a client certificate "
            f"(set {TLS_CERT} and {TLS_KEY})",
        )
    if client_side:
        return TemporalConnectError(
            TLS_CERT,
            f"{where} closed the connection after the TLS handshake: it refused this client certificate "
            "(not signed by a CA it trusts, or expired)",
        )
    return TemporalConnectError(ADDRESS, f"cannot connect to {where} ({_short(message)})")


def _explain_rpc_error(options: ConnectOptions, exc: RPCError) -> TemporalConnectError:
    if exc.status == RPCStatusCode.NOT_FOUND:
        return TemporalConnectError(
            NAMESPACE, f"namespace {options.namespace!r} does not exist on {options.address}"
        )
    if exc.status == RPCStatusCode.UNAUTHENTICATED:
        return _unauthenticated(options)
    if exc.status == RPCStatusCode.PERMISSION_DENIED:
        return _permission_denied(options)
    return TemporalConnectError(ADDRESS, f"{options.address} answered {exc.status.name}")


def _unauthenticated(options: ConnectOptions) -> TemporalConnectError:
    if options.api_key:
        return TemporalConnectError(
            options.api_key_setting, f"{options.address} refused the API key (UNAUTHENTICATED)"
        )
    return TemporalConnectError(
        API_KEY,
        f"{options.address} requires an API key (or a client certificate: {TLS_CERT}) (UNAUTHENTICATED)",
    )


def _permission_denied(options: ConnectOptions) -> TemporalConnectError:
    return TemporalConnectError(
        NAMESPACE, f"these credentials may not use namespace {options.namespace!r} (PERMISSION_DENIED)"
    )


def _short(message: str) -> str:
    """The SDK's error text on one line, cut to a readable length (it carries no secret)."""
    line = " ".join(message.split())
    return line if len(line) <= 200 else line[:197] + "..."

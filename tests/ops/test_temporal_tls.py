"""Temporal over TLS, mutual TLS and an API key, through a real TLS terminator in front of the dev server.

The dev server has no TLS options, so ``testbed.tls.TlsTerminator`` (OpenSSL through Python's ``ssl``,
ALPN h2) terminates TLS with certificates generated for the test and forwards to it. The terminator
records what its side of the handshake saw, so each refusal is shown to happen where it should: in the
TLS handshake, or (API key) in the HTTP/2 request headers before anything reaches the server. Every way
of failing is one ``TemporalConnectError`` whose single line starts with the setting to fix.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from service.temporal import TemporalConnectError, _explain_connect_failure, connect_client, connect_options
from settings import Settings
from testbed.tls import Pki, TlsTerminator
from tests.ops.conftest import one_line, upstream_of

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-api-key-" + uuid.uuid4().hex


@workflow.defn(sandboxed=False)
class Echo:
    """The smallest round trip: a workflow task that a worker on the TLS client completes."""

    @workflow.run
    async def run(self, text: str) -> str:
        return f"echo {text}"


@pytest.fixture(scope="module")
def mtls(pki: Pki, dev_server: WorkflowEnvironment) -> Iterator[TlsTerminator]:
    """Requires a client certificate signed by the test CA."""
    with TlsTerminator(
        upstream_of(dev_server), cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca_cert
    ) as terminator:
        yield terminator


@pytest.fixture(scope="module")
def bearer(pki: Pki, dev_server: WorkflowEnvironment) -> Iterator[TlsTerminator]:
    """Server-side TLS only; every request must carry ``authorization: Bearer API_KEY``."""
    with TlsTerminator(
        upstream_of(dev_server), cert=pki.server_cert, key=pki.server_key, require_bearer=API_KEY
    ) as terminator:
        yield terminator


def mtls_settings(pki: Pki, address: str, **overrides: object) -> Settings:
    values: dict = {
        "temporal_address": address,
        "temporal_tls_ca": pki.ca_cert,
        "temporal_tls_cert": pki.client_cert,
        "temporal_tls_key": pki.client_key,
        "temporal_connect_timeout_seconds": 5.0,
    }
    values.update(overrides)
    return Settings(**values)


async def refusal(settings: Settings) -> TemporalConnectError:
    with pytest.raises(TemporalConnectError) as caught:
        await connect_client(settings)
    assert one_line(str(caught.value)), str(caught.value)
    assert str(caught.value).startswith(caught.value.setting + ":")
    return caught.value


async def server_saw(terminator: TlsTerminator, reason: str, since: int) -> bool:
    """Whether the terminator's side of a handshake failed with ``reason`` (recorded on its own thread)."""
    for _ in range(100):
        if reason in terminator.stats.handshake_failures[since:]:
            return True
        await asyncio.sleep(0.05)
    return False


async def round_trip(settings: Settings) -> str:
    client = await connect_client(settings)
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Echo]):
        return await client.execute_workflow(
            Echo.run, "over TLS", id=f"echo-{uuid.uuid4()}", task_queue=queue
        )


async def test_mutual_tls_runs_a_workflow_round_trip(pki: Pki, mtls: TlsTerminator) -> None:
    assert await round_trip(mtls_settings(pki, mtls.address)) == "echo over TLS"
    assert "commonName=fenced-exports-worker" in mtls.stats.client_subjects


async def test_server_name_setting_lets_a_certificate_for_localhost_serve_another_address(
    pki: Pki, mtls: TlsTerminator
) -> None:
    client = await connect_client(mtls_settings(pki, mtls.address, temporal_tls_server_name="localhost"))
    assert client.namespace == "default"


async def test_wrong_ca_is_refused_with_one_line_naming_the_ca_setting(pki: Pki, mtls: TlsTerminator) -> None:
    failures = len(mtls.stats.handshake_failures)
    error = await refusal(mtls_settings(pki, mtls.address, temporal_tls_ca=pki.other_ca_cert))
    assert error.setting == "EXPORTS_TEMPORAL_TLS_CA", str(error)
    assert "not signed by a CA in this file" in str(error)
    assert await server_saw(mtls, "TLSV1_ALERT_UNKNOWN_CA", failures)  # the client's alert


async def test_missing_client_certificate_is_refused_with_one_line_naming_the_cert_setting(
    pki: Pki, mtls: TlsTerminator
) -> None:
    failures = len(mtls.stats.handshake_failures)
    error = await refusal(mtls_settings(pki, mtls.address, temporal_tls_cert=None, temporal_tls_key=None))
    assert error.setting == "EXPORTS_TEMPORAL_TLS_CERT", str(error)
    assert "requires a client certificate" in str(error)
    assert await server_saw(mtls, "PEER_DID_NOT_RETURN_A_CERTIFICATE", failures)


async def test_client_certificate_of_another_ca_is_refused(pki: Pki, mtls: TlsTerminator) -> None:
    failures = len(mtls.stats.handshake_failures)
    error = await refusal(
        mtls_settings(
            pki, mtls.address, temporal_tls_cert=pki.other_client_cert, temporal_tls_key=pki.other_client_key
        )
    )
    assert error.setting == "EXPORTS_TEMPORAL_TLS_CERT", str(error)
    assert "refused this client certificate" in str(error)
    assert await server_saw(mtls, "CERTIFICATE_VERIFY_FAILED", failures)


async def test_certificate_for_another_name_is_refused_naming_the_server_name_setting(
    pki: Pki, mtls: TlsTerminator
) -> None:
    error = await refusal(mtls_settings(pki, mtls.address, temporal_tls_server_name="temporal.example"))
    assert error.setting == "EXPORTS_TEMPORAL_TLS_SERVER_NAME", str(error)


async def test_plain_client_at_a_tls_port_is_told_to_use_tls(pki: Pki, mtls: TlsTerminator) -> None:
    error = await refusal(Settings(temporal_address=mtls.address, temporal_connect_timeout_seconds=5.0))
    assert error.setting == "EXPORTS_TEMPORAL_TLS", str(error)


# What the SDK said on this machine when the server closed the connection right after connecting (a plain
# client at a TLS port, a client without the certificate a mutual-TLS port requires), captured with the CPU
# kept busy: which of these comes is a race inside the client, so the tests above can meet any of them.
CLOSED_AFTER_CONNECTING = [
    'hyper::Error(Io, Custom { kind: BrokenPipe, error: "stream closed because of a broken pipe" })',
    "hyper::Error(Io, Kind(ConnectionReset))",
    'hyper::Error(Io, Custom { kind: UnexpectedEof, error: "peer closed connection without sending TLS'
    ' close_notify: https://docs.rs/rustls/latest/rustls/manual/_03_howto/index.html#unexpected-eof" })',
]
TRANSPORT_ERROR = (
    "Failed client connect: `get_system_info` call error after connection: Status {{ code: Unknown, "
    'message: "transport error", source: Some(tonic::transport::Error(Transport, {})) }}'
)
CANCELLED_IN_FLIGHT = (
    "Failed client connect: `get_system_info` call error after connection: Status { code: Cancelled, "
    'message: "operation was canceled", source: Some(tonic::transport::Error(Transport, '
    'hyper::Error(Canceled, "connection closed"))) }'
)


@pytest.mark.parametrize(
    "message", [TRANSPORT_ERROR.format(cause) for cause in CLOSED_AFTER_CONNECTING] + [CANCELLED_IN_FLIGHT]
)
def test_every_way_the_sdk_reports_a_close_after_connecting_names_the_tls_setting(
    pki: Pki, message: str
) -> None:
    plain = connect_options(Settings(temporal_address="127.0.0.1:7233"))
    assert _explain_connect_failure(plain, message).setting == "EXPORTS_TEMPORAL_TLS"
    without_certificate = connect_options(
        Settings(temporal_address="127.0.0.1:7233", temporal_tls_ca=pki.ca_cert)
    )
    assert _explain_connect_failure(without_certificate, message).setting == "EXPORTS_TEMPORAL_TLS_CERT"


async def test_tls_client_at_a_plain_port_is_told_it_is_not_tls(
    pki: Pki, dev_server: WorkflowEnvironment
) -> None:
    host, port = upstream_of(dev_server)
    error = await refusal(Settings(temporal_address=f"{host}:{port}", temporal_tls_ca=pki.ca_cert))
    assert error.setting == "EXPORTS_TEMPORAL_TLS", str(error)


async def test_unknown_namespace_is_named_at_start(pki: Pki, mtls: TlsTerminator) -> None:
    error = await refusal(mtls_settings(pki, mtls.address, temporal_namespace=f"nope-{uuid.uuid4().hex}"))
    assert error.setting == "EXPORTS_TEMPORAL_NAMESPACE", str(error)


async def test_api_key_is_sent_as_a_bearer_header(pki: Pki, bearer: TlsTerminator, tmp_path: Path) -> None:
    before = bearer.stats.authorized_requests
    settings = Settings(
        temporal_address=bearer.address,
        temporal_tls_ca=pki.ca_cert,
        temporal_api_key=API_KEY,
        temporal_connect_timeout_seconds=5.0,
    )
    assert await round_trip(settings) == "echo over TLS"
    assert bearer.stats.authorized_requests > before
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    from_file = settings.model_copy(update={"temporal_api_key": None, "temporal_api_key_file": key_file})
    assert (await connect_client(from_file)).namespace == "default"


@pytest.mark.parametrize("api_key", ["wrong-key", None], ids=["wrong key", "no key"])
async def test_missing_or_wrong_api_key_is_refused_before_the_server(
    pki: Pki, bearer: TlsTerminator, api_key: str | None
) -> None:
    refused = bearer.stats.refused_requests
    error = await refusal(
        Settings(
            temporal_address=bearer.address,
            temporal_tls_ca=pki.ca_cert,
            temporal_api_key=api_key,
            temporal_connect_timeout_seconds=5.0,
        )
    )
    assert error.setting == "EXPORTS_TEMPORAL_API_KEY", str(error)
    assert "UNAUTHENTICATED" in str(error)
    assert bearer.stats.refused_requests > refused
    if api_key:
        assert api_key not in str(error)


async def test_server_that_never_answers_is_an_error_within_the_timeout(pki: Pki) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP, never speaks
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        error = await refusal(
            Settings(
                temporal_address=address, temporal_tls_ca=pki.ca_cert, temporal_connect_timeout_seconds=1.5
            )
        )
        assert time.monotonic() - started < 5
    assert error.setting == "EXPORTS_TEMPORAL_ADDRESS", str(error)


def _bad(pki: Pki, tmp: Path, case: str) -> dict:
    good = {
        "temporal_tls_ca": pki.ca_cert,
        "temporal_tls_cert": pki.client_cert,
        "temporal_tls_key": pki.client_key,
    }
    not_pem = tmp / "not.pem"
    not_pem.write_text("hello\n")
    encrypted = tmp / "encrypted.key"
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return {
        "CA missing": {**good, "temporal_tls_ca": tmp / "absent.pem"},
        "CA not PEM": {**good, "temporal_tls_ca": not_pem},
        "cert without key": {**good, "temporal_tls_key": None},
        "key without cert": {**good, "temporal_tls_cert": None},
        "key of another cert": {**good, "temporal_tls_key": pki.other_client_key},
        "key encrypted": {**good, "temporal_tls_key": encrypted},
        "cert not PEM": {**good, "temporal_tls_cert": not_pem},
        "API key twice": {**good, "temporal_api_key": "a", "temporal_api_key_file": pki.ca_cert},
        "API key file missing": {**good, "temporal_api_key_file": tmp / "absent-key"},
    }[case]


@pytest.mark.parametrize(
    ("case", "setting"),
    [
        ("CA missing", "EXPORTS_TEMPORAL_TLS_CA"),
        ("CA not PEM", "EXPORTS_TEMPORAL_TLS_CA"),
        ("cert without key", "EXPORTS_TEMPORAL_TLS_KEY"),
        ("key without cert", "EXPORTS_TEMPORAL_TLS_CERT"),
        ("key of another cert", "EXPORTS_TEMPORAL_TLS_KEY"),
        ("key encrypted", "EXPORTS_TEMPORAL_TLS_KEY"),
        ("cert not PEM", "EXPORTS_TEMPORAL_TLS_CERT"),
        ("API key twice", "EXPORTS_TEMPORAL_API_KEY_FILE"),
        ("API key file missing", "EXPORTS_TEMPORAL_API_KEY_FILE"),
    ],
)
def test_bad_files_and_combinations_are_refused_before_any_connection(
    pki: Pki, tmp_path: Path, case: str, setting: str
) -> None:
    # A closed port: were anything sent, the error would be about the address instead.
    settings = Settings(temporal_address="127.0.0.1:1", **_bad(pki, tmp_path, case))
    with pytest.raises(TemporalConnectError) as caught:
        connect_options(settings)
    assert caught.value.setting == setting
    assert one_line(str(caught.value))


def test_worker_main_prints_one_line_naming_the_setting(pki: Pki, mtls: TlsTerminator) -> None:
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",  # never reached: Temporal first
        "EXPORTS_TEMPORAL_ADDRESS": mtls.address,
        "EXPORTS_TEMPORAL_TLS_CA": str(pki.other_ca_cert),
        "EXPORTS_TEMPORAL_TLS_CERT": str(pki.client_cert),
        "EXPORTS_TEMPORAL_TLS_KEY": str(pki.client_key),
        "EXPORTS_TEMPORAL_CONNECT_TIMEOUT_SECONDS": "5",
    }
    done = subprocess.run(
        [sys.executable, "worker.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("worker.py: EXPORTS_TEMPORAL_TLS_CA: "), done.stderr


@pytest.mark.slow
def test_worker_main_gives_up_on_a_silent_server_with_one_line(pki: Pki) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP, never speaks
        env = {
            **os.environ,
            "EXPORTS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "EXPORTS_TEMPORAL_ADDRESS": f"127.0.0.1:{silent.getsockname()[1]}",
            "EXPORTS_TEMPORAL_TLS_CA": str(pki.ca_cert),
            "EXPORTS_TEMPORAL_CONNECT_TIMEOUT_SECONDS": "2",
        }
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "worker.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert time.monotonic() - started < 20
    assert done.returncode == 1
    assert done.stderr.startswith("worker.py: EXPORTS_TEMPORAL_ADDRESS: no answer from ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # nothing after it: no panic, no traceback


def test_starter_serve_checks_the_temporal_files_before_serving(pki: Pki) -> None:
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "EXPORTS_TEMPORAL_TLS_CERT": str(pki.client_cert),
    }
    env.pop("EXPORTS_TEMPORAL_TLS_KEY", None)
    done = subprocess.run(
        [sys.executable, "starter.py", "serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "starter.py: EXPORTS_TEMPORAL_TLS_KEY: not set, but EXPORTS_TEMPORAL_TLS_CERT is: mutual TLS needs both"
    )

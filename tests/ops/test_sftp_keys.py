"""SFTP private keys as OpenSSH treats them: read from the file named by ``credential_ref``, refused when
the file is open to group or others, opened with a passphrase from a setting or a secrets file, and
never written to a log, an error or the evidence.

A refused key is refused before anything reaches the partner: those cases point the destination at a
bare listening socket and show that no connection arrived. Keys that work are shown to work against
the real servers (the in-process asyncssh server and OpenSSH's sshd).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from domain.models import FailureCode
from partner.client import (
    ConnectRefused,
    connect,
    load_private_key,
    passphrase_from,
    set_key_passphrase,
)
from settings import Settings
from testbed.sftp import SftpTarget
from tests.partner.helpers import local_file, run_delivery

ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "correct horse " + uuid.uuid4().hex


def key_copy(source: Path, target: Path, mode: int, passphrase: str | None = None) -> Path:
    """``source``'s private key written to ``target`` with ``mode``, encrypted when given a passphrase."""
    key = serialization.load_ssh_private_key(source.read_bytes(), password=None)
    encryption = (
        serialization.BestAvailableEncryption(passphrase.encode())
        if passphrase
        else serialization.NoEncryption()
    )
    target.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption)
    )
    target.chmod(mode)
    return target


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port where nobody answers: a refused key must not even connect to it."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.setblocking(False)
        yield sock


def nobody_connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


async def listing(target: SftpTarget, key: Path, passphrase: str | None = None) -> list[str]:
    """The remote directory, listed over a session opened with ``key`` (in a thread: the asyncssh server
    runs on this event loop)."""

    def list_it() -> list[str]:
        opened = connect(target.destination(credential_ref=str(key)), passphrase=passphrase)
        try:
            return opened.sftp.listdir(target.remote_dir)
        finally:
            opened.close()

    return await asyncio.to_thread(list_it)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o606], ids=oct)
def test_a_key_open_to_group_or_others_is_refused_before_any_connection(
    sftp_target: SftpTarget, tmp_path: Path, listener: socket.socket, mode: int
) -> None:
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", mode)
    destination = sftp_target.destination(credential_ref=str(key), port=listener.getsockname()[1])
    with pytest.raises(ConnectRefused) as caught:
        connect(destination)
    assert caught.value.code == "CredentialTooOpen"
    assert f"{mode:04o}" in str(caught.value)
    assert nobody_connected(listener)


async def test_a_delivery_with_an_open_key_sends_nothing_and_says_so(
    sftp_target: SftpTarget, tmp_path: Path
) -> None:
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", 0o644)
    run = await run_delivery(
        sftp_target.destination(credential_ref=str(key)), local_file(tmp_path, b"x" * 1000)
    )
    assert run.report.failure_code == FailureCode.NOT_DELIVERED
    assert run.one("connect")["code"] == "CredentialTooOpen"
    assert "nothing was sent" in run.report.summary
    assert sftp_target.files() == {}


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=oct)
async def test_a_private_key_only_its_owner_can_read_connects(
    sftp_target: SftpTarget, tmp_path: Path, mode: int
) -> None:
    sftp_target.put("seen.txt", b"hello")
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", mode)
    assert await listing(sftp_target, key) == ["seen.txt"]


async def test_an_encrypted_key_opens_with_the_passphrase_setting(
    sftp_target: SftpTarget, tmp_path: Path
) -> None:
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", 0o600, PASSPHRASE)
    assert b"OPENSSH PRIVATE KEY" in key.read_bytes()
    settings = Settings(sftp_key_passphrase=PASSPHRASE)
    value = settings.sftp_key_passphrase.get_secret_value() if settings.sftp_key_passphrase else None
    assert await listing(sftp_target, key, passphrase_from(value, settings.sftp_key_passphrase_file)) == []


async def test_an_encrypted_key_opens_with_the_passphrase_from_a_secrets_file(
    sftp_target: SftpTarget, tmp_path: Path
) -> None:
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", 0o600, PASSPHRASE)
    secret = tmp_path / "sftp-passphrase"
    secret.write_text(PASSPHRASE + "\n")
    settings = Settings(sftp_key_passphrase_file=secret)
    # What worker.py does at start: the process's passphrase, used by every connection.
    set_key_passphrase(passphrase_from(None, settings.sftp_key_passphrase_file))
    try:
        assert await listing(sftp_target, key) == []
    finally:
        set_key_passphrase(None)


@pytest.mark.parametrize("given", [None, "not the passphrase"], ids=["no passphrase", "wrong passphrase"])
def test_an_encrypted_key_without_its_passphrase_is_refused_before_any_connection(
    sftp_target: SftpTarget, tmp_path: Path, listener: socket.socket, given: str | None
) -> None:
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", 0o600, PASSPHRASE)
    destination = sftp_target.destination(credential_ref=str(key), port=listener.getsockname()[1])
    with pytest.raises(ConnectRefused) as caught:
        connect(destination, passphrase=given)
    assert caught.value.code == "CredentialLocked"
    assert PASSPHRASE not in str(caught.value) and (given is None or given not in str(caught.value))
    assert nobody_connected(listener)


def test_a_server_that_never_answers_is_a_refused_connection_not_an_unknown(
    sftp_target: SftpTarget, listener: socket.socket
) -> None:
    destination = sftp_target.destination(port=listener.getsockname()[1])  # accepted, never answered
    with pytest.raises(ConnectRefused) as caught:
        connect(destination, timeout=1.0)
    assert caught.value.code == "HandshakeFailed"


def test_a_missing_or_unusable_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConnectRefused) as caught:
        load_private_key(tmp_path / "absent", None)
    assert caught.value.code == "CredentialUnavailable"
    junk = tmp_path / "junk"
    junk.write_text("not a key\n")
    junk.chmod(0o600)
    with pytest.raises(ConnectRefused) as caught:
        load_private_key(junk, None)
    assert caught.value.code == "CredentialUnavailable"


async def test_neither_the_passphrase_nor_the_key_reaches_a_log_an_error_or_the_evidence(
    sftp_target: SftpTarget, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # paramiko's debug log included
    key = key_copy(sftp_target.client_key_path, tmp_path / "id", 0o600, PASSPHRASE)
    key_lines = [line for line in key.read_text().splitlines() if "PRIVATE KEY" not in line]
    set_key_passphrase(PASSPHRASE)
    try:
        delivered = await run_delivery(
            sftp_target.destination(credential_ref=str(key)), local_file(tmp_path, b"y")
        )
    finally:
        set_key_passphrase(None)
    refused = await run_delivery(sftp_target.destination(credential_ref=str(key)), local_file(tmp_path, b"z"))
    assert delivered.report.outcome.value == "Completed"
    assert refused.one("connect")["code"] == "CredentialLocked"
    seen = caplog.text + repr(delivered.evidence) + repr(refused.evidence) + repr(refused.report)
    seen += (
        repr(Settings(sftp_key_passphrase=PASSPHRASE))
        + Settings(sftp_key_passphrase=PASSPHRASE).model_dump_json()
    )
    assert PASSPHRASE not in seen
    assert not [line for line in key_lines if line in seen]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("both", "give the key passphrase once"),
        ("missing file", "cannot read the passphrase file"),
        ("empty file", "is empty"),
    ],
)
def test_worker_refuses_a_bad_passphrase_setting_in_one_line(
    tmp_path: Path, case: str, expected: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    env = {**os.environ, "EXPORTS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    env.update(
        {
            "both": {
                "EXPORTS_SFTP_KEY_PASSPHRASE": PASSPHRASE,
                "EXPORTS_SFTP_KEY_PASSPHRASE_FILE": str(empty),
            },
            "missing file": {"EXPORTS_SFTP_KEY_PASSPHRASE_FILE": str(tmp_path / "absent")},
            "empty file": {"EXPORTS_SFTP_KEY_PASSPHRASE_FILE": str(empty)},
        }[case]
    )
    done = subprocess.run(
        [sys.executable, "worker.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker.py: EXPORTS_SFTP_KEY_PASSPHRASE_FILE: ")
    assert expected in lines[0] and PASSPHRASE not in done.stderr

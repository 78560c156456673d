"""The connection test without trust on first use (issue #24.3) and several pinned keys (issue #24.4), against
both real servers (the asyncssh one and OpenSSH sshd).

- The test reports the host key the server presented, its SHA256 fingerprint, and whether it is pinned; it
  never pins anything, and offers our login only to a server whose key is pinned (an unpinned server never
  gets as far as our key being read).
- With the key pinned: the login's result, whether remote_dir lists and takes a new file (a temporary name,
  created and removed), posix-rename support and the write limit the server announces.
- A session opens when the presented key matches any pinned key, and is refused, with the presented key's
  fingerprint, when it matches none.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncssh
import pytest

from db.embedded import free_port
from domain.destination import host_key_fingerprint
from partner.client import CONNECTION_TEST_PREFIX, ConnectRefused, connect, open_verified, probe
from testbed.sftp import SftpTarget


def another_key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()


async def test_a_server_whose_key_is_pinned_is_reported_with_its_login_directory_and_extensions(sftp_target):
    destination = sftp_target.destination()

    report = await asyncio.to_thread(probe, destination)

    assert report.connected and report.error is None
    assert report.host_key == " ".join(sftp_target.host_key_line.split()[:2])
    assert report.host_key_fingerprint == host_key_fingerprint(sftp_target.host_key_line)
    assert report.pinned is True and report.pinned_fingerprints == [report.host_key_fingerprint]
    assert report.authentication == "accepted"
    assert (report.remote_dir_listable, report.remote_dir_writable) == (True, True)
    assert report.posix_rename is True and "posix-rename@openssh.com" in report.extensions
    if sftp_target.kind == "sshd":
        assert report.max_write_length == 261120  # OpenSSH's limit (limits@openssh.com)
    assert not [p for p in sftp_target.local_dir.iterdir() if p.name.startswith(CONNECTION_TEST_PREFIX)]


async def test_a_server_whose_key_is_not_pinned_is_reported_and_never_offered_our_login(sftp_target):
    # The key file does not exist: a test that tried our login would have to read it first.
    destination = sftp_target.destination(host_key=another_key(), credential_ref="/nonexistent/never-read")

    report = await asyncio.to_thread(probe, destination)

    assert report.connected and report.pinned is False
    assert report.host_key_fingerprint == host_key_fingerprint(sftp_target.host_key_line)
    assert report.pinned_fingerprints == [host_key_fingerprint(destination.host_key)]
    assert (report.authentication, report.error) == ("not_tried", "HostKeyNotPinned")
    assert report.remote_dir_writable is None and report.posix_rename is None
    assert destination.pinned_keys == (destination.host_key,)  # nothing pinned by the test


async def test_a_server_that_refuses_our_login_is_reported_refused(sftp_target, tmp_path):
    stranger = tmp_path / "stranger"  # a key the partner never authorized
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    stranger.chmod(0o600)

    report = await asyncio.to_thread(probe, sftp_target.destination(credential_ref=str(stranger)))

    assert report.pinned is True
    assert (report.authentication, report.error) == ("refused", "AuthRefused")


async def test_an_unreachable_server_is_reported_unreachable(sftp_target):
    report = await asyncio.to_thread(probe, sftp_target.destination(port=free_port()))

    assert not report.connected and report.error is not None and report.error.startswith("Unreachable")


@pytest.mark.sshd
async def test_a_directory_the_account_may_not_write_is_reported_not_writable(sshd_target: SftpTarget):
    closed = sshd_target.local_dir / "closed"
    closed.mkdir()
    os.chown(closed, 0, 0)  # root's: the partner account may list it, not write to it
    closed.chmod(0o755)

    report = await asyncio.to_thread(probe, sshd_target.destination(remote_dir=str(closed)))

    assert report.authentication == "accepted" and report.remote_dir_listable is True
    assert report.remote_dir_writable is False and report.remote_dir_status == 3  # permission denied
    assert list(closed.iterdir()) == []


async def test_a_session_opens_when_the_presented_key_is_any_of_the_pinned_ones(sftp_target):
    destination = sftp_target.destination(host_keys=(another_key(), sftp_target.host_key_line))

    opened = await asyncio.to_thread(open_verified, destination)
    try:
        assert opened.host_key_fingerprint == host_key_fingerprint(sftp_target.host_key_line)
    finally:
        await asyncio.to_thread(opened.close)


async def test_a_key_that_matches_none_of_the_pinned_ones_is_refused_with_the_presented_fingerprint(
    sftp_target,
):
    destination = sftp_target.destination(host_key=another_key(), host_keys=(another_key(), another_key()))

    with pytest.raises(ConnectRefused) as refused:
        await asyncio.to_thread(connect, destination)

    assert refused.value.code == "HostKeyMismatch"
    assert refused.value.presented == host_key_fingerprint(sftp_target.host_key_line)


async def test_a_verified_session_opens_the_remote_directory_or_is_refused(sftp_target):
    opened = await asyncio.to_thread(open_verified, sftp_target.destination())
    try:
        assert opened.alive()
    finally:
        await asyncio.to_thread(opened.close)
    assert not opened.alive()

    with pytest.raises(ConnectRefused) as refused:
        missing = sftp_target.destination(remote_dir=str(Path(sftp_target.remote_dir) / "missing"))
        await asyncio.to_thread(open_verified, missing)
    assert refused.value.code == "RemoteDirRefused"

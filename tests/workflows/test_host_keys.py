"""Pinned host keys on a real OpenSSH sshd, through ExportWorkflow on the real Temporal test server and real
PostgreSQL (issue #24.4). The sshd is this module's own, so it can be restarted with another host key.

- A host-key swap: the session opened before cutoff 2 meets a key none of the pinned ones match. Nothing is
  sent, the presented fingerprint is recorded, the destination's switch is paused with "host key changed:
  presented SHA256:...", and the export goes back to Queued without using an attempt. While paused it stays
  Queued; after an admin pins the new key and an operator resumes, it is delivered, with no replacement.
- A login the server refuses is treated the same way ("authentication refused: ...").
- A rotation overlaps: with the new key pinned beside the old one, deliveries go on before and after the
  partner switches keys; then the old key is removed. Each is a recorded version.
- After cutoff 2 the upload uses the session verified before it; when that one died meanwhile, the new one's
  key is checked again, and a key that matches none sends nothing: Failed NotDelivered, with the evidence.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from domain.destination import host_key_fingerprint
from domain.models import EventKind, FailureCode, JobStatus
from service.auth import Caller
from service.destinations import Destinations, PinHostKey, UnpinHostKey
from service.exports import Exports
from service.outcomes import Kind
from service.switches import DestinationResume, Operator, Switches
from testbed.sftp import Sshd, TcpProxy, sshd_available
from tests.workflows.harness import Harness, SftpTarget
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="module")
def own_sshd() -> Iterator[Sshd]:
    """This module's sshd: its host key is swapped by the tests."""
    from tests.conftest import require

    require(sshd_available(), "OpenSSH sshd (/usr/sbin/sshd, run as root)")
    server = Sshd.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def module_sftp_target(own_sshd: Sshd) -> Iterator[SftpTarget]:
    """The harness's directory on this module's sshd, behind a proxy (which can cut a kept session)."""
    local_dir = own_sshd.make_upload_dir()
    proxy = TcpProxy(own_sshd.host, own_sshd.port)
    yield SftpTarget(
        kind="sshd",
        host_key_line=own_sshd.host_key_line,
        client_key_path=own_sshd.client_key_path,
        remote_dir=str(local_dir),
        local_dir=local_dir,
        proxy=proxy,
        server_port=own_sshd.port,
    )
    proxy.close()


@pytest.fixture
def sshd_key(own_sshd: Sshd) -> Iterator[str]:
    """The key the sshd serves when a test starts; each test leaves it serving a new one."""
    yield own_sshd.host_key_line


def admin(tenant_id: uuid.UUID) -> Caller:
    return Caller(tenant_id=tenant_id, principal="ada.admin", role="admin")


async def queue_pinned_to(harness: Harness, key: str, contacts: int = 20, **destination: Any):
    """An enabled destination on the module's sshd pinning ``key``, its admin, and a queued export to it."""
    tenant_id = await harness.factory.tenant()
    destination_id = await harness.destination(
        tenant_id, host_key=key, max_write_request=261120, **destination
    )
    await harness.factory.principal(tenant_id, "ada.admin", "admin")
    await harness.add_contacts(tenant_id, "main", contacts)
    return await harness.factory.queued(tenant_id, destination_id, list_name="main")


async def evidence(harness: Harness, job_id: uuid.UUID) -> list[dict[str, Any]]:
    events = await harness.factory.worker.job_events(job_id)
    return [json.loads(e.detail or "{}") for e in events if e.kind == EventKind.DELIVERY_EVIDENCE]


async def destination_switch(harness: Harness, destination_id: uuid.UUID) -> dict[str, Any]:
    """The destination's switch as the gate reads it (on, and held by no pause), and its latest reason."""
    [row] = await harness.factory.admin(
        "SELECT enabled AND NOT coalesce(held_until > clock_timestamp(), false) AS enabled, reason, changed_by"
        " FROM delivery_switches WHERE scope = 'destination' AND destination_id = %(d)s",
        {"d": destination_id},
    )
    return row


async def pin(harness: Harness, job, key: str, version: int) -> None:
    """An admin pins ``key``; trusting a new key takes a second admin (issue #26.3), who approves it."""
    exports = Exports(harness.factory.api)
    asked = await Destinations(exports.store, approvals=exports.approvals).pin_key(
        admin(job.tenant_id),
        job.destination_id,
        PinHostKey(key=key, reason="fingerprint confirmed with the partner by phone"),
        f'"{version}"',
    )
    assert asked.kind == Kind.ACCEPTED, asked.body
    await harness.factory.principal(job.tenant_id, "ann.admin", "admin")
    second = Caller(tenant_id=job.tenant_id, principal="ann.admin", role="admin")
    answer = await exports.approvals.approve(second, uuid.UUID(asked.body["approval"]["id"]))
    assert answer.ok and answer.body["delivery_changed"] is True, answer.body


async def resume(harness: Harness, job) -> None:
    """An operator asks to release the worker's pause (it names it: another's pause is released only so), and
    another operator approves: a pause a changed host key tripped takes two people (issue #26.3)."""
    exports = Exports(harness.factory.api)
    [pause] = await harness.factory.admin(
        "SELECT id FROM delivery_pauses WHERE destination_id = %(d)s AND released_at IS NULL",
        {"d": job.destination_id},
    )
    for name in ("sam.ops", "rita.ops"):
        await harness.factory.principal(job.tenant_id, name, "operator")
    asked = await Switches(exports.store, approvals=exports.approvals).resume(
        Operator(principal="sam.ops", tenant_id=job.tenant_id),
        DestinationResume(
            scope="destination",
            destination_id=job.destination_id,
            reason="new key pinned",
            pause_id=pause["id"],
        ),
    )
    assert asked.kind == Kind.ACCEPTED, asked.body
    second = Caller(tenant_id=job.tenant_id, principal="rita.ops", role="operator")
    answer = await exports.approvals.approve(second, uuid.UUID(asked.body["approval"]["id"]))
    assert answer.ok, answer.body


async def test_a_host_key_swap_sends_nothing_pauses_the_destination_and_delivers_after_pin_and_resume(
    harness: Harness, own_sshd: Sshd, sshd_key: str
) -> None:
    job = await queue_pinned_to(harness, sshd_key)
    new_key = own_sshd.restart_with_new_host_key()
    presented = host_key_fingerprint(new_key)

    first = await harness.run(job)

    assert first.outcome == AttemptOutcome.RELEASED and first.cutoff_answers == []
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempts_released, row.transient_releases) == (
        JobStatus.QUEUED,
        None,
        1,
        0,  # not counted: no attempt was used
    )
    assert row.available_at is None and row.delivery_authorized_at is None
    kinds = await harness.factory.event_kinds(job.id)
    assert EventKind.DELIVERY_AUTHORIZED not in kinds and EventKind.UPLOAD_FENCED not in kinds
    [refused] = [e for e in await evidence(harness, job.id) if e.get("observation") == "connect"]
    assert (refused["result"], refused["code"], refused["presented"], refused["phase"]) == (
        "refused",
        "HostKeyMismatch",
        presented,
        "before cutoff 2",
    )
    reason = f"host key changed: presented {presented}"
    switch = await destination_switch(harness, job.destination_id)
    assert switch["enabled"] is False and switch["reason"] == reason
    assert switch["changed_by"] == f"worker {harness.host.name}"
    [history] = await harness.factory.admin(
        "SELECT was_enabled, enabled, reason FROM delivery_switch_changes WHERE destination_id = %(d)s"
        " ORDER BY id DESC LIMIT 1",
        {"d": job.destination_id},
    )
    assert history == {"was_enabled": True, "enabled": False, "reason": reason}
    [released] = [e for e in await harness.factory.worker.job_events(job.id) if e.kind == EventKind.RELEASED]
    assert released.detail is not None and released.detail.startswith(f"paused: {reason}")
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []  # nothing was sent

    # The release's wake-up, while paused: the export stays Queued, nothing claimed.
    assert (await harness.run(job)).outcome == AttemptOutcome.PAUSED
    assert (await harness.factory.job(job.id)).attempt_count == row.attempt_count

    await pin(harness, job, new_key, version=1)
    await resume(harness, job)
    delivered = await harness.run(job)

    assert delivered.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.replaces_job_id) == (JobStatus.COMPLETED, 2, None)
    assert [p.name for p in harness.uploads(job)] == [row.expected_file_name]
    connects = [e for e in await evidence(harness, job.id) if e.get("observation") == "connect"]
    assert connects[-1]["result"] == "ok" and connects[-1]["host_key"] == presented
    assert connects[-1]["session"] == "verified before cutoff 2"  # the upload used the session verified
    replacements = await harness.factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %(j)s", {"j": job.id}
    )
    assert replacements == [{"n": 0}]


async def test_a_login_the_server_refuses_pauses_the_destination_the_same_way(
    harness: Harness, own_sshd: Sshd, sshd_key: str, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger_ed25519"  # a key the partner never authorized
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    stranger.chmod(0o600)
    job = await queue_pinned_to(harness, sshd_key, credential_ref=str(stranger))

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.RELEASED and result.cutoff_answers == []
    row = await harness.factory.job(job.id)
    assert (row.status, row.transient_releases) == (JobStatus.QUEUED, 0)
    [refused] = [e for e in await evidence(harness, job.id) if e.get("observation") == "connect"]
    assert (refused["code"], refused["presented"]) == ("AuthRefused", host_key_fingerprint(sshd_key))
    switch = await destination_switch(harness, job.destination_id)
    assert switch["enabled"] is False
    assert switch["reason"] == f"authentication refused: partner at 127.0.0.1:{harness.sftp.port}"
    assert harness.partner_files(job) == []


async def test_a_rotation_overlaps_both_keys_deliver_then_the_old_one_is_removed(
    harness: Harness, own_sshd: Sshd, sshd_key: str
) -> None:
    old = sshd_key
    job = await queue_pinned_to(harness, old)
    upcoming = _new_key_line()  # the partner announces its next key before it switches to it

    await pin(harness, job, upcoming, version=1)  # version 2: both trusted
    assert (await harness.run(job)).outcome == AttemptOutcome.COMPLETED  # the server still serves the old key

    second = await harness.factory.queued(job.tenant_id, job.destination_id, list_name="main")
    new = own_sshd.restart_with_new_host_key()
    await pin(harness, job, new, version=2)  # version 3: the key actually served (its fingerprint checked)
    assert (await harness.run(second)).outcome == AttemptOutcome.COMPLETED  # the new key, still overlapping

    removed = await Destinations(harness.factory.api).unpin_key(
        admin(job.tenant_id),
        job.destination_id,
        UnpinHostKey(fingerprint=str(host_key_fingerprint(old)), reason="the partner retired its old key"),
        '"3"',
    )
    assert removed.ok, removed.body
    shown = await Destinations(harness.factory.api).show(admin(job.tenant_id), job.destination_id)
    assert [k["key"] for k in shown.body["destination"]["pinned_host_keys"]] == [upcoming, new]
    assert [(v["version"], v["change"]) for v in shown.body["versions"]] == [
        (4, "edited"),
        (3, "edited"),
        (2, "edited"),
    ]
    assert [v["changes"][0]["field"] for v in shown.body["versions"]] == [
        "host_key",
        "host_keys",
        "host_keys",
    ]
    third = await harness.factory.queued(job.tenant_id, job.destination_id, list_name="main")
    assert (await harness.run(third)).outcome == AttemptOutcome.COMPLETED
    switch = await destination_switch(harness, job.destination_id)
    assert switch["enabled"] is True  # never paused through the rotation

    last = await Destinations(harness.factory.api).unpin_key(
        admin(job.tenant_id),
        job.destination_id,
        UnpinHostKey(fingerprint=str(host_key_fingerprint(upcoming)), reason="never used"),
        '"4"',
    )
    assert last.ok
    refused = await Destinations(harness.factory.api).unpin_key(
        admin(job.tenant_id),
        job.destination_id,
        UnpinHostKey(fingerprint=str(host_key_fingerprint(new)), reason="oops"),
        '"5"',
    )
    assert refused.kind.value == "invalid" and "at least one pinned host key" in refused.text


async def test_a_kept_session_lost_after_cutoff_2_is_replaced_and_a_key_matching_none_then_sends_nothing(
    harness: Harness, own_sshd: Sshd, sshd_key: str
) -> None:
    job = await queue_pinned_to(harness, sshd_key, port=harness.sftp.proxy.port)  # through the proxy

    async def the_partner_reinstalls_its_server(job_id: uuid.UUID) -> None:
        harness.sftp.proxy.cut()  # the session verified before cutoff 2 dies
        own_sshd.restart_with_new_host_key()

    harness.host.activities.seams.before_upload = the_partner_reinstalls_its_server
    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.FAILED and result.failure_code == FailureCode.NOT_DELIVERED
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    seen = await evidence(harness, job.id)
    connects = [e for e in seen if e.get("observation") == "connect"]
    assert connects[-1]["result"] == "refused" and connects[-1]["code"] == "HostKeyMismatch"
    assert connects[-1]["presented"] == host_key_fingerprint(own_sshd.host_key_line)
    assert [e["rename_sent"] for e in seen if e.get("observation") == "outcome"] == [False]
    assert harness.partner_files(job) == []  # not even a temporary file


def _new_key_line() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()

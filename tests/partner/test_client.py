"""The partner client's connection rules and its seams with the rest: pinned keys, refusals before any
file operation, the per-file request size, recovery's observation, the destination row, and evidence
stored through the job store."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from typing import Any

import asyncssh
import paramiko
import pytest

from db.embedded import free_port
from db.errors import DestinationNotFound
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.destination import Destination
from domain.models import DeliveryOutcome, EventKind, FailureCode, JobStatus
from partner.client import ConnectRefused, connect, parse_pinned_key, upload_exclusive
from partner.delivery import (
    CONNECT_TRIES,
    DeliveryHooks,
    OriginalFile,
    deliver,
    observe_final_name,
)
from testbed.sftp import SftpTarget, TcpProxy
from tests.partner.helpers import contact_bytes, local_file, run_delivery
from tests.support.factories import Factory


def test_a_pinned_key_may_be_given_as_a_known_hosts_line():
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    assert parse_pinned_key(f"[127.0.0.1]:2222 {key}").asbytes() == parse_pinned_key(key).asbytes()


def test_an_unusable_pinned_key_refuses_to_connect():
    with pytest.raises(ConnectRefused) as caught:
        parse_pinned_key("ssh-ed25519 not-base64!")
    assert caught.value.code == "HostKeyUnusable"


async def test_an_unreachable_partner_is_not_delivered(sftp_target: SftpTarget, tmp_path):
    run = await run_delivery(
        sftp_target.destination(port=free_port()), local_file(tmp_path, contact_bytes(1000))
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    connects = [e for e in run.evidence if e["observation"] == "connect"]
    assert [e["result"] for e in connects] == ["retry"] * (CONNECT_TRIES - 1) + ["refused"]
    assert {e["code"] for e in connects} <= {"Unreachable", "HandshakeFailed"}


async def test_a_partner_that_refuses_connections_for_a_moment_is_asked_again_and_delivered(
    sftp_target: SftpTarget, tmp_path
):
    # The soak's cut links ended 63 of 2000 exports Failed NotDelivered that a second connect would deliver.
    data = contact_bytes(1000)
    file = local_file(tmp_path, data)
    sftp_target.proxy.close()  # nothing listens at the partner's address now
    port = sftp_target.proxy.port
    reopened: list[TcpProxy] = []

    def listen_again(observation: dict[str, Any]) -> None:
        # The first connect was refused and recorded; the partner is back before the pause ends.
        retry = observation["observation"] == "connect" and observation.get("result") == "retry"
        if retry and not reopened:
            reopened.append(TcpProxy(*sftp_target.proxy.target, port=port))

    try:
        run = await run_delivery(sftp_target.destination(), file, on_evidence=listen_again)
    finally:
        for proxy in reopened:
            proxy.close()

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    results = [e["result"] for e in run.evidence if e["observation"] == "connect"]
    assert results[0] == "retry" and results[-1] == "ok"
    assert sftp_target.files() == {file.final_name: data}


def cut_the_baseline_listing(target: SftpTarget, times: int):
    """An ``on_evidence`` seam: on each of the first ``times`` sessions, the request right after the connect
    (the baseline listing) is dropped and the link cut, at the proxy."""
    cuts: list[int] = []

    def on_evidence(observation: dict[str, Any]) -> None:
        if (
            observation["observation"] == "connect"
            and observation.get("result") == "ok"
            and len(cuts) < times
        ):
            cuts.append(1)
            target.proxy.cut_before_next_request()

    return on_evidence, cuts


async def test_a_session_lost_at_the_baseline_listing_is_opened_again_and_delivered(
    sftp_target: SftpTarget, tmp_path
):
    # The 1,000-export soak ended 5 exports Failed NotDelivered at a baseline listing cut by a partner link
    # fault: nothing had been uploaded, so a new session is as good as the first.
    data = contact_bytes(1000)
    file = local_file(tmp_path, data)
    on_evidence, cuts = cut_the_baseline_listing(sftp_target, times=1)

    run = await run_delivery(sftp_target.destination(), file, on_evidence=on_evidence)

    assert cuts and sftp_target.proxy.request_dropped.is_set()
    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.kinds()[:4] == ["connect", "interrupted", "connect", "baseline"]
    assert run.evidence[1]["phase"] == "baseline"
    assert run.kinds().count("upload") == 1  # one upload: nothing was sent on the lost session
    assert sftp_target.files() == {file.final_name: data}


@pytest.mark.slow
async def test_connects_not_answered_and_a_session_lost_at_the_baseline_have_budgets_of_their_own(
    sftp_target: SftpTarget, tmp_path
):
    # The soak's pattern: two partner cuts a few seconds apart. The connects are not answered twice, then the
    # session that opens is cut at its baseline listing; one more session delivers.
    data = contact_bytes(1000)
    file = local_file(tmp_path, data)
    sftp_target.proxy.close()  # nothing listens at the partner's address now
    port = sftp_target.proxy.port
    seen = {"retry": 0, "ok": 0}
    back: list[TcpProxy] = []

    def flapping_partner(observation: dict[str, Any]) -> None:
        if observation["observation"] != "connect" or observation.get("result") not in seen:
            return
        seen[observation["result"]] += 1
        if seen["retry"] == CONNECT_TRIES - 1 and not back:
            back.append(TcpProxy(*sftp_target.proxy.target, port=port))  # back for the last connect
        if observation["result"] == "ok" and seen["ok"] == 1:
            back[0].cut_before_next_request()  # and cut again at the first session's baseline listing

    try:
        run = await run_delivery(sftp_target.destination(), file, on_evidence=flapping_partner)
    finally:
        for proxy in back:
            proxy.close()

    assert run.report.outcome == DeliveryOutcome.COMPLETED, run.report.summary
    connects = [e["result"] for e in run.evidence if e["observation"] == "connect"]
    assert connects == ["retry"] * (CONNECT_TRIES - 1) + ["ok", "ok"]
    assert [e["phase"] for e in run.evidence if e["observation"] == "interrupted"] == ["baseline"]
    assert sftp_target.files() == {file.final_name: data}


async def test_a_baseline_listing_lost_on_every_session_is_not_delivered_and_nothing_is_sent(
    sftp_target: SftpTarget, tmp_path
):
    on_evidence, cuts = cut_the_baseline_listing(sftp_target, times=CONNECT_TRIES)

    run = await run_delivery(
        sftp_target.destination(), local_file(tmp_path, contact_bytes(1000)), on_evidence=on_evidence
    )

    assert len(cuts) == CONNECT_TRIES
    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    assert run.report.summary == (
        f"the session was lost at the baseline listing {CONNECT_TRIES} times; nothing was uploaded"
    )
    assert run.kinds().count("interrupted") == CONNECT_TRIES and "upload" not in run.kinds()
    assert sftp_target.files() == {}


async def test_a_client_key_the_partner_does_not_know_is_refused_before_any_file_operation(
    sftp_target: SftpTarget, tmp_path
):
    stranger = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(stranger, "openssh")
    stranger.chmod(0o600)  # a key open to others is refused before connecting (tests/ops/test_sftp_keys.py)
    run = await run_delivery(
        sftp_target.destination(credential_ref=str(stranger)), local_file(tmp_path, b"x")
    )

    assert run.report.failure_code == FailureCode.NOT_DELIVERED
    assert run.one("connect")["code"] == "AuthRefused"
    assert sftp_target.files() == {}


async def test_the_write_request_size_is_set_on_the_file_object_only(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes(700_000)
    file = local_file(tmp_path, data)
    destination = sftp_target.destination(max_write_request=65536)
    sizes: list[int] = []

    def upload() -> None:
        opened = connect(destination)
        try:
            upload_exclusive(
                opened.sftp,
                file.path,
                destination.remote_path(file.final_name),
                write_request=destination.max_write_request,
                after_write=sizes.append,
            )
        finally:
            opened.close()

    await asyncio.to_thread(upload)

    assert sizes[0] == 65536 and sizes[-1] == len(data)
    assert paramiko.SFTPFile.MAX_REQUEST_SIZE == 32768  # paramiko's class is untouched
    assert sftp_target.files() == {file.final_name: data}


async def test_an_existing_temporary_file_is_never_reused(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes(1000)
    file = local_file(tmp_path, data)
    attempt_id = uuid.uuid4()
    stale = f".partial-{attempt_id}-{file.final_name}"
    sftp_target.put(stale, b"left by an interrupted attempt")

    run = await run_delivery(sftp_target.destination(), file, attempt_id=attempt_id)

    # The exclusive open is refused and the final name is unchanged: provably not delivered.
    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    assert run.one("upload")["result"] == "refused"
    assert sftp_target.files() == {stale: b"left by an interrupted attempt"}


@pytest.mark.parametrize("contract", ["none", "read_back", "ack_file"])
async def test_recovery_observes_what_the_contract_offers(sftp_target: SftpTarget, contract: str):
    data = contact_bytes(5000)
    sftp_target.put("contacts-k.csv", data)
    ack = {
        "name": "contacts-k.csv",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "upload": None,
    }
    sftp_target.put("contacts-k.csv.ack", json.dumps(ack).encode())
    destination = sftp_target.destination(
        hash_evidence=contract, ack_suffix=".ack" if contract == "ack_file" else None
    )

    seen = await asyncio.to_thread(observe_final_name, destination, "contacts-k.csv")
    missing = await asyncio.to_thread(observe_final_name, destination, "contacts-absent.csv")

    assert (seen.present, seen.size) == (True, len(data))
    assert seen.sha256 == (hashlib.sha256(data).digest() if contract == "read_back" else None)
    assert seen.ack == (ack if contract == "ack_file" else None)
    assert missing.present is False


async def test_load_destination_reads_the_tenants_row(factory: Factory, worker_store: WorkerStore):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(
        tenant_id, hash_evidence="ack_file", ack_suffix=".done", max_write_request=261120
    )

    loaded = await worker_store.load_destination(tenant_id, destination_id)

    assert (loaded.id, loaded.tenant_id, loaded.hash_evidence, loaded.ack_suffix) == (
        destination_id,
        tenant_id,
        "ack_file",
        ".done",
    )
    assert loaded.max_write_request == 261120
    with pytest.raises(DestinationNotFound):
        await worker_store.load_destination(await factory.tenant(), destination_id)


async def test_a_replacements_evidence_is_stored_and_the_originals_outcome_is_untouched(
    sftp_target: SftpTarget, factory: Factory, api_store: ApiStore, worker_store: WorkerStore, tmp_path
):
    original_job, original_attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    created = await api_store.create_replacement(
        tenant_id=original_job.tenant_id,
        original_job_id=original_job.id,
        created_by="sam.ops",
        replacement_reason="partner lost the file",
    )
    assert created is not None
    events_before = await factory.event_kinds(original_job.id)
    file = local_file(tmp_path, contact_bytes(1234), final_name=original_job.final_name)
    stranger = contact_bytes(1234)  # the original's expected size, but not tied to it
    sftp_target.put(file.final_name, stranger)
    original = OriginalFile(
        name=original_job.final_name,
        size=original_job.expected_file_bytes,
        sha256=original_job.expected_file_sha256,
        attempt_id=original_attempt,
    )
    attempt_id = uuid.uuid4()
    loop = asyncio.get_running_loop()

    def store_evidence(evidence: dict) -> None:
        # The delivering thread hands each observation to the event loop's store as it is made.
        asyncio.run_coroutine_threadsafe(
            worker_store.append_delivery_evidence(created.job_id, attempt_id, "worker-7/attempt", evidence),
            loop,
        ).result()

    report = await asyncio.to_thread(
        deliver,
        sftp_target.destination(),
        file,
        attempt_id,
        original=original,
        overwrite_agreed=False,
        on_evidence=store_evidence,
    )

    assert report.failure_code == FailureCode.FINAL_NAME_OCCUPIED
    stored = [
        e for e in await worker_store.job_events(created.job_id) if e.kind == EventKind.DELIVERY_EVIDENCE
    ]
    assert [json.loads(e.detail)["observation"] for e in stored] == [
        "connect",
        "baseline",
        "final_name_occupied",
        "outcome",
    ]
    assert {(e.attempt_id, e.observed_by) for e in stored} == {(attempt_id, "worker-7/attempt")}
    assert await factory.status(original_job.id) == JobStatus.OUTCOME_UNKNOWN  # nobody corrects it on that
    assert await factory.event_kinds(original_job.id) == events_before
    assert sftp_target.files() == {file.final_name: stranger}


@pytest.mark.sshd
@pytest.mark.parametrize("round_", range(5))
async def test_two_uploads_racing_for_one_final_name_never_overwrite(
    sshd_target: SftpTarget, tmp_path, round_
):
    """Race test on the real sshd only (its rename is link+unlink; asyncssh's is check-then-act)."""
    first, second = contact_bytes(300_000), contact_bytes(300_000)
    name = f"contacts-{uuid.uuid4()}.csv"
    files = []
    for i, data in enumerate((first, second)):
        (tmp_path / str(i)).mkdir()
        files.append(local_file(tmp_path / str(i), data, final_name=name))
    both_ready = threading.Barrier(2, timeout=20)
    destination = sshd_target.destination(direct=True, hash_evidence="read_back")

    def attempt(file) -> object:
        return deliver(
            destination,
            file,
            uuid.uuid4(),
            original=None,
            overwrite_agreed=False,
            on_evidence=lambda e: None,
            hooks=DeliveryHooks(before_rename=both_ready.wait),  # both renames leave together
        )

    reports = await asyncio.gather(*(asyncio.to_thread(attempt, f) for f in files))

    outcomes = sorted(r.outcome.value for r in reports)
    assert outcomes == ["Completed", "OutcomeUnknown"]  # one published, the other was refused
    winner = (first, second)[[r.outcome for r in reports].index(DeliveryOutcome.COMPLETED)]
    assert (sshd_target.local_dir / name).read_bytes() == winner  # whole, never replaced


class _DropsTheFirstLink(asyncssh.SSHServer):
    """A real asyncssh server's own callback, used as the seam: the first connection's link is dropped
    (``conn.abort()``) when its client asks to authenticate; every later connection is served normally."""

    def __init__(self, step: str, dropped: list[str]) -> None:
        self.step, self.dropped = step, dropped
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        if self.step == "auth" and not self.dropped and self.conn is not None:
            self.dropped.append("auth")
            self.conn.abort()
        return True


@pytest.mark.parametrize("step", ["auth", "session"])
async def test_a_link_lost_during_authentication_or_the_session_open_is_tried_again_and_delivered(
    tmp_path, step: str
):
    # 1 in 1,000 exports of each soak ended "no SFTP session opened (SessionRefused)" after a cut link: paramiko
    # reports a link lost in these steps like a refusal, but the transport is no longer up.
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "client_key"
    client_key.write_private_key(key_path, "openssh")
    key_path.chmod(0o600)
    root = tmp_path / "root"
    root.mkdir()
    dropped: list[str] = []

    def sftp_dropping_the_first_session(chan: asyncssh.SSHServerChannel) -> asyncssh.SFTPServer:
        # The session step's seam: the SFTP subsystem the client asked for, the first time, loses its link.
        if step == "session" and not dropped:
            dropped.append("session")
            chan.get_extra_info("connection").abort()
        return asyncssh.SFTPServer(chan, chroot=bytes(root))

    server = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_factory=lambda: _DropsTheFirstLink(step, dropped),
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(
            client_key.export_public_key("openssh").decode()
        ),
        sftp_factory=sftp_dropping_the_first_session,
    )
    try:
        dest = Destination(
            id=uuid.uuid4(),
            tenant_id=uuid.uuid4(),
            name="partner-drops",
            host="127.0.0.1",
            port=server.get_port(),
            username="partner",
            host_key=host_key.export_public_key("openssh").decode().strip(),
            credential_ref=str(key_path),
            remote_dir="/",
        )
        data = contact_bytes(1000)
        file = local_file(tmp_path, data)
        run = await run_delivery(dest, file)
    finally:
        server.close()
        await server.wait_closed()

    assert dropped == [step]
    connects = [e for e in run.evidence if e["observation"] == "connect"]
    assert [(e["result"], e.get("code")) for e in connects] == [("retry", "LinkLost"), ("ok", None)]
    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert (root / file.final_name).read_bytes() == data

"""The seed's test matrix rows "Interrupted uploads, by where they stop" and "Replacement delivery",
against both real servers (in-process asyncssh and OpenSSH sshd). Interruptions are real: a TCP
proxy between client and server is cut from a delivery hook at a named point."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import uuid

import asyncssh
import pytest

from domain.evidence import set_aside_name_for, temp_name_for
from domain.models import DeliveryOutcome, FailureCode
from partner.delivery import READ_BACK_TRIES, DeliveryHooks
from testbed.sftp import SftpTarget, Sshd
from tests.partner.helpers import (
    SIZE,
    assert_no_data_in,
    contact_bytes,
    local_file,
    original_of,
    partner_ack,
    run_delivery,
)

# -- an original, nothing in the way --------------------------------------------------------------------


async def test_original_completes_when_the_new_name_appears_with_its_size(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    run = await run_delivery(sftp_target.destination(), file)

    assert (run.report.outcome, run.report.failure_code) == (DeliveryOutcome.COMPLETED, None)
    assert run.kinds() == ["connect", "baseline", "upload", "rename", "read_back", "outcome"]
    assert run.one("baseline")["present"] is False  # recorded before anything was uploaded
    assert (run.one("rename")["form"], run.one("rename")["result"]) == ("rename", "ok")
    assert run.one("connect")["cipher"] == "aes128-gcm@openssh.com"
    assert sftp_target.files() == {file.final_name: data}  # published, and no temporary file left behind
    assert_no_data_in(run.evidence, data)


async def test_original_completes_on_a_matching_read_back_hash(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    run = await run_delivery(sftp_target.destination(hash_evidence="read_back"), file)

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("read_back")["sha256"] == file.sha256.hex()


async def test_read_back_of_other_bytes_leaves_the_outcome_unknown(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    tampered = contact_bytes()  # same size, other bytes: only the hash can tell

    def partner_rewrites() -> None:
        (sftp_target.local_dir / file.final_name).write_bytes(tampered)

    run = await run_delivery(
        sftp_target.destination(hash_evidence="read_back"),
        file,
        hooks=DeliveryHooks(after_rename=partner_rewrites),
    )
    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.one("read_back")["sha256"] == hashlib.sha256(tampered).hexdigest()


async def test_original_completes_on_the_partners_ack_of_this_upload(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    attempt_id = uuid.uuid4()
    temp = temp_name_for(attempt_id, file.final_name)
    hooks = DeliveryHooks(after_rename=lambda: partner_ack(sftp_target, file.final_name, data, temp))
    run = await run_delivery(
        sftp_target.destination(hash_evidence="ack_file", ack_suffix=".ack"),
        file,
        hooks=hooks,
        attempt_id=attempt_id,
    )

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("ack")["tied"] is True
    assert run.one("ack")["ack"]["upload"] == temp


async def test_an_ack_of_other_bytes_leaves_the_outcome_unknown(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    hooks = DeliveryHooks(
        after_rename=lambda: partner_ack(sftp_target, file.final_name, contact_bytes(), None)
    )
    run = await run_delivery(
        sftp_target.destination(hash_evidence="ack_file", ack_suffix=".ack"), file, hooks=hooks, ack_wait=0.3
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.one("ack")["tied"] is False


# -- interrupted uploads, by where they stop ------------------------------------------------------------


async def test_cut_during_upload_never_renames_and_leaves_an_attributable_prefix(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes(2_000_000)
    file = local_file(tmp_path, data)
    destination = sftp_target.destination()

    def cut_after_first_write(sent: int) -> None:
        if not sftp_target.proxy.cut_done.is_set():
            sftp_target.proxy.cut()

    run = await run_delivery(destination, file, hooks=DeliveryHooks(during_upload=cut_after_first_write))

    # Issue 10: cut before its rename request, the attempt reconnects and a fresh listing still shows the
    # baseline: this attempt provably never wrote the final name, so Failed NotDelivered, not unknown.
    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    interrupted = run.one("interrupted")
    assert (interrupted["phase"], interrupted["rename_sent"]) == ("upload", False)
    assert "rename" not in run.kinds()  # the rename was never sent
    fresh = run.one("fresh_listing")
    assert fresh["present"] is False and run.one("baseline")["present"] is False
    files = sftp_target.files()
    assert file.final_name not in files  # and the final name was never written
    temp = temp_name_for(run.attempt_id, file.final_name)
    assert set(files) == {temp}  # the partial file names its attempt
    assert data.startswith(files[temp]) and len(files[temp]) < len(data)


async def test_final_name_present_beforehand_fails_occupied_and_uploads_nothing(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    already = contact_bytes(1000)
    sftp_target.put(file.final_name, already)

    run = await run_delivery(sftp_target.destination(), file)

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.FINAL_NAME_OCCUPIED,
    )
    assert run.kinds() == ["connect", "baseline", "final_name_occupied", "outcome"]
    assert run.one("baseline")["size"] == 1000
    assert sftp_target.files() == {file.final_name: already}  # untouched, no temporary file


async def test_a_read_back_cut_after_a_confirmed_rename_is_taken_again_on_a_new_session(
    sftp_target: SftpTarget, tmp_path
):
    # The evidence is still there to be had: a read on a new session settles it, never a second upload.
    data = contact_bytes()
    file = local_file(tmp_path, data)
    run = await run_delivery(
        sftp_target.destination(), file, hooks=DeliveryHooks(after_rename=sftp_target.proxy.cut)
    )

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("rename")["result"] == "ok"
    assert run.one("interrupted")["phase"] == "read_back"
    kinds = run.kinds()
    assert kinds.index("interrupted") < kinds.index("read_back")
    assert run.one("read_back")["present"] is True and run.one("read_back")["size"] == len(data)
    assert kinds.count("rename") == 1  # published once; only the read was repeated
    assert sftp_target.files() == {file.final_name: data}


async def test_cut_just_after_the_rename_with_no_new_session_to_be_had_is_unknown_with_the_file_published(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    run = await run_delivery(
        sftp_target.destination(), file, hooks=DeliveryHooks(after_rename=sftp_target.proxy.close)
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.one("rename")["result"] == "ok"
    phases = [e["phase"] for e in run.evidence if e["observation"] == "interrupted"]
    assert phases == ["read_back"] + ["read_back_again"] * READ_BACK_TRIES
    assert "read_back" not in run.kinds()
    assert sftp_target.files() == {file.final_name: data}


async def test_rename_whose_answer_is_lost_is_settled_by_a_read_back_on_a_new_session(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    # The rename request reaches the server and takes effect; its answer is swallowed and the link cut.
    run = await run_delivery(
        sftp_target.destination(),
        file,
        hooks=DeliveryHooks(before_rename=sftp_target.proxy.cut_at_next_answer),
    )

    assert sftp_target.proxy.answer_swallowed.is_set()
    assert run.one("rename")["result"] == "no_answer"
    # The final name changed since the (absent) baseline: the lost rename published it, and the read-back
    # on a new session shows this file under the contract's rules. Nothing is moved, nothing sent again.
    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("fresh_listing")["present"] is True
    assert run.one("read_back")["size"] == len(data)
    assert "set_aside" not in run.kinds()
    assert run.kinds().count("rename") == 1 and run.kinds().count("upload") == 1
    assert sftp_target.files() == {file.final_name: data}


async def test_rename_that_never_reached_the_server_is_set_aside_and_not_delivered(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    attempt_id = uuid.uuid4()
    # The rename request is lost on the way: the client only knows it sent it and heard nothing.
    run = await run_delivery(
        sftp_target.destination(),
        file,
        attempt_id=attempt_id,
        hooks=DeliveryHooks(before_rename=sftp_target.proxy.cut_before_next_request),
    )

    assert sftp_target.proxy.request_dropped.is_set()
    assert run.one("rename")["result"] == "no_answer"
    # On a new session the final name still matches the baseline: the temporary file is moved to a name
    # of its own, after which the lost rename could never publish it, and a last listing confirms.
    aside = set_aside_name_for(attempt_id, file.final_name)
    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    moved = run.one("set_aside")
    assert (moved["result"], moved["set_aside_name"]) == ("ok", aside)
    kinds = run.kinds()
    last_listing = max(i for i, kind in enumerate(kinds) if kind == "fresh_listing")
    assert kinds.index("rename") < kinds.index("set_aside") < last_listing
    assert [e["present"] for e in run.evidence if e["observation"] == "fresh_listing"] == [False, False]
    assert "read_back" not in kinds
    assert sftp_target.files() == {aside: data}  # never published; the bytes kept under a temporary name


@pytest.mark.sshd
async def test_a_lost_rename_still_waiting_on_the_server_can_never_publish_once_the_file_is_set_aside(
    sshd_target: SftpTarget, sshd_server: Sshd, tmp_path
):
    """The race setting the file aside is for: the rename request reached OpenSSH, whose session is paused (SIGSTOP)
    before reading it; the link to the client dies. The temporary file is set aside on a new session;
    then the old session resumes, carries out the stale rename, fails (no such file) and answers into
    the void. The final name is never written."""
    data = contact_bytes()
    file = local_file(tmp_path, data)
    attempt_id = uuid.uuid4()
    paused: list[int] = []

    def pause_the_session_then_lose_the_link() -> None:
        paused.extend(sshd_server.session_processes())  # only this delivery's session is open
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        sshd_target.proxy.cut_client_after_next_request()

    try:
        run = await run_delivery(
            sshd_target.destination(),
            file,
            attempt_id=attempt_id,
            hooks=DeliveryHooks(before_rename=pause_the_session_then_lose_the_link),
        )
        assert paused
        assert not sshd_target.proxy.late_answer.is_set()  # the old session has not answered yet
        assert (run.report.outcome, run.report.failure_code) == (
            DeliveryOutcome.FAILED,
            FailureCode.NOT_DELIVERED,
        )
        assert run.one("set_aside")["result"] == "ok"
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # The stale rename is carried out now, and answered (status NO_SUCH_FILE) to nobody.
    assert await asyncio.to_thread(sshd_target.proxy.late_answer.wait, 10)
    aside = set_aside_name_for(attempt_id, file.final_name)
    assert sshd_target.files() == {aside: data}


async def test_file_appearing_before_the_rename_is_never_overwritten(sftp_target: SftpTarget, tmp_path):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    late = contact_bytes()  # a paused earlier upload landing late, same size

    run = await run_delivery(
        sftp_target.destination(),
        file,
        hooks=DeliveryHooks(before_rename=lambda: sftp_target.put(file.final_name, late)),
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert (run.one("rename")["result"], run.one("rename")["status"]) == ("refused", 4)  # SSH_FX_FAILURE
    assert run.one("fresh_listing")["present"] is True
    temp = temp_name_for(run.attempt_id, file.final_name)
    assert sftp_target.files() == {file.final_name: late, temp: data}  # the late file's bytes are untouched


async def test_refused_rename_with_the_final_name_unchanged_is_not_delivered(
    sftp_target: SftpTarget, tmp_path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)

    def scavenger_removes_temp() -> None:
        (sftp_target.local_dir / temp_name_for(attempt_id, file.final_name)).unlink()

    attempt_id = uuid.uuid4()
    run = await run_delivery(
        sftp_target.destination(),
        file,
        attempt_id=attempt_id,
        hooks=DeliveryHooks(before_rename=scavenger_removes_temp),
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    assert run.one("rename")["result"] == "refused"
    assert run.one("fresh_listing")["present"] is False
    assert sftp_target.files() == {}


async def test_a_server_with_another_host_key_is_refused_before_any_file_operation(
    sftp_target: SftpTarget, tmp_path
):
    file = local_file(tmp_path, contact_bytes())
    other_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    assert other_key != sftp_target.host_key_line

    run = await run_delivery(sftp_target.destination(host_key=other_key), file)

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    assert run.kinds() == ["connect", "outcome"]
    assert run.one("connect")["code"] == "HostKeyMismatch"
    assert sftp_target.files() == {}  # no temporary file, nothing listed or written


# -- replacement delivery --------------------------------------------------------------------------------


async def test_replacement_finding_the_originals_checksum_uploads_nothing(sftp_target: SftpTarget, tmp_path):
    original_data = contact_bytes()
    file = local_file(tmp_path, contact_bytes())
    sftp_target.put(file.final_name, original_data)

    run = await run_delivery(
        sftp_target.destination(hash_evidence="read_back"),
        file,
        original=original_of(original_data, file.final_name),
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.ORIGINAL_DELIVERED,
    )
    assert run.one("final_name_occupied")["identified_by"] == "sha256"
    assert sftp_target.files() == {file.final_name: original_data}


async def test_replacement_finding_an_ack_tied_to_the_original_uploads_nothing(
    sftp_target: SftpTarget, tmp_path
):
    original_data = contact_bytes()
    file = local_file(tmp_path, contact_bytes())
    original = original_of(original_data, file.final_name)
    sftp_target.put(file.final_name, original_data)
    partner_ack(
        sftp_target, file.final_name, original_data, temp_name_for(original.attempt_id, file.final_name)
    )

    run = await run_delivery(
        sftp_target.destination(hash_evidence="ack_file", ack_suffix=".ack"), file, original=original
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.ORIGINAL_DELIVERED,
    )
    assert run.one("final_name_occupied")["identified_by"] == "ack"
    assert "upload" not in run.kinds()


async def test_same_size_file_not_tied_to_the_original_is_occupied(sftp_target: SftpTarget, tmp_path):
    original_data = contact_bytes()
    stranger = contact_bytes()  # same size as the original, neither checksum nor ack
    file = local_file(tmp_path, contact_bytes())
    sftp_target.put(file.final_name, stranger)

    run = await run_delivery(
        sftp_target.destination(), file, original=original_of(original_data, file.final_name)
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.FINAL_NAME_OCCUPIED,
    )
    assert run.one("final_name_occupied")["identified_by"] is None
    assert sftp_target.files() == {file.final_name: stranger}


async def test_same_size_file_is_the_original_where_the_contract_accepts_name_and_size(
    sftp_target: SftpTarget, tmp_path
):
    original_data = contact_bytes()
    file = local_file(tmp_path, contact_bytes())
    sftp_target.put(file.final_name, contact_bytes())  # bytes unknowable without a hash: size decides

    run = await run_delivery(
        sftp_target.destination(name_and_size_identify=True),
        file,
        original=original_of(original_data, file.final_name),
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.ORIGINAL_DELIVERED,
    )
    assert run.one("final_name_occupied")["identified_by"] == "name_and_size"


async def test_a_different_file_without_an_agreement_is_occupied(sftp_target: SftpTarget, tmp_path):
    original_data = contact_bytes()
    other = contact_bytes(SIZE - 17)
    file = local_file(tmp_path, contact_bytes())
    sftp_target.put(file.final_name, other)

    run = await run_delivery(
        sftp_target.destination(name_and_size_identify=True, hash_evidence="read_back"),
        file,
        original=original_of(original_data, file.final_name),
    )

    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.FINAL_NAME_OCCUPIED,
    )
    assert sftp_target.files() == {file.final_name: other}


async def test_agreed_overwrite_of_same_size_other_bytes_completes_on_a_matching_hash(
    sftp_target: SftpTarget, tmp_path
):
    original_data = contact_bytes()
    rebuilt = contact_bytes()  # same size, different bytes
    file = local_file(tmp_path, rebuilt)
    sftp_target.put(file.final_name, contact_bytes())  # unidentifiable

    run = await run_delivery(
        sftp_target.destination(hash_evidence="read_back"),
        file,
        original=original_of(original_data, file.final_name),
        overwrite_agreed=True,
    )

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("rename")["form"] == "posix_rename"
    assert sftp_target.files() == {file.final_name: rebuilt}


async def test_agreed_overwrite_without_hash_or_ack_is_unknown(sftp_target: SftpTarget, tmp_path):
    original_data = contact_bytes()
    rebuilt = contact_bytes()
    file = local_file(tmp_path, rebuilt)
    sftp_target.put(file.final_name, contact_bytes())

    run = await run_delivery(
        sftp_target.destination(),
        file,
        original=original_of(original_data, file.final_name),
        overwrite_agreed=True,
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN  # name and size cannot show the change
    assert run.one("rename")["form"] == "posix_rename"
    assert sftp_target.files() == {file.final_name: rebuilt}


async def test_agreed_overwrite_whose_answer_is_lost_still_needs_a_hash_or_ack(
    sftp_target: SftpTarget, tmp_path
):
    # The settlement of a lost rename reads back under the same rules: name and size never show an overwrite.
    rebuilt = contact_bytes()
    file = local_file(tmp_path, rebuilt)
    sftp_target.put(file.final_name, contact_bytes())

    run = await run_delivery(
        sftp_target.destination(),
        file,
        original=original_of(contact_bytes(), file.final_name),
        overwrite_agreed=True,
        hooks=DeliveryHooks(before_rename=sftp_target.proxy.cut_at_next_answer),
    )

    assert (run.one("rename")["form"], run.one("rename")["result"]) == ("posix_rename", "no_answer")
    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    # Same size, and an mtime of the same second: the listing may not tell the files apart. Setting the file aside then
    # finds no temporary file (the lost rename took it), which proves nothing either way.
    moves = [e for e in run.evidence if e["observation"] == "set_aside"]
    assert all((e["result"], e["status"]) == ("refused", 2) for e in moves)
    assert sftp_target.files() == {file.final_name: rebuilt}


async def test_agreed_overwrite_completes_on_the_partners_ack_of_this_upload(
    sftp_target: SftpTarget, tmp_path
):
    original_data = contact_bytes()
    occupant = contact_bytes()
    rebuilt = contact_bytes()
    file = local_file(tmp_path, rebuilt)
    sftp_target.put(file.final_name, occupant)
    partner_ack(sftp_target, file.final_name, occupant, None)  # acknowledges neither the original nor us
    attempt_id = uuid.uuid4()
    temp = temp_name_for(attempt_id, file.final_name)

    run = await run_delivery(
        sftp_target.destination(hash_evidence="ack_file", ack_suffix=".ack"),
        file,
        original=original_of(original_data, file.final_name),
        overwrite_agreed=True,
        attempt_id=attempt_id,
        hooks=DeliveryHooks(after_rename=lambda: partner_ack(sftp_target, file.final_name, rebuilt, temp)),
    )

    assert run.report.outcome == DeliveryOutcome.COMPLETED
    assert run.one("ack")["tied"] is True


async def test_agreed_overwrite_with_only_the_old_ack_is_unknown(sftp_target: SftpTarget, tmp_path):
    original_data = contact_bytes()
    occupant = contact_bytes()
    file = local_file(tmp_path, contact_bytes())
    sftp_target.put(file.final_name, occupant)
    partner_ack(sftp_target, file.final_name, occupant, None)

    run = await run_delivery(
        sftp_target.destination(hash_evidence="ack_file", ack_suffix=".ack"),
        file,
        original=original_of(original_data, file.final_name),
        overwrite_agreed=True,
        ack_wait=0.3,
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.one("ack")["tied"] is False


async def test_a_refused_rename_fence_sends_no_rename_and_is_not_delivered(sftp_target: SftpTarget, tmp_path):
    # Issue 10: the rename fence is asked right before the rename request; refused (the attempt lost its
    # row), the rename is never sent, so this attempt never wrote the final name.
    data = contact_bytes(100_000)
    file = local_file(tmp_path, data)
    asked: list[bool] = []

    def refuse() -> bool:
        asked.append(True)
        return False

    run = await run_delivery(sftp_target.destination(), file, hooks=DeliveryHooks(authorize_rename=refuse))

    assert asked == [True]
    assert (run.report.outcome, run.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.NOT_DELIVERED,
    )
    assert run.one("rename")["result"] == "not_authorized"
    files = sftp_target.files()
    assert file.final_name not in files
    assert set(files) == {temp_name_for(run.attempt_id, file.final_name)}  # uploaded, never renamed

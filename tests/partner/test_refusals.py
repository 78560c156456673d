"""A step the partner refused, or a session it dropped, before and after the rename request (issue 23, point
2), against the real in-process asyncssh server: each branch of the classification after a refusal, and of
the settlement of an upload cut before its rename.

The refusals are the server's own answers: a quota on the upload directory
(``LocalSftpServer.set_quota``), past which the server refuses the write, as a partner whose quota is full
does, and optionally drops the session right after; or a rename onto a name that exists. Sessions are lost
at the TCP proxy, at a named point: a delivery hook, or the evidence the delivery records as it goes.

The rule: before the rename fence the rename request was never sent, so this attempt never wrote the final
name, and the fences prove Failed NotDelivered whatever a fresh listing shows, or whether one could be
taken (000: NotDelivered "when the destination or reconciliation proves the final name was never
written"). Once the rename was sent only a fresh listing that still matches the baseline proves it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.evidence import temp_name_for
from domain.models import DeliveryOutcome, FailureCode
from partner.delivery import DeliveryHooks
from partner.local_server import LocalSftpServer
from testbed.sftp import SftpTarget
from tests.fix_sftp import target_on
from tests.partner.helpers import SIZE, Run, contact_bytes, local_file, original_of, run_delivery

SSH_FX_FAILURE = 4  # what a version 3 client hears for a refused write, a full quota included
QUOTA = 100_000  # bytes a file may hold: a few of the upload's write requests (32 KiB each) go through
NOT_DELIVERED = (DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED)


@pytest.fixture
def partner(request: pytest.FixtureRequest, local_sftp_server: LocalSftpServer) -> Iterator[SftpTarget]:
    """A fresh upload directory on the in-process asyncssh server, behind a fresh proxy; its quota lifted
    when the test ends."""
    for target in target_on(request, "asyncssh"):
        try:
            yield target
        finally:
            local_sftp_server.clear_quota(target.local_dir)


def outcome_of(run: Run) -> tuple[DeliveryOutcome, FailureCode | None]:
    return run.report.outcome, run.report.failure_code


def proven_by_the_fences(run: Run) -> None:
    """The attempt's outcome record says the rename was never sent, and its summary that the fences prove it."""
    assert run.one("outcome")["rename_sent"] is False
    assert "before the rename fence; the fences prove it: the rename was never sent" in run.report.summary
    assert "rename" not in run.kinds()


def cut_when(target: SftpTarget, observation: str, result: str) -> Any:
    """An ``on_evidence`` seam: cut every connection through the proxy as soon as the delivery records
    ``observation`` with ``result`` (in the delivering thread, before its next step)."""

    def seen(evidence: dict[str, Any]) -> None:
        if evidence["observation"] == observation and evidence.get("result") == result:
            target.proxy.cut()

    return seen


# -- the upload refused: before the rename fence ----------------------------------------------------------


async def test_an_upload_refused_by_a_full_quota_and_then_a_dropped_session_is_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    # The scenario: the quota is full, the temporary file cannot even be created, the session drops,
    # so no fresh listing can be taken. The rename was never sent: Failed NotDelivered from the fences, not
    # OutcomeUnknown waiting for a person.
    file = local_file(tmp_path, contact_bytes())
    local_sftp_server.set_quota(partner.local_dir, 0, drop_session=True)

    run = await run_delivery(partner.destination(), file)

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert run.report.summary.startswith(f"upload refused (status {SSH_FX_FAILURE}) before the rename fence")
    assert "(no fresh listing could be taken)" in run.report.summary
    refused = run.one("upload")
    assert (refused["result"], refused["bytes_sent"]) == ("refused", 0)
    lost = run.one("interrupted")
    assert (lost["phase"], lost["rename_sent"]) == ("fresh_listing", False)
    assert partner.files() == {}


async def test_a_write_refused_by_a_full_quota_and_then_a_dropped_session_is_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    # The same with the quota reached by the upload's last write: the refusal is read before anything else
    # (paramiko would drop a pipelined write's answer unread), then the session is gone.
    data = contact_bytes()
    file = local_file(tmp_path, data)
    local_sftp_server.set_quota(partner.local_dir, SIZE - 1, drop_session=True)  # the last write is refused

    run = await run_delivery(partner.destination(), file)

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(no fresh listing could be taken)" in run.report.summary
    refused = run.one("upload")
    assert (refused["result"], refused["status"]) == ("refused", SSH_FX_FAILURE)
    lost = run.one("interrupted")
    assert (lost["phase"], lost["rename_sent"]) == ("fresh_listing", False)
    assert "fresh_listing" not in run.kinds()
    files = partner.files()
    assert file.final_name not in files
    assert set(files) == {temp_name_for(run.attempt_id, file.final_name)}


async def test_an_upload_refused_whose_fresh_listing_fails_is_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    # The same branch with the session lost at the client's side, right after the refusal was recorded.
    file = local_file(tmp_path, contact_bytes())
    local_sftp_server.set_quota(partner.local_dir, QUOTA)

    run = await run_delivery(partner.destination(), file, on_evidence=cut_when(partner, "upload", "refused"))

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert run.one("interrupted")["phase"] == "fresh_listing"
    assert file.final_name not in partner.files()


async def test_an_upload_refused_with_the_final_name_unchanged_is_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    data = contact_bytes()
    file = local_file(tmp_path, data)
    local_sftp_server.set_quota(partner.local_dir, QUOTA)

    run = await run_delivery(partner.destination(), file)

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(a fresh listing still matches the baseline)" in run.report.summary
    assert run.one("upload")["result"] == "refused"
    assert run.one("fresh_listing")["present"] is False
    files = partner.files()
    temp = temp_name_for(run.attempt_id, file.final_name)
    assert set(files) == {temp}  # what the quota let through, under the attempt's temporary name
    assert data.startswith(files[temp]) and len(files[temp]) <= QUOTA


async def test_an_upload_refused_while_someone_else_wrote_the_final_name_is_still_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    # A change under the final name since the baseline is another writer's: this attempt never sent its
    # rename. It is kept as evidence (the fresh listing), and the file there is left alone.
    file = local_file(tmp_path, contact_bytes())
    other = contact_bytes(1000)
    local_sftp_server.set_quota(partner.local_dir, QUOTA)

    run = await run_delivery(
        partner.destination(),
        file,
        hooks=DeliveryHooks(after_listing=lambda: partner.put(file.final_name, other)),
    )

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(the final name changed since the baseline, not by this attempt)" in run.report.summary
    assert run.one("baseline")["present"] is False
    fresh = run.one("fresh_listing")
    assert (fresh["present"], fresh["size"]) == (True, len(other))
    assert partner.files()[file.final_name] == other


async def test_a_replacement_with_an_overwrite_agreement_whose_upload_is_refused_is_not_delivered(
    partner: SftpTarget, local_sftp_server: LocalSftpServer, tmp_path: Path
):
    # The replacement shares the original's final name and may overwrite it (posix_rename), but only by a
    # rename it never sent: the occupant, changed meanwhile by the partner, was not written by this attempt.
    occupant, rewritten = contact_bytes(1000), contact_bytes(2000)
    file = local_file(tmp_path, contact_bytes())
    partner.put(file.final_name, occupant)  # identifies as nothing: the agreement lets the replacement upload
    local_sftp_server.set_quota(partner.local_dir, QUOTA)

    run = await run_delivery(
        partner.destination(),
        file,
        original=original_of(contact_bytes(), file.final_name),
        overwrite_agreed=True,
        on_evidence=lambda e: (
            partner.put(file.final_name, rewritten)
            if (e["observation"], e.get("result")) == ("upload", "refused")
            else None
        ),
    )

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert run.one("final_name_occupied")["overwrite"] is True
    assert run.one("fresh_listing")["size"] == len(rewritten)
    assert partner.files()[file.final_name] == rewritten  # untouched by this attempt


async def test_an_upload_whose_temporary_file_does_not_hold_its_bytes_is_not_delivered(
    partner: SftpTarget, tmp_path: Path
):
    # The server accepted every write, yet the temporary file's size is not the file's (the partner's side
    # appended to it): the rename is not sent, and the fences prove the final name was never written.
    file = local_file(tmp_path, contact_bytes())
    attempt_id = uuid.uuid4()

    def partner_appends(sent: int) -> None:
        if sent == file.size:  # past the last byte: whatever writes are still in flight land before it
            with (partner.local_dir / temp_name_for(attempt_id, file.final_name)).open("r+b") as written:
                written.seek(file.size)
                written.write(b"\n")

    run = await run_delivery(
        partner.destination(),
        file,
        attempt_id=attempt_id,
        hooks=DeliveryHooks(during_upload=partner_appends),
    )

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert run.report.summary.startswith(
        f"upload incomplete (the temporary file holds {file.size + 1} of {file.size} bytes)"
    )
    assert run.one("upload")["remote_size"] == file.size + 1
    assert file.final_name not in partner.files()


# -- the rename refused: it was sent, so only a fresh listing can prove NotDelivered ----------------------


async def test_a_refused_rename_whose_fresh_listing_fails_stays_unknown(partner: SftpTarget, tmp_path: Path):
    # The rename fence matched and the rename was sent: the row's fences prove nothing, and a refusal
    # without a listing cannot tell what the server did.
    file = local_file(tmp_path, contact_bytes())
    late = contact_bytes(1000)

    run = await run_delivery(
        partner.destination(),
        file,
        hooks=DeliveryHooks(before_rename=lambda: partner.put(file.final_name, late)),
        on_evidence=cut_when(partner, "rename", "refused"),
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.report.summary == "rename refused and the fresh listing failed"
    assert run.one("outcome")["rename_sent"] is True
    assert (run.one("rename")["result"], run.one("rename")["status"]) == ("refused", SSH_FX_FAILURE)
    assert run.one("interrupted")["rename_sent"] is True
    assert partner.files()[file.final_name] == late


async def test_a_refused_rename_with_the_final_name_unchanged_is_not_delivered_by_the_listing(
    partner: SftpTarget, tmp_path: Path
):
    file = local_file(tmp_path, contact_bytes())
    attempt_id = uuid.uuid4()

    def scavenger_removes_temp() -> None:
        (partner.local_dir / temp_name_for(attempt_id, file.final_name)).unlink()

    run = await run_delivery(
        partner.destination(),
        file,
        attempt_id=attempt_id,
        hooks=DeliveryHooks(before_rename=scavenger_removes_temp),
    )

    assert outcome_of(run) == NOT_DELIVERED
    assert run.report.summary.startswith("rename refused (status 2); final name unchanged since baseline")
    assert run.one("outcome")["rename_sent"] is True
    assert run.one("fresh_listing")["present"] is False
    assert partner.files() == {}


async def test_a_refused_rename_with_the_final_name_changed_stays_unknown(
    partner: SftpTarget, tmp_path: Path
):
    file = local_file(tmp_path, contact_bytes())
    late = contact_bytes()

    run = await run_delivery(
        partner.destination(),
        file,
        hooks=DeliveryHooks(before_rename=lambda: partner.put(file.final_name, late)),
    )

    assert run.report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    assert run.report.summary.endswith("and the final name changed since the baseline")
    assert run.one("outcome")["rename_sent"] is True
    assert run.one("fresh_listing")["present"] is True
    assert partner.files()[file.final_name] == late


# -- the upload cut (the session dropped) before the rename fence ------------------------------------------


async def test_an_upload_cut_with_no_new_session_to_be_had_is_not_delivered(
    partner: SftpTarget, tmp_path: Path
):
    # The branch with no fresh listing: the partner answers no new connection after the cut.
    file = local_file(tmp_path, contact_bytes(2_000_000))

    def cut_and_go_silent(sent: int) -> None:
        if not partner.proxy.cut_done.is_set():
            partner.proxy.refuse_new_connections()
            partner.proxy.cut()

    run = await run_delivery(
        partner.destination(), file, hooks=DeliveryHooks(during_upload=cut_and_go_silent)
    )

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(no fresh listing could be taken)" in run.report.summary
    phases = [e["phase"] for e in run.evidence if e["observation"] == "interrupted"]
    assert phases == ["upload", "fresh_listing"]
    assert "fresh_listing" not in run.kinds()
    assert file.final_name not in partner.files()


async def test_an_upload_cut_with_the_final_name_unchanged_is_not_delivered(
    partner: SftpTarget, tmp_path: Path
):
    file = local_file(tmp_path, contact_bytes(2_000_000))

    def cut_once(sent: int) -> None:
        if not partner.proxy.cut_done.is_set():
            partner.proxy.cut()

    run = await run_delivery(partner.destination(), file, hooks=DeliveryHooks(during_upload=cut_once))

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(a fresh listing still matches the baseline)" in run.report.summary
    assert run.one("fresh_listing")["present"] is False


async def test_an_upload_cut_while_someone_else_wrote_the_final_name_is_still_not_delivered(
    partner: SftpTarget, tmp_path: Path
):
    # Before, a change under the final name left OutcomeUnknown, though the rename was never sent.
    file = local_file(tmp_path, contact_bytes(2_000_000))
    other = contact_bytes(1000)

    def another_writer_then_cut(sent: int) -> None:
        if not partner.proxy.cut_done.is_set():
            partner.put(file.final_name, other)
            partner.proxy.cut()

    run = await run_delivery(
        partner.destination(), file, hooks=DeliveryHooks(during_upload=another_writer_then_cut)
    )

    assert outcome_of(run) == NOT_DELIVERED
    proven_by_the_fences(run)
    assert "(the final name changed since the baseline, not by this attempt)" in run.report.summary
    fresh = run.one("fresh_listing")
    assert (fresh["present"], fresh["size"]) == (True, len(other))
    assert partner.files()[file.final_name] == other

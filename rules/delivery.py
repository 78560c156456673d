"""The delivery rules of the seed (000 "The Worker"), as pure functions of what was observed.

- Completed only on evidence tied to this attempt under the partner's contract: for a new file,
  the final name present with the expected size where the baseline was absent (the no-overwrite
  rename published it); a matching read-back hash or acknowledgment where the contract offers one;
  an overwrite needs the hash or the acknowledgment, never name and size.
- Failed NotDelivered only when the final name was provably never written by this attempt: no SFTP
  session was ever opened, nothing was uploaded yet, the upload was refused or cut before the rename
  fence so the rename request was never sent (:func:`never_renamed`, whatever a fresh listing shows or
  whether one could be taken), the server refused the rename and a fresh listing still equals the
  baseline, or a rename's answer was lost and the temporary file was then set aside with the final name
  still equal to the baseline.
- Failed FinalNameOccupied / OriginalDelivered for an occupied final name, decided before uploading.
- Everything else (connection loss, timeouts, an unconfirmed read-back) is OutcomeUnknown, resolved
  later from the recorded evidence. A rename whose answer never came is settled on a new session where
  it can be (partner/delivery.settle_lost_rename: the read-back, or the temporary file set aside so the
  lost rename can never publish it), else OutcomeUnknown.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.destination import Destination
from domain.evidence import DeliveryReport, FileToDeliver, Observation, OriginalFile, temp_name_for
from domain.models import DeliveryOutcome, FailureCode


def completed(summary: str) -> DeliveryReport:
    """A Completed report: the contract's evidence ties the final file to this attempt."""
    return DeliveryReport(outcome=DeliveryOutcome.COMPLETED, summary=summary)


def failed(code: FailureCode, summary: str) -> DeliveryReport:
    """A Failed report with its code: this attempt provably never wrote the final name."""
    return DeliveryReport(outcome=DeliveryOutcome.FAILED, failure_code=code, summary=summary)


def unknown(summary: str) -> DeliveryReport:
    """An OutcomeUnknown report: the evidence decides later, by recovery or reconciliation."""
    return DeliveryReport(outcome=DeliveryOutcome.OUTCOME_UNKNOWN, summary=summary)


def identify_original(
    baseline: Observation, original: OriginalFile | None, destination: Destination
) -> str | None:
    """How the file found under the final name is identified as the original's delivery, or ``None``.

    A matching checksum or an acknowledgment tied to the original identifies it; name and size do
    only where the contract says so, and never against a hash or acknowledgment that disagrees.
    """
    if original is None or not baseline.present:
        return None
    if baseline.sha256 is not None and original.sha256 is not None:
        return "sha256" if baseline.sha256 == original.sha256 else None
    ack = baseline.parsed_ack()
    if ack is not None and ack.name == original.name and ack.size == baseline.size:
        original_upload = (
            temp_name_for(original.attempt_id, original.name) if original.attempt_id is not None else None
        )
        if original.sha256 is not None:
            if ack.sha256 == original.sha256.hex():
                return "ack"
            return None  # the partner acknowledged different bytes under this name
        if original_upload is not None and ack.upload == original_upload:
            return "ack"
    if destination.name_and_size_identify and original.size is not None and baseline.size == original.size:
        return "name_and_size"
    return None


@dataclass(frozen=True)
class OccupiedDecision:
    """What an occupied final name means: end here with ``report``, or upload and overwrite."""

    report: DeliveryReport | None
    identified_by: str | None
    overwrite: bool


def decide_occupied(
    baseline: Observation, original: OriginalFile | None, destination: Destination, overwrite_agreed: bool
) -> OccupiedDecision:
    """The seed's rules for a final name that is already taken, decided before anything is uploaded."""
    if original is None:
        return OccupiedDecision(
            failed(FailureCode.FINAL_NAME_OCCUPIED, "final name already present before an original's upload"),
            None,
            False,
        )
    identified_by = identify_original(baseline, original, destination)
    if identified_by is not None:
        return OccupiedDecision(
            failed(
                FailureCode.ORIGINAL_DELIVERED, f"the file present is the original's (by {identified_by})"
            ),
            identified_by,
            False,
        )
    if overwrite_agreed:
        return OccupiedDecision(None, None, True)
    return OccupiedDecision(
        failed(FailureCode.FINAL_NAME_OCCUPIED, "final name holds a file not identified as the original's"),
        None,
        False,
    )


def confirm_delivery(
    after: Observation,
    file: FileToDeliver,
    destination: Destination,
    *,
    overwrite: bool,
    ack_tied: bool,
) -> DeliveryReport:
    """Classify a rename the server confirmed, from the read-back (and acknowledgment) that followed."""
    if not after.present:
        return unknown("final name absent after a confirmed rename")
    if after.size != file.size:
        return unknown(f"final name holds {after.size} bytes, expected {file.size}")
    if destination.hash_evidence == "read_back":
        if after.sha256 != file.sha256:
            return unknown("read-back hash differs from the expected file")
        return completed(f"name, size ({file.size}) and read-back sha256 match")
    if destination.hash_evidence == "ack_file":
        if not ack_tied:
            return unknown("no acknowledgment tied to this upload")
        return completed(f"name and size ({file.size}) match; partner acknowledged this upload's sha256")
    if overwrite:
        return unknown("overwrote under agreement, but the contract offers no hash or acknowledgment")
    return completed(
        f"final name published by no-overwrite rename, size {file.size} matches, baseline absent"
    )


def never_renamed(what: str, baseline: Observation, fresh: Observation | None) -> DeliveryReport:
    """The upload to the temporary name was refused or cut (``what``) before the rename fence: the rename
    request was never sent, so this attempt never wrote the final name. Failed NotDelivered on that proof
    alone (000: NotDelivered "when the destination or reconciliation proves the final name was never
    written"; "In each Failed case here, the attempt proved it never wrote the final name"); ``fresh``, the
    listing taken afterwards (``None`` when none could be taken), is kept as evidence and only named here.

    The same for an original and for every replacement, with an overwrite agreement or without. The upload
    goes to a temporary name of this attempt's own, opened exclusively, and only the rename (``rename``, or
    ``posix_rename`` under an agreement) can put it under the final name; neither is sent before the rename
    fence. A replacement shares its original's final name (000 "Recovery", "An existing final name"), so a
    change there since the baseline may be the original's late delivery or another writer's: that is
    evidence about the original, for a person to weigh and correct (000 "Recovery": "when a replacement
    finds the original's file after the original was reconciled to Failed, a named person corrects it"),
    never a file this attempt wrote. Only Completed needs the stricter replacement rules.
    """
    if fresh is None:
        seen = "no fresh listing could be taken"
    elif fresh.same_as(baseline):
        seen = "a fresh listing still matches the baseline"
    else:
        seen = "the final name changed since the baseline, not by this attempt"
    return failed(
        FailureCode.NOT_DELIVERED,
        f"{what} before the rename fence; the fences prove it: the rename was never sent, so this attempt "
        f"never wrote the final name ({seen})",
    )


def classify_refusal(
    step: str, status: int | None, baseline: Observation, fresh: Observation
) -> DeliveryReport:
    """The server refused the rename ``step``, which was sent: NotDelivered only if a fresh listing shows
    nothing changed (a refused upload is :func:`never_renamed`'s)."""
    if fresh.same_as(baseline):
        return failed(
            FailureCode.NOT_DELIVERED,
            f"{step} refused (status {status}); final name unchanged since baseline",
        )
    return unknown(f"{step} refused (status {status}) and the final name changed since the baseline")

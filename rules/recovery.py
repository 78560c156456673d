"""Recovery's reading of evidence for an expired Delivering attempt (000 "Recovery"): pure functions.

Completed only when the destination, or a receipt the attempt appended, matches the expected file
recorded at cutoff 2 under the worker's own rules (:mod:`rules.delivery`); otherwise OutcomeUnknown.
An absent file is never a reason for Failed: a paused worker can still upload. Failed NotDelivered needs
affirmative evidence (000 "Recovery": the partner confirming that nothing was published and that the
attempt's upload slot can no longer publish): the attempt's temporary file moved to its set-aside name, so
its rename can never publish it, and a final name that still shows what the attempt's baseline showed
(:func:`decide_after_set_aside`); or the row's own fences, which show the rename was never sent
(:func:`fences_prove_never_renamed`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from domain.destination import Destination
from domain.evidence import FileToDeliver, Observation, SetAside, temp_name_for
from domain.models import AttemptEvent, DeliveryOutcome, EventKind, ExportJob, JobStatus
from rules.delivery import confirm_delivery


class Verdict(BaseModel):
    """Recovery's decision for an expired delivery, with a summary of codes and sizes only."""

    resolution: JobStatus
    summary: str


RECOVERY_OBSERVER_PREFIX = "recovery"
# A reconciler's request for today's listing of the final name (0033) is answered by a recovery run and kept
# as the attempt's DeliveryEvidence observed by "reconciler-request:<request id>": a person's question, never
# the attempt's own evidence, and not recovery's re-check either (it settles nothing).
LISTING_REQUEST_OBSERVER_PREFIX = "reconciler-request"
LISTING_REQUEST_WINDOW_SECONDS = 3600.0  # a request not answered within this is no longer answered
# The rename evidence's form of the overwriting rename (partner/delivery.py records "rename" or this).
OVERWRITING_RENAME = "posix_rename"


def observed_by_recovery(observed_by: str | None) -> bool:
    """Whether an event was written by a recovery run (``recovery:<workflow>/<run>``), not by a worker.

    The separator decides: a worker's ID is its host name and process (``socket.gethostname()``, which has
    no colon), so a worker on a host named ``recovery-7`` keeps its own receipts as the attempt's evidence.
    """
    return (observed_by or "").startswith(f"{RECOVERY_OBSERVER_PREFIX}:")


def listing_request_observer(request_id: UUID) -> str:
    """The ``observed_by`` of the answer to one listing request: ``reconciler-request:<request id>``."""
    return f"{LISTING_REQUEST_OBSERVER_PREFIX}:{request_id}"


def observed_on_request(observed_by: str | None) -> bool:
    """Whether an event answers a reconciler's listing request (``reconciler-request:<id>``); as for
    recovery's, the colon tells it from a worker's ID."""
    return (observed_by or "").startswith(f"{LISTING_REQUEST_OBSERVER_PREFIX}:")


def attempt_evidence(events: list[AttemptEvent], attempt_id: UUID) -> list[dict[str, Any]]:
    """The attempt's own DeliveryEvidence observations (not recovery's, nor a listing a reconciler asked
    for), oldest first."""
    found: list[dict[str, Any]] = []
    for event in events:
        if event.kind != EventKind.DELIVERY_EVIDENCE or event.attempt_id != attempt_id:
            continue
        if observed_by_recovery(event.observed_by) or observed_on_request(event.observed_by):
            continue
        try:
            detail = json.loads(event.detail or "{}")
        except ValueError:
            continue
        if isinstance(detail, dict):
            found.append(detail)
    return found


def _last(evidence: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    matching = [e for e in evidence if e.get("observation") == kind]
    return matching[-1] if matching else None


def _observation_from(item: dict[str, Any]) -> Observation:
    """An Observation back from its evidence dict (``Observation.as_evidence``)."""
    sha = item.get("sha256")
    return Observation(
        present=bool(item.get("present")),
        size=item.get("size"),
        mtime=item.get("mtime"),
        sha256=bytes.fromhex(sha) if isinstance(sha, str) else None,
        ack=item.get("ack") if isinstance(item.get("ack"), dict) else None,
    )


def _expected(job: ExportJob) -> FileToDeliver | None:
    if job.expected_file_name is None or job.expected_file_bytes is None or job.expected_file_sha256 is None:
        return None
    return FileToDeliver(
        path=Path(job.expected_file_name),  # never read: only name, size and hash are compared
        final_name=job.expected_file_name,
        size=job.expected_file_bytes,
        sha256=job.expected_file_sha256,
    )


def _ack_tied(observation: Observation, expected: FileToDeliver, attempt_id: UUID) -> bool:
    ack = observation.parsed_ack()
    return ack is not None and ack.acknowledges(
        expected.final_name, expected.size, expected.sha256, temp_name_for(attempt_id, expected.final_name)
    )


def decide_delivery(
    job: ExportJob,
    evidence: list[dict[str, Any]],
    now: Observation | None,
    destination: Destination,
    *,
    observe_error: str | None = None,
) -> Verdict:
    """Decide Completed or OutcomeUnknown for an expired Delivering attempt, from evidence only.

    ``evidence`` is what the attempt itself appended; ``now`` is what the destination shows under the final
    name (``None`` when it could not be asked). The worker's own rules decide what counts
    (``rules.delivery.confirm_delivery``): name and size from an absent baseline, a read-back hash or an
    acknowledgment of this upload where the contract offers one, and never name and size for an overwrite.

    1. A receipt this attempt appended: a read-back after its confirmed rename that those rules accept.
    2. Otherwise the listing now. An original's final name is unique to its delivery key, so it counts
       unless this attempt's baseline already showed a file there. A replacement's name may hold the
       original's file: without this attempt's baseline it proves nothing, and over a baseline that showed
       a file only a hash or acknowledgment tied to this attempt's expected file counts.

    An absent file, or one that does not match, leaves OutcomeUnknown: nothing here concludes Failed.
    """
    expected = _expected(job)
    if expected is None:
        return Verdict(resolution=JobStatus.OUTCOME_UNKNOWN, summary="no expected file recorded at cutoff 2")
    attempt_id = job.attempt_id
    assert attempt_id is not None
    baseline_item = _last(evidence, "baseline")
    baseline = _observation_from(baseline_item) if baseline_item is not None else None
    # An overwrite is what the attempt did, not only what its baseline showed: a posix_rename (the overwriting
    # form, sent only under an overwrite agreement) whose baseline append was lost is an overwrite still, and
    # name and size never prove one (rules.delivery.confirm_delivery).
    renamed = _last(evidence, "rename")
    overwrote = renamed is not None and renamed.get("form") == OVERWRITING_RENAME
    overwrite = (baseline is not None and baseline.present) or overwrote

    receipt = _receipt_verdict(evidence, expected, destination, overwrite=overwrite)
    if receipt is not None:
        return receipt
    if now is None:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"destination not observed ({observe_error or 'no answer'}); no receipt of this attempt",
        )
    if not now.present:
        # A temporary file, or none at all, is evidence of nothing while the worker might still rename
        # (until recovery sets the file aside: may_set_aside, decide_after_set_aside).
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN, summary="final name absent; no receipt of this attempt"
        )
    if job.replaces_job_id is not None and baseline is None:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary="replacement without a recorded baseline: a file there may be the original's",
        )
    if job.replaces_job_id is None and overwrite:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary="final name occupied before this attempt's upload; the listing does not show its file",
        )
    if overwrite and baseline is not None and now.same_as(baseline):
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN, summary="listing unchanged since this attempt's baseline"
        )
    report = confirm_delivery(
        now, expected, destination, overwrite=overwrite, ack_tied=_ack_tied(now, expected, attempt_id)
    )
    resolution = (
        JobStatus.COMPLETED if report.outcome == DeliveryOutcome.COMPLETED else JobStatus.OUTCOME_UNKNOWN
    )
    basis = "listing by recovery" if baseline is not None else "listing by recovery, no baseline recorded"
    return Verdict(resolution=resolution, summary=f"{basis}: {report.summary}")


def fences_prove_never_renamed(job: ExportJob) -> bool:
    """Whether the row's own fences prove its attempt never sent the rename request, so never wrote the final
    name: it was to fence its rename before sending it (``fence_expected``), fenced its upload and never its
    rename. Once the row has left Delivering no fence can be written any more (both fences require it), so
    this stays true of an OutcomeUnknown: Failed NotDelivered with no listing (``settle_unknown_by_fences``)."""
    return job.fence_expected and job.upload_fenced_at is not None and job.rename_fenced_at is None


def may_set_aside(job: ExportJob, verdict: Verdict, now: Observation | None) -> bool:
    """Whether recovery should move the attempt's temporary file aside before recording ``verdict``: only
    in place of an OutcomeUnknown, when the partner answered, and after the rename fence, when the upload
    to the temporary name was complete and only the rename was left to send."""
    return (
        verdict.resolution == JobStatus.OUTCOME_UNKNOWN
        and now is not None
        and job.rename_fenced_at is not None
        and _expected(job) is not None
    )


def decide_after_set_aside(
    job: ExportJob,
    evidence: list[dict[str, Any]],
    destination: Destination,
    before: Verdict,
    aside: SetAside | None,
    after: Observation | None,
    *,
    error: str | None = None,
) -> Verdict:
    """Decide again after recovery tried to move the attempt's temporary file to its set-aside name;
    ``after`` is what the final name showed then (both ``None`` when the partner could not be asked,
    ``error``).

    - The file is under the set-aside name (moved now, or by an earlier move whose answer was lost) and
      the final name still shows what the attempt's baseline showed (nothing, without a baseline): Failed
      NotDelivered. The file never was under the final name, and no rename of the temporary name can put
      it there any more.
    - Neither name holds it: a rename took it since recovery's listing (a paused worker woke), so the
      final name decides as before (:func:`decide_delivery` on ``after``), or somebody removed it, which
      proves nothing.
    - Otherwise ``before`` (OutcomeUnknown), with what the move found.
    """
    if aside is None or after is None:
        return _still(before, f"the temporary file was not set aside ({error or 'no answer'})")
    if aside.result == "gone":
        again = decide_delivery(job, evidence, after, destination)
        if again.resolution == JobStatus.COMPLETED:
            return again
        return _still(before, "neither the temporary nor the set-aside name holds the attempt's file")
    if not aside.moved:
        return _still(before, f"the move to {aside.name} was refused (status {aside.status})")
    baseline_item = _last(evidence, "baseline")
    unchanged = (
        not after.present if baseline_item is None else after.same_as(_observation_from(baseline_item))
    )
    if not unchanged:
        changed = (
            "changed since the baseline"
            if baseline_item is not None
            else "holds a file, and no baseline was recorded"
        )
        return _still(before, f"the file was set aside as {aside.name}, but the final name {changed}")
    how = "moved" if aside.result == "ok" else "found"
    final = "still shows the attempt's baseline" if baseline_item is not None else "is still absent"
    return Verdict(
        resolution=JobStatus.FAILED,
        summary=(
            f"recovery {how} the attempt's temporary file under {aside.name}, so its rename can never "
            f"publish it, and the final name {final}"
        ),
    )


def _still(before: Verdict, why: str) -> Verdict:
    return Verdict(resolution=before.resolution, summary=f"{before.summary}; {why}")


def _receipt_verdict(
    evidence: list[dict[str, Any]], expected: FileToDeliver, destination: Destination, *, overwrite: bool
) -> Verdict | None:
    """Completed from the attempt's own read-back after a confirmed rename, when the worker's rules accept it."""
    renamed = _last(evidence, "rename")
    read_back = _last(evidence, "read_back")
    if renamed is None or renamed.get("result") != "ok" or read_back is None:
        return None
    if read_back.get("final_name") not in (None, expected.final_name):
        return None
    ack = _last(evidence, "ack")
    report = confirm_delivery(
        _observation_from(read_back),
        expected,
        destination,
        overwrite=overwrite,
        ack_tied=bool(ack and ack.get("tied")),
    )
    if report.outcome != DeliveryOutcome.COMPLETED:
        return None
    return Verdict(resolution=JobStatus.COMPLETED, summary=f"receipt of this attempt: {report.summary}")


def set_aside_evidence(
    aside: SetAside | None, after: Observation | None, job: ExportJob, error: str | None
) -> dict[str, Any]:
    """What recovery's move of the temporary file found, and the final name after it: names, sizes, codes."""
    item: dict[str, Any] = {
        "observation": "recovery_set_aside",
        "final_name": job.expected_file_name,
        "attempt_id": str(job.attempt_id),
    }
    if aside is None or after is None:
        return {**item, "error": error}
    return {
        **item,
        "set_aside_name": aside.name,
        "result": aside.result,
        "status": aside.status,
        "moved": aside.moved,
        "final_after": after.as_evidence(),
    }


def observation_evidence(
    observation: Observation | None, job: ExportJob, destination_id: UUID, error: str | None
) -> dict[str, Any]:
    """What recovery saw under the final name, as a JSON-able dict of sizes, times and hashes only."""
    seen: dict[str, Any] = observation.as_evidence() if observation is not None else {"error": error}
    return {
        "observation": "recovery_listing",
        "final_name": job.expected_file_name,
        "attempt_id": str(job.attempt_id),
        "destination_id": str(destination_id),
        **seen,
    }


def requested_listing_evidence(
    observation: Observation | None,
    job: ExportJob,
    destination: Destination,
    *,
    request_id: UUID,
    answered_by: str,
    error: str | None,
    reading: Verdict | None,
) -> dict[str, Any]:
    """A reconciler's listing of the final name, answered (0033): what the partner showed (sizes, times,
    hashes, or the error's type, or why it was not asked), and how recovery's rules read it
    (``decide_delivery``: a reading for the person, never a settlement). Codes and sizes only."""
    seen: dict[str, Any] = observation.as_evidence() if observation is not None else {"error": error}
    item: dict[str, Any] = {
        "observation": "requested_listing",
        "request_id": str(request_id),
        "answered_by": answered_by,
        "final_name": job.expected_file_name or job.final_name,
        "attempt_id": str(job.attempt_id),
        "destination_id": str(destination.id),
        "destination_version": destination.version,
        **seen,
    }
    if reading is not None:
        item["rules_read"] = reading.resolution.value
        item["rules_summary"] = reading.summary
    return item

"""Recovery's reading of evidence for an expired Delivering attempt (000 "Recovery"): Completed only on
evidence, OutcomeUnknown otherwise, never Failed from an absent file."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from domain.destination import Destination
from domain.evidence import Observation, SetAside
from domain.models import AttemptEvent, EventKind, JobStatus
from rules.recovery import Verdict, attempt_evidence, decide_after_set_aside, decide_delivery, may_set_aside
from tests.rules.factories import job

DATA = b"email,first_name,last_name\r\n"
SHA = hashlib.sha256(DATA).digest()
ATTEMPT = uuid.uuid4()


def delivering(**fields: Any):  # noqa: ANN201 - an ExportJob
    values: dict[str, Any] = {
        "attempt_id": ATTEMPT,
        "expected_file_name": "contacts-k.csv",
        "expected_file_bytes": len(DATA),
        "expected_file_sha256": SHA,
    }
    values.update(fields)
    return job(JobStatus.DELIVERING, **values)


def destination(**contract: Any) -> Destination:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": uuid.uuid4(),
        "name": "partner-old",
        "host": "127.0.0.1",
        "port": 22,
        "username": "partner",
        "host_key": "ssh-ed25519 AAAA",
        "credential_ref": "/keys/partner",
        "remote_dir": "/",
    }
    values.update(contract)
    return Destination(**values)


def present(size: int = len(DATA), sha: bytes | None = None) -> Observation:
    return Observation(present=True, size=size, mtime=1, sha256=sha)


ABSENT_BASELINE = {"observation": "baseline", "present": False}


def test_without_an_expected_file_recorded_at_cutoff_2_the_outcome_is_unknown() -> None:
    verdict = decide_delivery(delivering(expected_file_sha256=None), [], present(), destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_a_receipt_this_attempt_appended_after_its_confirmed_rename_is_completed() -> None:
    evidence = [
        ABSENT_BASELINE,
        {"observation": "rename", "result": "ok"},
        {"observation": "read_back", "present": True, "size": len(DATA), "sha256": SHA.hex()},
    ]
    verdict = decide_delivery(delivering(), evidence, None, destination(hash_evidence="read_back"))
    assert verdict.resolution == JobStatus.COMPLETED
    assert verdict.summary.startswith("receipt of this attempt")


def test_an_overwriting_rename_whose_baseline_was_lost_is_not_proven_by_name_and_size() -> None:
    # A replacement under an overwrite agreement: its posix_rename and read-back were recorded, its baseline
    # append was lost when the worker was killed. Name and size cannot tell its file from the original's.
    evidence = [
        {"observation": "rename", "form": "posix_rename", "result": "ok"},
        {"observation": "read_back", "present": True, "size": len(DATA)},
    ]
    replacement = delivering(replaces_job_id=uuid.uuid4(), overwrite_agreement_ref="AGR-7")
    verdict = decide_delivery(replacement, evidence, None, destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_an_overwriting_rename_whose_baseline_was_lost_is_proven_by_its_read_back_hash() -> None:
    evidence = [
        {"observation": "rename", "form": "posix_rename", "result": "ok"},
        {"observation": "read_back", "present": True, "size": len(DATA), "sha256": SHA.hex()},
    ]
    replacement = delivering(replaces_job_id=uuid.uuid4(), overwrite_agreement_ref="AGR-7")
    verdict = decide_delivery(replacement, evidence, None, destination(hash_evidence="read_back"))
    assert verdict.resolution == JobStatus.COMPLETED


def test_a_read_back_without_a_confirmed_rename_is_no_receipt() -> None:
    evidence = [
        ABSENT_BASELINE,
        {"observation": "read_back", "present": True, "size": len(DATA), "sha256": SHA.hex()},
    ]
    verdict = decide_delivery(delivering(), evidence, None, destination(hash_evidence="read_back"))
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_an_unobserved_destination_without_a_receipt_is_unknown() -> None:
    verdict = decide_delivery(
        delivering(), [ABSENT_BASELINE], None, destination(), observe_error="TimeoutError"
    )
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN and "TimeoutError" in verdict.summary


def test_an_absent_final_name_is_unknown_never_failed() -> None:
    verdict = decide_delivery(delivering(), [ABSENT_BASELINE], Observation(present=False), destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_an_originals_final_name_present_with_the_expected_size_from_an_absent_baseline_is_completed() -> (
    None
):
    verdict = decide_delivery(delivering(), [ABSENT_BASELINE], present(), destination())
    assert verdict.resolution == JobStatus.COMPLETED


def test_a_wrong_size_under_the_final_name_is_unknown() -> None:
    verdict = decide_delivery(delivering(), [ABSENT_BASELINE], present(size=3), destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_an_original_whose_baseline_was_occupied_is_unknown() -> None:
    baseline = {"observation": "baseline", "present": True, "size": 9, "mtime": 1}
    verdict = decide_delivery(delivering(), [baseline], present(), destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def test_a_replacement_without_a_recorded_baseline_is_unknown_the_file_may_be_the_originals() -> None:
    replacement = delivering(replaces_job_id=uuid.uuid4(), replacement_reason="lost")
    verdict = decide_delivery(replacement, [], present(), destination())
    assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN


def _event(kind: EventKind, attempt_id: uuid.UUID, observed_by: str, detail: str) -> AttemptEvent:
    return AttemptEvent(
        id=1,
        job_id=uuid.uuid4(),
        attempt_id=attempt_id,
        kind=kind,
        version=None,
        worker_id=None,
        observed_by=observed_by,
        detail=detail,
        recorded_at=datetime.now(UTC),
    )


def test_attempt_evidence_is_this_attempts_own_not_recoverys_nor_another_attempts() -> None:
    mine = json.dumps({"observation": "baseline", "present": False})
    events = [
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "worker-3", mine),
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "recovery:run-1", mine),
        _event(EventKind.DELIVERY_EVIDENCE, uuid.uuid4(), "worker-4", mine),
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "worker-3", "not json"),
        _event(EventKind.FINISHED, ATTEMPT, "worker-3", mine),
    ]
    assert attempt_evidence(events, ATTEMPT) == [{"observation": "baseline", "present": False}]


def test_a_worker_whose_host_name_starts_with_recovery_keeps_its_own_evidence() -> None:
    mine = json.dumps({"observation": "receipt", "size": 12})
    events = [
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "recovery-7-4242-a1b2c3", mine),
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "recoveryhost-1", mine),
        _event(EventKind.DELIVERY_EVIDENCE, ATTEMPT, "recovery:recovery-schedule/run-9", mine),
    ]
    assert attempt_evidence(events, ATTEMPT) == [{"observation": "receipt", "size": 12}] * 2


# -- after recovery set the temporary file aside (decide_after_set_aside) -------------------------------

ABSENT = Observation(present=False)
UNKNOWN = Verdict(
    resolution=JobStatus.OUTCOME_UNKNOWN, summary="final name absent; no receipt of this attempt"
)
ASIDE = "aside"


def fenced(**fields: Any):  # noqa: ANN201 - an ExportJob
    return delivering(rename_fenced_at=datetime.now(UTC), **fields)


def test_set_aside_is_tried_only_in_place_of_an_unknown_after_the_rename_fence_with_the_partner_answering():
    assert may_set_aside(fenced(), UNKNOWN, ABSENT)
    assert not may_set_aside(delivering(), UNKNOWN, ABSENT)  # no rename fence: the upload may be partial
    assert not may_set_aside(fenced(), UNKNOWN, None)  # the partner did not answer the listing
    assert not may_set_aside(fenced(expected_file_sha256=None), UNKNOWN, ABSENT)
    completed = Verdict(resolution=JobStatus.COMPLETED, summary="listing by recovery")
    assert not may_set_aside(fenced(), completed, present())


def test_a_file_moved_or_found_aside_under_an_unchanged_final_name_is_not_delivered():
    for result, how in (("ok", "moved"), ("already_moved", "found")):
        for evidence, final in (([ABSENT_BASELINE], ABSENT), ([], ABSENT)):
            verdict = decide_after_set_aside(
                fenced(), evidence, destination(), UNKNOWN, SetAside(ASIDE, result), final
            )
            assert verdict.resolution == JobStatus.FAILED
            assert verdict.summary.startswith(f"recovery {how} the attempt's temporary file under {ASIDE}")


def test_a_set_aside_file_proves_nothing_when_the_final_name_changed_or_the_move_did_not_happen():
    moved = SetAside(ASIDE, "ok")
    cases = [
        (moved, present(), "the final name changed since the baseline"),
        (SetAside(ASIDE, "refused", status=3), ABSENT, "refused (status 3)"),
        (SetAside(ASIDE, "gone", status=2), ABSENT, "neither the temporary nor the set-aside name"),
    ]
    for aside, after, why in cases:
        verdict = decide_after_set_aside(fenced(), [ABSENT_BASELINE], destination(), UNKNOWN, aside, after)
        assert verdict.resolution == JobStatus.OUTCOME_UNKNOWN
        assert verdict.summary.startswith(UNKNOWN.summary) and why in verdict.summary
    unasked = decide_after_set_aside(fenced(), [], destination(), UNKNOWN, None, None, error="TimeoutError")
    assert unasked.resolution == JobStatus.OUTCOME_UNKNOWN and "TimeoutError" in unasked.summary


def test_a_temporary_file_a_rename_took_since_the_listing_is_decided_on_the_final_name():
    gone = SetAside(ASIDE, "gone", status=2)
    ours = decide_after_set_aside(fenced(), [ABSENT_BASELINE], destination(), UNKNOWN, gone, present())
    assert ours.resolution == JobStatus.COMPLETED
    wrong = decide_after_set_aside(fenced(), [ABSENT_BASELINE], destination(), UNKNOWN, gone, present(size=3))
    assert wrong.resolution == JobStatus.OUTCOME_UNKNOWN

"""The delivery rules as pure functions: one case per rule, named as the rule."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from domain.destination import Destination
from domain.evidence import Ack, FileToDeliver, Observation, OriginalFile, temp_name_for
from domain.models import DeliveryOutcome, FailureCode
from rules.delivery import classify_refusal, confirm_delivery, decide_occupied, identify_original

ORIGINAL_BYTES = b"original export"
NAME = "contacts-k.csv"
ORIGINAL = OriginalFile(
    name=NAME,
    size=len(ORIGINAL_BYTES),
    sha256=hashlib.sha256(ORIGINAL_BYTES).digest(),
    attempt_id=uuid.uuid4(),
)
OTHER_SHA = hashlib.sha256(b"other export!!!").digest()  # same length as ORIGINAL_BYTES


def destination(**contract) -> Destination:
    fields = dict(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        name="p",
        host="127.0.0.1",
        port=22,
        username="partner",
        host_key="ssh-ed25519 AAAA",
        credential_ref="/k",
        remote_dir="/upload",
    )
    return Destination(**(fields | contract))


def present(
    size: int = len(ORIGINAL_BYTES), sha256: bytes | None = None, ack: dict | None = None
) -> Observation:
    return Observation(present=True, size=size, mtime=1_700_000_000, sha256=sha256, ack=ack)


def ack_of(sha256: bytes, size: int = len(ORIGINAL_BYTES), upload: str | None = None) -> dict:
    return {"name": NAME, "size": size, "sha256": sha256.hex(), "upload": upload}


def file_of(data: bytes) -> FileToDeliver:
    return FileToDeliver(path=None, final_name=NAME, size=len(data), sha256=hashlib.sha256(data).digest())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("baseline", "contract", "expected"),
    [
        (present(sha256=ORIGINAL.sha256), {}, "sha256"),
        (
            present(sha256=OTHER_SHA),
            {"name_and_size_identify": True},
            None,
        ),  # a hash that differs outweighs size
        (present(ack=ack_of(ORIGINAL.sha256)), {}, "ack"),
        (present(ack=ack_of(OTHER_SHA)), {"name_and_size_identify": True}, None),  # an ack of other bytes
        (
            present(ack=ack_of(ORIGINAL.sha256, size=99)),
            {},
            None,
        ),  # an ack of a file that is not the one there
        (present(), {"name_and_size_identify": True}, "name_and_size"),
        (present(), {}, None),  # same size, neither hash nor ack, contract does not accept name and size
        (present(size=3), {"name_and_size_identify": True}, None),
    ],
)
def test_the_file_found_is_the_originals_only_on_the_contracts_evidence(baseline, contract, expected):
    assert identify_original(baseline, ORIGINAL, destination(**contract)) == expected


def test_an_ack_naming_the_originals_upload_identifies_it_when_its_hash_is_unknown():
    original = OriginalFile(name=NAME, size=len(ORIGINAL_BYTES), sha256=None, attempt_id=ORIGINAL.attempt_id)
    upload = temp_name_for(ORIGINAL.attempt_id, NAME)
    assert identify_original(present(ack=ack_of(OTHER_SHA, upload=upload)), original, destination()) == "ack"
    assert (
        identify_original(present(ack=ack_of(OTHER_SHA, upload=".partial-x")), original, destination())
        is None
    )


def test_an_original_finding_its_name_taken_fails_occupied_whatever_is_there():
    decision = decide_occupied(present(sha256=ORIGINAL.sha256), None, destination(), overwrite_agreed=True)
    assert decision.report is not None
    assert (decision.report.outcome, decision.report.failure_code) == (
        DeliveryOutcome.FAILED,
        FailureCode.FINAL_NAME_OCCUPIED,
    )


@pytest.mark.parametrize(
    ("baseline", "agreed", "expected"),
    [
        (
            present(sha256=ORIGINAL.sha256),
            True,
            FailureCode.ORIGINAL_DELIVERED,
        ),  # identified: never overwritten
        (present(sha256=OTHER_SHA), False, FailureCode.FINAL_NAME_OCCUPIED),
        (present(sha256=OTHER_SHA), True, None),  # upload and overwrite
    ],
)
def test_a_replacement_finding_its_name_taken(baseline, agreed, expected):
    decision = decide_occupied(baseline, ORIGINAL, destination(), overwrite_agreed=agreed)
    assert (decision.report.failure_code if decision.report else None) == expected
    assert decision.overwrite is (expected is None)


NEW = b"rebuilt export!"


@pytest.mark.parametrize(
    ("after", "contract", "overwrite", "ack_tied", "expected"),
    [
        (present(size=len(NEW)), {}, False, False, DeliveryOutcome.COMPLETED),
        (present(size=len(NEW)), {}, True, False, DeliveryOutcome.OUTCOME_UNKNOWN),  # overwrite needs more
        (present(size=len(NEW) + 1), {}, False, False, DeliveryOutcome.OUTCOME_UNKNOWN),
        (Observation(present=False), {}, False, False, DeliveryOutcome.OUTCOME_UNKNOWN),
        (
            present(size=len(NEW), sha256=hashlib.sha256(NEW).digest()),
            {"hash_evidence": "read_back"},
            True,
            False,
            DeliveryOutcome.COMPLETED,
        ),
        (
            present(size=len(NEW), sha256=OTHER_SHA),
            {"hash_evidence": "read_back"},
            False,
            False,
            DeliveryOutcome.OUTCOME_UNKNOWN,
        ),
        (
            present(size=len(NEW)),
            {"hash_evidence": "ack_file", "ack_suffix": ".ack"},
            True,
            True,
            DeliveryOutcome.COMPLETED,
        ),
        (
            present(size=len(NEW)),
            {"hash_evidence": "ack_file", "ack_suffix": ".ack"},
            False,
            False,
            DeliveryOutcome.OUTCOME_UNKNOWN,
        ),
    ],
)
def test_completed_needs_evidence_tied_to_this_attempt(after, contract, overwrite, ack_tied, expected):
    report = confirm_delivery(
        after, file_of(NEW), destination(**contract), overwrite=overwrite, ack_tied=ack_tied
    )
    assert report.outcome == expected


def test_a_refusal_is_not_delivered_only_when_the_fresh_listing_equals_the_baseline():
    absent = Observation(present=False)
    assert classify_refusal("rename", 4, absent, absent).failure_code == FailureCode.NOT_DELIVERED
    assert classify_refusal("rename", 4, absent, present()).outcome == DeliveryOutcome.OUTCOME_UNKNOWN
    moved = present().model_copy(update={"mtime": 1_700_000_001})
    assert classify_refusal("posix_rename", 4, present(), moved).outcome == DeliveryOutcome.OUTCOME_UNKNOWN


def test_an_ack_is_tied_to_an_upload_by_name_size_hash_and_the_upload_it_names():
    upload = temp_name_for(uuid.uuid4(), NAME)
    sha = hashlib.sha256(NEW).digest()
    ack = Ack.model_validate(ack_of(sha, size=len(NEW), upload=upload))
    assert ack.acknowledges(NAME, len(NEW), sha, upload)
    assert not ack.acknowledges(NAME, len(NEW), sha, temp_name_for(uuid.uuid4(), NAME))
    assert not ack.acknowledges(NAME, len(NEW), OTHER_SHA, upload)
    assert not ack.acknowledges("contacts-other.csv", len(NEW), sha, upload)


@pytest.mark.parametrize("raw", [b"not json", b"[]", json.dumps({"name": NAME}).encode(), b"\xff\xfe"])
def test_an_ack_not_in_the_agreed_format_is_no_ack(raw):
    assert Ack.parse(raw) is None

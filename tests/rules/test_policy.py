"""The claim's policy check is a pure function of the facts it reads (000 "The Worker"; 001 "facts that live
outside the claimed row"): each refusal has its code and the message the console and API show."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Any

import pytest

from domain.controls import PolicyFacts
from domain.models import JobStatus, RejectionCode
from rules.policy import evaluate_policy

TODAY = date(2026, 11, 14)


def facts(**fields: Any) -> PolicyFacts:
    """Facts of a queued export that the policy allows; each test changes what it is about."""
    values: dict[str, Any] = {
        "job_id": uuid.uuid4(),
        "tenant_id": uuid.uuid4(),
        "status": JobStatus.QUEUED,
        "version": 1,
        "attempt_id": None,
        "destination_id": uuid.uuid4(),
        "list_name": "newsletter",
        "created_by": "sam.ops",
        "destination_found": True,
        "destination_name": "partner-old",
        "destination_retired_at": None,
        "contract_starts_on": date(2025, 1, 1),
        "contract_ends_on": None,
        "principal_found": True,
        "principal_role": "operator",
        "principal_revoked_at": None,
        "principal_lists": None,
        "list_exists": True,
        "deliveries_open": True,
        "today": TODAY,
    }
    values.update(fields)
    return PolicyFacts(**values)


def test_an_active_destination_in_contract_a_permitted_creator_and_an_existing_list_are_allowed() -> None:
    decision = evaluate_policy(facts())
    assert decision.allowed and decision.code is None and decision.message == ""


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        ({"list_name": "   "}, RejectionCode.LIST_INVALID, "Rejected: no contact list named"),
        ({"list_name": "x" * 201}, RejectionCode.LIST_INVALID, "Rejected: the list name is not allowed"),
        ({"list_name": "main\x00"}, RejectionCode.LIST_INVALID, "Rejected: the list name is not allowed"),
        (
            {"destination_found": False, "destination_name": None},
            RejectionCode.DESTINATION_NOT_FOUND,
            "Rejected: the destination is not one of this tenant's",
        ),
        (
            {"destination_retired_at": datetime(2026, 11, 2, 9, 30, tzinfo=UTC)},
            RejectionCode.DESTINATION_RETIRED,
            "Rejected: partner-old was retired on 2026-11-02",
        ),
        (
            {"contract_starts_on": date(2026, 12, 1)},
            RejectionCode.CONTRACT_NOT_STARTED,
            "Rejected: partner-old's contract starts on 2026-12-01",
        ),
        (
            {"contract_ends_on": date(2026, 10, 31)},
            RejectionCode.CONTRACT_ENDED,
            "Rejected: partner-old's contract ended on 2026-10-31",
        ),
        (
            {"principal_found": False, "principal_role": None},
            RejectionCode.CREATOR_UNKNOWN,
            "Rejected: sam.ops is not a principal of this tenant",
        ),
        (
            {"principal_revoked_at": datetime(2026, 11, 10, 8, 0, tzinfo=UTC)},
            RejectionCode.CREATOR_REVOKED,
            "Rejected: sam.ops's access was revoked on 2026-11-10",
        ),
        (
            {"principal_role": "viewer"},
            RejectionCode.CREATOR_NOT_PERMITTED,
            "Rejected: sam.ops's role (viewer) may not export",
        ),
        (
            {"principal_lists": ["vip"]},
            RejectionCode.CREATOR_NOT_PERMITTED,
            "Rejected: sam.ops may not export the list 'newsletter'",
        ),
        (
            {"list_exists": False},
            RejectionCode.LIST_MISSING,
            "Rejected: the list 'newsletter' has no contacts in this tenant",
        ),
    ],
)
def test_each_refusal_has_its_code_and_message(
    changes: dict[str, Any], code: RejectionCode, message: str
) -> None:
    decision = evaluate_policy(facts(**changes))
    assert not decision.allowed
    assert decision.code == code and decision.message == message


def test_the_contract_window_includes_both_of_its_days() -> None:
    assert evaluate_policy(facts(contract_starts_on=TODAY, contract_ends_on=TODAY)).allowed
    assert evaluate_policy(facts(contract_ends_on=date(2026, 11, 13))).code == RejectionCode.CONTRACT_ENDED
    assert (
        evaluate_policy(facts(contract_starts_on=date(2026, 11, 15))).code
        == RejectionCode.CONTRACT_NOT_STARTED
    )


def test_a_granted_list_is_allowed_and_a_200_character_name_is_well_formed() -> None:
    assert evaluate_policy(facts(principal_lists=["newsletter", "vip"])).allowed
    assert evaluate_policy(facts(list_name="x" * 200)).allowed


def test_the_first_refusal_wins_destination_before_creator_before_list() -> None:
    everything_wrong = facts(
        contract_ends_on=date(2026, 10, 31),
        principal_revoked_at=datetime(2026, 11, 1, tzinfo=UTC),
        list_exists=False,
    )
    assert evaluate_policy(everything_wrong).code == RejectionCode.CONTRACT_ENDED
    assert (
        evaluate_policy(facts(principal_found=False, list_exists=False)).code == RejectionCode.CREATOR_UNKNOWN
    )


def test_a_pause_is_not_the_policys_business() -> None:
    # The worker does not evaluate while paused; if it did, a pause would not make the policy refuse.
    assert evaluate_policy(facts(deliveries_open=False)).allowed


def test_every_code_the_policy_writes_is_one_the_database_accepts() -> None:
    from pathlib import Path

    migration = (Path(__file__).resolve().parents[2] / "db" / "migrations" / "0006_controls.sql").read_text()
    for code in RejectionCode:
        assert f"'{code.value}'" in migration

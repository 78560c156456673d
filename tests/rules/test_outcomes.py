"""What an attempt's own writes mean for the attempt: one mapping for the activities and the workflow."""

from __future__ import annotations

import pytest

from domain.models import AttemptOutcome, AuthorizationResult, DeliveryOutcome, FinishResult
from rules.outcomes import after_delivery, after_refused_cutoff, after_terminal_write, unwritten


def test_a_terminal_write_that_matched_is_its_outcome() -> None:
    assert after_terminal_write(FinishResult.WRITTEN, AttemptOutcome.STOPPED) == AttemptOutcome.STOPPED


def test_a_terminal_write_on_another_attempts_row_is_not_owner_and_an_unanswered_one_is_left_to_recovery() -> (
    None
):
    assert after_terminal_write(FinishResult.NOT_OWNER, AttemptOutcome.FAILED) == AttemptOutcome.NOT_OWNER
    assert (
        after_terminal_write(FinishResult.UNKNOWN, AttemptOutcome.FAILED) == AttemptOutcome.LEFT_TO_RECOVERY
    )
    assert unwritten(None) == AttemptOutcome.LEFT_TO_RECOVERY


@pytest.mark.parametrize(
    ("delivery", "expected"),
    [
        (DeliveryOutcome.COMPLETED, AttemptOutcome.COMPLETED),
        (DeliveryOutcome.FAILED, AttemptOutcome.FAILED),
        (DeliveryOutcome.OUTCOME_UNKNOWN, AttemptOutcome.OUTCOME_UNKNOWN),
    ],
)
def test_a_delivery_whose_terminal_write_matched_is_its_classified_outcome(
    delivery: DeliveryOutcome, expected: AttemptOutcome
) -> None:
    assert after_delivery(delivery, FinishResult.WRITTEN) == expected


def test_a_delivery_whose_terminal_write_did_not_match_says_so_whatever_it_classified() -> None:
    assert after_delivery(DeliveryOutcome.COMPLETED, FinishResult.NOT_OWNER) == AttemptOutcome.NOT_OWNER
    assert after_delivery(DeliveryOutcome.COMPLETED, FinishResult.UNKNOWN) == AttemptOutcome.LEFT_TO_RECOVERY


def test_an_upload_that_never_started_is_not_owner_or_left_to_recovery() -> None:
    assert after_delivery(None, FinishResult.NOT_OWNER) == AttemptOutcome.NOT_OWNER
    assert after_delivery(None, FinishResult.UNKNOWN) == AttemptOutcome.LEFT_TO_RECOVERY
    assert after_delivery(None, None) == AttemptOutcome.LEFT_TO_RECOVERY


def test_a_refused_cutoff_writes_nothing_and_only_not_owner_says_so() -> None:
    assert after_refused_cutoff(AuthorizationResult.NOT_OWNER) == AttemptOutcome.NOT_OWNER
    for answer in (AuthorizationResult.LEASE_LAPSED, AuthorizationResult.UNKNOWN):
        assert after_refused_cutoff(answer) == AttemptOutcome.LEFT_TO_RECOVERY

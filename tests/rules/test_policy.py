"""The claim's policy check is a pure function of the terms it evaluates (000 "The Worker")."""

from __future__ import annotations

from rules.policy import evaluate_policy
from tests.rules.factories import job


def test_a_named_list_is_allowed() -> None:
    assert evaluate_policy(job(list_name="newsletter")).allowed


def test_a_blank_list_name_is_refused_with_a_reason() -> None:
    decision = evaluate_policy(job(list_name="   "))
    assert not decision.allowed and decision.reason == "policy: no contact list named"


def test_an_oversized_or_control_character_list_name_is_refused() -> None:
    assert not evaluate_policy(job(list_name="x" * 201)).allowed
    assert not evaluate_policy(job(list_name="main\x00")).allowed
    assert evaluate_policy(job(list_name="x" * 200)).allowed

"""Which delivery failures are tried again (issue #25, item 4): ``rules.retries`` classifies a NotDelivered's
cause from the attempt's own evidence (observation kinds, connect codes, SFTP status codes), never a message."""

from __future__ import annotations

import random

import pytest

from domain.models import DeliveryOutcome, FailureCause, FailureCode
from rules.retries import (
    TRANSIENT_CAUSES,
    RetryPolicy,
    classify_failure,
    is_transient,
    retry_cause,
    retry_delay_seconds,
)

BASELINE = {"observation": "baseline", "final_name": "f.csv", "present": False}
CONNECTED = {"observation": "connect", "result": "ok", "host_key": "SHA256:x", "session": "new"}


def refused_connect(code: str) -> list[dict]:
    return [
        {"observation": "connect", "result": "retry", "error": "ConnectRefused", "code": code},
        {"observation": "connect", "result": "refused", "error": "ConnectRefused", "code": code},
    ]


@pytest.mark.parametrize("code", ["Unreachable", "HandshakeFailed", "LinkLost"])
def test_a_connect_refused_or_not_answered_is_transient(code):
    assert classify_failure(refused_connect(code)) == FailureCause.CONNECT_REFUSED


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("AuthRefused", FailureCause.AUTH_REFUSED),
        ("HostKeyMismatch", FailureCause.HOST_KEY_MISMATCH),
        ("HostKeyUnusable", FailureCause.OTHER),
        ("CredentialUnreadable", FailureCause.OTHER),
    ],
)
def test_a_login_or_key_refused_is_permanent(code, cause):
    assert classify_failure(refused_connect(code)) == cause
    assert not is_transient(cause)


def test_a_connect_retried_and_then_answered_decides_nothing():
    evidence = [
        {"observation": "connect", "result": "retry", "code": "Unreachable"},
        CONNECTED,
        BASELINE,
        {"observation": "upload", "result": "refused", "status": 3, "bytes_sent": 0},
    ]
    assert classify_failure(evidence) == FailureCause.PERMISSION_DENIED


@pytest.mark.parametrize("phase", ["baseline", "upload"])
def test_a_session_cut_before_the_rename_request_is_transient(phase):
    evidence = [
        CONNECTED,
        {"observation": "interrupted", "phase": phase, "rename_sent": False, "error": "OSError"},
        # the fresh listing on a new session failed too: it does not decide the cause
        {"observation": "interrupted", "phase": "fresh_listing", "rename_sent": False, "error": "EOFError"},
    ]
    assert classify_failure(evidence) == FailureCause.SESSION_CUT


def test_a_baseline_listing_refused_is_a_refusal_not_a_cut():
    evidence = [
        CONNECTED,
        {"observation": "interrupted", "phase": "baseline", "rename_sent": False, "status": 3},
    ]
    assert classify_failure(evidence) == FailureCause.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("fields", "cause"),
    [
        ({"status": 14}, FailureCause.NO_SPACE),  # SSH_FX_NO_SPACE_ON_FILESYSTEM
        ({"status": 15}, FailureCause.NO_SPACE),  # SSH_FX_QUOTA_EXCEEDED
        (
            {"status": 4, "no_space": True},
            FailureCause.NO_SPACE,
        ),  # a v3 FAILURE whose answer spoke of a quota
        ({"status": 4}, FailureCause.OTHER),  # a bare FAILURE: not known to pass, a person looks
        ({"status": 3}, FailureCause.PERMISSION_DENIED),
    ],
)
def test_an_upload_refusal_is_classified_by_its_status(fields, cause):
    evidence = [
        CONNECTED,
        BASELINE,
        {"observation": "upload", "result": "refused", "bytes_sent": 65536, **fields},
        {"observation": "fresh_listing", "final_name": "f.csv", "present": False},
    ]
    assert classify_failure(evidence) == cause


def test_a_refused_upload_decides_even_when_the_dropped_session_then_cut_the_fresh_listing():
    evidence = [
        CONNECTED,
        BASELINE,
        {"observation": "upload", "result": "refused", "status": 4, "no_space": True},
        {"observation": "interrupted", "phase": "fresh_listing", "rename_sent": False, "error": "OSError"},
    ]
    assert classify_failure(evidence) == FailureCause.NO_SPACE


@pytest.mark.parametrize(
    "step",
    [
        {"observation": "rename", "form": "rename", "result": "not_authorized"},
        {"observation": "rename", "form": "rename", "result": "refused", "status": 4},
        {"observation": "set_aside", "result": "ok"},
        {"observation": "final_name_occupied", "replacement": False},
    ],
)
def test_whatever_happened_past_the_upload_is_not_retried(step):
    assert classify_failure([CONNECTED, BASELINE, step]) == FailureCause.OTHER


def test_no_evidence_is_no_reason_to_try_again():
    assert classify_failure([]) == FailureCause.OTHER


def test_only_a_failed_not_delivered_with_a_transient_cause_is_retried():
    cut = refused_connect("Unreachable")
    assert retry_cause(DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED, cut) == FailureCause.CONNECT_REFUSED
    assert retry_cause(DeliveryOutcome.FAILED, FailureCode.FINAL_NAME_OCCUPIED, cut) is None
    assert retry_cause(DeliveryOutcome.OUTCOME_UNKNOWN, None, cut) is None
    assert retry_cause(DeliveryOutcome.COMPLETED, None, cut) is None
    assert (
        retry_cause(DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED, refused_connect("AuthRefused")) is None
    )


def test_the_transient_causes_are_the_three_the_issue_names():
    assert {c.value for c in TRANSIENT_CAUSES} == {"connect_refused", "session_cut", "no_space"}


def test_the_wait_doubles_per_attempt_used_up_to_the_cap_scaled_by_the_jitter():
    policy = RetryPolicy(base_seconds=30.0, cap_seconds=100.0, max_attempts=5)
    assert [retry_delay_seconds(policy, n, 1.0) for n in range(4)] == [30.0, 60.0, 100.0, 100.0]
    assert retry_delay_seconds(policy, 0, 0.0) == 15.0
    assert 0.0 <= RetryPolicy(rng=random.Random(7)).jitter() < 1.0

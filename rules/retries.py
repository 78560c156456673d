"""Retries that wait (issue #25, item 4): which delivery failures are tried again, and after how long.

A delivery proven Failed NotDelivered (rules/delivery.py) sent nothing under the final name. Its cause is read
from the attempt's own evidence (partner/evidence.py: observation kinds, SFTP status codes, connect codes,
never message texts), first decisive observation first:

- **transient**, tried again in a new attempt after a backoff, within the attempt cap:
  ``connect_refused`` (the partner refused or did not answer the connect: ``Unreachable``,
  ``HandshakeFailed``, ``LinkLost``), ``session_cut`` (the session was lost before the rename request: at
  the baseline listing, during the upload), ``no_space`` (the partner refused our writes for lack of space:
  SFTP status 14 ``SSH_FX_NO_SPACE_ON_FILESYSTEM`` or 15 ``SSH_FX_QUOTA_EXCEEDED``, or a version 3 server's
  4 ``SSH_FX_FAILURE`` whose answer spoke of a quota or full storage, recorded as the fact ``no_space``);
- **permanent**, Failed at once, for a person: ``auth_refused`` (our login refused), ``permission_denied``
  (SFTP status 3), ``host_key_mismatch`` (the key presented matches none of the pinned ones), and
  ``other``: whatever the evidence does not name (a bare FAILURE, a refused rename, a set-aside, an
  unreadable key of ours). Not knowing is not a reason to try again: a person looks.

The backoff: the next claim waits ``min(cap, base * 2^n)`` scaled by a jitter between 0.5 and 1, where n is
the number of attempts the job used before the failed one (``EXPORTS_DELIVERY_RETRY_BASE_SECONDS``,
``EXPORTS_DELIVERY_RETRY_CAP_SECONDS``); the statement ``retry_delivery_if_delivering`` computes it on the
database clock and :func:`retry_delay_seconds` states the same formula for the tests and the docs.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from domain.models import DeliveryOutcome, FailureCause, FailureCode

# SFTP status codes (draft-ietf-secsh-filexfer-13, section 9.1)
SFTP_FAILURE = 4
SFTP_PERMISSION_DENIED = 3
SFTP_NO_SPACE_ON_FILESYSTEM = 14
SFTP_QUOTA_EXCEEDED = 15

# connect codes of partner.client.ConnectRefused: a partner that did not answer, or whose link dropped
UNANSWERED_CONNECT_CODES = frozenset({"Unreachable", "HandshakeFailed", "LinkLost"})
# the steps of a delivery before its rename request: a session lost there sent no rename
_BEFORE_RENAME = frozenset({"connect", "baseline", "upload"})


TRANSIENT_CAUSES = frozenset({FailureCause.CONNECT_REFUSED, FailureCause.SESSION_CUT, FailureCause.NO_SPACE})


def is_transient(cause: FailureCause) -> bool:
    """Whether a NotDelivered with this cause is tried again (after a backoff, within the attempt cap)."""
    return cause in TRANSIENT_CAUSES


def _status_cause(status: object, no_space: object) -> FailureCause:
    if status in (SFTP_NO_SPACE_ON_FILESYSTEM, SFTP_QUOTA_EXCEEDED):
        return FailureCause.NO_SPACE
    if status == SFTP_FAILURE and no_space is True:
        return FailureCause.NO_SPACE
    if status == SFTP_PERMISSION_DENIED:
        return FailureCause.PERMISSION_DENIED
    return FailureCause.OTHER


def _connect_cause(code: object) -> FailureCause:
    if code in UNANSWERED_CONNECT_CODES:
        return FailureCause.CONNECT_REFUSED
    if code == "HostKeyMismatch":
        return FailureCause.HOST_KEY_MISMATCH
    if code == "AuthRefused":
        return FailureCause.AUTH_REFUSED
    return FailureCause.OTHER


def classify_failure(evidence: Iterable[Mapping[str, Any]]) -> FailureCause:
    """The cause of a NotDelivered, from the attempt's evidence in the order it was recorded: the first
    observation that ended the delivery's progress decides (a refused upload, not the fresh listing a dropped
    session then failed). A connect that was retried and then answered decides nothing."""
    for item in evidence:
        kind, result = item.get("observation"), item.get("result")
        if kind == "connect" and result == "refused":
            return _connect_cause(item.get("code"))
        if kind == "upload" and result == "refused":
            return _status_cause(item.get("status"), item.get("no_space"))
        if kind == "interrupted" and item.get("rename_sent") is False and item.get("phase") in _BEFORE_RENAME:
            if "status" in item:  # the server answered, and refused: not a lost session
                return _status_cause(item.get("status"), item.get("no_space"))
            return FailureCause.SESSION_CUT
        if kind in ("rename", "set_aside", "final_name_occupied"):
            return FailureCause.OTHER  # past the upload: not one of the transient causes
    return FailureCause.OTHER


def retry_cause(
    outcome: DeliveryOutcome, code: FailureCode | None, evidence: Iterable[Mapping[str, Any]]
) -> FailureCause | None:
    """The transient cause for which this delivery is tried again, or ``None``: only a Failed NotDelivered
    whose evidence names a transient cause is."""
    if outcome != DeliveryOutcome.FAILED or code != FailureCode.NOT_DELIVERED:
        return None
    cause = classify_failure(evidence)
    return cause if is_transient(cause) else None


@dataclass(frozen=True)
class RetryPolicy:
    """The backoff of retries and the attempt cap they count against (``EXPORTS_DELIVERY_RETRY_*``,
    ``EXPORTS_MAX_ATTEMPTS``). ``rng`` draws the jitter; tests inject a seeded one."""

    base_seconds: float = 30.0
    cap_seconds: float = 900.0
    max_attempts: int = 3
    rng: random.Random | None = None

    def jitter(self) -> float:
        """A draw in [0, 1): the wait is scaled by ``0.5 + 0.5 * jitter``, so the exports of a partner that
        comes back do not all try again at the same moment."""
        return (self.rng or random).random()


def retry_delay_seconds(policy: RetryPolicy, used_before: int, jitter: float) -> float:
    """The wait before the next try when the job used ``used_before`` attempts before the failed one: the
    formula ``retry_delivery_if_delivering`` applies in SQL."""
    backoff: float = min(policy.cap_seconds, policy.base_seconds * 2.0 ** max(used_before, 0))
    return backoff * (0.5 + 0.5 * jitter)

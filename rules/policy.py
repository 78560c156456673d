"""The claim's policy check: side-effect free, for the version of the terms the worker read (000 "The Worker";
001 "facts that live outside the claimed row").

Before the claim the worker reads, in one statement, the job's version and terms, its destination row,
the creator's principal row and whether the list exists (:class:`domain.controls.PolicyFacts`), and asks
:func:`evaluate_policy`. A refusal is written as Queued -> Rejected for that version only, with the code
and the message people read. Facts outside the claimed row can change after this read: cutoff 2 re-checks
the destination inside its own statement, and the switches are read by the claim and cutoff 2 themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from domain.controls import PolicyFacts
from domain.models import RejectionCode

# The roles whose holders may export: a viewer may not (service.permissions states the API's side; cutoff 2's
# statement in db/queries.sql repeats this list, and a test holds the two to the same answers).
EXPORTING_ROLES = frozenset({"operator", "reconciler", "admin"})
MAX_LIST_NAME = 200


@dataclass(frozen=True)
class PolicyDecision:
    """Allowed, or refused with the code recorded on the Rejected row and the message people read."""

    allowed: bool
    code: RejectionCode | None = None
    message: str = ""


ALLOWED = PolicyDecision(True)


def _day(value: date | datetime) -> str:
    return (value.date() if isinstance(value, datetime) else value).isoformat()


def _refused(code: RejectionCode, message: str) -> PolicyDecision:
    return PolicyDecision(False, code, f"Rejected: {message}")


def evaluate_policy(facts: PolicyFacts) -> PolicyDecision:
    """Whether the queued export described by ``facts`` may be claimed for the terms of ``facts.version``.

    In this order: the list name is well formed; the destination is one of the tenant's, not retired and
    within its contract on ``facts.today`` (UTC days, both ends inclusive); the creator is a principal of
    the tenant, not revoked, whose role may export and who may export this list; the list exists (has
    contacts). The first refusal wins.
    """
    name = facts.list_name
    if not name.strip():
        return _refused(RejectionCode.LIST_INVALID, "no contact list named")
    if len(name) > MAX_LIST_NAME or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return _refused(RejectionCode.LIST_INVALID, "the list name is not allowed")

    destination = facts.destination_name or str(facts.destination_id)
    if not facts.destination_found:
        return _refused(RejectionCode.DESTINATION_NOT_FOUND, "the destination is not one of this tenant's")
    if facts.destination_retired_at is not None:
        return _refused(
            RejectionCode.DESTINATION_RETIRED,
            f"{destination} was retired on {_day(facts.destination_retired_at)}",
        )
    if facts.contract_starts_on is not None and facts.today < facts.contract_starts_on:
        return _refused(
            RejectionCode.CONTRACT_NOT_STARTED,
            f"{destination}'s contract starts on {_day(facts.contract_starts_on)}",
        )
    if facts.contract_ends_on is not None and facts.today > facts.contract_ends_on:
        return _refused(
            RejectionCode.CONTRACT_ENDED, f"{destination}'s contract ended on {_day(facts.contract_ends_on)}"
        )

    creator = facts.created_by
    if not facts.principal_found:
        return _refused(RejectionCode.CREATOR_UNKNOWN, f"{creator} is not a principal of this tenant")
    if facts.principal_revoked_at is not None:
        return _refused(
            RejectionCode.CREATOR_REVOKED,
            f"{creator}'s access was revoked on {_day(facts.principal_revoked_at)}",
        )
    if facts.principal_role not in EXPORTING_ROLES:
        return _refused(
            RejectionCode.CREATOR_NOT_PERMITTED, f"{creator}'s role ({facts.principal_role}) may not export"
        )
    if facts.principal_lists is not None and name not in facts.principal_lists:
        return _refused(RejectionCode.CREATOR_NOT_PERMITTED, f"{creator} may not export the list '{name}'")

    if not facts.list_exists:
        return _refused(RejectionCode.LIST_MISSING, f"the list '{name}' has no contacts in this tenant")
    return ALLOWED

"""What each tenant role may do, stated once (issues #24, #26: roles ``viewer``, ``operator``, ``reconciler``,
``admin``). Every operation that changes something asks :func:`refused` first; the API answers 403 and the
command line exits with its refusal code, and nothing is recorded.

- ``viewer`` reads: exports, their timelines, the switches.
- ``operator`` also creates and edits exports, cancels (one or in bulk), replaces, pauses and resumes its
  tenant's deliveries, and tests a destination's connection (it resumes a destination once its connection
  is checked; a test pins nothing and records nothing).
- ``reconciler`` may do what an operator may, and settles what evidence cannot: reconciliation and
  corrections (000 "Reconciliation": a role only reconciliation operators hold).
- ``admin`` may do what an operator may, and manages the tenant's partner contracts (destinations), its
  recurring exports and its notification endpoints; reconciliation stays the reconciler's.
- Admins and reconcilers read the ledger of operator actions (``GET /audit``); operators and viewers do not.

Stopping takes one person (a cancel, a bulk cancel, a pause). What re-opens deliveries takes two
(:mod:`service.approvals`): one who requests and another principal of the tenant who approves in time, each
with a role that may do the action (resuming a pause someone else set or a host-key change tripped: operator,
reconciler or admin; pinning a host key or changing a destination's host, credentials or encryption keys:
admin; correcting a recorded outcome: reconciler; a replacement with an overwrite agreement: operator,
reconciler or admin). ``TWO_PERSON_ROLES`` states it, and the database's ``approval_roles`` the same.

The database backs the parts it can see: the roles that may export are the policy check's
(``rules.policy.EXPORTING_ROLES``) and cutoff 2's, and reconciliation runs over the reconciler's pool only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from service.outcomes import Answer, Kind, refusal

Role = Literal["viewer", "operator", "reconciler", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "reconciler", "admin")


class Action(StrEnum):
    READ = "read"
    EXPORT = "export"  # create an export, edit a queued one's terms, replace one
    CANCEL = "cancel"  # one export or a bulk cancel (its preview included)
    SWITCH = "switch"  # pause or resume the tenant's or a destination's deliveries
    TEST_CONNECTION = "test a destination's connection"  # what its server presents and allows; pins nothing
    RECONCILE = "reconcile"  # reconcile an OutcomeUnknown, correct a recorded outcome
    MANAGE_DESTINATIONS = "manage destinations"
    MANAGE_RECURRING = "manage recurring exports"
    MANAGE_NOTIFICATIONS = "manage notification endpoints"
    READ_AUDIT = "read the ledger of operator actions"


_OPERATOR = frozenset({Action.READ, Action.EXPORT, Action.CANCEL, Action.SWITCH, Action.TEST_CONNECTION})

PERMISSIONS: dict[str, frozenset[Action]] = {
    "viewer": frozenset({Action.READ}),
    "operator": _OPERATOR,
    "reconciler": _OPERATOR | {Action.RECONCILE, Action.READ_AUDIT},
    "admin": _OPERATOR
    | {Action.MANAGE_DESTINATIONS, Action.MANAGE_RECURRING, Action.MANAGE_NOTIFICATIONS, Action.READ_AUDIT},
}

# What a two-person action needs of both people (the requester and the approver): the permission of the
# action itself. The database's approval_roles() says the same by role (tests/db/test_two_person.py).
TWO_PERSON_PERMISSION: dict[str, Action] = {
    "resume_pause": Action.SWITCH,
    "pin_host_key": Action.MANAGE_DESTINATIONS,
    "change_destination": Action.MANAGE_DESTINATIONS,
    "correct_outcome": Action.RECONCILE,
    "replace_with_overwrite": Action.EXPORT,
}
TWO_PERSON_ROLES: dict[str, list[str]] = {
    action: sorted(role for role, actions in PERMISSIONS.items() if permission in actions)
    for action, permission in TWO_PERSON_PERMISSION.items()
}

_WHO_MAY = {
    action: sorted(role for role, actions in PERMISSIONS.items() if action in actions) for action in Action
}


def may(role: str, action: Action) -> bool:
    """Whether a principal with ``role`` may do ``action`` (an unknown role may do nothing)."""
    return action in PERMISSIONS.get(role, frozenset())


def refused(role: str, action: Action) -> Answer | None:
    """``None`` when ``role`` may do ``action``; else the 403 answer that names who may."""
    if may(role, action):
        return None
    return refusal(
        Kind.FORBIDDEN,
        f"the {role} role may not {action.value}; that needs the {' or '.join(_WHO_MAY[action])} role",
    )

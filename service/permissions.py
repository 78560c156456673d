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


_OPERATOR = frozenset({Action.READ, Action.EXPORT, Action.CANCEL, Action.SWITCH, Action.TEST_CONNECTION})

PERMISSIONS: dict[str, frozenset[Action]] = {
    "viewer": frozenset({Action.READ}),
    "operator": _OPERATOR,
    "reconciler": _OPERATOR | {Action.RECONCILE},
    "admin": _OPERATOR | {Action.MANAGE_DESTINATIONS, Action.MANAGE_RECURRING, Action.MANAGE_NOTIFICATIONS},
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

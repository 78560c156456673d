"""The vocabulary of the ledger of operator actions and of two-person actions (issue #26, items 2 and 3).

A row of ``operator_actions`` says who (a principal and the role it acted with), when, what (an
:class:`AuditAction` on a subject), why, the request ID, the outcome, and the subject before and after. Secrets
never appear: :func:`without_secrets` shows a reference to one (a ``*_ref`` key) as ``"set"`` and drops a key
that names a secret, a password or a private key, and the database refuses a row that still holds one
(``ck_operator_actions_no_secrets``, migration 0031).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from domain.models import Row

__all__ = [
    "ActionRecord",
    "Approval",
    "AuditAction",
    "DeliveryPause",
    "OperatorAction",
    "SubjectKind",
    "TwoPersonAction",
    "TWO_PERSON_DESTINATION_FIELDS",
    "fields_needing_a_second_person",
    "without_secrets",
]


class AuditAction(StrEnum):
    """What an operator did (``ck_operator_actions_action`` lists the same)."""

    CANCEL = "cancel"
    BULK_CANCEL = "bulk_cancel"
    PAUSE = "pause"
    RESUME = "resume"
    RECONCILE = "reconcile"
    CORRECT = "correct"
    REPLACE = "replace"
    DESTINATION_CREATE = "destination.create"
    DESTINATION_EDIT = "destination.edit"
    DESTINATION_RETIRE = "destination.retire"
    DESTINATION_PIN_KEY = "destination.pin_key"
    RECURRING_CREATE = "recurring.create"
    RECURRING_EDIT = "recurring.edit"
    RECURRING_PAUSE = "recurring.pause"
    RECURRING_RESUME = "recurring.resume"
    RECURRING_DELETE = "recurring.delete"
    TOKEN_MINT = "token.mint"
    TOKEN_REVOKE = "token.revoke"
    PRINCIPAL_GRANT = "principal.grant"
    PRINCIPAL_REVOKE = "principal.revoke"
    WEBHOOK_CREATE = "webhook.create"
    WEBHOOK_EDIT = "webhook.edit"  # a rotated secret too (never its value)
    WEBHOOK_DELETE = "webhook.delete"
    WEBHOOK_REDELIVER = "webhook.redeliver"
    LISTING_REQUEST = "listing.request"  # a reconciler's ask for today's listing of a final name
    APPROVAL_APPROVE = "approval.approve"  # an attempt to approve that was refused (an approval that ran is
    APPROVAL_DECLINE = "approval.decline"  # recorded as the action it ran, naming both people)


class SubjectKind(StrEnum):
    """What an action was done to (``ck_operator_actions_subject_kind``)."""

    EXPORT = "export"
    CANCELLATION_BATCH = "cancellation_batch"
    DELIVERY_SCOPE = "delivery_scope"
    DESTINATION = "destination"
    RECURRING_EXPORT = "recurring_export"
    PRINCIPAL = "principal"
    TOKEN = "token"
    APPROVAL = "approval"
    WEBHOOK_ENDPOINT = "webhook_endpoint"


class TwoPersonAction(StrEnum):
    """What takes two people: one who requests, another principal who approves in time (``approvals``)."""

    RESUME_PAUSE = "resume_pause"  # releasing a pause someone else set, or that a host-key change tripped
    PIN_HOST_KEY = "pin_host_key"
    CHANGE_DESTINATION = "change_destination"  # its host, port, account, credential or encryption keys
    CORRECT_OUTCOME = "correct_outcome"
    REPLACE_WITH_OVERWRITE = "replace_with_overwrite"


# The destination fields whose change takes two people (two_person_destination_fields(), migration 0032).
TWO_PERSON_DESTINATION_FIELDS = frozenset(
    {
        "host",
        "port",
        "username",
        "credential_ref",
        "host_key",
        "host_keys",
        "pgp_recipient_keys",
        "pgp_signing_key_ref",
    }
)


def fields_needing_a_second_person(changes: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The fields of a destination's change that take two admins (``destination_versions_approved``, 0036
    states the same): each of ``TWO_PERSON_DESTINATION_FIELDS`` it changes, except removing pinned host keys
    (``host_keys`` left a part of what was pinned trusts less, never more)."""
    fields = set(changes) & TWO_PERSON_DESTINATION_FIELDS
    kept = changes.get("host_keys")
    pinned = current.get("host_keys") or [current.get("host_key")]
    if fields == {"host_keys"} and isinstance(kept, list) and set(kept) <= set(pinned):
        return []
    return sorted(fields)


_SECRET_KEY = re.compile(r"secret|password|private_key")
SET = "set"
# References that name a document, not a secret: shown as they are. Every other ``*_ref`` is a reference to a
# secret (a destination's convention: credential_ref, pgp_signing_key_ref), shown as "set"; the database's check
# (operator_action_json_ok, 0031) allows the same two.
PLAIN_REFERENCES = frozenset({"evidence_ref", "overwrite_agreement_ref"})


def without_secrets(value: Any) -> Any:
    """``value`` (JSON-able) with every reference to a secret shown as ``"set"`` (or ``None``) and every key
    naming a secret, a password or a private key left out, at any depth."""
    if isinstance(value, dict):
        shown: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            if _SECRET_KEY.search(name):
                continue
            secret_reference = name.endswith("_ref") and name not in PLAIN_REFERENCES
            shown[key] = (SET if item is not None else None) if secret_reference else without_secrets(item)
        return shown
    if isinstance(value, list | tuple):
        return [without_secrets(item) for item in value]
    return value


@dataclass
class ActionRecord:
    """One ledger row being made: filled as the action runs, written once (in the action's transaction where
    the action is a database write, else on its own). ``outcome`` is a ``service.outcomes.Kind`` value."""

    tenant_id: UUID | None
    principal: str
    role: str
    action: AuditAction
    subject_kind: SubjectKind
    subject_id: str | None
    request_id: str | None = None
    reason: str | None = None
    outcome: str | None = None
    detail: str | None = None
    approval_id: UUID | None = None
    requested_by: str | None = None
    before: Any = None
    after: Any = None
    written: bool = field(default=False)

    def params(self) -> dict[str, Any]:
        """The named parameters of ``record_operator_action`` (before and after without secrets)."""

        def document(value: Any) -> str | None:
            return None if value is None else json.dumps(without_secrets(value), default=str)

        return {
            "tenant_id": self.tenant_id,
            "principal": self.principal,
            "role": self.role,
            "action": self.action.value,
            "subject_kind": self.subject_kind.value,
            "subject_id": self.subject_id,
            "request_id": self.request_id,
            "reason": self.reason,
            "outcome": self.outcome,
            "detail": (self.detail or None) and self.detail[:2000],
            "approval_id": self.approval_id,
            "requested_by": self.requested_by,
            "before": document(self.before),
            "after": document(self.after),
        }


class OperatorAction(Row):
    """One row of the ledger as it is read back."""

    id: int
    tenant_id: UUID | None
    at: datetime
    principal: str
    role: str
    action: str
    subject_kind: str
    subject_id: str | None
    request_id: str | None
    reason: str | None
    outcome: str
    detail: str | None
    approval_id: UUID | None
    requested_by: str | None
    before: Any
    after: Any


class Approval(Row):
    """A two-person action: asked by one principal, decided by another before it expires, run once."""

    tenant_id: UUID
    id: UUID
    action: TwoPersonAction
    subject_kind: str
    subject_id: str
    parameters: dict[str, Any]
    reason: str
    requested_by: str
    requested_role: str
    requested_at: datetime
    expires_at: datetime
    decision: str | None
    decided_by: str | None
    decided_role: str | None
    decided_at: datetime | None
    decision_reason: str | None
    executed_at: datetime | None
    outcome: str | None
    expired: bool  # undecided past its expiry, on the database clock


class DeliveryPause(Row):
    """An active pause of one scope: its owner, reason, kind and expiry."""

    id: UUID
    scope: str
    tenant_id: UUID | None
    destination_id: UUID | None
    kind: str
    owner: str
    reason: str
    paused_at: datetime
    expires_at: datetime | None

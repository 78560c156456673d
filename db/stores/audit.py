"""The ledger of operator actions and the approvals of two-person actions (issue #26; migrations 0031, 0032).

The ledger is appended by every store (``StoreBase.recording`` / ``record_operator_action``, in the role that
runs the action) and read by the API's (``AuditReads``). Approvals are asked for and read by the API's store;
the decision and the run's outcome are written by the store that runs the approved action, in its transaction
(``ApprovalDecisions``: the API's, and the reconciler's for a correction).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from db.rows import IdRow
from db.stores.base import StoreBase
from domain.audit import Approval, OperatorAction


class AuditReads(StoreBase):
    """The ledger, read a page at a time (role ``exports_api``)."""

    async def page_operator_actions(
        self,
        tenant_id: UUID,
        *,
        limit: int,
        before_id: int | None = None,
        principal: str | None = None,
        action: str | None = None,
        subject_kind: str | None = None,
        subject_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[OperatorAction]:
        """Up to ``limit`` rows of the tenant's ledger, newest first, older than ``before_id``, filtered."""
        return await self._rows(
            "page_operator_actions",
            {
                "tenant_id": tenant_id,
                "limit": limit,
                "before_id": before_id,
                "principal": principal,
                "action": action,
                "subject_kind": subject_kind,
                "subject_id": subject_id,
                "since": since,
                "until": until,
            },
            OperatorAction,
        )


class ApprovalDecisions(StoreBase):
    """The second person's decision and the approved action's outcome, in the action's transaction."""

    async def decide_approval(
        self,
        *,
        tenant_id: UUID,
        approval_id: UUID,
        decision: str,
        decided_by: str,
        decided_role: str,
        decision_reason: str | None,
    ) -> bool:
        """Approve or decline a waiting approval; False when it was decided already. The database refuses the
        requester (``ck_approvals_second_person``), a decision after expiry (``ck_approvals_expired``) and a
        role that may not do the action (``ck_approvals_role``)."""
        rows = await self._rows(
            "decide_approval",
            {
                "tenant_id": tenant_id,
                "approval_id": approval_id,
                "decision": decision,
                "decided_by": decided_by,
                "decided_role": decided_role,
                "decision_reason": decision_reason,
            },
            IdRow,
        )
        return bool(rows)

    async def conclude_approval(self, *, tenant_id: UUID, approval_id: UUID, outcome: str) -> bool:
        """Record that an approved action ran, and what it answered (once)."""
        rows = await self._rows(
            "conclude_approval",
            {"tenant_id": tenant_id, "approval_id": approval_id, "outcome": outcome},
            IdRow,
        )
        return bool(rows)


class ApprovalStatements(ApprovalDecisions):
    """Two-person actions asked for and read (role ``exports_api``)."""

    async def insert_approval(
        self,
        *,
        tenant_id: UUID,
        action: str,
        subject_kind: str,
        subject_id: str,
        parameters: dict[str, Any],
        reason: str,
        requested_by: str,
        requested_role: str,
        ttl_seconds: int,
    ) -> Approval:
        """Ask for a two-person action: it waits ``ttl_seconds`` (database clock) for another principal."""
        [approval] = await self._rows(
            "insert_approval",
            {
                "tenant_id": tenant_id,
                "action": action,
                "subject_kind": subject_kind,
                "subject_id": subject_id,
                "parameters": json.dumps(parameters, default=str),
                "reason": reason,
                "requested_by": requested_by,
                "requested_role": requested_role,
                "ttl_seconds": ttl_seconds,
            },
            Approval,
        )
        return approval

    async def find_approval(self, tenant_id: UUID, approval_id: UUID) -> Approval | None:
        """One approval of the tenant, or ``None`` (another tenant's looks missing)."""
        return await self._row(
            "find_approval", {"tenant_id": tenant_id, "approval_id": approval_id}, Approval
        )

    async def page_approvals(
        self, tenant_id: UUID, *, pending_only: bool, limit: int = 100
    ) -> list[Approval]:
        """The tenant's approvals, newest first; with ``pending_only``, those still waiting and unexpired."""
        return await self._rows(
            "page_approvals", {"tenant_id": tenant_id, "pending_only": pending_only, "limit": limit}, Approval
        )

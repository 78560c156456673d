"""A second person for what re-opens deliveries (issue #26, item 3).

Stopping takes one person. These take two, one who requests and another principal of the tenant who approves
within a time limit, both recorded:

- resuming a pause someone else set, or that a host-key change tripped (``resume_pause``);
- pinning a new host key (``pin_host_key``);
- changing a destination's host, port, account, credential or encryption keys (``change_destination``);
- correcting a recorded outcome (``correct_outcome``);
- a replacement with an overwrite agreement (``replace_with_overwrite``).

**How.** The operation, asked by the first person, checks everything it can (the role, the subject, its
state) and then, instead of acting, records what it would do as an approval (``approvals``: the action, its
parameters, a secret only as a reference, who, why, until when) and answers 202 with it. Another principal
with a role that may do the action approves it (``POST /approvals/{id}/approval``) before it expires: the
action then runs as the approver, through the same service operation and the same conditional statements, in
one transaction that also records the decision, the action's outcome on the approval, and the ledger row that
names both people. The requester cannot approve (403, recorded), nor can anyone after the expiry (409,
recorded); a declined approval never runs. The database refuses the same (migration 0032): a decision by the
requester, after the expiry, or by a role that may not do the action; and each two-person write without an
approval that its writer decided and that has not run yet.

**Wrapping an operation in it** (how ``pin-key`` is wired): give the operation an ``approval`` keyword; at its
top, once its checks pass, one line::

    if approval is None:
        return await self.approvals.request(caller, TwoPersonAction.PIN_HOST_KEY, Subject("destination", id),
                                            parameters, reason, record)

run its write inside ``async with self.approvals.executing(store, record, approval, caller):``, and register
how an approval re-enters it: ``approvals.register(TwoPersonAction.PIN_HOST_KEY, lambda approver, a:
ops.pin_key(approver, UUID(a.subject_id), PinKey(**a.parameters["body"]), approval=a))``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from db.errors import ConstraintRefused, NotPermitted
from db.stores.api import ApiStore
from db.stores.audit import ApprovalDecisions
from domain.audit import ActionRecord, Approval, AuditAction, SubjectKind, TwoPersonAction, without_secrets
from service.audit import Ledger, answered
from service.auth import Caller
from service.outcomes import Answer, Kind, refusal
from service.permissions import TWO_PERSON_PERMISSION, TWO_PERSON_ROLES, may
from service.views import stamp

DEFAULT_TTL_SECONDS = 3600  # an approval waits an hour for its second person (EXPORTS_APPROVAL_TTL_SECONDS)
MAX_TTL_SECONDS = 7 * 24 * 3600  # ck_approvals_window

Executor = Callable[[Caller, Approval], Awaitable[Answer]]

# What each action is, in words, for the answers and the console.
WHAT: dict[TwoPersonAction, str] = {
    TwoPersonAction.RESUME_PAUSE: "resuming a pause someone else set, or a host-key trip",
    TwoPersonAction.PIN_HOST_KEY: "pinning a new host key",
    TwoPersonAction.CHANGE_DESTINATION: "changing a destination's host, credentials or encryption keys",
    TwoPersonAction.CORRECT_OUTCOME: "correcting a recorded outcome",
    TwoPersonAction.REPLACE_WITH_OVERWRITE: "a replacement with an overwrite agreement",
}


@dataclass(frozen=True)
class Subject:
    """What an approval is about: ``delivery_pause``, ``destination`` or ``export``, and its ID."""

    kind: str
    id: object


class Deciding(Protocol):
    """A store that records a decision and an approved action's outcome (the API's, the reconciler's)."""

    def recording(self, record: ActionRecord) -> contextlib.AbstractAsyncContextManager[ActionRecord]: ...

    async def decide_approval(
        self,
        *,
        tenant_id: UUID,
        approval_id: UUID,
        decision: str,
        decided_by: str,
        decided_role: str,
        decision_reason: str | None,
    ) -> bool: ...

    async def conclude_approval(self, *, tenant_id: UUID, approval_id: UUID, outcome: str) -> bool: ...


def approval_json(a: Approval) -> dict[str, Any]:
    """One approval as the API shows it: its parameters with every reference as ``"set"``, its state."""
    data = a.model_dump(mode="json")
    data["parameters"] = without_secrets(a.parameters)
    data["state"] = state_of(a)
    data["what"] = WHAT[a.action]
    data["links"] = {
        "self": f"/approvals/{a.id}",
        "approve": f"/approvals/{a.id}/approval",
        "decline": f"/approvals/{a.id}/refusal",
    }
    return data


def state_of(a: Approval) -> str:
    """``pending``, ``expired``, ``declined``, or ``approved`` (with what it answered when it ran)."""
    if a.decision is None:
        return "expired" if a.expired else "pending"
    return a.decision


class ApprovalTaken(Exception):
    """Another decision committed first: the approval is no longer waiting."""


class Approvals:
    """Two-person actions over the API's store: asked for, read, approved (running the action) or declined."""

    def __init__(self, store: ApiStore, *, ttl_seconds: int = DEFAULT_TTL_SECONDS) -> None:
        if not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
            raise ValueError(f"an approval's time limit is 1 to {MAX_TTL_SECONDS} seconds")
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.ledger = Ledger(store)
        self.executors: dict[TwoPersonAction, Executor] = {}

    def register(self, action: TwoPersonAction, executor: Executor) -> None:
        """How an approval of ``action`` re-enters its operation, as the approver, with the approval."""
        self.executors[action] = executor

    # -- the first person ------------------------------------------------------------------------------

    async def request(
        self,
        caller: Caller,
        action: TwoPersonAction,
        subject: Subject,
        parameters: dict[str, Any],
        reason: str,
        record: ActionRecord,
    ) -> Answer:
        """Record the action as waiting for a second person (202), with its ledger row in the same
        transaction; nothing else changes until another principal approves it in time."""
        try:
            approval = await self._insert(caller, action, subject, parameters, reason, record)
        except NotPermitted:
            # the database's own check of the requester (ck_approvals_role): not a principal of the tenant with
            # a role that may do it (the command line names any principal)
            return refusal(
                Kind.FORBIDDEN,
                f"{caller.principal} is not a principal of this tenant with the "
                f"{' or '.join(TWO_PERSON_ROLES[action.value])} role: only one may ask for {WHAT[action]}",
            )
        who = " or ".join(TWO_PERSON_ROLES[action.value])
        return Answer(
            Kind.ACCEPTED,
            {
                "approval": approval_json(approval),
                "message": (
                    f"Waiting for approval: {WHAT[action]} takes two people. Another principal of this tenant "
                    f"with the {who} role approves it before {stamp(approval.expires_at)} UTC "
                    f"(POST /approvals/{approval.id}/approval); until then nothing changes."
                ),
            },
            location=f"/approvals/{approval.id}",
        )

    async def _insert(
        self,
        caller: Caller,
        action: TwoPersonAction,
        subject: Subject,
        parameters: dict[str, Any],
        reason: str,
        record: ActionRecord,
    ) -> Approval:
        async with self.store.recording(record):
            approval = await self.store.insert_approval(
                tenant_id=caller.tenant_id,
                action=action.value,
                subject_kind=subject.kind,
                subject_id=str(subject.id),
                parameters=parameters,
                reason=reason,
                requested_by=caller.principal,
                requested_role=caller.role,
                ttl_seconds=self.ttl_seconds,
            )
            record.approval_id = approval.id
            record.after = {"approval": approval_json(approval)}
            record.outcome = Kind.ACCEPTED.value
            record.detail = f"waiting for a second person until {stamp(approval.expires_at)} UTC"
        return approval

    # -- reads -----------------------------------------------------------------------------------------

    async def list(self, caller: Caller, *, pending_only: bool = False, limit: int = 100) -> Answer:
        """The tenant's approvals, newest first (every role reads them)."""
        rows = await self.store.page_approvals(caller.tenant_id, pending_only=pending_only, limit=limit)
        return Answer(Kind.DONE, {"approvals": [approval_json(a) for a in rows]})

    async def show(self, caller: Caller, approval_id: UUID) -> Answer:
        """One approval of the tenant (another tenant's looks missing)."""
        approval = await self.store.find_approval(caller.tenant_id, approval_id)
        if approval is None:
            return refusal(Kind.NOT_FOUND, "no such approval")
        return Answer(Kind.DONE, {"approval": approval_json(approval)})

    # -- the second person -----------------------------------------------------------------------------

    async def approve(self, caller: Caller, approval_id: UUID, reason: str | None = None) -> Answer:
        """Approve a waiting approval and run its action now, as the caller: the action's answer, recorded
        with both people. Refused (and recorded): the requester (403), a role that may not do the action
        (403), an approval decided or expired (409), another tenant's (404)."""
        async with self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=AuditAction.APPROVAL_APPROVE,
            subject_kind=SubjectKind.APPROVAL,
            subject_id=approval_id,
            reason=reason,
        ) as record:
            approval, problem = await self._decidable(caller, approval_id)
            if problem is not None:
                return answered(record, problem)
            assert approval is not None
            executor = self.executors.get(approval.action)
            if executor is None:
                return answered(
                    record,
                    refusal(Kind.REFUSED, f"nothing runs {approval.action.value} here yet; it stays waiting"),
                )
            record.written = True  # the action's own row names both people (executing); none of this kind
            try:
                return await executor(caller, approval.model_copy(update={"decision_reason": reason}))
            except ApprovalTaken:
                record.written = False
                return answered(record, refusal(Kind.REFUSED, "the approval was decided meanwhile"))
            except ConstraintRefused as exc:
                record.written = False
                return answered(record, _refused_by_database(exc))
            except NotPermitted as exc:
                record.written = False
                return answered(record, refusal(Kind.FORBIDDEN, str(exc)))

    async def decline(self, caller: Caller, approval_id: UUID, reason: str) -> Answer:
        """Decline a waiting approval: it never runs (recorded with who and why). The same rules as approving:
        another principal, with a role that may do the action, before it expires."""
        async with self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=AuditAction.APPROVAL_DECLINE,
            subject_kind=SubjectKind.APPROVAL,
            subject_id=approval_id,
            reason=reason,
        ) as record:
            approval, problem = await self._decidable(caller, approval_id)
            if problem is not None:
                return answered(record, problem)
            assert approval is not None
            record.approval_id = approval.id
            record.requested_by = approval.requested_by
            try:
                async with self.store.recording(record):
                    decided = await self.store.decide_approval(
                        tenant_id=caller.tenant_id,
                        approval_id=approval.id,
                        decision="declined",
                        decided_by=caller.principal,
                        decided_role=caller.role,
                        decision_reason=reason,
                    )
                    if not decided:
                        raise ApprovalTaken
                    record.outcome = Kind.DONE.value
                    record.after = {"approval": approval.id, "decision": "declined"}
            except ApprovalTaken:
                return answered(record, refusal(Kind.REFUSED, "the approval was decided meanwhile"))
            except ConstraintRefused as exc:
                return answered(record, _refused_by_database(exc))
            now = await self.store.find_approval(caller.tenant_id, approval.id)
            assert now is not None
            return Answer(
                Kind.DONE,
                {
                    "approval": approval_json(now),
                    "message": f"Declined: {WHAT[approval.action]} asked by {approval.requested_by} will not run.",
                },
            )

    async def _decidable(self, caller: Caller, approval_id: UUID) -> tuple[Approval | None, Answer | None]:
        approval = await self.store.find_approval(caller.tenant_id, approval_id)
        if approval is None:
            return None, refusal(Kind.NOT_FOUND, "no such approval")
        if approval.decision is not None:
            return approval, refusal(
                Kind.REFUSED, f"already {approval.decision} by {approval.decided_by}: a decision is final"
            )
        if approval.expired:
            return approval, refusal(
                Kind.REFUSED,
                f"expired at {stamp(approval.expires_at)} UTC: ask again, and approve it in time",
            )
        if approval.requested_by == caller.principal:
            return approval, refusal(
                Kind.FORBIDDEN,
                f"you asked for it: {WHAT[approval.action]} takes a second person, another principal of "
                "this tenant",
            )
        permission = TWO_PERSON_PERMISSION[approval.action.value]
        if not may(caller.role, permission):
            who = " or ".join(TWO_PERSON_ROLES[approval.action.value])
            return approval, refusal(
                Kind.FORBIDDEN,
                f"the {caller.role} role may not approve {WHAT[approval.action]}; that needs {who}",
            )
        return approval, None

    # -- the approved action's transaction -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def executing(
        self, store: ApprovalDecisions, record: ActionRecord, approval: Approval, approver: Caller
    ) -> AsyncIterator[ActionRecord]:
        """The approved action's one transaction: the decision first (the statements of the action then see it
        and the guards find it), the action (the block, which sets ``record.outcome``), then the outcome on the
        approval and the ledger row naming both people. An exception rolls all of it back: the approval stays
        waiting."""
        record.approval_id = approval.id
        record.requested_by = approval.requested_by
        async with store.recording(record):
            decided = await store.decide_approval(
                tenant_id=approver.tenant_id,
                approval_id=approval.id,
                decision="approved",
                decided_by=approver.principal,
                decided_role=approver.role,
                decision_reason=approval.decision_reason,
            )
            if not decided:
                raise ApprovalTaken
            yield record
            assert record.outcome is not None
            await store.conclude_approval(
                tenant_id=approver.tenant_id, approval_id=approval.id, outcome=record.outcome
            )


_DATABASE_REFUSALS = {
    "ck_approvals_second_person": (
        Kind.FORBIDDEN,
        "the requester may not decide it: that takes another principal",
    ),
    "ck_approvals_expired": (Kind.REFUSED, "the approval expired"),
    "ck_approvals_decided": (Kind.REFUSED, "the approval was decided already"),
}


def _refused_by_database(exc: ConstraintRefused) -> Answer:
    kind, text = _DATABASE_REFUSALS.get(exc.constraint or "", (Kind.REFUSED, f"refused ({exc.constraint})"))
    return refusal(kind, text)

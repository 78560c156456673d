"""How an approval of a two-person action re-enters its operation (:mod:`service.approvals`), for the actions
whose operations live beside the exports': releasing a pause (``service.switches``) and changing a destination's
host, credentials or encryption keys (``service.destinations``). Those modules import ``service.exports``, so
``Exports`` calls :func:`register` once it is built, rather than importing them.

``pin_host_key`` is registered where its operation is wired (the partner session's ``pin-key``), the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from domain.audit import Approval, TwoPersonAction
from service.auth import Caller
from service.destinations import Destinations, EditDestination
from service.outcomes import Answer
from service.switches import RESUME_REQUEST, Operator, Switches

if TYPE_CHECKING:
    from service.exports import Exports


def register(exports: Exports) -> None:
    """Register the switches' and the destinations' two-person actions on ``exports.approvals``."""
    approvals = exports.approvals

    async def resume(approver: Caller, approval: Approval) -> Answer:
        operator = Operator(principal=approver.principal, tenant_id=approver.tenant_id, role=approver.role)
        request = RESUME_REQUEST.validate_python(approval.parameters["body"])
        return await Switches(exports.store, approvals=approvals).resume(operator, request, approval=approval)

    async def change_destination(approver: Caller, approval: Approval) -> Answer:
        body = EditDestination(**approval.parameters["body"])
        version = approval.parameters["expected_version"]
        return await Destinations(exports.store, approvals=approvals).edit(
            approver, UUID(approval.subject_id), body, f'"{version}"', approval=approval
        )

    approvals.register(TwoPersonAction.RESUME_PAUSE, resume)
    approvals.register(TwoPersonAction.CHANGE_DESTINATION, change_destination)

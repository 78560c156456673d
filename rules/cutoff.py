"""Why cutoff 2 did or did not authorize delivery, read from the row it left (000 "A lost response")."""

from __future__ import annotations

from uuid import UUID

from domain.models import AuthorizationResult, JobStatus, OwnershipState
from rules.ownership import held_by


def authorization_from(
    state: OwnershipState | None,
    attempt_id: UUID,
    *,
    destination_usable: bool = True,
    deliveries_open: bool = True,
    policy_allows: bool = True,
    destination_unchanged: bool = True,
    window_open: bool = True,
) -> AuthorizationResult:
    """Cutoff 2's answer for ``attempt_id`` from state and ownership read together.

    Delivering with this attempt is Authorized (a lost response); another attempt or any state but
    Running is NotOwner; a recorded stop request is StopRecorded; a replacement whose original is
    Completed is OriginalCompleted; a destination retired or out of contract is DestinationInactive, a
    creator who may no longer export this list or a list with no contacts is PolicyDenied, and a paused
    switch of the job's scope is Paused, and a destination whose delivery terms changed since the build read
    it is DestinationChanged, and a delivery window that closed during the build is WindowClosed (all five
    give the attempt back to the queue, as cutoff 2 read them under its
    own locks; a lost-response re-read does not know them and says LeaseLapsed, whose retry answers again);
    anything else is LeaseLapsed, which gets one renewal and retry.
    """
    if held_by(state, attempt_id, JobStatus.DELIVERING):
        return AuthorizationResult.AUTHORIZED
    if not held_by(state, attempt_id, JobStatus.RUNNING):
        return AuthorizationResult.NOT_OWNER
    if state.stop_request_id is not None:
        return AuthorizationResult.STOP_RECORDED
    if state.original_status == JobStatus.COMPLETED:
        return AuthorizationResult.ORIGINAL_COMPLETED
    if not destination_usable:
        return AuthorizationResult.DESTINATION_INACTIVE
    if not policy_allows:
        return AuthorizationResult.POLICY_DENIED
    if not deliveries_open:
        return AuthorizationResult.PAUSED
    if not destination_unchanged:
        return AuthorizationResult.DESTINATION_CHANGED
    if not window_open:
        return AuthorizationResult.WINDOW_CLOSED
    # Expired, or renewed between the refusal and the re-read: either way LeaseLapsed, with its one retry.
    return AuthorizationResult.LEASE_LAPSED

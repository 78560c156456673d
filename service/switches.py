"""The delivery switches (004's fail-closed kill switch): pause and resume deliveries globally, for a tenant
or to one destination, with who and why; list them with their history; and the console's banner.

A switch lives in the database and is read by the claim and by cutoff 2 inside their own statements, so a
change takes effect at once, without a restart, and serializes with those decisions. A paused scope
leaves its jobs Queued (a claim matches nothing) and gives back, at cutoff 2, an attempt that is still
building; an attempt already past cutoff 2 finishes. A resume writes fresh wake-ups, in bounded batches,
for the scope's Queued jobs whose whole scope is now enabled. Fail-closed: a scope that was never enabled
is paused, and a switch that cannot be read is shown as paused, never as running.

**Owned, overlapping pauses** (issue #26, migration 0032). A pause has an owner, a reason, maybe an expiry; a
scope delivers while its switch rows are on and none of its pauses is active. A resume releases only what it
names: by default the resumer's own pauses of the scope, or the one ``pause_id`` names. Releasing a pause
someone else set, or one a host-key change tripped, takes two people (:mod:`service.approvals`): the resume
asks, another principal approves, and the release runs then as theirs. An expired pause lifts itself: nothing
is written, the claim and cutoff 2 see it gone, and the sweeper wakes the scope's queued exports (a resume of
the scope wakes them at once).

Operators of a tenant switch their tenant and its destinations (API and command line); the global switch
belongs to the platform's operators, who switch it from the command line only, over a pool of the database
role ``exports_platform``: the API's role may not change it (migration 0019), so the 403 here is not the only
thing that keeps it the platform's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field, TypeAdapter

from db.errors import ConstraintRefused, StoreError, UnknownReference
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.platform import PlatformStore
from domain.audit import ActionRecord, Approval, AuditAction, DeliveryPause, SubjectKind, TwoPersonAction
from domain.controls import DeliverySwitch, SwitchChange, SwitchScope
from service.approvals import Approvals, Subject
from service.audit import Ledger, answered
from service.auth import Caller
from service.commands import Body, Reason
from service.outcomes import Answer, Kind, refusal
from service.permissions import ROLES, Action, refused
from service.views import stamp
from settings import Settings

log = logging.getLogger(__name__)

WAKE_BATCH = 500
HISTORY_LIMIT = 50
UNREADABLE = "The delivery switches could not be read: treat deliveries as paused until they can be."


Expiry = Annotated[
    AwareDatetime | None,
    Field(description="When this pause lifts itself (with its UTC offset); none: until it is released"),
]
PauseId = Annotated[
    UUID | None,
    Field(
        description=(
            "The pause to release (GET /switches lists them); none: your own pauses of this scope. Another's "
            "pause, or a host-key trip, waits for a second person's approval (202)"
        )
    ),
]


class TenantSwitch(Body):
    """The caller's whole tenant."""

    scope: Literal["tenant"]
    reason: Reason
    expires_at: Expiry = None


class DestinationSwitch(Body):
    """One destination of the caller's tenant."""

    scope: Literal["destination"]
    destination_id: UUID
    reason: Reason
    expires_at: Expiry = None


class GlobalSwitch(Body):
    """Every tenant: the platform's switch (the command line only; over HTTP a 403)."""

    scope: Literal["global"]
    reason: Reason
    expires_at: Expiry = None


class TenantResume(Body):
    """Resume the caller's whole tenant: release your pauses of it, or the one named."""

    scope: Literal["tenant"]
    reason: Reason
    pause_id: PauseId = None


class DestinationResume(Body):
    """Resume one destination of the caller's tenant: release your pauses of it, or the one named."""

    scope: Literal["destination"]
    destination_id: UUID
    reason: Reason
    pause_id: PauseId = None


class GlobalResume(Body):
    """Resume every tenant (the platform's, the command line only)."""

    scope: Literal["global"]
    reason: Reason
    pause_id: PauseId = None


# POST /switches/pause and /switches/resume: which scope, and why (the reason is recorded). One schema per
# scope, told apart by ``scope``, so the published schema says which fields each needs.
SwitchRequest = Annotated[TenantSwitch | DestinationSwitch | GlobalSwitch, Field(discriminator="scope")]
ResumeRequest = Annotated[TenantResume | DestinationResume | GlobalResume, Field(discriminator="scope")]
AnySwitch = TenantSwitch | DestinationSwitch | GlobalSwitch | TenantResume | DestinationResume | GlobalResume
SWITCH_REQUEST: TypeAdapter[TenantSwitch | DestinationSwitch | GlobalSwitch] = TypeAdapter(SwitchRequest)
RESUME_REQUEST: TypeAdapter[TenantResume | DestinationResume | GlobalResume] = TypeAdapter(ResumeRequest)


def scope_of(request: AnySwitch) -> SwitchScope:
    """The request's scope as the store names it."""
    return SwitchScope(request.scope)


def destination_of(request: AnySwitch) -> UUID | None:
    """The destination a request names, if it is a destination's switch."""
    return request.destination_id if isinstance(request, DestinationSwitch | DestinationResume) else None


@dataclass(frozen=True)
class Operator:
    """Who changes a switch: the principal recorded, the tenant acted for (``None`` on the command line
    when only the global switch is concerned), and whether they may switch every tenant at once."""

    principal: str
    tenant_id: UUID | None
    platform: bool = False  # the command line, run by the platform's operators
    role: str = "operator"  # the principal's tenant role (service.permissions): a viewer may not switch


def switch_json(switch: DeliverySwitch) -> dict[str, Any]:
    """One switch as JSON, with its state in words: enabled, paused, or never enabled (paused)."""
    data = switch.model_dump(mode="json")
    data["state"] = state_of(switch)
    data["paused"] = switch.paused
    return data


def change_json(change: SwitchChange) -> dict[str, Any]:
    """One recorded change as JSON."""
    return change.model_dump(mode="json")


def state_of(switch: DeliverySwitch) -> str:
    """``enabled``, ``paused`` or ``never enabled`` (which is paused: fail-closed)."""
    if switch.enabled is None:
        return "never enabled"
    return "enabled" if switch.enabled else "paused"


def where(scope: SwitchScope, destination_name: str | None = None, tenant_name: str | None = None) -> str:
    """The scope in words: ``globally``, ``for this tenant`` / ``for tenant acme``, ``to partner-old``."""
    if scope == SwitchScope.GLOBAL:
        return "globally"
    if scope == SwitchScope.TENANT:
        return f"for tenant {tenant_name}" if tenant_name else "for this tenant"
    return f"to {destination_name or 'this destination'}"


def pause_line(switch: DeliverySwitch) -> str:
    """The banner's sentence for one paused scope."""
    scope = where(switch.scope, switch.destination_name)
    if switch.enabled is None:
        if switch.scope == SwitchScope.DESTINATION:
            return f"Deliveries {scope} are paused: it was never enabled."
        return f"Deliveries {scope} are paused: they were never enabled."
    since = stamp(switch.changed_at) + " UTC" if switch.changed_at else "an unrecorded time"
    return f"Deliveries {scope} are paused since {since} by {switch.changed_by}: {switch.reason}"


def banner_lines(switches: list[DeliverySwitch], pauses: list[DeliveryPause] | None = None) -> list[str]:
    """One sentence per paused scope a tenant's operator should know of (retired destinations left out): with
    ``pauses``, one per active pause (overlapping pauses each say who and why) and one per scope never
    enabled; without, one per scope from its switch."""
    shown = [s for s in switches if s.paused and not s.destination_retired]
    if pauses is None:
        return [pause_line(s) for s in shown]
    names = {s.destination_id: s.destination_name for s in switches if s.destination_id}
    retired = {s.destination_id for s in switches if s.destination_retired}
    lines = [pause_line(s) for s in shown if s.enabled is not True and not _held_by(s, pauses)]
    lines += [
        held_line(p, names) for p in pauses if p.destination_id not in retired or p.destination_id is None
    ]
    return lines


def _held_by(switch: DeliverySwitch, pauses: list[DeliveryPause]) -> bool:
    """Whether a scope shown paused is held by an active pause (then the pause's own line says so)."""
    return switch.enabled is not None and any(
        p.scope == switch.scope.value
        and p.tenant_id == switch.tenant_id
        and p.destination_id == switch.destination_id
        for p in pauses
    )


def held_line(pause: DeliveryPause, names: Mapping[UUID, str | None]) -> str:
    """One active pause in words: where, since when, by whom, why, until when, and its ID."""
    scope = where(SwitchScope(pause.scope), names.get(pause.destination_id) if pause.destination_id else None)
    until = f" until {stamp(pause.expires_at)} UTC" if pause.expires_at else ""
    kind = " (a host-key change tripped it)" if pause.kind == "host_key" else ""
    return (
        f"Deliveries {scope} are paused since {stamp(pause.paused_at)} UTC by {pause.owner}: {pause.reason}"
        f"{kind}{until} (pause {pause.id})."
    )


def pause_json(pause: DeliveryPause) -> dict[str, Any]:
    """One active pause as JSON."""
    return pause.model_dump(mode="json")


def _subject(operator: Operator, request: AnySwitch) -> str:
    """The ledger's subject of a switch change: the destination, the tenant, or ``global``."""
    scope = scope_of(request)
    if scope == SwitchScope.GLOBAL:
        return "global"
    if scope == SwitchScope.DESTINATION:
        return str(destination_of(request))
    return str(operator.tenant_id)


def _matches(pause: DeliveryPause, operator: Operator, request: AnySwitch) -> bool:
    """Whether a pause is of the scope a request names."""
    if pause.scope != scope_of(request).value:
        return False
    if scope_of(request) == SwitchScope.GLOBAL:
        return True
    return pause.tenant_id == operator.tenant_id and pause.destination_id == destination_of(request)


def _caller(operator: Operator) -> Caller:
    """A tenant's operator as the caller of a two-person action (never the global scope's)."""
    assert operator.tenant_id is not None
    role = operator.role if operator.role in ROLES else "operator"
    return Caller(tenant_id=operator.tenant_id, principal=operator.principal, role=role)


class Switches:
    """The switch operations over an ``exports_api`` store, and an ``exports_platform`` one for the global
    switch where the platform's operators run them (the command line); the API has none. Every pause and
    resume is in the ledger of operator actions, in its own transaction."""

    def __init__(
        self,
        store: ApiStore,
        *,
        platform: PlatformStore | None = None,
        wake_batch: int = WAKE_BATCH,
        approvals: Approvals | None = None,
    ) -> None:
        self.store = store
        self.platform = platform
        self.wake_batch = wake_batch
        self.approvals = approvals or Approvals(store)
        self.ledger = Ledger(store)

    # -- reads ----------------------------------------------------------------------------------------

    async def view(self, tenant_id: UUID | None) -> Answer:
        """``GET /switches``: the global switch, the tenant's, each destination's, the active pauses (who, why,
        until when), and the latest changes."""
        switches = await self.store.tenant_switches(tenant_id)
        pauses = await self.store.tenant_pauses(tenant_id)
        history = await self.store.switch_history(tenant_id, HISTORY_LIMIT)
        lines = banner_lines(switches, pauses)
        return Answer(
            Kind.DONE,
            {
                "switches": [switch_json(s) for s in switches],
                "pauses": [pause_json(p) for p in pauses],
                "paused": bool(lines),
                "banner": lines,
                "history": [change_json(c) for c in history],
                "message": " ".join(lines) if lines else "Deliveries are running in every scope you can see.",
            },
        )

    async def banner(self, tenant_id: UUID) -> list[str]:
        """The console's banner: one sentence per active pause and per scope never enabled; a read that fails
        says so (fail-closed)."""
        try:
            switches = await self.store.tenant_switches(tenant_id)
            return banner_lines(switches, await self.store.tenant_pauses(tenant_id))
        except StoreError as exc:
            log.warning("delivery switches unreadable for the banner (%s)", type(exc).__name__)
            return [UNREADABLE]

    # -- changes --------------------------------------------------------------------------------------

    def _action(self, operator: Operator, action: AuditAction, request: AnySwitch) -> Any:
        global_scope = scope_of(request) == SwitchScope.GLOBAL
        return self.ledger.action(
            tenant_id=None if global_scope else operator.tenant_id,
            principal=operator.principal,
            role="platform" if global_scope and operator.platform else operator.role,
            action=action,
            subject_kind=SubjectKind.DELIVERY_SCOPE,
            subject_id=_subject(operator, request),
            reason=request.reason,
        )

    async def pause(self, operator: Operator, request: AnySwitch) -> Answer:
        """Pause deliveries in a scope, as the operator's own pause (until ``expires_at``, if given): its jobs
        stay Queued; what is building is given back at cutoff 2. One person suffices to stop."""
        async with self._action(operator, AuditAction.PAUSE, request) as record:
            return answered(record, await self._pause(operator, request, record))

    async def _pause(self, operator: Operator, request: AnySwitch, record: ActionRecord) -> Answer:
        refused = self._refusal(operator, request)
        if refused is not None:
            return refused
        expires_at = getattr(request, "expires_at", None)
        changed = await self._set(operator, request, record, enabled=False, expires_at=expires_at)
        if isinstance(changed, Answer):
            return changed
        scope = await self._describe(operator, request)
        activity = await self.store.scope_activity(**self._scope_filter(operator, request))
        until = f" until {stamp(expires_at)} UTC" if expires_at else ""
        message = (
            f"Paused deliveries {scope}: {request.reason}{until}. {activity.queued} queued export(s) stay Queued; "
            f"{activity.running} being built will be given back to the queue at cutoff 2; "
            f"{activity.delivering} already past cutoff 2 will finish."
        )
        if changed.was_enabled is False:
            message = (
                f"Already paused; your pause is recorded too (a resume releases only its own). {message}"
            )
        return Answer(
            Kind.DONE,
            {
                "change": change_json(changed),
                "pause_id": str(changed.pause_ids[0]) if changed.pause_ids else None,
                "expires_at": expires_at.isoformat() if expires_at else None,
                "queued": activity.queued,
                "running": activity.running,
                "delivering": activity.delivering,
                "message": message,
            },
        )

    async def resume(
        self, operator: Operator, request: AnySwitch, *, approval: Approval | None = None
    ) -> Answer:
        """Resume deliveries in a scope: open its switch and release the pauses the request names (by default
        the operator's own), then wake its Queued jobs whose whole scope is open. Another's pause, or a
        host-key trip, waits for a second person (202); approved, it is released as the approver's."""
        async with self._action(operator, AuditAction.RESUME, request) as record:
            if approval is not None:
                record.approval_id, record.requested_by = approval.id, approval.requested_by
            return answered(record, await self._resume(operator, request, record, approval))

    async def _resume(
        self, operator: Operator, request: AnySwitch, record: ActionRecord, approval: Approval | None
    ) -> Answer:
        refused = self._refusal(operator, request)
        if refused is not None:
            return refused
        pause_id: UUID | None = getattr(request, "pause_id", None)
        if pause_id is not None:
            named = await self.store.find_delivery_pause(operator.tenant_id, pause_id)
            if named is None or not _matches(named, operator, request):
                return refusal(Kind.INVALID, "pause_id: no active pause of this scope has that ID")
            record.before = {"pause": pause_json(named)}
            second_person = scope_of(request) != SwitchScope.GLOBAL and (
                named.owner != operator.principal or named.kind != "manual"
            )
            if second_person and approval is None:
                return await self.approvals.request(
                    _caller(operator),
                    TwoPersonAction.RESUME_PAUSE,
                    Subject("delivery_pause", named.id),
                    {"body": request.model_dump(mode="json"), "owner": named.owner, "kind": named.kind},
                    request.reason,
                    record,
                )
        changed = await self._set(
            operator,
            request,
            record,
            enabled=True,
            pause_ids=[pause_id] if pause_id is not None else None,
            approval=approval,
        )
        if isinstance(changed, Answer):
            return changed
        scope = await self._describe(operator, request)
        released = changed.pause_ids or []
        woken, complete = await self._wake(changed, **self._scope_filter(operator, request))
        still = await self._still_paused(operator, request)
        message = f"Resumed deliveries {scope}: {request.reason}."
        if pause_id is not None and pause_id not in released:
            message = f"Pause {pause_id} was not released (released meanwhile, or not yours to release)."
        elif released:
            message += f" Released {len(released)} pause(s)."
        message += f" Woke {woken} queued export(s)."
        if not complete:
            message += " Some could not be woken now; the sweeper wakes them."
        if still:
            message += " Still paused, so nothing in this scope runs yet: " + " ".join(still)
        return Answer(
            Kind.DONE,
            {
                "change": change_json(changed),
                "released": [str(p) for p in released],
                "woken": woken,
                "wake_complete": complete,
                "still_paused": still,
                "message": message,
            },
        )

    # -- helpers --------------------------------------------------------------------------------------

    def _refusal(self, operator: Operator, request: AnySwitch) -> Answer | None:
        if not operator.platform:
            forbidden = refused(operator.role, Action.SWITCH)
            if forbidden is not None:
                return forbidden
        if scope_of(request) == SwitchScope.GLOBAL and not operator.platform:
            return refusal(
                Kind.FORBIDDEN,
                "the global switch belongs to the platform's operators: python starter.py pause --global",
            )
        if scope_of(request) != SwitchScope.GLOBAL and operator.tenant_id is None:
            return refusal(Kind.INVALID, "give the tenant whose deliveries to switch (--tenant)")
        return None

    @staticmethod
    def _scope_filter(operator: Operator, request: AnySwitch) -> dict[str, UUID | None]:
        if scope_of(request) == SwitchScope.GLOBAL:
            return {"tenant_id": None, "destination_id": None}
        return {"tenant_id": operator.tenant_id, "destination_id": destination_of(request)}

    async def _set(
        self,
        operator: Operator,
        request: AnySwitch,
        record: ActionRecord,
        *,
        enabled: bool,
        expires_at: datetime | None = None,
        pause_ids: list[UUID] | None = None,
        approval: Approval | None = None,
    ) -> SwitchChange | Answer:
        """The pause or the release, and its ledger row, in one transaction (with an approval: its decision
        and outcome too, as the approver's)."""
        scoped = self._scope_filter(operator, request)
        writer: ApiStore | PlatformStore = self.store
        if scope_of(request) == SwitchScope.GLOBAL:
            if self.platform is None:
                return refusal(
                    Kind.FORBIDDEN,
                    "the global switch is changed over the platform's database role (exports_platform):"
                    " python starter.py pause --global",
                )
            writer = self.platform
        try:
            if approval is not None and isinstance(writer, ApiStore):
                transaction = self.approvals.executing(writer, record, approval, _caller(operator))
            else:
                transaction = writer.recording(record)
            async with transaction:
                changed = await writer.set_delivery_switch(
                    scope=scope_of(request),
                    tenant_id=scoped["tenant_id"],
                    destination_id=scoped["destination_id"],
                    enabled=enabled,
                    reason=request.reason,
                    changed_by=operator.principal,
                    expires_at=expires_at,
                    pause_ids=pause_ids,
                )
                record.before = record.before or {"open": changed.was_enabled}
                record.after = {
                    "open": changed.enabled,
                    "pause_ids": [str(p) for p in changed.pause_ids or []],
                    "expires_at": expires_at,
                }
                record.outcome = Kind.DONE.value
            return changed
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        except ConstraintRefused as exc:
            if exc.constraint == "ck_delivery_pauses_expiry":
                return refusal(Kind.INVALID, "expires_at: must be later than now")
            raise

    async def _describe(self, operator: Operator, request: AnySwitch) -> str:
        if scope_of(request) != SwitchScope.DESTINATION or operator.tenant_id is None:
            return where(scope_of(request))
        names = {d.id: d.name for d in await self.store.tenant_destinations(operator.tenant_id)}
        destination = destination_of(request)
        return where(scope_of(request), names.get(destination) if destination else None)

    async def _wake(
        self, changed: SwitchChange, *, tenant_id: UUID | None, destination_id: UUID | None
    ) -> tuple[int, bool]:
        """Bounded batches of wake-ups until one comes back short; a failure leaves the rest to the sweeper."""
        woken = 0
        try:
            while True:
                batch = await self.store.wake_resumed_queued(
                    changed.changed_at,
                    tenant_id=tenant_id,
                    destination_id=destination_id,
                    batch=self.wake_batch,
                )
                woken += len(batch)
                if len(batch) < self.wake_batch:
                    return woken, True
        except StoreError as exc:
            log.warning("resume: wake-ups stopped after %d (%s); the sweeper wakes the rest", woken, exc)
            return woken, False

    async def _still_paused(self, operator: Operator, request: AnySwitch) -> list[str]:
        """What still holds this scope: its own pauses left (another's, a host-key trip) and the paused scopes
        above it (a resumed destination of a paused tenant...)."""
        try:
            switches = await self.store.tenant_switches(operator.tenant_id)
            pauses = await self.store.tenant_pauses(operator.tenant_id)
        except StoreError:
            return [UNREADABLE]
        scope = scope_of(request)
        above = {SwitchScope.GLOBAL} | ({SwitchScope.TENANT} if scope == SwitchScope.DESTINATION else set())
        names = {s.destination_id: s.destination_name for s in switches if s.destination_id}
        lines = [
            pause_line(s)
            for s in switches
            if s.scope in above and s.enabled is not True and not _held_by(s, pauses)
        ]
        lines += [
            held_line(p, names)
            for p in pauses
            if SwitchScope(p.scope) in above
            and (p.scope == "global" or p.tenant_id == operator.tenant_id)
            or _matches(p, operator, request)
        ]
        if scope != SwitchScope.GLOBAL:
            own = [p for p in pauses if _matches(p, operator, request)]
            if own:
                lines.append(
                    "Releasing another's pause, or a host-key trip, takes a second person: resume naming its "
                    "pause_id, and another principal approves it."
                )
        return lines


@contextlib.asynccontextmanager
async def open_switches(settings: Settings, *, platform: bool = False) -> AsyncIterator[Switches]:
    """The switch operations over an ``exports_api`` pool opened from ``settings.database_url``, and with
    ``platform`` an ``exports_platform`` pool for the global switch (the login must be granted that role)."""
    if not settings.database_url:
        raise ValueError("EXPORTS_DATABASE_URL is not set")
    pool = await open_pool(settings.database_url, "exports_api", max_size=2, name="switches")
    try:
        approvals = Approvals(ApiStore(pool), ttl_seconds=settings.approval_ttl_seconds)
        if not platform:
            yield Switches(ApiStore(pool), approvals=approvals)
            return
        platform_pool = await open_pool(
            settings.database_url, "exports_platform", max_size=1, name="switches-platform"
        )
        try:
            yield Switches(ApiStore(pool), platform=PlatformStore(platform_pool), approvals=approvals)
        finally:
            await platform_pool.close()
    finally:
        await pool.close()

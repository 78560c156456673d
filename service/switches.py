"""The delivery switches (004's fail-closed kill switch): pause and resume deliveries globally, for a tenant
or to one destination, with who and why; list them with their history; and the console's banner.

A switch lives in the database and is read by the claim and by cutoff 2 inside their own statements, so a
change takes effect at once, without a restart, and serializes with those decisions. A paused scope
leaves its jobs Queued (a claim matches nothing) and gives back, at cutoff 2, an attempt that is still
building; an attempt already past cutoff 2 finishes. A resume writes fresh wake-ups, in bounded batches,
for the scope's Queued jobs whose whole scope is now enabled. Fail-closed: a scope that was never enabled
is paused, and a switch that cannot be read is shown as paused, never as running.

Operators of a tenant switch their tenant and its destinations (API and command line); the global switch
belongs to the platform's operators, who switch it from the command line only, over a pool of the database
role ``exports_platform``: the API's role may not change it (migration 0019), so the 403 here is not the only
thing that keeps it the platform's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import Field, TypeAdapter

from db.errors import StoreError, UnknownReference
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.platform import PlatformStore
from db.stores.switching import SwitchChanges
from domain.controls import DeliverySwitch, SwitchChange, SwitchScope
from service.commands import Body, Reason
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, refused
from service.views import stamp
from settings import Settings

log = logging.getLogger(__name__)

WAKE_BATCH = 500
HISTORY_LIMIT = 50
UNREADABLE = "The delivery switches could not be read: treat deliveries as paused until they can be."


class TenantSwitch(Body):
    """The caller's whole tenant."""

    scope: Literal["tenant"]
    reason: Reason


class DestinationSwitch(Body):
    """One destination of the caller's tenant."""

    scope: Literal["destination"]
    destination_id: UUID
    reason: Reason


class GlobalSwitch(Body):
    """Every tenant: the platform's switch (the command line only; over HTTP a 403)."""

    scope: Literal["global"]
    reason: Reason


# POST /switches/pause and /switches/resume: which scope, and why (the reason is recorded). One schema per
# scope, told apart by ``scope``, so the published schema says which fields each needs.
SwitchRequest = Annotated[TenantSwitch | DestinationSwitch | GlobalSwitch, Field(discriminator="scope")]
AnySwitch = TenantSwitch | DestinationSwitch | GlobalSwitch
SWITCH_REQUEST: TypeAdapter[AnySwitch] = TypeAdapter(SwitchRequest)


def scope_of(request: AnySwitch) -> SwitchScope:
    """The request's scope as the store names it."""
    return SwitchScope(request.scope)


def destination_of(request: AnySwitch) -> UUID | None:
    """The destination a request names, if it is a destination's switch."""
    return request.destination_id if isinstance(request, DestinationSwitch) else None


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


def banner_lines(switches: list[DeliverySwitch]) -> list[str]:
    """One sentence per paused scope a tenant's operator should know of (retired destinations left out)."""
    return [pause_line(s) for s in switches if s.paused and not s.destination_retired]


class Switches:
    """The switch operations over an ``exports_api`` store, and an ``exports_platform`` one for the global
    switch where the platform's operators run them (the command line); the API has none."""

    def __init__(
        self, store: ApiStore, *, platform: PlatformStore | None = None, wake_batch: int = WAKE_BATCH
    ) -> None:
        self.store = store
        self.platform = platform
        self.wake_batch = wake_batch

    # -- reads ----------------------------------------------------------------------------------------

    async def view(self, tenant_id: UUID | None) -> Answer:
        """``GET /switches``: the global switch, the tenant's, each destination's, and the latest changes."""
        switches = await self.store.tenant_switches(tenant_id)
        history = await self.store.switch_history(tenant_id, HISTORY_LIMIT)
        lines = banner_lines(switches)
        return Answer(
            Kind.DONE,
            {
                "switches": [switch_json(s) for s in switches],
                "paused": bool(lines),
                "banner": lines,
                "history": [change_json(c) for c in history],
                "message": " ".join(lines) if lines else "Deliveries are running in every scope you can see.",
            },
        )

    async def banner(self, tenant_id: UUID) -> list[str]:
        """The console's banner: one sentence per paused scope; a read that fails says so (fail-closed)."""
        try:
            return banner_lines(await self.store.tenant_switches(tenant_id))
        except StoreError as exc:
            log.warning("delivery switches unreadable for the banner (%s)", type(exc).__name__)
            return [UNREADABLE]

    # -- changes --------------------------------------------------------------------------------------

    async def pause(self, operator: Operator, request: AnySwitch) -> Answer:
        """Pause deliveries in a scope: its jobs stay Queued; what is building is given back at cutoff 2."""
        refused = self._refusal(operator, request)
        if refused is not None:
            return refused
        changed = await self._set(operator, request, enabled=False)
        if isinstance(changed, Answer):
            return changed
        scope = await self._describe(operator, request)
        activity = await self.store.scope_activity(**self._scope_filter(operator, request))
        message = (
            f"Paused deliveries {scope}: {request.reason}. {activity.queued} queued export(s) stay Queued; "
            f"{activity.running} being built will be given back to the queue at cutoff 2; "
            f"{activity.delivering} already past cutoff 2 will finish."
        )
        if changed.was_enabled is False:
            message = f"Already paused; the reason is now updated. {message}"
        return Answer(
            Kind.DONE,
            {
                "change": change_json(changed),
                "queued": activity.queued,
                "running": activity.running,
                "delivering": activity.delivering,
                "message": message,
            },
        )

    async def resume(self, operator: Operator, request: AnySwitch) -> Answer:
        """Resume deliveries in a scope and wake its Queued jobs whose whole scope is now enabled."""
        refused = self._refusal(operator, request)
        if refused is not None:
            return refused
        changed = await self._set(operator, request, enabled=True)
        if isinstance(changed, Answer):
            return changed
        scope = await self._describe(operator, request)
        woken, complete = await self._wake(changed, **self._scope_filter(operator, request))
        still = await self._still_paused(operator, request)
        message = f"Resumed deliveries {scope}: {request.reason}. Woke {woken} queued export(s)."
        if not complete:
            message += " Some could not be woken now; the sweeper wakes them."
        if still:
            message += " Still paused, so nothing in this scope runs yet: " + " ".join(still)
        return Answer(
            Kind.DONE,
            {
                "change": change_json(changed),
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

    async def _set(self, operator: Operator, request: AnySwitch, *, enabled: bool) -> SwitchChange | Answer:
        scoped = self._scope_filter(operator, request)
        writer: SwitchChanges = self.store
        if scope_of(request) == SwitchScope.GLOBAL:
            if self.platform is None:
                return refusal(
                    Kind.FORBIDDEN,
                    "the global switch is changed over the platform's database role (exports_platform):"
                    " python starter.py pause --global",
                )
            writer = self.platform
        try:
            return await writer.set_delivery_switch(
                scope=scope_of(request),
                tenant_id=scoped["tenant_id"],
                destination_id=scoped["destination_id"],
                enabled=enabled,
                reason=request.reason,
                changed_by=operator.principal,
            )
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")

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
        """The other paused scopes that still hold this one (a resumed destination of a paused tenant...)."""
        if scope_of(request) == SwitchScope.GLOBAL:
            return []
        try:
            switches = await self.store.tenant_switches(operator.tenant_id)
        except StoreError:
            return [UNREADABLE]
        holding = [s for s in switches if s.scope == SwitchScope.GLOBAL]
        if scope_of(request) == SwitchScope.DESTINATION:
            holding += [s for s in switches if s.scope == SwitchScope.TENANT]
        return [pause_line(s) for s in holding if s.paused]


@contextlib.asynccontextmanager
async def open_switches(settings: Settings, *, platform: bool = False) -> AsyncIterator[Switches]:
    """The switch operations over an ``exports_api`` pool opened from ``settings.database_url``, and with
    ``platform`` an ``exports_platform`` pool for the global switch (the login must be granted that role)."""
    if not settings.database_url:
        raise ValueError("EXPORTS_DATABASE_URL is not set")
    pool = await open_pool(settings.database_url, "exports_api", max_size=2, name="switches")
    try:
        if not platform:
            yield Switches(ApiStore(pool))
            return
        platform_pool = await open_pool(
            settings.database_url, "exports_platform", max_size=1, name="switches-platform"
        )
        try:
            yield Switches(ApiStore(pool), platform=PlatformStore(platform_pool))
        finally:
            await platform_pool.close()
    finally:
        await pool.close()

"""Recurring exports (issue #25, item 1): define, list, show, edit, pause, resume and delete them; shared by
the HTTP API (``/recurring-exports``) and the command line (``starter.py recurring``).

The PostgreSQL row is the source of truth: each change commits there first, then its Temporal Schedule is
brought to it (:mod:`service.recurring_schedules`); if Temporal does not answer, the answer says the
Schedule is pending and a worker brings it to the row at its next start. Admins manage recurring exports
(``Action.MANAGE_RECURRING``); every role reads them. Another tenant's recurring export reads as missing.
Pausing or deleting one never touches the exports it already created, and the answer says so with their
count by status.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID, uuid4

from pydantic import AwareDatetime, ConfigDict, Field, WithJsonSchema, model_validator

from db.errors import UnknownReference
from db.stores.api import ApiStore
from domain.audit import ActionRecord, AuditAction, SubjectKind
from domain.models import JobStatus
from domain.recurring import Firing, RecurringExport
from rules.recurring import MAX_INTERVAL_SECONDS, MIN_INTERVAL_SECONDS, definition_problems
from service.audit import Ledger, answered
from service.auth import Caller
from service.commands import MAX_NAME, NAME_PATTERN, Body, Name, Reason
from service.exports import if_match_versions
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, refused
from service.recurring_schedules import ScheduleState, ScheduleSync

LIVE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DELIVERING)
FIRINGS_SHOWN = 50
Cron = Annotated[str, Field(min_length=1, max_length=200, examples=["0 2 * * *", "@daily"])]
TimeZone = Annotated[str, Field(min_length=1, max_length=64, examples=["Europe/Berlin", "UTC"])]
IntervalSeconds = Annotated[
    int, Field(ge=MIN_INTERVAL_SECONDS, le=MAX_INTERVAL_SECONDS, examples=[3600, 86400])
]
_CRON_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 200}
_ZONE_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 64}
_INTERVAL_SCHEMA: dict[str, Any] = {
    "type": "integer",
    "minimum": MIN_INTERVAL_SECONDS,
    "maximum": MAX_INTERVAL_SECONDS,
}
_UUID_SCHEMA: dict[str, Any] = {"type": "string", "format": "uuid"}
_NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME,
    "pattern": NAME_PATTERN,
}

# What the schema cannot say (a cron expression's fields, a timezone's name, cron or interval but not both, an
# end after the start) the service checks after the caller's permission: a 422 whose ``problems`` name each
# field and why, and nothing stored. The schema's own refusals carry ``errors`` (api/app.py).


class DefineRecurringExport(Body):
    """POST /recurring-exports: which list goes to which destination, when (a cron expression or an
    interval, in a timezone), from when and until when."""

    destination_id: UUID
    list_name: Name
    cron: Cron | None = Field(
        default=None,
        description="five fields (minute hour day-of-month month day-of-week) or @daily, @hourly, ...; or give "
        "interval_seconds",
    )
    interval_seconds: IntervalSeconds | None = Field(
        default=None, description="every N seconds, 60 to 31622400 (366 days); or give cron"
    )
    time_zone: TimeZone = Field(description="IANA name the cron expression is read in, e.g. Europe/Berlin")
    starts_at: AwareDatetime | None = Field(default=None, description="no firing before this")
    ends_at: AwareDatetime | None = Field(default=None, description="no firing after this")

    def problems(self) -> dict[str, str]:
        """What is wrong with this definition, by field (empty: it may be stored)."""
        return definition_problems(
            cron=self.cron,
            interval_seconds=self.interval_seconds,
            time_zone=self.time_zone,
            starts_at=self.starts_at,
            ends_at=self.ends_at,
        )


class EditRecurringExport(Body):
    """PATCH /recurring-exports/{id}: fields left out keep their value; giving ``cron`` replaces an interval
    and ``interval_seconds`` a cron expression; ``starts_at``/``ends_at`` may be null to remove them. At least
    one field; no nulls but those two."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    destination_id: Annotated[UUID | None, WithJsonSchema(_UUID_SCHEMA)] = None
    list_name: Annotated[Name | None, WithJsonSchema(_NAME_SCHEMA)] = None
    cron: Annotated[Cron | None, WithJsonSchema(_CRON_SCHEMA)] = None
    interval_seconds: Annotated[IntervalSeconds | None, WithJsonSchema(_INTERVAL_SCHEMA)] = None
    time_zone: Annotated[TimeZone | None, WithJsonSchema(_ZONE_SCHEMA)] = None
    starts_at: AwareDatetime | None = None
    ends_at: AwareDatetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(k for k, v in data.items() if v is None and k not in ("starts_at", "ends_at"))
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: give a value, or leave the field out to keep it")
            if not data:
                raise ValueError("give at least one field to change")
        return data


def _invalid(problems: dict[str, str]) -> Answer:
    return refusal(
        Kind.INVALID, "; ".join(f"{field}: {why}" for field, why in problems.items()), problems=problems
    )


class PauseRecurringExport(Body):
    """POST /recurring-exports/{id}/pause: why (recorded with it, shown on the console)."""

    reason: Reason | None = None


def recurring_audit_json(row: RecurringExport) -> dict[str, Any]:
    """What the ledger keeps of a recurring export before or after a change: its terms, timing and state."""
    return row.model_dump(
        mode="json",
        include={
            "destination_id",
            "list_name",
            "cron",
            "interval_seconds",
            "time_zone",
            "starts_at",
            "ends_at",
            "paused",
            "paused_reason",
            "deleted_at",
            "version",
        },
    )


def recurring_json(row: RecurringExport) -> dict[str, Any]:
    """One recurring export as JSON, with its Schedule's ID and its timing in words."""
    data = row.model_dump(mode="json")
    data["schedule_id"] = row.schedule_id
    data["when"] = describe_when(row)
    data["state"] = "deleted" if row.deleted_at else ("paused" if row.paused else "active")
    return data


def firing_json(firing: Firing) -> dict[str, Any]:
    """One recorded firing as JSON."""
    return firing.model_dump(mode="json")


def describe_when(row: RecurringExport) -> str:
    """``cron '0 2 * * *' in Europe/Berlin`` or ``every 3600 s``, with its start and end."""
    when = f"cron '{row.cron}' in {row.time_zone}" if row.cron else f"every {row.interval_seconds} s"
    if row.starts_at:
        when += f", from {row.starts_at.isoformat()}"
    if row.ends_at:
        when += f", until {row.ends_at.isoformat()}"
    return when


def _untouched(by_status: dict[JobStatus, int]) -> dict[str, Any]:
    total = sum(by_status.values())
    live = sum(n for status, n in by_status.items() if status in LIVE)
    return {"total": total, "live": live, "by_status": {s.value: n for s, n in sorted(by_status.items())}}


def _untouched_sentence(untouched: dict[str, Any]) -> str:
    total, live = untouched["total"], untouched["live"]
    if total == 0:
        return "It had created no exports."
    sentence = f"The {total} export(s) it already created are untouched"
    if live:
        return f"{sentence}: {live} still live and will run; cancel them separately if they must not deliver."
    return f"{sentence}."


def _schedule_sentence(state: ScheduleState) -> str:
    if state == ScheduleState.PENDING:
        return " Temporal did not answer: its Schedule follows when a worker next starts."
    return ""


class RecurringExports:
    """The operations over an ``exports_api`` store and the Schedules' sync."""

    def __init__(self, store: ApiStore, sync: ScheduleSync) -> None:
        self.store = store
        self.sync = sync
        self.ledger = Ledger(store)

    def _action(
        self, caller: Caller, action: AuditAction, subject_id: object, reason: str | None = None
    ) -> Any:
        """The ledger row of one change (0031): in the change's transaction, or on its own for a refusal."""
        return self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=action,
            subject_kind=SubjectKind.RECURRING_EXPORT,
            subject_id=subject_id,
            reason=reason,
        )

    async def _mine(self, caller: Caller, recurring_export_id: UUID) -> RecurringExport | None:
        return await self.store.get_recurring_export(caller.tenant_id, recurring_export_id)

    async def create(self, caller: Caller, body: DefineRecurringExport) -> Answer:
        """Define a recurring export for the caller's tenant, created by the caller (its firings' exports are
        the caller's: the claim's policy check evaluates the caller as their creator)."""
        async with self._action(caller, AuditAction.RECURRING_CREATE, None) as record:
            return answered(record, await self._create(caller, body, record))

    async def _create(self, caller: Caller, body: DefineRecurringExport, record: ActionRecord) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_RECURRING)
        if forbidden is not None:
            return forbidden
        problems = body.problems()
        if problems:
            return _invalid(problems)
        try:
            async with self.store.recording(record):
                row = await self.store.insert_recurring_export(
                    tenant_id=caller.tenant_id,
                    id=uuid4(),
                    destination_id=body.destination_id,
                    list_name=body.list_name,
                    cron=body.cron.strip() if body.cron else None,
                    interval_seconds=body.interval_seconds,
                    time_zone=body.time_zone,
                    starts_at=body.starts_at,
                    ends_at=body.ends_at,
                    paused=False,
                    paused_reason=None,
                    created_by=caller.principal,
                )
                record.subject_id = str(row.id)
                record.after = recurring_audit_json(row)
                record.outcome = Kind.CREATED.value
        except UnknownReference as exc:
            if "creator" in (exc.constraint or ""):
                return refusal(Kind.INVALID, f"{caller.principal} is not a principal of this tenant")
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        state = await self.sync.apply(row)
        return Answer(
            Kind.CREATED,
            {
                "recurring_export": recurring_json(row),
                "schedule": state.value,
                "message": f"Recurring export {row.id} defined: {describe_when(row)}."
                + _schedule_sentence(state),
            },
            location=f"/recurring-exports/{row.id}",
            version=row.version,
        )

    async def list(self, caller: Caller, *, include_deleted: bool = False, limit: int = 100) -> Answer:
        """The tenant's recurring exports, newest first."""
        rows = await self.store.page_recurring_exports(
            caller.tenant_id, limit=limit, include_deleted=include_deleted
        )
        return Answer(Kind.DONE, {"recurring_exports": [recurring_json(r) for r in rows]})

    async def show(
        self, caller: Caller, recurring_export_id: UUID, *, firings: int = FIRINGS_SHOWN
    ) -> Answer:
        """One recurring export, its latest firings (created export X, or skipped and why), and the exports
        it created by status."""
        row = await self._mine(caller, recurring_export_id)
        if row is None:
            return refusal(Kind.NOT_FOUND, "no such recurring export")
        recorded = await self.store.recurring_export_firings(caller.tenant_id, row.id, limit=firings)
        by_status = await self.store.recurring_export_exports_by_status(caller.tenant_id, row.id)
        return Answer(
            Kind.DONE,
            {
                "recurring_export": recurring_json(row),
                "firings": [firing_json(f) for f in recorded],
                "exports": _untouched(by_status),
            },
            version=row.version,
        )

    async def edit(
        self, caller: Caller, recurring_export_id: UUID, body: EditRecurringExport, if_match: str | None
    ) -> Answer:
        """Change its terms or timing for the version read (If-Match): 428 without it, 412 when it moved on,
        409 when it is deleted, 422 when the result is not a valid definition (nothing stored)."""
        async with self._action(caller, AuditAction.RECURRING_EDIT, recurring_export_id) as record:
            return answered(record, await self._edit(caller, recurring_export_id, body, if_match, record))

    async def _edit(
        self,
        caller: Caller,
        recurring_export_id: UUID,
        body: EditRecurringExport,
        if_match: str | None,
        record: ActionRecord,
    ) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_RECURRING)
        if forbidden is not None:
            return forbidden
        if if_match is None:
            return refusal(Kind.PRECONDITION_REQUIRED, 'the If-Match header is required, e.g. If-Match: "1"')
        versions = if_match_versions(if_match)
        if versions is None:
            return refusal(
                Kind.MALFORMED, 'If-Match must be entity tags as the ETag header gives them, e.g. "1"'
            )
        row = await self._mine(caller, recurring_export_id)
        if row is None:
            return refusal(Kind.NOT_FOUND, "no such recurring export")
        if row.deleted_at is not None:
            return refusal(Kind.REFUSED, f"recurring export {row.id} was deleted; define a new one")
        if row.version not in versions and -1 not in versions:
            return refusal(
                Kind.STALE, f"recurring export {row.id} is at version {row.version} now; read it again"
            )
        given = body.model_fields_set
        if "cron" in given and "interval_seconds" in given:
            return _invalid({"cron": "give cron or interval_seconds, not both"})
        cron, interval = row.cron, row.interval_seconds
        if "cron" in given:
            cron, interval = body.cron, None
        if "interval_seconds" in given:
            cron, interval = None, body.interval_seconds
        time_zone = body.time_zone if body.time_zone is not None else row.time_zone
        starts_at = body.starts_at if "starts_at" in given else row.starts_at
        ends_at = body.ends_at if "ends_at" in given else row.ends_at
        merged: dict[str, Any] = {
            "destination_id": body.destination_id or row.destination_id,
            "list_name": body.list_name or row.list_name,
            "cron": cron.strip() if cron else cron,
            "interval_seconds": interval,
            "time_zone": time_zone,
            "starts_at": starts_at,
            "ends_at": ends_at,
        }
        problems = definition_problems(
            cron=cron, interval_seconds=interval, time_zone=time_zone, starts_at=starts_at, ends_at=ends_at
        )
        if problems:
            return _invalid(problems)
        record.before = recurring_audit_json(row)
        try:
            async with self.store.recording(record):
                edited = await self.store.edit_recurring_export_if_version(
                    tenant_id=caller.tenant_id,
                    id=row.id,
                    expected_version=row.version,
                    updated_by=caller.principal,
                    **merged,
                )
                record.after = recurring_audit_json(edited) if edited else None
                record.outcome = (Kind.DONE if edited else Kind.STALE).value
        except UnknownReference:
            return refusal(Kind.INVALID, "destination_id: no such destination in this tenant")
        if edited is None:
            return refusal(Kind.STALE, f"recurring export {row.id} changed meanwhile; read it again")
        state = await self.sync.apply(edited)
        return Answer(
            Kind.DONE,
            {
                "recurring_export": recurring_json(edited),
                "schedule": state.value,
                "message": f"Recurring export {edited.id} now fires {describe_when(edited)}; exports it already "
                "created keep their terms." + _schedule_sentence(state),
            },
            version=edited.version,
        )

    async def pause(self, caller: Caller, recurring_export_id: UUID, body: PauseRecurringExport) -> Answer:
        """Pause it: no new export until resumed (a firing meanwhile is recorded skipped); the exports it
        created are untouched, and the answer counts them."""
        async with self._action(
            caller, AuditAction.RECURRING_PAUSE, recurring_export_id, body.reason
        ) as record:
            return answered(
                record, await self._set_paused(caller, recurring_export_id, True, body.reason, record)
            )

    async def resume(self, caller: Caller, recurring_export_id: UUID) -> Answer:
        """Resume it: its next firing creates an export again (missed ones are not run)."""
        async with self._action(caller, AuditAction.RECURRING_RESUME, recurring_export_id) as record:
            return answered(record, await self._set_paused(caller, recurring_export_id, False, None, record))

    async def _set_paused(
        self,
        caller: Caller,
        recurring_export_id: UUID,
        paused: bool,
        reason: str | None,
        record: ActionRecord,
    ) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_RECURRING)
        if forbidden is not None:
            return forbidden
        async with self.store.recording(record):
            changed = await self.store.set_recurring_export_paused(
                tenant_id=caller.tenant_id,
                recurring_export_id=recurring_export_id,
                paused=paused,
                reason=reason,
                updated_by=caller.principal,
            )
            record.outcome = Kind.DONE.value  # the answer below says otherwise for a missing or deleted one
            record.after = recurring_audit_json(changed) if changed else None
            if changed is None:
                current = await self._mine(caller, recurring_export_id)
                record.outcome = (
                    Kind.NOT_FOUND if current is None else Kind.REFUSED if current.deleted_at else Kind.DONE
                ).value
        row = changed or await self._mine(caller, recurring_export_id)
        if row is None:
            return refusal(Kind.NOT_FOUND, "no such recurring export")
        if row.deleted_at is not None:
            return refusal(Kind.REFUSED, f"recurring export {row.id} was deleted")
        untouched = _untouched(await self.store.recurring_export_exports_by_status(caller.tenant_id, row.id))
        verb = "Paused" if paused else "Resumed"
        if changed is None:
            state = ScheduleState.UNCHANGED
            message = (
                f"Recurring export {row.id} was already {'paused' if paused else 'active'}; nothing changed."
            )
        else:
            state = await self.sync.apply(changed)
            effect = (
                "it creates no export until resumed (a firing meanwhile is recorded as skipped)"
                if paused
                else "its next firing creates an export again; firings missed while paused are not run"
            )
            message = f"{verb} recurring export {row.id}: {effect}."
        return Answer(
            Kind.DONE,
            {
                "recurring_export": recurring_json(row),
                "schedule": state.value,
                "exports_untouched": untouched,
                "changed": changed is not None,
                "message": f"{message} {_untouched_sentence(untouched)}{_schedule_sentence(state)}",
            },
            version=row.version,
        )

    async def delete(self, caller: Caller, recurring_export_id: UUID) -> Answer:
        """Delete it: its Schedule goes, its row and firings stay as history, and the exports it created are
        untouched (the answer counts them)."""
        async with self._action(caller, AuditAction.RECURRING_DELETE, recurring_export_id) as record:
            return answered(record, await self._delete(caller, recurring_export_id, record))

    async def _delete(self, caller: Caller, recurring_export_id: UUID, record: ActionRecord) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_RECURRING)
        if forbidden is not None:
            return forbidden
        async with self.store.recording(record):
            deleted = await self.store.delete_recurring_export(
                tenant_id=caller.tenant_id,
                recurring_export_id=recurring_export_id,
                deleted_by=caller.principal,
            )
            record.after = recurring_audit_json(deleted) if deleted else None
            record.outcome = (
                Kind.DONE if deleted or await self._mine(caller, recurring_export_id) else Kind.NOT_FOUND
            ).value
        row = deleted or await self._mine(caller, recurring_export_id)
        if row is None:
            return refusal(Kind.NOT_FOUND, "no such recurring export")
        untouched = _untouched(await self.store.recurring_export_exports_by_status(caller.tenant_id, row.id))
        if deleted is None:
            assert row.deleted_at is not None
            message = f"Recurring export {row.id} was already deleted on {row.deleted_at.isoformat()}."
            state = ScheduleState.UNCHANGED
        else:
            state = await self.sync.apply(deleted)
            message = f"Deleted recurring export {row.id}: it fires no more; its firings stay recorded."
        return Answer(
            Kind.DONE,
            {
                "recurring_export": recurring_json(row),
                "schedule": state.value,
                "exports_untouched": untouched,
                "changed": deleted is not None,
                "message": f"{message} {_untouched_sentence(untouched)}{_schedule_sentence(state)}",
            },
        )

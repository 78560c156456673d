"""Outcome notifications, the tenant's side (issue 26, item 1): webhook endpoints and their deliveries.

A tenant's admins register endpoints (an HTTPS URL, the event types wanted, optionally their own
``whsec_`` secret), change, disable or remove them, and redeliver a delivery by hand; every role of the
tenant may read the endpoints and how their deliveries stand. The signing secret is shown once, in the
answer that creates or rotates it: the API's database role may write it and never read it back (0025), so
no later answer can carry it. A non-admin sees an endpoint's URL reduced to its origin (a URL's path or
query may carry the receiver's own token).

Another tenant's endpoint or delivery answers exactly as a missing one does.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import ConfigDict, Field, StringConstraints, WithJsonSchema, field_validator, model_validator

from db.stores.api import ApiStore
from domain.audit import AuditAction, SubjectKind
from domain.notifications import DeliveryState, EndpointSummary, NotificationKind, WebhookDelivery
from rules.webhooks import MAX_URL, new_secret, secret_key, url_origin, url_problem
from service.audit import Ledger, answered
from service.auth import Caller
from service.commands import _NAME_SCHEMA, Body, Name
from service.exports import ANY_VERSION, if_match_versions
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, may, refused
from settings import Settings

NOT_FOUND = "no such webhook endpoint"
NO_DELIVERY = "no such delivery of this webhook endpoint"

EndpointUrl = Annotated[str, StringConstraints(min_length=8, max_length=MAX_URL)]
Secret = Annotated[str, StringConstraints(min_length=38, max_length=100, pattern=r"^whsec_[A-Za-z0-9+/]+=*$")]
Events = Annotated[
    list[NotificationKind],
    Field(min_length=1, max_length=len(NotificationKind), json_schema_extra={"uniqueItems": True}),
]
# PATCH's fields as the published schema states them: never null (leave a field out to keep it).
_URL_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 8, "maxLength": MAX_URL}
_EVENTS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"enum": [k.value for k in NotificationKind]},
    "minItems": 1,
    "maxItems": len(NotificationKind),
    "uniqueItems": True,
}


def _distinct(events: list[NotificationKind]) -> list[NotificationKind]:
    if len(set(events)) != len(events):
        raise ValueError("each event type once")
    return events


class CreateEndpoint(Body):
    """POST /webhook-endpoints: where to POST, which events, and (optionally) your own signing secret."""

    url: EndpointUrl
    events: Events
    description: Name | None = None
    secret: Secret | None = Field(
        default=None,
        description="whsec_ and the base64 of 24 to 64 random bytes; left out, one is generated. Shown once.",
    )

    _events = field_validator("events")(_distinct)


class EditEndpoint(Body):
    """PATCH /webhook-endpoints/{id}: fields left out keep their value; ``rotate_secret`` makes a new
    secret (shown once, in this answer), effective at once."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    url: Annotated[EndpointUrl | None, WithJsonSchema(_URL_SCHEMA)] = None
    events: Annotated[Events | None, WithJsonSchema(_EVENTS_SCHEMA)] = None
    description: Annotated[Name | None, WithJsonSchema(_NAME_SCHEMA)] = None
    enabled: Annotated[bool | None, WithJsonSchema({"type": "boolean"})] = None
    rotate_secret: Annotated[Literal[True] | None, WithJsonSchema({"const": True})] = None

    _events = field_validator("events")(_distinct)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(v is None for v in data.values()):
            raise ValueError("a field given must have a value; leave a field out to keep it")
        return data

    @model_validator(mode="after")
    def _changes_something(self) -> EditEndpoint:
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError("give at least one of url, events, description, enabled, rotate_secret")
        return self


def endpoint_json(endpoint: EndpointSummary, caller: Caller) -> dict[str, Any]:
    """An endpoint as JSON, never its secret; the full URL for admins, its origin for everyone else."""
    admin = may(caller.role, Action.MANAGE_NOTIFICATIONS)
    return {
        "id": str(endpoint.id),
        "url": endpoint.url if admin else url_origin(endpoint.url),
        "events": [e.value for e in endpoint.events],
        "description": endpoint.description,
        "enabled": endpoint.enabled,
        "version": endpoint.version,
        "created_by": endpoint.created_by,
        "created_at": endpoint.created_at.isoformat(),
        "updated_by": endpoint.updated_by,
        "updated_at": endpoint.updated_at.isoformat() if endpoint.updated_at else None,
        "deliveries": {
            "pending": endpoint.pending,
            "failed": endpoint.failed,
            "delivered": endpoint.delivered,
            "last_failure_at": endpoint.last_failure_at.isoformat() if endpoint.last_failure_at else None,
        },
    }


def delivery_json(delivery: WebhookDelivery) -> dict[str, Any]:
    """One delivery as JSON: its event, state, attempts and last answer (a status code or an error type)."""

    def at(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": str(delivery.id),
        "event_id": str(delivery.event_id),
        "type": delivery.kind.value,
        "export_id": str(delivery.job_id) if delivery.job_id else None,
        "state": delivery.state.value,
        "attempts": delivery.attempts,
        "next_attempt_at": at(delivery.next_attempt_at) if delivery.state == DeliveryState.PENDING else None,
        "give_up_at": at(delivery.give_up_at),
        "last_attempt_at": at(delivery.last_attempt_at),
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        "delivered_at": at(delivery.delivered_at),
        "redeliveries": delivery.redeliveries,
        "redelivered_by": delivery.redelivered_by,
        "redelivered_at": at(delivery.redelivered_at),
        "event_created_at": at(delivery.event_created_at),
    }


class Notifications:
    """The endpoint and delivery operations over the API's ``exports_api`` store."""

    def __init__(self, store: ApiStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.ledger = Ledger(store)

    async def _recorded(
        self,
        caller: Caller,
        action: AuditAction,
        subject_id: object | None,
        run: Callable[[], Awaitable[Answer]],
    ) -> Answer:
        """An endpoint change and its row of the ledger of operator actions in one transaction (0031): what the
        endpoint is after (its URL's origin, its events, whether enabled; never its secret), and the answer's
        outcome; a refusal's row is the only write of its transaction."""
        async with self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=action,
            subject_kind=SubjectKind.WEBHOOK_ENDPOINT,
            subject_id=subject_id,
        ) as record:
            async with self.store.recording(record):
                answer = await run()
                endpoint = answer.body.get("endpoint")
                if isinstance(endpoint, dict):
                    record.subject_id = endpoint["id"]
                    record.after = {
                        "url_origin": url_origin(endpoint["url"]),
                        "events": endpoint["events"],
                        "enabled": endpoint["enabled"],
                        "version": endpoint["version"],
                        "signing_key_rotated": "secret" in answer.body and action == AuditAction.WEBHOOK_EDIT,
                    }
                record.outcome, record.detail = answer.kind.value, answer.text or None
            return answered(record, answer)

    async def _endpoint(self, caller: Caller, endpoint_id: UUID) -> EndpointSummary | None:
        rows = await self.store.tenant_webhook_endpoints(caller.tenant_id, endpoint_id)
        return rows[0] if rows else None

    async def endpoints(self, caller: Caller) -> list[EndpointSummary]:
        """The caller's tenant's endpoints (for the console)."""
        return await self.store.tenant_webhook_endpoints(caller.tenant_id)

    async def list(self, caller: Caller) -> Answer:
        """``GET /webhook-endpoints``: the tenant's endpoints and how their deliveries stand."""
        forbidden = refused(caller.role, Action.READ)
        if forbidden is not None:
            return forbidden
        rows = await self.store.tenant_webhook_endpoints(caller.tenant_id)
        return Answer(Kind.DONE, {"endpoints": [endpoint_json(e, caller) for e in rows]})

    async def get(self, caller: Caller, endpoint_id: UUID) -> Answer:
        """``GET /webhook-endpoints/{id}``."""
        forbidden = refused(caller.role, Action.READ)
        if forbidden is not None:
            return forbidden
        endpoint = await self._endpoint(caller, endpoint_id)
        if endpoint is None:
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        return Answer(Kind.DONE, {"endpoint": endpoint_json(endpoint, caller)}, version=endpoint.version)

    async def create(self, caller: Caller, body: CreateEndpoint) -> Answer:
        """The operation, and its row of the ledger of operator actions in its transaction."""
        return await self._recorded(
            caller, AuditAction.WEBHOOK_CREATE, None, lambda: self._create(caller, body)
        )

    async def _create(self, caller: Caller, body: CreateEndpoint) -> Answer:
        """``POST /webhook-endpoints``: 201 with the endpoint and its secret (the only answer that has it)."""
        forbidden = refused(caller.role, Action.MANAGE_NOTIFICATIONS)
        if forbidden is not None:
            return forbidden
        problem = url_problem(body.url)
        if problem is not None:
            return refusal(Kind.INVALID, f"url: {problem}")
        secret = body.secret or new_secret()
        try:
            secret_key(secret)
        except ValueError as exc:
            return refusal(Kind.INVALID, f"secret: {exc}")
        created = await self.store.create_webhook_endpoint(
            caller.tenant_id,
            uuid.uuid4(),
            url=body.url,
            secret=secret,
            events=[e.value for e in body.events],
            description=body.description,
            created_by=caller.principal,
            max_endpoints=self.settings.webhook_max_endpoints,
        )
        if created is None:
            return refusal(
                Kind.REFUSED,
                f"this tenant has {self.settings.webhook_max_endpoints} webhook endpoints, the most it may have;"
                " remove one first",
            )
        endpoint = await self._endpoint(caller, created.id)
        assert endpoint is not None
        return Answer(
            Kind.CREATED,
            {
                "endpoint": endpoint_json(endpoint, caller),
                "secret": secret,
                "message": "Keep the secret now: it is never shown again. Verify each delivery's "
                "webhook-signature with it (docs/notifications.md).",
            },
            location=f"/webhook-endpoints/{endpoint.id}",
            version=endpoint.version,
        )

    async def edit(
        self, caller: Caller, endpoint_id: UUID, body: EditEndpoint, if_match: str | None
    ) -> Answer:
        """The operation, and its row of the ledger of operator actions in its transaction."""
        return await self._recorded(
            caller,
            AuditAction.WEBHOOK_EDIT,
            endpoint_id,
            lambda: self._edit(caller, endpoint_id, body, if_match),
        )

    async def _edit(
        self, caller: Caller, endpoint_id: UUID, body: EditEndpoint, if_match: str | None
    ) -> Answer:
        """``PATCH /webhook-endpoints/{id}`` for the version read (``If-Match``): 428 without it, 412 when
        it moved on; a rotated secret is in this answer only."""
        forbidden = refused(caller.role, Action.MANAGE_NOTIFICATIONS)
        if forbidden is not None:
            return forbidden
        if if_match is None:
            return refusal(
                Kind.PRECONDITION_REQUIRED,
                'the If-Match header is required: the version you read, e.g. If-Match: "1"',
            )
        versions = if_match_versions(if_match)
        if versions is None:
            return refusal(
                Kind.MALFORMED, 'If-Match must be entity tags as the ETag header gives them, e.g. "1"'
            )
        endpoint = await self._endpoint(caller, endpoint_id)
        if endpoint is None:
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        if ANY_VERSION not in versions and endpoint.version not in versions:
            return refusal(
                Kind.STALE,
                f'the endpoint is at version {endpoint.version}; If-Match names no "{endpoint.version}"',
                version=endpoint.version,
            )
        if body.url is not None:
            problem = url_problem(body.url)
            if problem is not None:
                return refusal(Kind.INVALID, f"url: {problem}")
        secret = new_secret() if body.rotate_secret else None
        updated = await self.store.update_webhook_endpoint(
            caller.tenant_id,
            endpoint_id,
            expected_version=endpoint.version,
            updated_by=caller.principal,
            url=body.url,
            events=[e.value for e in body.events] if body.events is not None else None,
            description=body.description,
            enabled=body.enabled,
            secret=secret,
        )
        now = await self._endpoint(caller, endpoint_id)
        if now is None:
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        if updated is None:
            return refusal(
                Kind.STALE,
                f"the endpoint is at version {now.version}, not {endpoint.version}",
                version=now.version,
            )
        answer: dict[str, Any] = {"endpoint": endpoint_json(now, caller)}
        if secret is not None:
            answer["secret"] = secret
            answer["message"] = "The new secret signs every delivery from now on; it is never shown again."
        return Answer(Kind.DONE, answer, version=now.version)

    async def delete(self, caller: Caller, endpoint_id: UUID) -> Answer:
        """The operation, and its row of the ledger of operator actions in its transaction."""
        return await self._recorded(
            caller, AuditAction.WEBHOOK_DELETE, endpoint_id, lambda: self._delete(caller, endpoint_id)
        )

    async def _delete(self, caller: Caller, endpoint_id: UUID) -> Answer:
        """``DELETE /webhook-endpoints/{id}``: the endpoint and its deliveries go; the events stay."""
        forbidden = refused(caller.role, Action.MANAGE_NOTIFICATIONS)
        if forbidden is not None:
            return forbidden
        if not await self.store.delete_webhook_endpoint(caller.tenant_id, endpoint_id):
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        return Answer(Kind.DONE, {"message": f"Webhook endpoint {endpoint_id} removed, with its deliveries."})

    async def deliveries(
        self, caller: Caller, endpoint_id: UUID, *, state: DeliveryState | None = None, limit: int = 100
    ) -> Answer:
        """``GET /webhook-endpoints/{id}/deliveries``: the newest first, failures with their last answer."""
        forbidden = refused(caller.role, Action.READ)
        if forbidden is not None:
            return forbidden
        if await self._endpoint(caller, endpoint_id) is None:
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        rows = await self.store.endpoint_deliveries(caller.tenant_id, endpoint_id, state=state, limit=limit)
        return Answer(Kind.DONE, {"deliveries": [delivery_json(d) for d in rows]})

    async def redeliver(self, caller: Caller, endpoint_id: UUID, delivery_id: UUID) -> Answer:
        """The operation, and its row of the ledger of operator actions in its transaction."""
        return await self._recorded(
            caller,
            AuditAction.WEBHOOK_REDELIVER,
            endpoint_id,
            lambda: self._redeliver(caller, endpoint_id, delivery_id),
        )

    async def _redeliver(self, caller: Caller, endpoint_id: UUID, delivery_id: UUID) -> Answer:
        """``POST /webhook-endpoints/{id}/deliveries/{delivery_id}/redelivery``: due now, with a fresh retry
        window, the same event ID (202: the worker sends it)."""
        forbidden = refused(caller.role, Action.MANAGE_NOTIFICATIONS)
        if forbidden is not None:
            return forbidden
        if await self._endpoint(caller, endpoint_id) is None:
            return refusal(Kind.NOT_FOUND, NOT_FOUND)
        if not await self.store.redeliver_webhook(
            caller.tenant_id,
            endpoint_id,
            delivery_id,
            redelivered_by=caller.principal,
            window_seconds=self.settings.webhook_retry_window_seconds,
        ):
            return refusal(Kind.NOT_FOUND, NO_DELIVERY)
        return Answer(
            Kind.ACCEPTED,
            {
                "delivery_id": str(delivery_id),
                "message": "Redelivery queued: the worker sends the same event (the same webhook-id) within"
                " seconds, and retries it with backoff if the endpoint fails again.",
            },
        )

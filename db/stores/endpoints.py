"""A tenant's webhook endpoints and their deliveries (role ``exports_api``): register, list, change and
remove endpoints, read their deliveries, and redeliver one by hand. The API's role writes an endpoint's
secret and can never read it back (0025's column grants)."""

from __future__ import annotations

from uuid import UUID

from db.errors import translated
from db.queries import fetch, fetch_maybe
from db.rows import IdRow
from db.stores.base import StoreBase
from domain.notifications import DeliveryState, EndpointSummary, WebhookDelivery, WebhookEndpoint


class EndpointStatements(StoreBase):
    """Webhook endpoints and their deliveries, for the tenant's admins (changes) and everyone (reads)."""

    async def create_webhook_endpoint(
        self,
        tenant_id: UUID,
        endpoint_id: UUID,
        *,
        url: str,
        secret: str,
        events: list[str],
        description: str | None,
        created_by: str,
        max_endpoints: int,
    ) -> WebhookEndpoint | None:
        """Register an endpoint, enabled; ``None`` when the tenant already has ``max_endpoints``."""
        return await self._row(
            "create_webhook_endpoint",
            {
                "tenant_id": tenant_id,
                "endpoint_id": endpoint_id,
                "url": url,
                "secret": secret,
                "events": events,
                "description": description,
                "created_by": created_by,
                "max_endpoints": max_endpoints,
            },
            WebhookEndpoint,
        )

    async def tenant_webhook_endpoints(
        self, tenant_id: UUID, endpoint_id: UUID | None = None
    ) -> list[EndpointSummary]:
        """The tenant's endpoints with their delivery counts (or the one named; none for another tenant's)."""
        return await self._rows(
            "tenant_webhook_endpoints", {"tenant_id": tenant_id, "endpoint_id": endpoint_id}, EndpointSummary
        )

    async def update_webhook_endpoint(
        self,
        tenant_id: UUID,
        endpoint_id: UUID,
        *,
        expected_version: int,
        updated_by: str,
        url: str | None = None,
        events: list[str] | None = None,
        description: str | None = None,
        clear_description: bool = False,
        enabled: bool | None = None,
        secret: str | None = None,
    ) -> WebhookEndpoint | None:
        """Change an endpoint for the version read, and rotate its secret to ``secret`` if one is given, in
        one transaction; ``None`` when another version or no such endpoint (nothing changed)."""
        params = {
            "tenant_id": tenant_id,
            "endpoint_id": endpoint_id,
            "expected_version": expected_version,
            "updated_by": updated_by,
            "url": url,
            "events": events,
            "description": description,
            "clear_description": clear_description,
            "enabled": enabled,
        }
        async with translated(), self._connection() as conn, conn.transaction():
            updated = await fetch_maybe(conn, "update_webhook_endpoint", params, WebhookEndpoint)
            if updated is not None and secret is not None:
                await fetch(
                    conn,
                    "rotate_webhook_secret",
                    {
                        "tenant_id": tenant_id,
                        "endpoint_id": endpoint_id,
                        "version": updated.version,
                        "secret": secret,
                    },
                    IdRow,
                )
            return updated

    async def delete_webhook_endpoint(self, tenant_id: UUID, endpoint_id: UUID) -> bool:
        """Remove an endpoint and its deliveries; whether there was one in this tenant."""
        return await self._matched("delete_webhook_endpoint", tenant_id=tenant_id, endpoint_id=endpoint_id)

    async def endpoint_deliveries(
        self, tenant_id: UUID, endpoint_id: UUID, *, state: DeliveryState | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """An endpoint's deliveries, newest first (none for another tenant's endpoint)."""
        return await self._rows(
            "endpoint_deliveries",
            {"tenant_id": tenant_id, "endpoint_id": endpoint_id, "state": state, "limit": limit},
            WebhookDelivery,
        )

    async def redeliver_webhook(
        self,
        tenant_id: UUID,
        endpoint_id: UUID,
        delivery_id: UUID,
        *,
        redelivered_by: str,
        window_seconds: float,
    ) -> bool:
        """Make one delivery due now with a fresh retry window; whether it exists in this tenant's endpoint."""
        rows = await self._rows(
            "redeliver_webhook",
            {
                "tenant_id": tenant_id,
                "endpoint_id": endpoint_id,
                "delivery_id": delivery_id,
                "redelivered_by": redelivered_by,
                "window_seconds": window_seconds,
            },
            IdRow,
        )
        return bool(rows)

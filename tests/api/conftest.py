"""The API under test: the real app over real PostgreSQL stores, driven in-process through httpx."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from api.app import create_app
from db.stores.api import ApiStore
from db.stores.reconciler import ReconcilerStore
from service.auth import mint_token
from service.exports import Exports
from service.signals import StopSignaller, TemporalStopSignaller
from settings import Settings
from testbed.pg import TestDatabase
from tests.support.factories import Factory


@dataclass(frozen=True)
class TenantKeys:
    """A tenant with a destination and its callers: an operator, a reconciler, a viewer and an admin."""

    id: UUID
    destination_id: UUID
    operator: dict[str, str]
    reconciler: dict[str, str]
    operator_name: str
    reconciler_name: str
    viewer: dict[str, str]
    admin: dict[str, str]


async def make_tenant(factory: Factory, database: TestDatabase, name: str) -> TenantKeys:
    tenant_id = await factory.tenant(name)
    destination_id = await factory.destination(tenant_id)
    operator_name, reconciler_name = f"sam.ops@{name}", f"rita.recon@{name}"
    operator = await mint_token(
        database.admin_url, tenant_id=tenant_id, principal=operator_name, role="operator"
    )
    reconciler = await mint_token(
        database.admin_url, tenant_id=tenant_id, principal=reconciler_name, role="reconciler"
    )
    viewer = await mint_token(
        database.admin_url, tenant_id=tenant_id, principal=f"vic.view@{name}", role="viewer"
    )
    admin = await mint_token(
        database.admin_url, tenant_id=tenant_id, principal=f"ada.admin@{name}", role="admin"
    )
    return TenantKeys(
        id=tenant_id,
        destination_id=destination_id,
        operator={"Authorization": f"Bearer {operator}"},
        reconciler={"Authorization": f"Bearer {reconciler}"},
        operator_name=operator_name,
        reconciler_name=reconciler_name,
        viewer={"Authorization": f"Bearer {viewer}"},
        admin={"Authorization": f"Bearer {admin}"},
    )


async def another(
    database: TestDatabase, keys: TenantKeys, role: str, name: str | None = None
) -> dict[str, str]:
    """The headers of another principal of ``keys``' tenant with ``role`` (a second person, issue #26)."""
    principal = name or f"{role}.two.{uuid.uuid4().hex[:6]}"
    token = await mint_token(database.admin_url, tenant_id=keys.id, principal=principal, role=role)  # type: ignore[arg-type]
    return {"Authorization": f"Bearer {token}"}


async def approve(
    client: httpx.AsyncClient, answer: httpx.Response, headers: dict[str, str], reason: str | None = None
) -> httpx.Response:
    """Approve the approval a 202 answered with, as ``headers``' principal: the action's own answer."""
    assert answer.status_code == 202, answer.text
    approval = answer.json()["approval"]["id"]
    return await client.post(
        f"/approvals/{approval}/approval", json={"reason": reason} if reason else {}, headers=headers
    )


@pytest.fixture(scope="module")
async def acme(factory: Factory, database: TestDatabase) -> TenantKeys:
    return await make_tenant(factory, database, "acme")


@pytest.fixture(scope="module")
async def globex(factory: Factory, database: TestDatabase) -> TenantKeys:
    return await make_tenant(factory, database, "globex")


@pytest.fixture(scope="module")
def make_app(api_store: ApiStore, reconciler_store: ReconcilerStore) -> Callable[..., FastAPI]:
    def build(signaller: StopSignaller | Client | None = None, lock_timeout: str = "300ms") -> FastAPI:
        settings = Settings(temporal_ui_url="http://ui.test:8233")
        exports = Exports(
            api_store,
            reconciler_store,
            TemporalStopSignaller(signaller) if isinstance(signaller, Client) else signaller,
            temporal_ui_url=settings.temporal_ui_url,
            cancel_lock_timeout=lock_timeout,
        )
        return create_app(settings, exports=exports)

    return build


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


@pytest.fixture(scope="module")
async def client(make_app: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(make_app()) as c:
        yield c


def cancel_body(request_id: UUID | None = None, reason: str = "wrong destination") -> dict[str, Any]:
    return {"request_id": str(request_id or uuid.uuid4()), "reason": reason}


async def recorded_requests(factory: Factory, job_id: UUID) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE job_id = %(id)s", {"id": job_id}
    )
    return rows[0]["n"]


async def snapshot(factory: Factory, job_id: UUID) -> dict[str, Any]:
    """Everything a request could have changed about one job: the row, its events, requests, outbox."""
    row = (await factory.admin("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": job_id}))[0]
    counts = await factory.admin(
        "SELECT (SELECT count(*) FROM export_attempt_events WHERE job_id = %(id)s) AS events,"
        " (SELECT count(*) FROM cancellation_requests WHERE job_id = %(id)s) AS requests,"
        " (SELECT count(*) FROM outbox WHERE job_id = %(id)s) AS wakeups,"
        " (SELECT count(*) FROM export_jobs WHERE replaces_job_id = %(id)s) AS replacements",
        {"id": job_id},
    )
    return {**row, **counts[0]}


async def sign_in(client: httpx.AsyncClient, keys: TenantKeys, as_role: str = "operator") -> str:
    """Sign the console in as ``keys``' operator (or the caller of ``as_role``), as a browser on this site
    would (the login form's anti-forgery token, our own Origin); the client keeps the session cookie.
    Returns the session ID."""
    import re

    from api.auth import COOKIE_NAME

    form = await client.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    r = await client.post(
        "/console/login",
        data={
            "token": getattr(keys, as_role)["Authorization"].removeprefix("Bearer "),
            "csrf": csrf.group(1),
        },
        headers={"Origin": "http://testserver"},
    )
    assert r.status_code == 303, r.text
    session = client.cookies.get(COOKIE_NAME)
    assert session is not None
    return session


async def counted(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The API's /metrics as {(sample, sorted labels): value}; tests compare two readings (the registry is
    the process's, shared by every test)."""
    text = (await client.get("/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def increase(before: dict, after: dict, sample: str, **labels: str) -> float:
    """How much one series grew between two readings of ``counted``."""
    key = (sample, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)

"""The API while PostgreSQL restarts (issue 10.8): a real server stopped (immediate, then fast) and started
again while clients stream creates, status reads, cancellations, lists and console pages at the real HTTP
server. Every answer is 2xx/4xx or 503 with Retry-After, never another 5xx; clients retry a 503 with the
same Idempotency-Key or request ID, and afterwards the database holds each export and each cancellation
request once."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from api.app import create_app
from api.auth import COOKIE_NAME
from api.server import BackgroundServer
from db.embedded import EmbeddedPostgres
from service.auth import mint_token
from service.exports import open_exports
from service.signals import NoSignaller
from settings import Settings
from tests.support.pg_restart import app_url, own_postgres, start, stop

pytestmark = pytest.mark.slow

USERS = 4
OUTAGE_LONGER_THAN_A_CHECKOUT = 6.5  # seconds: past the API's 5 s checkout, so requests meet the outage


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with own_postgres("fenced-api-restarts-") as server:
        yield server


async def admin(postgres: EmbeddedPostgres, query: Any, params: dict[str, Any] | None = None) -> list[dict]:
    async with await psycopg.AsyncConnection.connect(postgres.url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params or {})
            return await cur.fetchall() if cur.description else []


@dataclass
class Tenant:
    id: uuid.UUID
    destination_id: uuid.UUID
    token: str


@pytest.fixture(scope="module")
async def tenant(postgres: EmbeddedPostgres) -> Tenant:
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    await admin(
        postgres,
        "WITH t AS (INSERT INTO tenants (id, name) VALUES (%(t)s, 'acme') RETURNING id)"
        " INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
        " remote_dir) SELECT %(d)s, id, 'partner-old', '127.0.0.1', 22, 'partner', 'ssh-ed25519 AAAA',"
        " '/nonexistent', '/upload' FROM t",
        {"t": tenant_id, "d": destination_id},
    )
    token = await mint_token(postgres.url, tenant_id=tenant_id, principal="sam.ops", role="operator")
    await admin(postgres, "CHECKPOINT")
    return Tenant(tenant_id, destination_id, token)


@pytest.fixture
async def api_url(postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    settings = Settings(database_url=app_url(postgres), temporal_ui_url="http://ui.test:8233")
    async with open_exports(settings, signaller=NoSignaller()) as exports:
        server = BackgroundServer(create_app(settings, exports=exports))
        url = await server.start()
        try:
            yield url
        finally:
            await server.stop()


@dataclass
class Stream:
    """What the clients were told, and what they believe they created and cancelled."""

    answers: list[tuple[str, int, str | None]] = field(default_factory=list)  # (what, status, Retry-After)
    created: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> export ID
    cancelled: dict[str, str] = field(default_factory=dict)  # request ID -> export ID
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def ok_since(self, mark: int) -> int:
        return sum(1 for _, status, _ in self.answers[mark:] if status < 500)


async def call(
    http: httpx.AsyncClient, stream: Stream, what: str, method: str, path: str, **kw: Any
) -> httpx.Response | None:
    """One request, retried as a client should after a 503: the same request, same key, same ID."""
    for _ in range(200):
        response = await http.request(method, path, **kw)
        stream.answers.append((what, response.status_code, response.headers.get("retry-after")))
        if response.status_code != 503:
            return response
        if stream.done.is_set() and method == "GET":
            return None
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} answered 503 two hundred times")


async def user(http: httpx.AsyncClient, stream: Stream, tenant: Tenant) -> None:
    bearer = {"Authorization": f"Bearer {tenant.token}"}
    while not stream.done.is_set():
        key = f"restart-{uuid.uuid4()}"
        created = await call(
            http,
            stream,
            "create",
            "POST",
            "/exports",
            json={"destination_id": str(tenant.destination_id), "list_name": "main"},
            headers={**bearer, "Idempotency-Key": key},
        )
        assert created is not None and created.status_code in (200, 201), created and created.text
        export_id = created.json()["export"]["id"]
        stream.created[key] = export_id
        await call(http, stream, "status", "GET", f"/exports/{export_id}", headers=bearer)
        request_id = str(uuid.uuid4())
        cancelled = await call(
            http,
            stream,
            "cancel",
            "POST",
            f"/exports/{export_id}/cancellations",
            json={"request_id": request_id, "reason": "database restart test"},
            headers=bearer,
        )
        assert cancelled is not None and cancelled.status_code == 200, cancelled and cancelled.text
        stream.cancelled[request_id] = export_id
        await call(http, stream, "list", "GET", "/exports?limit=5", headers=bearer)
        await call(
            http, stream, "console", "GET", "/console", headers={"Cookie": f"{COOKIE_NAME}={tenant.token}"}
        )


async def until_answered(
    stream: Stream, users: list[asyncio.Task[None]], count: int, seconds: float = 90
) -> None:
    """Wait for ``count`` more answers below 500 (the API serving again), bounded; a client that failed
    fails the test at once."""
    mark = len(stream.answers)
    async with asyncio.timeout(seconds):
        while stream.ok_since(mark) < count:
            for task in users:
                if task.done():
                    task.result()
                    raise AssertionError("a client stopped early")
            await asyncio.sleep(0.05)  # noqa: ASYNC110 - polling what the clients were told


async def test_restarts_under_a_stream_of_requests_answer_503_never_500_and_record_nothing_twice(
    postgres, tenant, api_url
):
    stream = Stream()
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        users = [asyncio.create_task(user(http, stream, tenant)) for _ in range(USERS)]
        try:
            await until_answered(stream, users, 20)
            stop(postgres, "immediate")  # as a crash: every connection cut, crash recovery at start
            await asyncio.sleep(OUTAGE_LONGER_THAN_A_CHECKOUT)
            start(postgres)
            await until_answered(stream, users, 20)
            stop(postgres, "fast")  # as a switchover: every backend told to end
            await asyncio.sleep(1.0)
            start(postgres)
            await until_answered(stream, users, 20)
        finally:
            stream.done.set()
            await asyncio.wait_for(asyncio.gather(*users), 120)

    statuses = Counter(status for _, status, _ in stream.answers)
    assert not [s for s in statuses if s >= 500 and s != 503], statuses
    assert statuses[503] > 0, "no request met the outage: the test proved nothing"
    assert all(retry_after for _, status, retry_after in stream.answers if status == 503)
    print(
        f"answers: {dict(statuses)}; 503 by request: {Counter(w for w, s, _ in stream.answers if s == 503)}"
    )

    # Nothing recorded twice: one export per Idempotency-Key, one wake-up per export, one recorded
    # request per cancellation, each export cancelled once.
    jobs = await admin(
        postgres,
        "SELECT j.id::text AS id, j.status, k.key,"
        " (SELECT count(*) FROM outbox o WHERE o.job_id = j.id) AS wakeups,"
        " (SELECT count(*) FROM cancellation_requests c WHERE c.job_id = j.id) AS requests"
        " FROM export_jobs j LEFT JOIN idempotency_keys k ON k.job_id = j.id WHERE j.tenant_id = %(t)s",
        {"t": tenant.id},
    )
    by_key = {job["key"]: job for job in jobs}
    assert len(by_key) == len(jobs), "an export without its key, or a key with two exports"
    assert {key: job["id"] for key, job in by_key.items()} == stream.created
    assert all(job["wakeups"] == 1 for job in jobs)
    assert all(job["requests"] == 1 and job["status"] == "Canceled" for job in jobs)
    requests = await admin(
        postgres,
        "SELECT id::text AS id, job_id::text AS job_id FROM cancellation_requests WHERE tenant_id = %(t)s",
        {"t": tenant.id},
    )
    assert {r["id"]: r["job_id"] for r in requests} == stream.cancelled

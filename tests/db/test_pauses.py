"""Owned, overlapping pauses (issue #26 item 3, migration 0032): a pause is its owner's, with its reason and
maybe an expiry; a scope delivers while none of its pauses is active; a resume releases only the pauses it
names (by default its own), so an incident pause, a deploy pause and a contract pause do not undo each other;
an expired pause lifts itself. The claim and cutoff 2 read the pauses through the same gate functions, after
the switch rows they lock (the race tests are tests/db/test_controls_races.py). An upgrade keeps every paused
scope paused, as a pause owned by whoever paused it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from db.errors import ConstraintRefused
from db.migrate import migrate, migration_files
from db.queries import fetch_sync
from domain.controls import SwitchScope
from domain.models import AuthorizationResult, ClaimResult
from testbed.pg import with_database
from tests.db.race import authorize


async def pause(store, job, *, by: str, reason: str, scope: str = "destination", **kw: Any):
    return await store.set_delivery_switch(
        scope=SwitchScope(scope),
        tenant_id=job.tenant_id,
        destination_id=job.destination_id if scope == "destination" else None,
        enabled=False,
        reason=reason,
        changed_by=by,
        **kw,
    )


async def resume(store, job, *, by: str, scope: str = "destination", **kw: Any):
    return await store.set_delivery_switch(
        scope=SwitchScope(scope),
        tenant_id=job.tenant_id,
        destination_id=job.destination_id if scope == "destination" else None,
        enabled=True,
        reason="resumed",
        changed_by=by,
        **kw,
    )


async def claim(worker_store, job) -> ClaimResult:
    return await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")


async def test_overlapping_pauses_do_not_undo_each_other(factory, api_store, worker_store):
    job = await factory.queued()
    incident = await pause(api_store, job, by="rita.ops", reason="partner incident")
    deploy = await pause(api_store, job, by="sam.ops", reason="deploy")
    contract = await pause(api_store, job, by="sam.ops", reason="contract renewal", scope="tenant")
    assert len({*incident.pause_ids, *deploy.pause_ids, *contract.pause_ids}) == 3

    # sam's resume of the destination releases sam's deploy pause only: rita's incident still holds it
    released = await resume(api_store, job, by="sam.ops")
    assert released.pause_ids == deploy.pause_ids and released.enabled is False
    assert await claim(worker_store, job) == ClaimResult.PAUSED

    # rita's releases hers; sam's tenant-wide contract pause still holds the destination's exports
    released = await resume(api_store, job, by="rita.ops")
    assert released.pause_ids == incident.pause_ids and released.enabled is True
    assert await claim(worker_store, job) == ClaimResult.PAUSED

    await resume(api_store, job, by="sam.ops", scope="tenant")
    assert await claim(worker_store, job) == ClaimResult.CLAIMED


async def test_pausing_again_for_the_same_reason_is_the_same_pause(factory, api_store):
    job = await factory.queued()
    first = await pause(api_store, job, by="rita.ops", reason="partner incident")
    again = await pause(api_store, job, by="rita.ops", reason="partner incident")
    assert first.pause_ids == again.pause_ids
    assert again.was_enabled is False  # it was paused already: the answer says so


async def test_an_expired_pause_lifts_itself_for_the_claim_and_cutoff_2(factory, api_store, worker_store):
    job, attempt = await factory.running()
    queued = await factory.queued(job.tenant_id, job.destination_id)
    # a pause that started two hours ago and ended an hour ago: the database clock decides (set on the row)
    await factory.admin(
        "INSERT INTO delivery_pauses (scope, tenant_id, destination_id, owner, reason, paused_at, expires_at)"
        " VALUES ('destination', %(t)s, %(d)s, 'rita.ops', 'maintenance window',"
        " clock_timestamp() - interval '2 hours', clock_timestamp() - interval '1 hour')",
        {"t": job.tenant_id, "d": job.destination_id},
    )
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.AUTHORIZED
    assert await claim(worker_store, queued) == ClaimResult.CLAIMED
    switches = {s.destination_id: s for s in await api_store.tenant_switches(job.tenant_id)}
    assert switches[job.destination_id].enabled is True
    assert await api_store.tenant_pauses(job.tenant_id) == []


async def test_a_pause_until_a_later_time_holds_until_then(factory, api_store, worker_store):
    job = await factory.queued()
    [row] = await factory.admin("SELECT clock_timestamp() + interval '1 hour' AS later", {})
    paused = await pause(api_store, job, by="rita.ops", reason="maintenance window", expires_at=row["later"])
    assert await claim(worker_store, job) == ClaimResult.PAUSED
    [active] = await api_store.tenant_pauses(job.tenant_id)
    assert (active.id, active.expires_at) == (paused.pause_ids[0], row["later"])


async def test_an_expiry_that_is_not_later_than_now_is_refused(factory, api_store):
    job = await factory.queued()
    [row] = await factory.admin("SELECT clock_timestamp() - interval '1 minute' AS earlier", {})
    with pytest.raises(ConstraintRefused) as refused:
        await pause(api_store, job, by="rita.ops", reason="too late", expires_at=row["earlier"])
    assert refused.value.constraint == "ck_delivery_pauses_expiry"


async def test_the_gate_and_the_scopes_hold_agree(factory, api_store):
    job = await factory.queued()
    await pause(api_store, job, by="rita.ops", reason="partner incident")
    [row] = await factory.admin(
        "SELECT delivery_scope_open(%(t)s, %(d)s) AS open,"
        " delivery_scope_hold('destination', %(t)s, %(d)s) AS hold,"
        " delivery_scope_hold('tenant', %(t)s, NULL) AS tenant_hold",
        {"t": job.tenant_id, "d": job.destination_id},
    )
    assert row == {"open": False, "hold": "partner incident", "tenant_hold": None}


# -- an upgrade ---------------------------------------------------------------------------------------------

BEFORE = "0023_recurring_exports.sql"


@pytest.fixture(scope="module")
def old_database(pg_server: str) -> Iterator[str]:
    """A database migrated up to the last migration before 0031, as a deployment before this change had it."""
    name = f"fenced_pauses_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(pg_server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        fetch_sync(conn, "create_migrations_table", {})
        for file, text in migration_files():
            if file > BEFORE:
                break
            with conn.transaction():
                conn.execute(text)
                fetch_sync(conn, "record_migration", {"name": file})
    yield url


def test_an_upgrade_keeps_every_paused_scope_paused_as_its_pausers_own_pause(old_database: str) -> None:
    tenant, destination, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(old_database, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%(t)s, 'acme')", {"t": tenant})
        for d, name in ((destination, "partner-old"), (other, "partner-new")):
            conn.execute(
                "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
                " remote_dir) VALUES (%(d)s, %(t)s, %(n)s, 'h', 22, 'u', 'k', '/k', '/')",
                {"d": d, "t": tenant, "n": name},
            )
        conn.execute(
            "INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
            " VALUES ('tenant', %(t)s, NULL, true, 'enabled', 'seeding'),"
            " ('destination', %(t)s, %(d)s, false, 'partner compromised', 'rita.ops'),"
            " ('destination', %(t)s, %(o)s, true, 'enabled', 'seeding')",
            {"t": tenant, "d": destination, "o": other},
        )

    migrate(old_database)

    with psycopg.connect(old_database, autocommit=True, row_factory=dict_row) as conn:
        pauses = conn.execute(
            "SELECT destination_id, owner, reason, kind, released_at FROM delivery_pauses WHERE tenant_id = %(t)s",
            {"t": tenant},
        ).fetchall()
        assert pauses == [
            {
                "destination_id": destination,
                "owner": "rita.ops",
                "reason": "partner compromised",
                "kind": "manual",
                "released_at": None,
            }
        ]
        gate = conn.execute(
            "SELECT delivery_scope_open(%(t)s, %(d)s) AS paused_one, delivery_scope_open(%(t)s, %(o)s) AS other",
            {"t": tenant, "d": destination, "o": other},
        ).fetchone()
        assert gate == {"paused_one": False, "other": True}

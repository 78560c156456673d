"""A second person for what re-opens deliveries, over HTTP (issue #26, item 3).

Stopping takes one person (a pause, a cancel). Each of these takes two: resuming a pause someone else set;
resuming one a host-key change tripped; pinning a new host key or changing where deliveries go (a
destination's host, credentials or keys); correcting a recorded outcome; a replacement with an overwrite
agreement. For each, a principal of tenant A asking alone changes nothing (202: waiting); the same principal
approving its own request is refused (403, recorded); another principal of the tenant with a role that may do
it approves, and the action runs as theirs, recorded with both names. An approval past its time limit, one
already decided, and a declined one never run."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from domain.models import JobStatus
from tests.api.conftest import TenantKeys, another, make_tenant
from tests.api.test_destinations import OTHER_KEY


@dataclass
class Case:
    """One two-person action staged in tenant A: what the first person asks, who asks, who may approve, and
    what the database says about whether it happened."""

    method: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]  # the first person's, with any precondition header
    approver_role: str
    happened: Callable[[], Awaitable[bool]]


async def pause(client, keys: TenantKeys, headers: dict[str, str], reason: str) -> str:
    r = await client.post(
        "/switches/pause",
        json={"scope": "destination", "destination_id": str(keys.destination_id), "reason": reason},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    return r.json()["pause_id"]


async def released(factory, pause_id: str) -> bool:
    [row] = await factory.admin("SELECT released_at FROM delivery_pauses WHERE id = %(p)s", {"p": pause_id})
    return row["released_at"] is not None


async def stage(name: str, client, factory, database, api_store, keys: TenantKeys) -> Case:
    if name in ("resume another's pause", "resume a host-key trip"):
        if name == "resume another's pause":
            pause_id = await pause(client, keys, keys.operator, "partner compromised")
        else:
            tripped = await api_store.trip_host_key_pause(
                tenant_id=keys.id, destination_id=keys.destination_id, reason="the partner's host key changed"
            )
            pause_id = str(tripped.pause_ids[0])
        asker = await another(database, keys, "operator", name=f"olga.ops.{uuid.uuid4().hex[:4]}")
        return Case(
            "POST",
            "/switches/resume",
            {
                "scope": "destination",
                "destination_id": str(keys.destination_id),
                "pause_id": pause_id,
                "reason": "the partner says it is fixed",
            },
            asker,
            "operator",
            lambda: released(factory, pause_id),
        )
    if name in ("pin a new host key", "change where deliveries go"):
        change = (
            {"host_key": OTHER_KEY} if name == "pin a new host key" else {"host": "sftp.elsewhere.example"}
        )

        async def changed() -> bool:
            [row] = await factory.admin(
                "SELECT host, host_key FROM destinations WHERE id = %(d)s", {"d": keys.destination_id}
            )
            return any(row[k] == v for k, v in change.items())

        [row] = await factory.admin(
            "SELECT version FROM destinations WHERE id = %(d)s", {"d": keys.destination_id}
        )
        return Case(
            "PATCH",
            f"/destinations/{keys.destination_id}",
            {**change, "reason": "the partner moved"},
            {**keys.admin, "If-Match": f'"{row["version"]}"'},
            "admin",
            changed,
        )
    if name == "correct a recorded outcome":
        job, _ = await factory.in_status(
            JobStatus.COMPLETED, job=await factory.queued(keys.id, keys.destination_id)
        )
        return Case(
            "POST",
            f"/exports/{job.id}/corrections",
            {
                "recorded_status": "Completed",
                "corrected_status": "Failed",
                "failure_reason": "NotDelivered",
                "evidence_ref": "TICKET-7",
                "why": "the partner never had it",
            },
            keys.reconciler,
            "reconciler",
            lambda: _status_is(factory, job.id, JobStatus.FAILED),
        )
    assert name == "replace with an overwrite agreement"
    original, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(keys.id, keys.destination_id)
    )

    async def replaced() -> bool:
        rows = await factory.admin(
            "SELECT 1 FROM export_jobs WHERE replaces_job_id = %(o)s", {"o": original.id}
        )
        return bool(rows)

    return Case(
        "POST",
        f"/exports/{original.id}/replacements",
        {"reason": "the partner lost it", "overwrite_agreement_ref": "AGR-2026-7"},
        keys.operator,
        "operator",
        replaced,
    )


async def _status_is(factory, job_id, status: JobStatus) -> bool:
    return (await factory.status(job_id)) == status


ACTIONS = [
    "resume another's pause",
    "resume a host-key trip",
    "pin a new host key",
    "change where deliveries go",
    "correct a recorded outcome",
    "replace with an overwrite agreement",
]


async def approvals_of(factory, tenant) -> int:
    [row] = await factory.admin("SELECT count(*) AS n FROM approvals WHERE tenant_id = %(t)s", {"t": tenant})
    return row["n"]


@pytest.mark.parametrize("name", ACTIONS)
async def test_one_person_alone_cannot_and_may_not_approve_their_own_request(
    client, factory, database, api_store, name
):
    keys = await make_tenant(factory, database, f"acme-{uuid.uuid4().hex[:6]}")
    case = await stage(name, client, factory, database, api_store, keys)

    asked = await client.request(case.method, case.path, json=case.body, headers=case.headers)

    # alone: nothing happens; the request waits for a second person
    assert asked.status_code == 202, asked.text
    assert not await case.happened()
    approval = asked.json()["approval"]
    assert approval["state"] == "pending" and asked.headers["Location"] == f"/approvals/{approval['id']}"

    # the same principal as its own approver: refused, and recorded
    own = await client.post(f"/approvals/{approval['id']}/approval", json={}, headers=case.headers)
    assert own.status_code == 403 and "second person" in own.json()["detail"]
    assert not await case.happened()
    [refused] = await factory.admin(
        "SELECT action, outcome FROM operator_actions WHERE subject_id = %(a)s ORDER BY id DESC LIMIT 1",
        {"a": approval["id"]},
    )
    assert refused == {"action": "approval.approve", "outcome": "forbidden"}

    # another principal with a role that may do it: it runs now, as theirs, recorded with both names
    second = await another(database, keys, case.approver_role, name=f"second.{case.approver_role}")
    approved = await client.post(
        f"/approvals/{approval['id']}/approval", json={"reason": "checked"}, headers=second
    )
    assert approved.status_code in (200, 201), approved.text
    assert await case.happened()
    shown = (await client.get(f"/approvals/{approval['id']}", headers=keys.viewer)).json()["approval"]
    assert (shown["state"], shown["decided_by"], shown["outcome"]) == (
        "approved",
        f"second.{case.approver_role}",
        "created" if approved.status_code == 201 else "done",
    )
    [ran] = await factory.admin(
        "SELECT principal, requested_by FROM operator_actions WHERE approval_id = %(a)s AND requested_by IS NOT NULL",
        {"a": approval["id"]},
    )
    assert ran["principal"] == f"second.{case.approver_role}" and ran["requested_by"] != ran["principal"]

    # and it ran once
    again = await client.post(f"/approvals/{approval['id']}/approval", json={}, headers=keys.admin)
    assert again.status_code == 409


async def test_stopping_takes_one_person_and_resuming_your_own_pause_too(client, factory, database):
    keys = await make_tenant(factory, database, "acme-own-pause")
    job = await factory.queued(keys.id, keys.destination_id)
    await pause(client, keys, keys.operator, "deploy")
    cancel = await client.post(
        f"/exports/{job.id}/cancellations", json={"request_id": str(uuid.uuid4())}, headers=keys.reconciler
    )
    assert cancel.status_code == 200
    resumed = await client.post(
        "/switches/resume",
        json={"scope": "destination", "destination_id": str(keys.destination_id), "reason": "deployed"},
        headers=keys.operator,
    )
    assert resumed.status_code == 200 and len(resumed.json()["released"]) == 1
    assert await approvals_of(factory, keys.id) == 0


async def test_a_resume_releases_only_its_own_pause_and_says_what_still_holds(client, factory, database):
    keys = await make_tenant(factory, database, "acme-overlap")
    incident = await pause(client, keys, keys.reconciler, "partner incident")
    await pause(client, keys, keys.operator, "deploy")

    resumed = await client.post(
        "/switches/resume",
        json={"scope": "destination", "destination_id": str(keys.destination_id), "reason": "deployed"},
        headers=keys.operator,
    )

    answer = resumed.json()
    assert resumed.status_code == 200 and len(answer["released"]) == 1
    assert any(
        f"(pause {incident})" in line and "partner incident" in line for line in answer["still_paused"]
    )
    assert "takes a second person" in answer["message"]
    view = (await client.get("/switches", headers=keys.viewer)).json()
    assert [p["reason"] for p in view["pauses"]] == ["partner incident"]


async def test_a_role_that_may_not_do_the_action_may_not_approve_it(client, factory, database, api_store):
    keys = await make_tenant(factory, database, "acme-roles")
    case = await stage("correct a recorded outcome", client, factory, database, api_store, keys)
    asked = await client.request(case.method, case.path, json=case.body, headers=case.headers)
    approval = asked.json()["approval"]["id"]
    for headers in (keys.viewer, keys.operator, keys.admin):
        r = await client.post(f"/approvals/{approval}/approval", json={}, headers=headers)
        assert r.status_code == 403 and "may not approve" in r.json()["detail"]
    assert not await case.happened()


async def test_an_approval_past_its_time_limit_never_runs(client, factory, database, api_store):
    keys = await make_tenant(factory, database, "acme-expired")
    case = await stage("replace with an overwrite agreement", client, factory, database, api_store, keys)
    asked = await client.request(case.method, case.path, json=case.body, headers=case.headers)
    approval = asked.json()["approval"]["id"]
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        await conn.execute(
            "SET session_replication_role = replica"
        )  # set-up: the row's clock, past its guard
        await conn.execute(
            "UPDATE approvals SET requested_at = clock_timestamp() - interval '2 hours',"
            " expires_at = clock_timestamp() - interval '1 hour' WHERE id = %(id)s",
            {"id": approval},
        )

    late = await client.post(
        f"/approvals/{approval}/approval", json={}, headers=await another(database, keys, "operator")
    )

    assert late.status_code == 409 and "expired" in late.json()["detail"]
    assert not await case.happened()
    assert (await client.get(f"/approvals/{approval}", headers=keys.viewer)).json()["approval"][
        "state"
    ] == "expired"


async def test_a_declined_approval_never_runs(client, factory, database, api_store):
    keys = await make_tenant(factory, database, "acme-declined")
    case = await stage("change where deliveries go", client, factory, database, api_store, keys)
    asked = await client.request(case.method, case.path, json=case.body, headers=case.headers)
    approval = asked.json()["approval"]["id"]
    second = await another(database, keys, "admin")

    own = await client.post(
        f"/approvals/{approval}/refusal", json={"reason": "changed my mind"}, headers=keys.admin
    )
    assert own.status_code == 403
    declined = await client.post(
        f"/approvals/{approval}/refusal", json={"reason": "not the partner's host"}, headers=second
    )
    assert declined.status_code == 200 and declined.json()["approval"]["state"] == "declined"
    late = await client.post(f"/approvals/{approval}/approval", json={}, headers=second)
    assert late.status_code == 409
    assert not await case.happened()


async def test_the_approvals_are_listed_and_shown_to_every_role(client, factory, database, api_store):
    keys = await make_tenant(factory, database, "acme-listed")
    case = await stage("correct a recorded outcome", client, factory, database, api_store, keys)
    asked = await client.request(case.method, case.path, json=case.body, headers=case.headers)
    approval = asked.json()["approval"]
    assert approval["parameters"]["attempt_id"] and approval["what"] == "correcting a recorded outcome"
    listed = (await client.get("/approvals", params={"pending": "true"}, headers=keys.viewer)).json()
    assert [a["id"] for a in listed["approvals"]] == [approval["id"]]

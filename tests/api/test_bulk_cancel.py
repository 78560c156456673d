"""Bulk cancel through the API and the command line (issue 9, part 3): one action over every live export of
a destination (or of one list); each export gets its own request through the ledger, grouped under the
client's batch ID; the answer counts outcomes and lists the Busy ones; a retry records nothing twice."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from domain.models import JobStatus
from service.bulk import request_id_for
from tests.api.conftest import counted, increase, make_tenant, snapshot
from tests.api.test_starter import starter


def bulk_body(keys, batch_id=None, **kw):
    return {
        "batch_id": str(batch_id or uuid.uuid4()),
        "destination_id": str(keys.destination_id),
        "reason": "contract ended",
        **kw,
    }


async def test_preview_counts_the_live_exports_and_records_nothing(client, factory, database):
    keys = await make_tenant(factory, database, "preview")
    await factory.queued(keys.id, keys.destination_id)
    await factory.running(await factory.queued(keys.id, keys.destination_id))
    await factory.queued(keys.id, keys.destination_id, list_name="vip")
    await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(keys.id, keys.destination_id))

    every = await client.get(
        "/cancellation-batches/preview",
        params={"destination_id": str(keys.destination_id)},
        headers=keys.operator,
    )
    vip = await client.get(
        "/cancellation-batches/preview",
        params={"destination_id": str(keys.destination_id), "list_name": "vip"},
        headers=keys.operator,
    )

    assert every.status_code == 200
    assert every.json()["matching"] == 3
    assert every.json()["by_status"] == {"Queued": 2, "Running": 1, "Delivering": 0}
    assert len(every.json()["export_ids"]) == 3 and every.json()["preview_token"]
    assert vip.json()["matching"] == 1
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_batches WHERE tenant_id = %(t)s", {"t": keys.id}
    )
    assert rows[0]["n"] == 0


async def test_bulk_cancel_counts_each_outcome_and_a_replay_records_nothing_twice(client, factory, database):
    keys = await make_tenant(factory, database, "bulk")
    queued = [await factory.queued(keys.id, keys.destination_id) for _ in range(3)]
    running, _ = await factory.running(await factory.queued(keys.id, keys.destination_id))
    delivering, _ = await factory.delivering(await factory.queued(keys.id, keys.destination_id))
    body = bulk_body(keys)
    before = await counted(client)

    r = await client.post("/cancellation-batches", json=body, headers=keys.operator)

    assert r.status_code == 201, r.text
    answer = r.json()
    assert answer["matched"] == 5 and answer["complete"] is True and answer["busy"] == []
    assert answer["outcomes"] == {"CanceledWhileQueued": 3, "StopRequested": 1, "TooLate": 1}
    after = await counted(client)
    for outcome, n in answer["outcomes"].items():  # each export's answer, counted once
        assert (
            increase(before, after, "fenced_exports_cancellations_total", outcome=outcome, source="api") == n
        )
    written = {"statement": "cancel_and_record", "result": "written"}
    assert increase(before, after, "fenced_exports_transitions_total", **written) == 4
    assert answer["requested_by"] == keys.operator_name and answer["reason"] == "contract ended"
    assert answer["message"].startswith("5 live exports matched: 3 canceled while queued, 1 stop requested")
    assert r.headers["Location"] == f"/cancellation-batches/{body['batch_id']}"
    for job in queued:
        assert (await factory.job(job.id)).status == JobStatus.CANCELED
    assert (await factory.job(running.id)).stop_request_id == request_id_for(
        uuid.UUID(body["batch_id"]), running.id
    )
    assert (await factory.job(delivering.id)).status == JobStatus.DELIVERING

    before = {j.id: await snapshot(factory, j.id) for j in [*queued, running, delivering]}
    replay = await client.post("/cancellation-batches", json=body, headers=keys.operator)
    read = await client.get(f"/cancellation-batches/{body['batch_id']}", headers=keys.operator)

    assert replay.status_code == 200 and replay.json()["replayed"] is True
    assert replay.json()["outcomes"] == answer["outcomes"] == read.json()["outcomes"]
    assert {j: await snapshot(factory, j) for j in before} == before


async def test_busy_exports_are_listed_with_request_ids_and_a_retry_decides_only_them(
    client, factory, database
):
    keys = await make_tenant(factory, database, "busy")
    free = await factory.queued(keys.id, keys.destination_id)
    held = await factory.queued(keys.id, keys.destination_id)
    body = bulk_body(keys)
    batch_id = uuid.UUID(body["batch_id"])

    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": held.id})
        partial = await client.post("/cancellation-batches", json=body, headers=keys.operator)
        await holder.rollback()

    assert partial.status_code == 202, partial.text
    assert partial.headers["Retry-After"]
    assert partial.json()["complete"] is False
    assert partial.json()["outcomes"] == {"CanceledWhileQueued": 1, "Busy": 1}
    assert partial.json()["busy"] == [
        {"export_id": str(held.id), "request_id": str(request_id_for(batch_id, held.id))}
    ]
    assert (await factory.job(held.id)).status == JobStatus.QUEUED
    free_before = await snapshot(factory, free.id)

    retried = await client.post("/cancellation-batches", json=body, headers=keys.operator)

    assert retried.status_code == 200, retried.text
    assert retried.json()["outcomes"] == {"CanceledWhileQueued": 2}
    assert retried.json()["busy"] == []
    assert (await factory.job(held.id)).cancellation_request_id == request_id_for(batch_id, held.id)
    assert await snapshot(factory, free.id) == free_before


async def test_a_batch_id_reused_for_another_filter_is_400_and_changes_nothing(client, factory, database):
    keys = await make_tenant(factory, database, "reuse")
    job = await factory.queued(keys.id, keys.destination_id)
    body = bulk_body(keys, list_name="vip")
    assert (await client.post("/cancellation-batches", json=body, headers=keys.operator)).status_code == 201

    r = await client.post("/cancellation-batches", json={**body, "list_name": "main"}, headers=keys.operator)

    assert r.status_code == 400
    assert "different bulk cancel" in r.json()["detail"]
    assert (await factory.job(job.id)).status == JobStatus.QUEUED


async def test_another_tenants_destination_or_batch_looks_missing(client, factory, database, acme):
    keys = await make_tenant(factory, database, "intruder")
    theirs = await factory.queued(acme.id, acme.destination_id)
    body = bulk_body(keys, destination_id=str(acme.destination_id))

    create = await client.post("/cancellation-batches", json=body, headers=keys.operator)
    preview = await client.get(
        "/cancellation-batches/preview",
        params={"destination_id": str(acme.destination_id)},
        headers=keys.operator,
    )
    mine = bulk_body(acme)
    await client.post("/cancellation-batches", json=mine, headers=acme.operator)
    read = await client.get(f"/cancellation-batches/{mine['batch_id']}", headers=keys.operator)

    assert create.status_code == 422
    assert preview.json()["matching"] == 0
    assert preview.json()["export_ids"] == [] and preview.json()["preview_token"] is None
    assert read.status_code == 404
    assert (await factory.job(theirs.id)).status == JobStatus.CANCELED  # by acme's own batch only


# -- the confirmation covers the set it counted (issue 23, point 7) ----------------------------------------


async def previewed(client, keys, **params):
    r = await client.get(
        "/cancellation-batches/preview",
        params={"destination_id": str(keys.destination_id), **params},
        headers=keys.operator,
    )
    assert r.status_code == 200, r.text
    return r.json()


async def requests_of(factory, job_id) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE job_id = %(id)s", {"id": job_id}
    )
    return rows[0]["n"]


async def test_the_confirmed_preview_cancels_exactly_the_exports_it_counted_and_names_those_live_since(
    client, factory, database
):
    keys = await make_tenant(factory, database, "confirm")
    queued = await factory.queued(keys.id, keys.destination_id)
    canceled_since = await factory.queued(keys.id, keys.destination_id)
    running, _ = await factory.running(await factory.queued(keys.id, keys.destination_id))
    seen = await previewed(client, keys)
    assert sorted(seen["export_ids"]) == sorted(str(j.id) for j in (queued, canceled_since, running))
    # After the review: someone cancels one of the set, and a new export is queued.
    await factory.cancel(canceled_since)
    later = await factory.queued(keys.id, keys.destination_id)
    body = bulk_body(keys, preview_token=seen["preview_token"])

    r = await client.post("/cancellation-batches", json=body, headers=keys.operator)

    assert r.status_code == 201, r.text
    answer = r.json()
    assert answer["matched"] == 3 and answer["preview_token"] == seen["preview_token"]
    assert answer["outcomes"] == {"CanceledWhileQueued": 1, "AlreadyCanceled": 1, "StopRequested": 1}
    assert answer["not_in_preview"] == [str(later.id)]
    assert answer["message"].endswith(
        f"1 live export not in the previewed set was not touched: {str(later.id)[:8]}."
    )
    assert await factory.status(later.id) == JobStatus.QUEUED
    assert await requests_of(factory, later.id) == 0
    read = await client.get(f"/cancellation-batches/{body['batch_id']}", headers=keys.operator)
    assert read.json()["not_in_preview"] == [str(later.id)]
    assert read.json()["outcomes"] == answer["outcomes"]


async def test_a_preview_token_confirms_nothing_for_another_tenant_caller_or_filter(
    client, factory, database, acme
):
    async def batches() -> int:
        rows = await factory.admin(
            "SELECT count(*) AS n FROM cancellation_batches WHERE tenant_id = ANY(%(t)s)",
            {"t": [keys.id, acme.id]},
        )
        return rows[0]["n"]

    keys = await make_tenant(factory, database, "token")
    job = await factory.queued(keys.id, keys.destination_id)
    token = (await previewed(client, keys))["preview_token"]
    await factory.queued(acme.id, acme.destination_id)
    acme_token = (await previewed(client, acme))["preview_token"]
    before = await batches()

    refused = [
        # acme's operator with this tenant's token, for acme's destination
        await client.post(
            "/cancellation-batches", json=bulk_body(acme, preview_token=token), headers=acme.operator
        ),
        # this tenant's operator with acme's token
        await client.post(
            "/cancellation-batches", json=bulk_body(keys, preview_token=acme_token), headers=keys.operator
        ),
        # another principal of this tenant
        await client.post(
            "/cancellation-batches", json=bulk_body(keys, preview_token=token), headers=keys.reconciler
        ),
        # another filter
        await client.post(
            "/cancellation-batches",
            json=bulk_body(keys, preview_token=token, list_name="vip"),
            headers=keys.operator,
        ),
    ]

    for r in refused:
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("preview_token: no preview") and "errors" not in r.json()
    assert await factory.status(job.id) == JobStatus.QUEUED
    assert await batches() == before


async def test_a_batch_id_replayed_with_another_preview_is_400_and_the_same_one_replays(
    client, factory, database
):
    keys = await make_tenant(factory, database, "replay-token")
    await factory.queued(keys.id, keys.destination_id)
    first = (await previewed(client, keys))["preview_token"]
    second = (await previewed(client, keys))["preview_token"]
    body = bulk_body(keys, preview_token=first)
    assert (await client.post("/cancellation-batches", json=body, headers=keys.operator)).status_code == 201

    other = await client.post(
        "/cancellation-batches", json={**body, "preview_token": second}, headers=keys.operator
    )
    same = await client.post("/cancellation-batches", json=body, headers=keys.operator)

    assert other.status_code == 400 and "different bulk cancel" in other.json()["detail"]
    assert same.status_code == 200 and same.json()["replayed"] is True


@pytest.mark.slow
async def test_bulk_cancel_from_the_command_line(database, factory):
    tenant = await factory.tenant("cli-bulk")
    destination = await factory.destination(tenant, name="partner-old")
    jobs = [await factory.queued(tenant, destination) for _ in range(2)]

    code, out, _ = await starter(
        database, "bulk-cancel", "--destination-name", "partner-old", "--dry-run", tenant=tenant
    )
    assert code == 0 and out.startswith("2 live exports match (2 queued, 0 running, 0 delivering)")
    token = out.split("to cancel exactly these: --preview ")[1].split()[0]
    later = await factory.queued(tenant, destination)  # not in the set the dry run counted

    code, out, _ = await starter(
        database,
        "--json",
        "bulk-cancel",
        "--destination",
        str(destination),
        "--reason",
        "contract ended",
        "--preview",
        token,
        tenant=tenant,
    )
    assert code == 0, out
    answer = json.loads(out)
    assert answer["outcome_kind"] == "created" and answer["outcomes"] == {"CanceledWhileQueued": 2}
    assert answer["not_in_preview"] == [str(later.id)]
    for job in jobs:
        assert await factory.status(job.id) == JobStatus.CANCELED
    assert await factory.status(later.id) == JobStatus.QUEUED

    code, _, err = await starter(database, "bulk-cancel", "--destination", str(destination), tenant=tenant)
    assert code == 2 and "--reason is required" in err

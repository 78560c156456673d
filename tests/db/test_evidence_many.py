"""``append_delivery_evidence_many``: several observations of one attempt in one statement, in their order,
kept whoever owns the job, and never a change of the job's status."""

from __future__ import annotations

import json
import uuid

from domain.models import EventKind


async def test_several_observations_land_in_their_order_in_one_statement_and_change_nothing_else(
    factory, worker_store
):
    job, attempt = await factory.delivering()
    before = await factory.job(job.id)
    observations = [{"observation": kind, "n": n} for n, kind in enumerate(["upload", "rename", "read_back"])]

    appended = await worker_store.append_delivery_evidence_many(job.id, attempt, "worker-7", observations)

    assert appended == 3
    events = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert [json.loads(e.detail or "{}") for e in events] == observations
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert {(e.attempt_id, e.observed_by) for e in events} == {(attempt, "worker-7")}
    rows = await factory.admin(
        "SELECT count(DISTINCT xmin::text) AS n FROM export_attempt_events"
        " WHERE job_id = %(id)s AND kind = 'DeliveryEvidence'",
        {"id": job.id},
    )
    assert rows[0]["n"] == 1  # one statement, one transaction
    assert await factory.job(job.id) == before


async def test_nothing_is_appended_for_a_job_that_does_not_exist_or_for_no_observations(
    factory, worker_store
):
    job, attempt = await factory.delivering()
    assert await worker_store.append_delivery_evidence_many(uuid.uuid4(), attempt, "w", [{"a": 1}]) == 0
    assert await worker_store.append_delivery_evidence_many(job.id, attempt, "w", []) == 0
    assert not [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.DELIVERY_EVIDENCE]

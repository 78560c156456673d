"""Every status is reachable along the protocol's own edges, and each leaves its event."""

from __future__ import annotations

import pytest

from domain.models import FailureCode, JobStatus


@pytest.mark.parametrize("status", list(JobStatus))
async def test_every_status_is_reachable_through_the_statements(factory, status):
    job, _ = await factory.in_status(status)
    assert job.status == status


async def test_failed_from_delivery_carries_its_code(factory):
    job, _ = await factory.in_status(JobStatus.FAILED, code=FailureCode.NOT_DELIVERED)
    assert job.failure_reason == FailureCode.NOT_DELIVERED
    assert await factory.event_kinds(job.id) == ["Claimed", "DeliveryAuthorized", "Finished"]

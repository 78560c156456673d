"""The version a delivery used (issue #24, item 2), through ExportWorkflow on the real Temporal test server,
real PostgreSQL and a real OpenSSH sshd, with the destination changed by an admin through the service.

- An edit of the host during the build: cutoff 2 refuses the file built for the old version
  (DestinationChanged), the attempt is given back without being counted, and the next claim rebuilds and
  delivers once, to the new host; the old host is sent nothing (the session opened before cutoff 2 for the
  version built is its one connection).
- An edit of the host after cutoff 2: the upload under way uses the version cutoff 2 authorized, to the old
  host, and its evidence names that version; the new host is never contacted.

Each "host" is its own TCP proxy in front of the session's sshd, with its own upload directory, so the test
can tell which one a delivery reached and make the other refuse every connection.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from domain.models import AuthorizationResult, EventKind, JobStatus
from observability.metrics import get_metrics
from service.auth import Caller
from service.destinations import Destinations, EditDestination
from service.exports import Exports
from service.outcomes import Kind
from testbed.sftp import Sshd, TcpProxy
from tests.fix_sftp import target_on
from tests.workflows.harness import Harness, SftpTarget
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """The harness's directory on the session's real sshd."""
    yield from target_on(request, "sshd")


@dataclass
class Endpoint:
    """One partner host: a proxy in front of the sshd, and the upload directory it is told to use."""

    proxy: TcpProxy
    local_dir: Path

    def files(self) -> list[str]:
        return sorted(p.name for p in self.local_dir.iterdir())


@pytest.fixture
def endpoints(request: pytest.FixtureRequest) -> Iterator[tuple[Endpoint, Endpoint]]:
    """The old host and the new one, both on the session's sshd."""
    sshd: Sshd = request.getfixturevalue("sshd_server")
    pair = tuple(Endpoint(TcpProxy(sshd.host, sshd.port), sshd.make_upload_dir()) for _ in range(2))
    yield pair  # type: ignore[misc]
    for endpoint in pair:
        endpoint.proxy.close()


def admin_of(tenant_id: uuid.UUID) -> Caller:
    return Caller(tenant_id=tenant_id, principal="ada.admin", role="admin")


async def move_to(
    harness: Harness, tenant_id: uuid.UUID, destination_id: uuid.UUID, to: Endpoint, version: int
):
    """An admin moves the destination to another host and directory (a delivery term), from ``version``; a change
    of where deliveries go takes two admins (issue #26.3): asked by one, made when another approves it."""
    exports = Exports(harness.factory.api)
    for name in ("ada.admin", "ann.admin"):
        await harness.factory.principal(tenant_id, name, "admin")
    asked = await Destinations(exports.store, approvals=exports.approvals).edit(
        admin_of(tenant_id),
        destination_id,
        EditDestination(
            port=to.proxy.port, remote_dir=str(to.local_dir), reason="the partner moved its server"
        ),
        f'"{version}"',
    )
    assert asked.kind == Kind.ACCEPTED, asked.body
    second = Caller(tenant_id=tenant_id, principal="ann.admin", role="admin")
    answer = await exports.approvals.approve(second, uuid.UUID(asked.body["approval"]["id"]))
    assert answer.ok and answer.body["delivery_changed"] is True, answer.body
    return answer


async def queue_to(harness: Harness, at: Endpoint, contacts: int = 40):
    tenant_id = await harness.factory.tenant()
    destination_id = await harness.destination(
        tenant_id, port=at.proxy.port, remote_dir=str(at.local_dir), max_write_request=261120
    )
    await harness.factory.principal(tenant_id, "ada.admin", "admin")
    await harness.add_contacts(tenant_id, "main", contacts)
    return await harness.factory.queued(tenant_id, destination_id, list_name="main")


async def events(harness: Harness, job_id: uuid.UUID):
    return await harness.factory.worker.job_events(job_id)


async def test_an_edit_of_the_host_during_the_build_gives_the_attempt_back_and_the_rebuild_goes_to_the_new_host(
    harness: Harness, endpoints: tuple[Endpoint, Endpoint]
) -> None:
    old, new = endpoints
    job = await queue_to(harness, old)

    async def the_partner_moves(job_id: uuid.UUID) -> None:
        await move_to(harness, job.tenant_id, job.destination_id, new, 1)
        old.proxy.refuse_new_connections()  # the old server is gone: nothing may reach it any more

    harness.host.activities.seams.before_authorize = the_partner_moves
    first = await harness.run(job)

    assert first.cutoff_answers == [AuthorizationResult.DESTINATION_CHANGED]
    assert first.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempts_released, row.transient_releases) == (
        JobStatus.QUEUED,
        None,
        1,
        0,  # not counted: the next claim does not wait, and no attempt is used up
    )
    assert row.available_at is None and row.destination_version is None
    [released] = [e for e in await events(harness, job.id) if e.kind == EventKind.RELEASED]
    assert released.detail is not None and released.detail.startswith("destination_changed: cutoff 2:")
    assert harness.files_on_disk() == []  # the file built for version 1 is gone

    harness.host.activities.seams.before_authorize = None
    second = await harness.run(job)

    assert second.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.attempt_count) == (JobStatus.COMPLETED, 2, 2)
    assert new.files() == [row.expected_file_name]  # delivered once, to the new host
    # The old host was sent nothing: the first attempt's session for the version it built (opened before cutoff
    # 2, #24.4) was its one connection, refused at the proxy, and cutoff 2 then refused that version.
    assert old.files() == [] and old.proxy.accepted == 1
    assert harness.files_on_disk() == []


async def test_an_edit_of_the_host_after_cutoff_2_does_not_touch_the_upload_and_its_evidence_names_the_version(
    harness: Harness, endpoints: tuple[Endpoint, Endpoint]
) -> None:
    old, new = endpoints
    job = await queue_to(harness, old)

    async def the_partner_moves(job_id: uuid.UUID) -> None:
        await move_to(harness, job.tenant_id, job.destination_id, new, 1)
        new.proxy.refuse_new_connections()  # the new host answers nobody: only the authorized one may be used

    harness.host.activities.seams.before_upload = the_partner_moves
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.attempt_count) == (JobStatus.COMPLETED, 1, 1)
    assert old.files() == [row.expected_file_name]  # the version cutoff 2 authorized
    assert new.files() == [] and new.proxy.accepted == 0
    destination = await harness.factory.worker.load_destination(job.tenant_id, job.destination_id)
    assert (destination.version, destination.port) == (
        2,
        new.proxy.port,
    )  # the edit stands, for what comes next

    recorded = await events(harness, job.id)
    [authorized] = [e for e in recorded if e.kind == EventKind.DELIVERY_AUTHORIZED]
    assert authorized.destination_version == 1
    evidence = [json.loads(e.detail or "{}") for e in recorded if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert evidence and {e.get("destination_version") for e in evidence} == {1}


def statements_run(*names: str) -> dict[str, float]:
    """How many times this process has run each named statement so far (its latency histogram's count)."""
    value = get_metrics().registry.get_sample_value
    return {
        name: value("fenced_exports_statement_duration_seconds_count", {"statement": name}) or 0.0
        for name in names
    }


READS = ("get_job", "load_destination", "fence_upload_if_delivering")


async def test_an_attempt_on_one_host_reads_the_row_and_the_destination_once_each(
    harness: Harness, endpoints: tuple[Endpoint, Endpoint]
) -> None:
    """The claim's answer is the row, and the build starts from it; cutoff 2 authorized the version the build
    read, so the upload uses the destination the build read, handed on, and its fence's answer is the row.
    From the claim to the rename fence: no read of the row, and one of the destination (the build's)."""
    old, _ = endpoints
    job = await queue_to(harness, old)
    counted: list[dict[str, float]] = []

    async def count(job_id: uuid.UUID) -> None:
        counted.append(statements_run(*READS))

    harness.host.activities.seams.after_claim = count
    harness.host.activities.seams.before_authorize = count
    harness.host.activities.seams.after_rename_fence = count
    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    claimed, built, renamed = counted
    assert {name: built[name] - claimed[name] for name in READS} == {
        "get_job": 0,
        "load_destination": 1,  # the build's
        "fence_upload_if_delivering": 0,
    }
    assert {name: renamed[name] - built[name] for name in READS} == {
        "get_job": 0,
        "load_destination": 0,
        "fence_upload_if_delivering": 1,
    }
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version) == (JobStatus.COMPLETED, 1)
    assert old.files() == [row.expected_file_name]
    recorded = await events(harness, job.id)
    evidence = [json.loads(e.detail or "{}") for e in recorded if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert evidence and {e.get("destination_version") for e in evidence} == {1}


async def test_an_edit_of_no_delivery_term_during_the_build_is_authorized_and_the_upload_reads_that_version(
    harness: Harness, endpoints: tuple[Endpoint, Endpoint]
) -> None:
    """A new display name during the build: cutoff 2 authorizes (nothing a delivery uses changed) and records
    version 2, which is not the version the build read; the upload then reads version 2, and its evidence
    names it."""
    old, _ = endpoints
    job = await queue_to(harness, old)
    counted: list[dict[str, float]] = []

    async def renamed_during_the_build(job_id: uuid.UUID) -> None:
        await harness.factory.principal(job.tenant_id, "ada.admin", "admin")
        exports = Exports(harness.factory.api)
        answer = await Destinations(exports.store, approvals=exports.approvals).edit(
            admin_of(job.tenant_id),
            job.destination_id,
            EditDestination(name="partner, renamed", reason="the partner's new trading name"),
            '"1"',
        )
        assert answer.ok, answer.body
        counted.append(statements_run(*READS))

    async def count(job_id: uuid.UUID) -> None:
        counted.append(statements_run(*READS))

    harness.host.activities.seams.before_authorize = renamed_during_the_build
    harness.host.activities.seams.after_rename_fence = count
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.COMPLETED
    built, renamed = counted
    assert renamed["load_destination"] - built["load_destination"] == 1  # the version cutoff 2 authorized
    assert renamed["get_job"] - built["get_job"] == 0
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.attempt_count) == (JobStatus.COMPLETED, 2, 1)
    assert old.files() == [row.expected_file_name]
    recorded = await events(harness, job.id)
    evidence = [json.loads(e.detail or "{}") for e in recorded if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert evidence and {e.get("destination_version") for e in evidence} == {2}

"""An admin's edit of what the partner receives (issue #24, items 2 and 5), through ExportWorkflow on the real
Temporal test server, real PostgreSQL and the asyncssh partner, with Debian's gpg as the partner's decryptor.
The destination is changed through the service, as the API and the command line change it.

- The partner rotates its OpenPGP key during the build (two admins: asked, approved): cutoff 2 refuses the
  file encrypted to the old key (DestinationChanged), the attempt is given back without being counted, and
  the rebuild is encrypted to the new key alone: the new key's gpg decrypts it, the old key's cannot.
- The format changes after cutoff 2 (one admin): the upload under way is the file built and authorized for
  the version before (plain CSV, commas), and its evidence names that version; the edit stands for what
  comes next.
"""

from __future__ import annotations

import json
import uuid

from domain.models import AuthorizationResult, EventKind, JobStatus
from service.auth import Caller
from service.destinations import Destinations, EditDestination
from service.exports import Exports
from service.outcomes import Kind
from testbed.gpg import GpgIdentity
from tests.workflows.harness import Harness
from workflows.models import AttemptOutcome


def admin(tenant_id: uuid.UUID, name: str = "ada.admin") -> Caller:
    return Caller(tenant_id=tenant_id, principal=name, role="admin")


async def edit(harness: Harness, tenant_id: uuid.UUID, destination_id: uuid.UUID, **fields: object):
    """An admin's edit from version 1; a change of the keys is asked by one admin and approved by another."""
    exports = Exports(harness.factory.api)
    for name in ("ada.admin", "ann.admin"):
        await harness.factory.principal(tenant_id, name, "admin")
    destinations = Destinations(exports.store, approvals=exports.approvals)
    answer = await destinations.edit(
        admin(tenant_id), destination_id, EditDestination(reason="the partner asked", **fields), '"1"'
    )
    if answer.kind == Kind.ACCEPTED:
        answer = await exports.approvals.approve(
            admin(tenant_id, "ann.admin"), uuid.UUID(answer.body["approval"]["id"])
        )
    assert answer.ok and answer.body["delivery_changed"] is True, answer.body
    return answer


async def test_a_key_rotation_during_the_build_gives_the_attempt_back_and_the_rebuild_is_for_the_new_key(
    harness: Harness, partner_key: GpgIdentity, second_partner_key: GpgIdentity
) -> None:
    old, new = partner_key, second_partner_key
    job = await harness.queue_export(contacts=12, pgp_recipient_keys=[old.public_key])
    rotated: list[object] = []

    async def the_partner_rotates_its_key(job_id: uuid.UUID) -> None:
        rotated.append(
            await edit(harness, job.tenant_id, job.destination_id, pgp_recipient_keys=[new.public_key])
        )

    harness.host.activities.seams.before_authorize = the_partner_rotates_its_key
    first = await harness.run(job)

    assert rotated, "the seam before cutoff 2 ran"
    assert first.cutoff_answers == [AuthorizationResult.DESTINATION_CHANGED]
    assert first.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempts_released, row.transient_releases) == (JobStatus.QUEUED, 1, 0)
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []  # nothing sent, nothing left

    harness.host.activities.seams.before_authorize = None
    second = await harness.run(job)

    assert second.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.attempt_count) == (JobStatus.COMPLETED, 2, 2)
    [delivered] = harness.partner_files(job)
    assert delivered.name == row.expected_file_name and delivered.name.endswith(".csv.pgp")
    events = await harness.factory.worker.job_events(job.id)
    [authorized] = [e for e in events if e.kind == EventKind.DELIVERY_AUTHORIZED]
    assert authorized.destination_version == 2
    assert json.loads(authorized.detail or "")["recipients"] == [new.fingerprint]
    # The partner's gpg: the new key decrypts the file, the old one cannot.
    with_new = new.decrypt(delivered)
    assert with_new.returncode == 0 and with_new.data.count(b"\n") == 13  # a header and 12 rows
    with_old = old.decrypt(delivered)
    assert with_old.returncode != 0 and with_old.data == b""


async def test_a_format_edit_after_cutoff_2_leaves_the_upload_on_the_version_it_authorized(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=5)

    async def the_partner_asks_for_another_format(job_id: uuid.UUID) -> None:
        await edit(
            harness,
            job.tenant_id,
            job.destination_id,
            csv_delimiter=";",
            csv_columns=["email"],
            csv_header=False,
            compression="gzip",
        )

    harness.host.activities.seams.before_upload = the_partner_asks_for_another_format
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.destination_version, row.attempt_count) == (JobStatus.COMPLETED, 1, 1)
    [delivered] = harness.partner_files(job)
    text = delivered.read_text()
    assert (
        delivered.name == row.expected_file_name == job.final_name
    )  # not gzipped: the version authorized had no compression
    assert text.startswith("email,first_name,last_name\n") and text.count("\n") == 6 and ";" not in text
    events = await harness.factory.worker.job_events(job.id)
    [authorized] = [e for e in events if e.kind == EventKind.DELIVERY_AUTHORIZED]
    assert authorized.destination_version == 1
    evidence = [json.loads(e.detail or "{}") for e in events if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert evidence and {e.get("destination_version") for e in evidence} == {1}
    # The edit stands, for the next export: a new delivery version.
    destination = await harness.factory.worker.load_destination(job.tenant_id, job.destination_id)
    assert destination.version == 2 and destination.file_format.compression == "gzip"
    assert destination.file_format.delimiter == ";" and destination.file_format.columns == ("email",)

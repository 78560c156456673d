"""A manifest published last (issue #24.6), against the real OpenSSH sshd: the partner's ``sha256sum -c`` passes
on what lands, the manifest goes up only after the data file's rename, by a temporary name and the
no-overwrite rename, and Completed waits for it. A name that already holds other bytes is never replaced."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from domain.evidence import TEMP_PREFIX
from domain.models import JobStatus
from tests.fix_sftp import target_on
from tests.support.sha256sum import sha256sum_check
from tests.workflows.harness import Harness, SftpTarget, recover
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """A fresh upload directory, owned by the partner account, on the session's real sshd."""
    yield from target_on(request, "sshd")


async def evidence(harness: Harness, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The job's DeliveryEvidence, oldest first, with who observed it."""
    events = await harness.factory.worker.job_events(job_id)
    return [
        {**json.loads(e.detail or "{}"), "_by": e.observed_by}
        for e in events
        if e.kind.value == "DeliveryEvidence"
    ]


async def test_both_manifests_are_published_after_the_rename_and_sha256sum_check_passes(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=200, manifest="both")

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.expected_manifest) == (JobStatus.COMPLETED, "both")
    final = row.expected_file_name
    assert final is not None
    directory = harness.sftp.local_dir
    assert sorted(p.name for p in harness.partner_files(job)) == sorted(
        [final, f"{final}.manifest.json", f"{final}.sha256"]
    )  # no temporary name left behind
    checked = sha256sum_check(directory, f"{final}.sha256")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == f"{final}: OK"
    manifest = json.loads((directory / f"{final}.manifest.json").read_text())
    assert manifest == {
        "export_id": str(job.id),
        "delivery_key": job.delivery_key,
        "file": final,
        "bytes": row.expected_file_bytes,
        "rows": row.expected_file_rows,
        "sha256": (row.expected_file_sha256 or b"").hex(),
        "created_at": manifest["created_at"],
    }
    assert row.expected_file_rows == 200

    seen = await evidence(harness, job.id)
    kinds = [e["observation"] for e in seen]
    # published last: after the data file's rename (and its read-back), each by temp name and no-overwrite rename
    assert kinds.index("rename") < kinds.index("read_back") < kinds.index("manifest")
    published = [e for e in seen if e["observation"] == "manifest"]
    assert [(e["name"], e["result"], e["form"]) for e in published] == [
        (f"{final}.sha256", "published", "rename"),
        (f"{final}.manifest.json", "published", "rename"),
    ]
    assert all(e["temp_name"].startswith(TEMP_PREFIX) for e in published)


async def test_a_manifest_name_holding_other_bytes_is_never_replaced_and_the_export_is_not_completed(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=20, manifest="sha256")
    squatter = harness.sftp.local_dir / f"{job.final_name}.sha256"
    squatter.write_text("0" * 64 + "  someone-else.csv\n")
    shutil.chown(squatter, user=harness.sftp.username)

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.OUTCOME_UNKNOWN
    assert await harness.status(job) == JobStatus.OUTCOME_UNKNOWN
    assert squatter.read_text() == "0" * 64 + "  someone-else.csv\n"  # never replaced
    assert len(harness.uploads(job)) == 1  # the data file is in place, sent once
    [manifest] = [e for e in await evidence(harness, job.id) if e["observation"] == "manifest"]
    assert manifest["result"] == "conflict"


async def test_a_worker_presumed_dead_between_the_renames_leaves_the_manifest_to_recovery_and_finds_it_in_place(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=20, manifest="json")
    harness.host.activities.seams.lease_timer_disabled = True
    held: list[str] = []

    async def expire_then_recover(job_id: uuid.UUID) -> None:
        # The data file is renamed into place, the manifest not yet: the worker is presumed dead here and
        # recovery publishes the manifest (the same bytes) and completes; the worker's own publication then
        # finds it in place and its terminal write matches nothing.
        await harness.factory.expire_lease(job_id)
        held.append(await recover(harness, job))

    harness.host.activities.seams.after_rename = expire_then_recover
    try:
        result = await harness.run(job)
    finally:
        harness.host.reset_seams()

    assert held == ["Completed"]
    assert result.outcome == AttemptOutcome.NOT_OWNER
    assert await harness.status(job) == JobStatus.COMPLETED
    final = job.final_name
    assert sorted(p.name for p in harness.partner_files(job)) == [final, f"{final}.manifest.json"]
    manifests = [e for e in await evidence(harness, job.id) if e["observation"] == "manifest"]
    assert [(e["_by"].startswith("recovery"), e["result"]) for e in manifests] == [
        (True, "published"),
        (False, "in_place"),
    ]

"""A real worker process killed with SIGKILL between the data file's rename and its manifest's (issue #24.6),
against the real OpenSSH sshd: recovery finds the data file in place by the same evidence as ever, publishes the
missing manifest (never the data again) and completes, and the partner's ``sha256sum -c`` passes.

Two points: right after the data file's rename (no manifest written at all), and with the first manifest written
under its temporary name but not renamed. The killed process runs ``tests/e2e/killed_worker_runner.py`` as in
``test_killed_worker.py``; the row's lease is expired on the database clock and recovery's takeover runs as its
scheduled batch would.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator

import pytest

from domain.evidence import TEMP_PREFIX
from domain.manifest import manifest_names
from domain.models import JobStatus
from testbed.sftp import SftpTarget
from tests.e2e.test_killed_worker import (  # noqa: F401 - task_queue is a fixture
    Partner,
    killable_worker,
    queue_export,
    recover,
)
from tests.support.sha256sum import sha256sum_check
from workflows.models import Takeover

pytestmark = pytest.mark.sshd


@pytest.fixture
def task_queue() -> str:
    """A shared queue of this test's own: the killed attempt's workflow never meets another test's worker."""
    return f"exports-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def partner(sshd_target: SftpTarget) -> Iterator[Partner]:
    """A fresh upload directory on the real sshd, as the partner's account owns it."""
    yield Partner(
        row={
            "host": sshd_target.host,
            "port": sshd_target.port,
            "username": sshd_target.username,
            "host_key": sshd_target.host_key,
            "credential_ref": str(sshd_target.client_key_path),
            "remote_dir": sshd_target.remote_dir,
        },
        local_dir=sshd_target.local_dir,
    )


@pytest.mark.parametrize("point", ["after_rename", "before_manifest_rename"])
async def test_a_worker_killed_between_the_two_renames_is_completed_by_recovery_publishing_the_manifest(
    ts_env, database, factory, partner, task_queue, tmp_path, recovery_store, point
):
    job = await queue_export(factory, partner, contacts=300, manifest="both")
    async with killable_worker(
        point,
        job,
        database_url=database.app_url,
        client=ts_env.client,
        task_queue=task_queue,
        work_dir=tmp_path / "killed",
    ) as killed:
        await killed.reached()
        await killed.kill()

    renamed = await factory.job(job.id)
    assert renamed.status == JobStatus.DELIVERING and renamed.expected_file_name is not None
    final = renamed.expected_file_name
    sidecar, manifest = manifest_names(final, "both")
    before = partner.files()
    assert before[final] == renamed.expected_file_bytes  # the data file is in place
    assert sidecar not in before and manifest not in before  # the manifests are not
    data_mtime = (partner.local_dir / final).stat().st_mtime_ns
    if point == "before_manifest_rename":
        assert any(
            n.startswith(TEMP_PREFIX) and n.endswith(sidecar) for n in before
        )  # written, never renamed

    await factory.expire_lease(job.id)
    assert await recover(recovery_store, job.id) == Takeover.COMPLETED

    done = await factory.job(job.id)
    assert (done.status, done.attempt_id) == (JobStatus.COMPLETED, renamed.attempt_id)
    after = partner.files()
    assert {sidecar, manifest, final} <= set(after)
    delivered = (partner.local_dir / final).read_bytes()
    assert hashlib.sha256(delivered).digest() == done.expected_file_sha256
    assert (partner.local_dir / final).stat().st_mtime_ns == data_mtime  # never sent again
    checked = sha256sum_check(partner.local_dir, sidecar)
    assert checked.returncode == 0 and checked.stdout.strip() == f"{final}: OK", (
        checked.stdout + checked.stderr
    )
    assert (
        json.loads((partner.local_dir / manifest).read_text())["sha256"]
        == hashlib.sha256(delivered).hexdigest()
    )

    events = await factory.worker.job_events(job.id)
    evidence = [
        (e.observed_by or "", json.loads(e.detail or "{}"))
        for e in events
        if e.kind.value == "DeliveryEvidence"
    ]
    uploads = [d for _, d in evidence if d.get("observation") == "upload"]
    assert len(uploads) == 1  # the data file went up once, by the killed attempt
    published = [
        (by.startswith("recovery"), d["name"], d["result"])
        for by, d in evidence
        if d.get("observation") == "manifest"
    ]
    assert published == [(True, sidecar, "published"), (True, manifest, "published")]
    assert [e.kind.value for e in events].count("ResolvedByRecovery") == 1

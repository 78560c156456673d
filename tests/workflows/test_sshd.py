"""The delivery-side workflow tests again, against a real OpenSSH sshd (internal-sftp, its no-overwrite
rename), started by the tests on a free port. Skips on a machine without sshd; fails in CI."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pytest

from tests.fix_sftp import target_on
from tests.workflows.harness import Harness, SftpTarget
from tests.workflows.test_leases import (  # noqa: F401 - collected here too, against sshd
    test_a_long_upload_that_outlasts_the_initial_lease_finishes_completed,
    test_a_takeover_after_the_rename_fence_keeps_the_late_receipt_as_evidence,
    test_a_takeover_after_the_rename_fence_sets_the_file_aside_and_the_late_rename_is_refused,
    test_a_takeover_during_the_upload_refuses_the_rename_and_nothing_is_published,
)
from tests.workflows.test_outcomes import (  # noqa: F401
    test_an_occupied_final_name_ends_failed_and_is_never_overwritten,
)
from tests.workflows.test_races import (  # noqa: F401
    test_a_cancel_during_the_upload_is_too_late_and_the_job_still_completes,
)
from tests.workflows.test_stops import (  # noqa: F401
    test_a_workflow_cancelled_from_temporal_while_delivering_still_completes,
)
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """A fresh upload directory, owned by the partner account, on the session's real sshd."""
    yield from target_on(request, "sshd")


async def test_an_export_delivered_to_openssh_is_the_file_that_was_built(harness: Harness) -> None:
    job = await harness.queue_export(contacts=500)

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    [delivered] = harness.uploads(job)
    data = delivered.read_bytes()
    assert len(data) == result.file_bytes
    assert hashlib.sha256(data).hexdigest() == result.file_sha256
    assert data.startswith(b"email,first_name,last_name")
    assert harness.partner_files(job) == [delivered]  # no temporary file left behind
    assert harness.files_on_disk() == []
    assert uuid.UUID(str(result.attempt_id)) == (await harness.factory.job(job.id)).attempt_id

"""End to end through ExportWorkflow (time-skipping server, real PostgreSQL, the asyncssh partner): a
destination that asks for gzip, encryption to two partner keys and the tenant's signature receives
``contacts-{key}.csv.gz.pgp``; the attempt's evidence holds the delivered bytes' and the CSV's hashes and
sizes, the rows and the fingerprints; each partner's ``gpg --decrypt`` gives back exactly that CSV; and
no key or contact data reaches the workflow's history."""

from __future__ import annotations

import gzip
import hashlib
import json

from domain.models import EventKind, JobStatus
from testbed.gpg import GpgIdentity
from tests.workflows.harness import Harness, history_text
from workflows.models import AttemptOutcome


async def test_an_encrypted_gzipped_signed_delivery_records_both_hashes_and_the_fingerprints(
    harness: Harness, partner_key: GpgIdentity, second_partner_key: GpgIdentity, tenant_key: GpgIdentity
) -> None:
    job = await harness.queue_export(
        contacts=25,
        compression="gzip",
        pgp_recipient_keys=[partner_key.public_key, second_partner_key.public_key],
        pgp_signing_key_ref=str(tenant_key.secret_key_file),
    )

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    final_name = f"contacts-{job.delivery_key}.csv.gz.pgp"
    assert row.status == JobStatus.COMPLETED and row.expected_file_name == final_name
    delivered = (harness.sftp.local_dir / final_name).read_bytes()
    # What recovery compares with the partner is the delivered ciphertext.
    assert (row.expected_file_bytes, row.expected_file_sha256) == (
        len(delivered),
        hashlib.sha256(delivered).digest(),
    )
    assert row.expected_file_rows == 25

    events = await harness.factory.worker.job_events(job.id)
    authorized = [e for e in events if e.kind == EventKind.DELIVERY_AUTHORIZED]
    assert len(authorized) == 1 and authorized[0].attempt_id == row.attempt_id
    evidence = json.loads(authorized[0].detail or "")
    assert evidence["file"] == final_name and evidence["rows"] == 25
    assert (evidence["bytes"], evidence["sha256"]) == (len(delivered), hashlib.sha256(delivered).hexdigest())
    assert evidence["recipients"] == [partner_key.fingerprint, second_partner_key.fingerprint]
    assert evidence["signer"] == tenant_key.fingerprint
    assert evidence["format"]["compression"] == "gzip" and evidence["format"]["encrypted"] is True

    for partner in (partner_key, second_partner_key):
        decrypted = partner.decrypt(harness.sftp.local_dir / final_name)
        assert decrypted.returncode == 0 and decrypted.has("VALIDSIG", tenant_key.fingerprint)
        csv = gzip.decompress(decrypted.data)
        assert hashlib.sha256(csv).hexdigest() == evidence["plaintext"]["sha256"]
        assert len(csv) == evidence["plaintext"]["bytes"] and csv.count(b"\n") == 26  # header and 25 rows

    assert harness.files_on_disk() == []  # the build's private directory went with the delivery
    for handle in harness.started[-1:]:
        text = await history_text(handle)
        assert b"BEGIN PGP" not in text and str(tenant_key.secret_key_file).encode() not in text


async def test_an_unusable_partner_key_ends_the_export_failed_with_build_failed_and_sends_nothing(
    harness: Harness,
) -> None:
    not_a_key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n"
    job = await harness.queue_export(contacts=3, pgp_recipient_keys=[not_a_key])

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.FAILED
    events = await harness.factory.worker.job_events(job.id)
    assert [e.kind for e in events] == ["Claimed", "Failed"]
    assert (events[-1].detail or "").startswith("BuildFailed: RecipientKeyUnusable")
    assert "bm90IGEga2V5" not in (events[-1].detail or "")
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []

"""The encoding stages against Debian's GnuPG as the partner runs it: each recipient's ``gpg --decrypt`` in
its own GNUPGHOME gives back exactly the CSV whose hash the writer reported, a signature verifies with the
tenant's public key, and a key that cannot be used fails before anything is written, without repeating it."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from domain.file_format import FileFormat
from encoding import EncodedFile, EncodingError, EncodingStopped, open_file_writer
from testbed.gpg import GpgIdentity

CSV = b"email,first_name,last_name\n" + b"".join(
    b'person%d@example.com,First%d,"Last, %d"\n' % (i, i, i) for i in range(40_000)
)


def write(path: Path, file_format: FileFormat, data: bytes = CSV, block: int = 1 << 20) -> EncodedFile:
    writer = open_file_writer(path, file_format)
    for start in range(0, len(data), block):
        writer.write(data[start : start + block])
    return writer.finish()


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def test_a_plain_csv_is_the_bytes_written_and_one_hash_describes_both_sides(tmp_path):
    encoded = write(tmp_path / "contacts-k.csv", FileFormat())

    assert (tmp_path / "contacts-k.csv").read_bytes() == CSV
    assert (encoded.size, encoded.sha256) == (len(CSV), sha256(CSV))
    assert (encoded.plain_size, encoded.plain_sha256) == (len(CSV), sha256(CSV))
    assert encoded.recipients == () and encoded.signer is None


def test_gzip_gives_back_exactly_the_csv_and_the_evidence_hashes_both_layers(tmp_path):
    path = tmp_path / "contacts-k.csv.gz"
    encoded = write(path, FileFormat(compression="gzip"))

    delivered = path.read_bytes()
    assert gzip.decompress(delivered) == CSV
    # What a partner's gunzip gives, too (the gzip format, not only zlib's).
    assert subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True).stdout == CSV
    assert (encoded.size, encoded.sha256) == (len(delivered), sha256(delivered))
    assert (encoded.plain_size, encoded.plain_sha256) == (len(CSV), sha256(CSV))
    assert encoded.size < len(CSV) // 3


def test_encrypted_to_one_key_the_partners_gpg_decrypts_exactly_the_recorded_csv(
    tmp_path, partner_key: GpgIdentity
):
    path = tmp_path / "contacts-k.csv.pgp"
    encoded = write(path, FileFormat(recipient_keys=(partner_key.public_key,)))

    decrypted = partner_key.decrypt(path)
    assert decrypted.returncode == 0, decrypted.status
    assert sha256(decrypted.data) == encoded.plain_sha256 and decrypted.data == CSV
    assert decrypted.has("DECRYPTION_OKAY") and decrypted.has("PLAINTEXT")
    assert encoded.recipients == (partner_key.fingerprint,)
    assert (encoded.size, encoded.sha256) == (path.stat().st_size, sha256(path.read_bytes()))
    assert CSV[:200] not in path.read_bytes()


def test_encrypted_to_two_keys_each_recipient_decrypts_alone_in_its_own_home(
    tmp_path, partner_key: GpgIdentity, second_partner_key: GpgIdentity
):
    path = tmp_path / "contacts-k.csv.gz.pgp"
    file_format = FileFormat(
        compression="gzip", recipient_keys=(partner_key.public_key, second_partner_key.public_key)
    )
    encoded = write(path, file_format)

    assert encoded.recipients == (partner_key.fingerprint, second_partner_key.fingerprint)
    for recipient in (partner_key, second_partner_key):
        decrypted = recipient.decrypt(path)
        assert decrypted.returncode == 0, decrypted.status
        assert sha256(gzip.decompress(decrypted.data)) == encoded.plain_sha256


def test_a_signed_file_verifies_with_the_tenants_public_key(
    tmp_path, partner_key: GpgIdentity, tenant_key: GpgIdentity
):
    path = tmp_path / "contacts-k.csv.gz.pgp"
    file_format = FileFormat(
        compression="gzip",
        recipient_keys=(partner_key.public_key,),
        signing_key_ref=str(tenant_key.secret_key_file),
    )
    encoded = write(path, file_format)

    decrypted = partner_key.decrypt(path)
    assert decrypted.returncode == 0, decrypted.status
    assert decrypted.has("GOODSIG") and decrypted.has("VALIDSIG", tenant_key.fingerprint)
    assert gzip.decompress(decrypted.data) == CSV
    assert encoded.signer == tenant_key.fingerprint


def test_a_signed_only_file_verifies_with_gpg_verify(
    tmp_path, partner_key: GpgIdentity, tenant_key: GpgIdentity
):
    path = tmp_path / "contacts-k.csv.pgp"
    encoded = write(path, FileFormat(signing_key_ref=str(tenant_key.secret_key_file)))

    verified = subprocess.run(
        ["gpg", "--homedir", str(partner_key.home), "--batch", "--status-fd", "1", "--verify", str(path)],
        capture_output=True,
        check=False,
    )
    assert verified.returncode == 0
    assert f"VALIDSIG {tenant_key.fingerprint}".encode() in verified.stdout
    assert partner_key.decrypt(path).data == CSV and encoded.recipients == ()


def test_a_recipient_key_gpg_cannot_use_fails_before_the_file_exists_and_is_never_repeated(
    tmp_path, tenant_key: GpgIdentity
):
    # An armored block gpg cannot read as one usable key (truncated, as a bad paste would be).
    broken = tenant_key.public_key[:200] + "\n-----END PGP PUBLIC KEY BLOCK-----\n"
    path = tmp_path / "contacts-k.csv.pgp"
    with pytest.raises(EncodingError) as refused:
        open_file_writer(path, FileFormat(recipient_keys=(broken,)))

    assert refused.value.code == "RecipientKeyUnusable"
    assert "recipient key 0" in str(refused.value)
    assert "PGP" not in str(refused.value) and broken[40:80] not in str(refused.value)
    assert not path.exists()


def test_a_signing_key_file_open_to_others_is_refused_without_reading_it(tmp_path, tenant_key: GpgIdentity):
    loose = tmp_path / "loose.asc"
    loose.write_bytes(tenant_key.secret_key_file.read_bytes())
    os.chmod(loose, 0o644)
    with pytest.raises(EncodingError) as refused:
        open_file_writer(tmp_path / "contacts-k.csv.pgp", FileFormat(signing_key_ref=str(loose)))
    assert refused.value.code == "SigningKeyTooOpen" and "0644" in str(refused.value)

    with pytest.raises(EncodingError) as missing:
        open_file_writer(tmp_path / "contacts-j.csv.pgp", FileFormat(signing_key_ref=str(tmp_path / "none")))
    assert missing.value.code == "SigningKeyUnavailable"
    assert list(tmp_path.glob("contacts-*")) == []


def test_a_stop_while_the_stages_are_behind_ends_the_write_and_abort_leaves_no_gpg(
    tmp_path, partner_key: GpgIdentity
):
    stopping = {"now": False}
    writer = open_file_writer(
        tmp_path / "contacts-k.csv.gz.pgp",
        FileFormat(compression="gzip", recipient_keys=(partner_key.public_key,)),
        should_stop=lambda: stopping["now"],
    )
    gpg = writer._gpg
    assert gpg is not None and gpg.process.poll() is None
    writer.write(CSV)
    stopping["now"] = True
    with pytest.raises(EncodingStopped):
        for _ in range(200):  # the queue holds a few blocks: a write soon has to wait, and hears the stop
            writer.write(CSV)
    writer.abort()

    assert gpg.process.poll() is not None  # killed, and reaped
    assert writer._home is None  # the private GnuPG home is gone


@pytest.mark.slow  # a GnuPG key generated with a passphrase: seconds
def test_a_protected_signing_key_signs_with_its_passphrase_and_is_locked_without_it(
    tmp_path, partner_key: GpgIdentity, gpg_root
):
    protected = GpgIdentity.generate(
        "Acme protected <exports@acme.example>", gpg_root, passphrase="s3cret word"
    )
    try:
        partner_key.import_public(protected)
        fmt = FileFormat(
            recipient_keys=(partner_key.public_key,), signing_key_ref=str(protected.secret_key_file)
        )
        for wrong in (None, "not it"):
            writer = open_file_writer(tmp_path / f"contacts-{wrong}.csv.pgp", fmt, passphrase=wrong)
            writer.write(CSV)
            with pytest.raises(EncodingError) as locked:
                writer.finish()
            assert locked.value.code == "SigningKeyLocked" and "not it" not in str(locked.value)

        path = tmp_path / "contacts-k.csv.pgp"
        writer = open_file_writer(path, fmt, passphrase="s3cret word")
        writer.write(CSV)
        encoded = writer.finish()
        decrypted = partner_key.decrypt(path)
        assert decrypted.has("VALIDSIG", protected.fingerprint) and encoded.signer == protected.fingerprint
    finally:
        protected.close()

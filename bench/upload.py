"""The partner client's upload against OpenSSH ``sftp``, side by side in one run: MB/s and the ratio.

Starts a private OpenSSH sshd on loopback (as the tests do; needs root and ``openssh-server``),
writes one random file (200 MB by default), then alternates for ``--runs`` rounds:

- ``deliver()``: connect with the pinned key, baseline listing, exclusive upload with 255 KiB
  pipelined writes, no-overwrite rename, stat read-back; the upload alone is timed too;
- ``sftp -b`` (batch ``put``) with the same cipher, ``-c aes128-gcm@openssh.com``.

Both include connecting. MB = 10^6 bytes; medians. Target: ratio >= 0.85.

    python -m bench.upload [--mb 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from domain.destination import Destination
from domain.models import DeliveryOutcome
from partner.client import session, upload_exclusive
from partner.delivery import FileToDeliver, deliver
from testbed.sftp import Sshd, sshd_available

CIPHER = "aes128-gcm@openssh.com"


def random_file(path: Path, size: int) -> bytes:
    """Write ``size`` random bytes to ``path``; returns their SHA-256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(left, 1 << 22))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.digest()


def run_sftp(sshd: Sshd, known_hosts: Path, local: Path, remote: str) -> float:
    batch = local.with_suffix(".batch")
    batch.write_text(f'put "{local}" "{remote}"\n')
    args = [
        "sftp",
        "-q",
        "-b",
        str(batch),
        "-c",
        CIPHER,
        "-i",
        str(sshd.client_key_path),
        "-P",
        str(sshd.port),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        f"partner@{sshd.host}",
    ]
    started = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def run_deliver(destination: Destination, file: FileToDeliver) -> float:
    started = time.perf_counter()
    report = deliver(
        destination, file, uuid.uuid4(), original=None, overwrite_agreed=False, on_evidence=lambda e: None
    )
    seconds = time.perf_counter() - started
    if report.outcome != DeliveryOutcome.COMPLETED:
        raise SystemExit(f"delivery did not complete: {report.summary}")
    return seconds


def run_upload_only(destination: Destination, local: Path, remote_name: str) -> float:
    with session(destination) as opened:
        started = time.perf_counter()
        upload_exclusive(
            opened.sftp,
            local,
            destination.remote_path(remote_name),
            write_request=destination.max_write_request,
        )
        return time.perf_counter() - started


def main(megabytes: int, runs: int) -> dict[str, float]:
    """Run the comparison; print and return the medians (MB/s) and the ratio."""
    if not sshd_available() or not shutil.which("sftp"):
        raise SystemExit("needs root, /usr/sbin/sshd and the sftp client")
    size = megabytes * 1_000_000
    sshd = Sshd.start()
    scratch = Path(tempfile.mkdtemp(prefix="fenced-bench-upload-"))
    try:
        local = scratch / "contacts-bench.csv"
        sha256 = random_file(local, size)
        known_hosts = scratch / "known_hosts"
        known_hosts.write_text(f"[{sshd.host}]:{sshd.port} {sshd.host_key_line}\n")
        destination = Destination(
            id=uuid.uuid4(),
            tenant_id=uuid.uuid4(),
            name="bench",
            host=sshd.host,
            port=sshd.port,
            username="partner",
            host_key=sshd.host_key_line,
            credential_ref=str(sshd.client_key_path),
            remote_dir=str(sshd.upload_dir),
            max_write_request=261120,
        )
        times: dict[str, list[float]] = {"deliver": [], "upload_only": [], "sftp": []}
        for _ in range(runs):
            name = f"contacts-{uuid.uuid4()}.csv"
            times["deliver"].append(run_deliver(destination, FileToDeliver(local, name, size, sha256)))
            (sshd.upload_dir / name).unlink()
            name = f"upload-only-{uuid.uuid4()}.csv"
            times["upload_only"].append(run_upload_only(destination, local, name))
            (sshd.upload_dir / name).unlink()
            name = f"sftp-{uuid.uuid4()}.csv"
            times["sftp"].append(run_sftp(sshd, known_hosts, local, f"{sshd.upload_dir}/{name}"))
            (sshd.upload_dir / name).unlink()
    finally:
        sshd.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    rates = {k: size / 1e6 / statistics.median(v) for k, v in times.items()}
    result = {**{f"{k}_mb_per_s": r for k, r in rates.items()}, "ratio": rates["deliver"] / rates["sftp"]}
    print(
        f"file: {megabytes} MB random, runs: {runs} (medians), cipher {CIPHER}, cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}"
    )
    for key, label in (
        ("deliver", "deliver()"),
        ("upload_only", "  its upload alone"),
        ("sftp", "sftp -b put"),
    ):
        print(f"{label:<18}: {rates[key]:7.1f} MB/s   {[round(t, 2) for t in times[key]]} s")
    print(f"ratio deliver()/sftp: {result['ratio']:.2f}  (target >= 0.85)")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    main(options.mb, options.runs)

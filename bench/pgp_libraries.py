"""Which OpenPGP library the builder uses, by measurement: throughput on 128 MiB, streaming, and whether the
partner's ``gpg --decrypt`` reads each one's output (and verifies its signature).

Candidates: ``gpg`` through a pipe (``encoding/``, what the builder runs), python-gnupg over the same ``gpg``,
pysequoia and PGPy. The last three are not the project's dependencies; a candidate that is not installed is
reported so (``pip install python-gnupg pysequoia pgpy`` to measure them). Each encrypts the same random
128 MiB (what gzip leaves is about as incompressible) to one partner key, then signs and encrypts with the
tenant's key; wall and CPU seconds (this process and its finished children) and the peak resident memory of
the process that held the data are printed, and the output is decrypted by the partner's ``gpg``.

    python -m bench.pgp_libraries [--mib 128]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from domain.file_format import FileFormat
from encoding import open_file_writer
from testbed.gpg import GpgIdentity

BLOCK = 1 << 20


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def peak_rss_mb() -> float:
    """This process's peak resident memory since its exec (VmHWM; ru_maxrss would carry the parent's over)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gpg_pipe(source: Path, out: Path, partner: GpgIdentity, signer: GpgIdentity | None) -> None:
    fmt = FileFormat(
        recipient_keys=(partner.public_key,), signing_key_ref=str(signer.secret_key_file) if signer else None
    )
    writer = open_file_writer(out, fmt)
    with source.open("rb") as data:
        while block := data.read(BLOCK):
            writer.write(block)
    writer.finish()


def python_gnupg(source: Path, out: Path, partner: GpgIdentity, signer: GpgIdentity | None) -> None:
    import gnupg  # type: ignore[import-not-found]

    home = tempfile.mkdtemp(prefix="fx-pyg-")
    try:
        gpg = gnupg.GPG(gnupghome=home)
        gpg.import_keys(partner.public_key)
        extra: dict[str, object] = {}
        if signer is not None:
            gpg.import_keys_file(str(signer.secret_key_file))
            extra = {"sign": signer.fingerprint, "passphrase": ""}
        with source.open("rb") as data:
            done = gpg.encrypt_file(
                data, [partner.fingerprint], output=str(out), armor=False, always_trust=True,
                extra_args=["--compress-algo", "none"], **extra,
            )  # fmt: skip
        if not done.ok:
            raise RuntimeError(done.status)
        digest = hashlib.sha256()  # it writes the file itself: hashing what was written takes a second read
        with out.open("rb") as written:
            while block := written.read(BLOCK):
                digest.update(block)
    finally:
        subprocess.run(
            ["gpgconf", "--homedir", home, "--kill", "gpg-agent"], capture_output=True, check=False
        )
        shutil.rmtree(home, ignore_errors=True)


def pysequoia(source: Path, out: Path, partner: GpgIdentity, signer: GpgIdentity | None) -> None:
    import pysequoia as ps  # type: ignore[import-not-found]

    cert = ps.Cert.from_bytes(partner.public_key.encode())
    signing = ps.Tsk.from_bytes(signer.secret_key_file.read_bytes()).signer() if signer else None
    # File to file only (no stream from Python), and the GIL is held for the whole call.
    ps.encrypt_file(str(source), str(out), recipients=[cert], signer=signing, armor=False)


def pgpy(source: Path, out: Path, partner: GpgIdentity, signer: GpgIdentity | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgpy as pg  # type: ignore[import-not-found]
        from pgpy.constants import CompressionAlgorithm, SymmetricKeyAlgorithm  # type: ignore[import-not-found]

        key, _ = pg.PGPKey.from_blob(partner.public_key)
        message = pg.PGPMessage.new(source.read_bytes(), compression=CompressionAlgorithm.Uncompressed)
        if signer is not None:
            secret, _ = pg.PGPKey.from_blob(signer.secret_key_file.read_text())
            message |= secret.sign(message)
        out.write_bytes(bytes(key.encrypt(message, cipher=SymmetricKeyAlgorithm.AES256)))


CANDIDATES: dict[str, tuple[str | None, Callable[[Path, Path, GpgIdentity, GpgIdentity | None], None]]] = {
    "gpg through a pipe (encoding/)": (None, gpg_pipe),
    "python-gnupg (same gpg)": ("gnupg", python_gnupg),
    "pysequoia": ("pysequoia", pysequoia),
    "PGPy": ("pgpy", pgpy),
}


def measure_in_child(
    name: str, source: Path, out: Path, partner: GpgIdentity, signer: GpgIdentity | None
) -> str:
    """Run one candidate in a fresh process (so its peak memory is its own); its figures as one line."""
    code = (
        "import sys, time, resource; from pathlib import Path; import bench.pgp_libraries as b; "
        "from testbed.gpg import GpgIdentity; "
        f"p = GpgIdentity(Path({str(partner.home)!r}), {partner.fingerprint!r}, {partner.public_key!r}, "
        f"Path({str(partner.secret_key_file)!r})); "
        + (
            f"s = GpgIdentity(Path({str(signer.home)!r}), {signer.fingerprint!r}, {signer.public_key!r}, "
            f"Path({str(signer.secret_key_file)!r})); "
            if signer
            else "s = None; "
        )
        + f"c, w = b._cpu(), time.perf_counter(); b.CANDIDATES[{name!r}][1](Path({str(source)!r}), Path({str(out)!r}), p, s); "
        "w, c = time.perf_counter() - w, b._cpu() - c; "
        "print(f'{w:.3f} {c:.3f} {b.peak_rss_mb():.0f}')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return done.stdout.strip()


def main(mib: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="fenced-bench-pgplib-"))
    partner = GpgIdentity.generate("Partner <partner@bench.example>", scratch)
    tenant = GpgIdentity.generate("Tenant <tenant@bench.example>", scratch)
    partner.import_public(tenant)
    try:
        source = scratch / "in.bin"
        with source.open("wb") as data:
            for _ in range(mib):
                data.write(os.urandom(BLOCK))
        digest = hashlib.sha256()
        with source.open("rb") as data:
            while block := data.read(BLOCK):
                digest.update(block)
        expected = digest.digest()
        size = mib * BLOCK
        print(f"{mib} MiB random, cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}; MB = 10^6 bytes")
        print(
            f"{'candidate':<32} {'mode':<14} {'MB/s':>6} {'wall s':>7} {'cpu s':>6} {'max RSS MB':>10}  gpg --decrypt"
        )
        for name, (module, _) in CANDIDATES.items():
            if module is not None and importlib.util.find_spec(module) is None:
                print(f"{name:<32} not installed")
                continue
            for signer in (None, tenant):
                out = scratch / "out.pgp"
                out.unlink(missing_ok=True)
                figures = measure_in_child(name, source, out, partner, signer)
                mode = "sign+encrypt" if signer else "encrypt"
                if figures.startswith("failed"):
                    print(f"{name:<32} {mode:<14} {figures}")
                    continue
                wall, cpu, rss = figures.split()
                decrypted = partner.decrypt(out)
                ok = decrypted.returncode == 0 and hashlib.sha256(decrypted.data).digest() == expected
                if signer is not None:
                    ok = ok and decrypted.has("VALIDSIG", tenant.fingerprint)
                why = (
                    ""
                    if ok
                    else f" (exit {decrypted.returncode}, {[s.split()[1] for s in decrypted.status][:8]})"
                )
                print(
                    f"{name:<32} {mode:<14} {size / 1e6 / float(wall):6.0f} {float(wall):7.2f} {float(cpu):6.2f}"
                    f" {rss:>10}  {'same data' + (', signature valid' if signer else '') if ok else 'FAILED' + why}"
                )
    finally:
        partner.close()
        tenant.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    main(parser.parse_args().mib)

"""A real PostgreSQL server that speaks TLS: Debian's ``postgresql`` package (the embedded wheel is built
without OpenSSL), in a private data directory, on a free loopback port, with a certificate signed by a
test CA (:func:`testbed.tls.make_pki`).

By default its ``pg_hba.conf`` accepts TCP connections only over TLS (``hostssl``) and rejects the rest
(``hostnossl ... reject``), so a connection that works is a TLS connection. Authentication is ``trust``:
what is under test is the channel, not passwords. The server runs as the ``postgres`` system user when
started by root (PostgreSQL refuses to run as root), else as the current user.

``apt-get install -y postgresql`` provides it (``.ci/run`` does); :func:`find_postgres_bin` says whether
it is there.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from servers.ports import PortPicker, ServerStartError, log_tail, pick_port, start_with_retries
from testbed.tls import Pki

DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"


def find_postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL server's ``bin`` directory, or None when none is installed."""
    if not DEBIAN_PG_ROOT.is_dir():
        return None
    candidates = sorted(
        (p / "bin" for p in DEBIAN_PG_ROOT.iterdir() if (p / "bin" / "postgres").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def can_run() -> bool:
    """A Debian server is installed and we can run it (as ``postgres`` when we are root)."""
    if find_postgres_bin() is None:
        return False
    if os.geteuid() != 0:
        return True
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        return False
    return True


@dataclass
class TlsPostgres:
    """A running server; ``url(...)`` builds ``sslmode=verify-full`` URLs; ``stop()`` removes it."""

    work_dir: Path
    port: int
    bin_dir: Path
    ca_cert: Path
    _run_as: dict = field(default_factory=dict)

    @classmethod
    def start(cls, pki: Pki, *, tls_only: bool = True) -> TlsPostgres:
        """initdb, install the server certificate, start with ``ssl=on`` and wait until it accepts."""
        bin_dir = find_postgres_bin()
        if bin_dir is None:
            raise RuntimeError("Debian's postgresql package is not installed (apt-get install -y postgresql)")
        work_dir = Path(tempfile.mkdtemp(prefix="fenced-pg-tls-"))
        run_as: dict = {}
        if os.geteuid() == 0:
            run_as = {"user": SERVER_USER}
            shutil.chown(work_dir, SERVER_USER, SERVER_USER)
        work_dir.chmod(0o700)
        server = cls(
            work_dir=work_dir, port=pick_port(), bin_dir=bin_dir, ca_cert=pki.ca_cert, _run_as=run_as
        )
        data = work_dir / "data"
        try:
            server._run(
                "initdb", "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync"
            )
            # The key must belong to the server's user and be private to it, or the server refuses it.
            for source, name in ((pki.server_cert, "server.crt"), (pki.server_key, "server.key")):
                target = data / name
                shutil.copyfile(source, target)
                target.chmod(0o600)
                if run_as:
                    shutil.chown(target, SERVER_USER, SERVER_USER)
            hba = ["local all all trust", "hostssl all all 127.0.0.1/32 trust"]
            hba.append(
                "hostnossl all all 0.0.0.0/0 reject" if tls_only else "host all all 127.0.0.1/32 trust"
            )
            (data / "pg_hba.conf").write_text("\n".join(hba) + "\n")

            def start_on(ports: PortPicker) -> None:
                server.port = ports()
                options = (
                    f"-h 127.0.0.1 -p {server.port} -k {work_dir} -c ssl=on -c ssl_cert_file=server.crt"
                    " -c ssl_key_file=server.key -c fsync=off -c synchronous_commit=off"
                    " -c full_page_writes=off -c max_connections=100"
                )
                log = work_dir / "server.log"
                try:
                    server._run(
                        "pg_ctl", "-D", str(data), "-w", "-t", "60", "-l", str(log), "-o", options, "start",
                    )  # fmt: skip
                except RuntimeError as exc:
                    server._stop_server()
                    raise ServerStartError(f"{exc}; log: {log_tail(log)}") from exc

            start_with_retries("PostgreSQL with TLS (Debian's)", start_on)
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin_dir / program), *args], capture_output=True, text=True, **self._run_as
        )
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()[-500:]}")

    def url(
        self,
        database: str = "postgres",
        user: str = "postgres",
        *,
        sslmode: str = "verify-full",
        ca: Path | None = None,
        host: str = "127.0.0.1",
    ) -> str:
        """A URL for ``database`` as ``user`` with ``sslmode`` and ``sslrootcert`` (default: the test CA)."""
        params = f"sslmode={sslmode}"
        if sslmode.startswith("verify"):
            params += f"&sslrootcert={quote(str(ca or self.ca_cert), safe='/')}"
        return f"postgresql://{user}@{host}:{self.port}/{database}?{params}"

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        self._stop_server()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_server(self) -> None:
        data = self.work_dir / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                capture_output=True,
                check=False,
                **self._run_as,
            )

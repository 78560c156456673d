"""A real PostgreSQL of a test module's own, stopped and started for real: an immediate stop (as a crash:
backends are killed, crash recovery at start) or a fast one (backends told to end), then back on the same
port with the same data, as after a restart or a failover to a server at the same address."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import psycopg
from psycopg import sql

from db.embedded import EmbeddedPostgres, _bin_dir
from db.migrate import ensure_app_login, migrate
from testbed.pg import APP_LOGIN

StopMode = Literal["immediate", "fast"]


@contextmanager
def own_postgres(prefix: str) -> Iterator[EmbeddedPostgres]:
    """A migrated server with the application login, removed afterwards."""
    server = EmbeddedPostgres.start(data_dir=Path(tempfile.mkdtemp(prefix=prefix)), keep=True)
    try:
        migrate(server.url)
        ensure_app_login(server.url, APP_LOGIN)
        with psycopg.connect(server.url, autocommit=True) as conn:
            # The embedded server runs with synchronous_commit=off (tests, not durability): an immediate
            # stop would lose commits already acknowledged. The application's sessions commit durably,
            # as in production, and the set-up is on disk before any stop.
            conn.execute(
                sql.SQL("ALTER ROLE {} SET synchronous_commit = on").format(sql.Identifier(APP_LOGIN))
            )
            conn.execute("CHECKPOINT")
        yield server
    finally:
        server.keep = False
        server.stop()


def app_url(server: EmbeddedPostgres) -> str:
    return server.url_for("postgres", APP_LOGIN)


def stop(server: EmbeddedPostgres, mode: StopMode) -> None:
    """``pg_ctl stop -m MODE``: the server is gone when this returns."""
    subprocess.run(
        [str(_bin_dir() / "pg_ctl"), "-D", str(server.data_dir / "pgdata"), "-m", mode, "-w", "stop"],
        check=True,
        capture_output=True,
        **server._run_as,  # the embedded server's own user when the tests run as root
    )


def start(server: EmbeddedPostgres) -> None:
    """Start it again on the same port and data directory."""
    restarted = EmbeddedPostgres.start(data_dir=server.data_dir, port=server.port, keep=True)
    server._run_as = restarted._run_as

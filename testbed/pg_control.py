"""Stopping and starting an embedded PostgreSQL server in place, for restart faults.

The server keeps its data directory and port, so every client's URL stays valid: a restart is what a
database failover or a crash looks like to the application (connections reset, then refused, then
accepted again). ``immediate`` is a crash (no checkpoint, crash recovery at the next start); ``fast``
disconnects sessions and shuts down cleanly.
"""

from __future__ import annotations

import subprocess
import time
from typing import Literal

import psycopg

from db.embedded import EmbeddedPostgres, _bin_dir

StopMode = Literal["immediate", "fast", "smart"]


def stop_server(server: EmbeddedPostgres, mode: StopMode) -> None:
    """``pg_ctl stop -m mode`` and wait until the server is down; the data directory stays."""
    pg_ctl = [str(_bin_dir() / "pg_ctl"), "-D", str(server.data_dir / "pgdata"), "-m", mode, "-w", "-t", "60"]
    done = subprocess.run([*pg_ctl, "stop"], check=False, capture_output=True, **server._run_as)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise RuntimeError(f"pg_ctl stop -m {mode} exited {done.returncode}: {said}")


def start_server(server: EmbeddedPostgres) -> EmbeddedPostgres:
    """Start the same server again (same data directory and port); returns the started server."""
    return EmbeddedPostgres.start(data_dir=server.data_dir, port=server.port, keep=True)


def wait_until_accepting(url: str, timeout: float = 60.0) -> float:
    """Poll ``url`` with a trivial query until it answers; returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return time.monotonic() - started
        except psycopg.Error as exc:
            last = exc
            time.sleep(0.1)  # starting up or recovering: poll until it accepts
    raise TimeoutError(f"PostgreSQL did not accept connections within {timeout}s ({last!r})")
